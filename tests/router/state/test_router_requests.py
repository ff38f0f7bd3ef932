"""Request ids, idempotent retries and deadlines in the router (router/router.py), a real ``Router``
over Redis with an in-process dispatcher: one id is one request at a time even when two arrive
together, a retry that repeats its id and key gets the first answer, a finished request's deadline
timer is gone, and a client's lane string never becomes a metrics label."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerateRequest, RouterError
from router.lanes import TenantConfig
from router.request_ids import scoped_request_id
from tests.router.state.inprocess_router import make_router, release
from tests.waiting import async_wait_until

TENANTS = (TenantConfig("alice", api_key="ka"), TenantConfig("bob", api_key="kb"))


def _request(**kw) -> GenerateRequest:
    return GenerateRequest(SamplingParams(max_tokens=4), prompt_token_ids=tuple(range(1, 40)), **kw)


def test_two_requests_arriving_together_with_one_id_are_one_request_and_a_409(redis_server, cluster) -> None:
    """Both passed the in-flight check (awaits came between it and the queue): the second replaced
    the first in the router's table, the first failed as a duplicate, the second could not be aborted."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        dispatcher.hold = True
        await router.start()
        try:
            got = await asyncio.gather(
                router.generate(_request(tenant="alice", request_id="shared-1")),
                router.generate(_request(tenant="alice", request_id="shared-1")),
                return_exceptions=True,
            )
            errors = [g for g in got if isinstance(g, BaseException)]
            [stream] = [g for g in got if not isinstance(g, BaseException)]
            assert len(errors) == 1 and isinstance(errors[0], RouterError) and errors[0].kind is ErrorKind.CONFLICT
            await async_wait_until(lambda: dispatcher.held, message="the request reaching a worker")
            assert await router.abort("shared-1", "alice")  # the one that runs can be stopped
            assert (await stream.result()).finish_reason == "abort"
            assert dispatcher.aborted == [scoped_request_id("alice", "shared-1")]
            assert router.requests.num_held == 0
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_retry_repeating_its_request_id_and_key_gets_the_first_answer(
    redis_server, cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It got a 409 for the id (checked before the key) while the first attempt ran."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        dispatcher.hold = True
        begun: list[str] = []  # idempotency keys whose lookup started (the retry's then waits in it)
        real_begin = router.state.idempotency_begin

        async def begin(tenant: str, key: str, *args: Any, **kw: Any) -> Any:
            begun.append(key)
            return await real_begin(tenant, key, *args, **kw)

        monkeypatch.setattr(router.state, "idempotency_begin", begin)
        await router.start()
        try:
            first = await router.generate(_request(tenant="alice", request_id="req-77", idempotency_key="K"))
            retry = asyncio.create_task(
                router.generate(_request(tenant="alice", request_id="req-77", idempotency_key="K"))
            )
            await async_wait_until(lambda: dispatcher.held, message="the request reaching a worker")
            await async_wait_until(lambda: begun == ["K", "K"], message="the retry looking its key up")
            assert not retry.done()  # waiting for the first attempt, not refused
            first_result = asyncio.create_task(first.result())  # its client reads it, as over HTTP
            release(dispatcher)
            answer = await (await asyncio.wait_for(retry, 20)).result()
            assert answer.token_ids == (await first_result).token_ids == (7, 8)
            assert dispatcher.submitted == [scoped_request_id("alice", "req-77")]  # one generation
            assert answer.request_id == "req-77"  # the client's id, not the one it ran under
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_finished_requests_deadline_does_not_abort_a_later_one_with_its_id(redis_server, cluster) -> None:
    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        await router.start()
        try:
            quick = await router.generate(
                _request(tenant="alice", request_id="job-42", deadline_s=time.monotonic() + 0.5)
            )
            assert (await quick.result()).finish_reason == "length"
            dispatcher.hold = True
            later = await router.generate(_request(tenant="alice", request_id="job-42"))  # no deadline
            await asyncio.sleep(0.8)  # the behaviour under test: past the first one's deadline
            assert dispatcher.aborted == [] and not later.ctx.stream.finished
            assert not [t for t in asyncio.all_tasks() if "with_deadline" in repr(t.get_coro())]
            release(dispatcher)
            assert (await later.result()).finish_reason == "length"
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_clients_lane_string_is_no_metrics_label(redis_server, cluster) -> None:
    async def main() -> None:
        router, _ = make_router(redis_server.url, cluster, TENANTS)
        await router.start()
        try:
            router.draining = True
            for lane in ("x" * 200, "batch"):
                try:
                    await router.generate(_request(tenant="alice", lane=lane))
                    raise AssertionError("a draining router admitted a request")
                except RouterError as e:
                    assert e.kind is ErrorKind.OVERLOADED
            assert set(router.admission.rejections) == {("none", "draining"), ("batch", "draining")}
        finally:
            router.draining = False
            await router.stop()

    asyncio.run(main())


def test_an_id_outside_the_rule_names_nothing_and_is_not_looked_up(
    redis_server, cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An abort or a batch lookup with an id no request can have (a newline, 10,000 characters) is
    "not found" at once: no Redis lookup with it as a key, and the 404 does not echo all of it."""

    async def main() -> None:
        router, _ = make_router(redis_server.url, cluster, TENANTS)
        await router.start()

        async def looked_up(*_args):
            raise AssertionError("a lookup with an id outside the rule")

        monkeypatch.setattr(router.batch, "cancel", looked_up)
        monkeypatch.setattr(router.state, "batch_get", looked_up)
        try:
            for bad in ("a\nb", "x" * 10_000, "", "../job"):
                assert await router.abort(bad, "alice") is False
                try:
                    await router.batch_result(bad, "alice")
                    raise AssertionError("found a batch job")
                except RouterError as e:
                    assert e.kind is ErrorKind.NOT_FOUND and len(str(e)) < 300
        finally:
            await router.stop()

    asyncio.run(main())


def test_request_ids_belong_to_their_tenant(redis_server, cluster) -> None:
    """Two tenants choosing one id run two requests (bob got a 409 for alice's id: he learnt that it
    existed, and could take ids alice would use); each sees its own id, and only its owner aborts it."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        dispatcher.hold = True
        await router.start()
        try:
            alices = await router.generate(_request(tenant="alice", request_id="order-1"))
            bobs = await router.generate(_request(tenant="bob", request_id="order-1"))
            await async_wait_until(lambda: len(dispatcher.held) == 2, message="two requests reaching a worker")
            assert alices.request_id == bobs.request_id == "order-1"
            assert set(dispatcher.submitted) == {
                scoped_request_id("alice", "order-1"),
                scoped_request_id("bob", "order-1"),
            }
            assert await router.abort("order-1", "bob")
            bob_result = await asyncio.wait_for(bobs.result(), 10)
            assert bob_result.finish_reason == "abort" and bob_result.request_id == "order-1"
            assert not alices.ctx.stream.finished  # alice's request goes on
            release(dispatcher)
            alice_result = await asyncio.wait_for(alices.result(), 10)
            assert alice_result.finish_reason == "length" and alice_result.request_id == "order-1"
        finally:
            await router.stop()

    asyncio.run(main())


def test_failed_requests_are_counted_but_not_timed(redis_server, cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of failures (0 tokens each, failing fast) pulled the e2e histogram and admission's
    expected output length towards zero, and admission turned optimistic."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        ok_submit = dispatcher.submit

        def failing_submit(spec, stream, hint) -> None:
            if spec.request_id.startswith("err-"):
                stream.fail("worker died")
            else:
                ok_submit(spec, stream, hint)

        monkeypatch.setattr(dispatcher, "submit", failing_submit)
        await router.start()
        try:
            for i in range(5):
                await (await router.generate(_request(tenant="alice", request_id=f"ok-{i}"))).result()
            expected = router.signals.expected_output(4)
            for i in range(10):
                stream = await router.generate(_request(tenant="alice", request_id=f"err-{i}"))
                try:
                    await stream.result()
                    raise AssertionError("a failed request returned a result")
                except RouterError:
                    pass
            await async_wait_until(
                lambda: _sample(router.metrics()[0].decode(), "baton_requests_finished_total", "error") == 10,
                message="the last failure's bookkeeping",
            )
            assert router.signals.expected_output(4) == expected == 2.0
            text = router.metrics()[0].decode()
            assert 'finish_reason="error"' in text and _sample(text, "baton_requests_finished_total", "error") == 10
            assert _sample(text, "baton_e2e_request_latency_seconds_count") == 5
        finally:
            await router.stop()

    asyncio.run(main())


def _sample(text: str, name: str, finish_reason: str | None = None) -> float:
    """The sum of ``name``'s samples (with that finish_reason label, if given) in an exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (finish_reason is None or f'finish_reason="{finish_reason}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_inter_token_gaps_are_observed_as_the_tokens_arrive(redis_server, cluster) -> None:
    """All of a request's gaps went into the ITL histogram when it ended, on the event loop: ~9 ms
    for 16,000 tokens, a stall for every other stream. Now each delta's as it is read, aborted
    streams' included (their gaps were real)."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        dispatcher.hold = True
        await router.start()
        try:
            stream = await router.generate(_request(tenant="alice", request_id="itl-1"))
            await async_wait_until(lambda: dispatcher.held, message="the request reaching a worker")
            held = dispatcher.held[scoped_request_id("alice", "itl-1")]
            for i in range(4):  # four deltas, one token each, a little apart
                held.put(RequestOutput(scoped_request_id("alice", "itl-1"), [10 + i], "x"))
                await asyncio.sleep(0.02)  # the behaviour under test: the gaps between tokens are measured
            reader = asyncio.create_task(stream.result())
            await async_wait_until(
                lambda: _sample(router.metrics()[0].decode(), "baton_inter_token_latency_seconds_count") == 3,
                message="three gaps observed before the end",
            )
            text = router.metrics()[0].decode()
            assert _sample(text, "baton_inter_token_latency_seconds_sum") >= 0.05
            await router.abort("itl-1", "alice")
            assert (await reader).finish_reason == "abort"
            assert _sample(router.metrics()[0].decode(), "baton_inter_token_latency_seconds_count") == 3
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_request_nobody_reads_to_its_end_still_ends_in_the_router(redis_server, cluster) -> None:
    """Its end was recorded only by a reader reaching it (or an abort, which skips finished ones): a
    choice of n that finished while its client left, or before a sibling choice was refused, stayed
    in flight for good, holding a sequence slot; at ~256 of them dispatch stopped."""
    from router.choices import Choices

    async def main() -> None:
        router, _dispatcher = make_router(redis_server.url, cluster, TENANTS)
        await router.start()
        try:
            unread = await router.generate(_request(tenant="alice", request_id="unread"))  # finishes at once
            await async_wait_until(lambda: not router.requests, message="the unread request's end")
            assert router.capacity.in_flight == 0 and unread.ctx.finished
            # n = 3, its client gone after the choices finished but before anyone read them
            choices = await Choices.start(router, _request(tenant="alice", request_id="multi"), 3)
            await async_wait_until(
                lambda: _sample(router.metrics()[0].decode(), "baton_requests_finished_total", "length") == 4,
                message="the three choices finished",
            )
            await choices.abort()
            await async_wait_until(lambda: not router.requests, message="no request left in flight")
            assert router.requests.num_dispatched == 0 and router.capacity.in_flight == 0
        finally:
            await router.stop()

    asyncio.run(main())


def test_the_choices_of_a_request_with_a_long_id_can_be_aborted_and_looked_up(redis_server, cluster) -> None:
    """A 127-character id with n = 2 runs as '<id>-0' and '<id>-1' (129 characters): past the id
    rule, so a client's disconnect aborted neither choice (they ran on, holding their slots), and
    their batch jobs could not be fetched or cancelled (a review found it)."""
    from router.choices import Choices

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        dispatcher.hold = True
        await router.start()
        try:
            rid = "x" * 127
            choices = await Choices.start(router, _request(tenant="alice", request_id=rid), 2)
            await async_wait_until(lambda: len(dispatcher.held) == 2, message="two requests reaching a worker")
            await choices.abort()  # what the frontends do when the client goes away
            assert len(dispatcher.aborted) == 2 and not dispatcher.held
            await async_wait_until(lambda: not router.requests, message="both choices ended in the router")
            jobs = await Choices.start(router, _request(tenant="alice", request_id=rid, lane="batch"), 2)
            await async_wait_until(lambda: len(dispatcher.held) == 2, message="two requests reaching a worker")
            assert (await router.batch_result(rid + "-1", "alice"))["status"] == "running"
            assert await router.abort(rid + "-1", "alice")
            await jobs.abort()
        finally:
            release(dispatcher)
            await router.stop()

    asyncio.run(main())


def test_a_requests_spec_carries_its_lanes_priority_and_preemptibility(redis_server, cluster) -> None:
    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, TENANTS)
        await router.start()
        try:
            await (await router.generate(_request(tenant="alice", request_id="i", lane="interactive"))).result()
            await (await router.generate(_request(tenant="alice", request_id="l", lane="long_context"))).result()
            specs = {s.request_id.split("~")[0]: s for s in dispatcher.specs.values()}
            lanes = {lane.name: lane for lane in router.policy.lanes}
            for rid, lane in (("i", "interactive"), ("l", "long_context")):
                assert specs[rid].priority == lanes[lane].priority
                assert specs[rid].preemptible == lanes[lane].preemptible
        finally:
            await router.stop()

    asyncio.run(main())
