"""The router's side of the durable batch lane (router/router.py over router/durable_batch.py), a
real ``Router`` and Redis with a dispatcher that answers in process: the client's abort cancels its
job and nobody else's, an Idempotency-Key on a journaled request replays its result, and a
restarted replica's dispatcher is a new origin for the workers."""

from __future__ import annotations

import asyncio

import pytest

from engine.sampling_params import SamplingParams
from router.api import GenerateRequest
from router.dispatcher import Dispatcher
from router.lanes import TenantConfig
from router.prompt_input import request_fingerprint
from router.request_ids import scoped_request_id
from router.router import Router
from router.worker_pool import WorkerPool
from tests.router.state.inprocess_router import make_router
from tests.router.state.journal_watch import count_claims
from tests.waiting import async_wait_until


def _batch_request(**kw) -> GenerateRequest:
    return GenerateRequest(SamplingParams(max_tokens=4), prompt_token_ids=(1, 2, 3), lane="batch", **kw)


async def _until_cancelled(router: Router, job_id: str, tenant: str, or_unknown: bool = False) -> None:
    async def cancelled() -> bool:
        status = await router.state.journal.get(job_id, tenant)
        return (status is None and or_unknown) or (status is not None and status.status == "cancelled")

    await async_wait_until(cancelled, message=f"job {job_id} cancelled")


def test_the_clients_abort_cancels_its_own_batch_job_only(redis_server, cluster) -> None:
    async def main() -> None:
        router, dispatcher = make_router(
            redis_server.url, cluster, (TenantConfig("alice", api_key="ka"), TenantConfig("bob", api_key="kb"))
        )
        dispatcher.hold = True
        await router.start()
        try:
            stream = await router.generate(_batch_request(tenant="alice", request_id="job-a"))
            await async_wait_until(lambda: dispatcher.held, message="the job reaching a worker")
            assert not await router.abort("job-a", "bob")  # (it raised AttributeError: a 500)
            assert not await router.abort("no-such-job", "alice")
            assert await router.abort("job-a", "alice")
            result = await asyncio.wait_for(stream.result(), 10)
            job = scoped_request_id("alice", "job-a")  # the id it runs under (router/request_ids.py)
            assert result.finish_reason == "abort" and dispatcher.aborted == [job] and result.request_id == "job-a"
            await _until_cancelled(router, job, "alice")
            assert await router.state.journal.pending_count() == 0
        finally:
            await router.stop()

    asyncio.run(main())


def test_an_idempotency_key_on_a_batch_request_replays_its_result(redis_server, cluster) -> None:
    """The key was claimed and never completed: a retry waited 600 s, then got a 409."""

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, (TenantConfig("default"),))
        await router.start()
        try:
            req = _batch_request(idempotency_key="K1")
            first = await (await router.generate(req)).result()
            assert first.finish_reason == "length"
            fingerprint = request_fingerprint(req, [1, 2, 3])
            replay = await router.state.idempotency_begin("default", "K1", fingerprint, wait_s=5.0)
            assert replay is not None and replay.token_ids == first.token_ids
            again = await (await router.generate(req)).result()
            assert again.token_ids == first.token_ids and len(dispatcher.submitted) == 1
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_restarted_replica_is_a_new_origin_for_the_workers() -> None:
    """Same replica id, another start: workers must not take its requests for the old start's
    (they refused them as duplicate ids while the old copies ran)."""
    pool = WorkerPool([], [])
    first, second = Dispatcher(pool, router_id="router-0"), Dispatcher(pool, router_id="router-0")
    assert first.router_id == second.router_id == "router-0"
    assert first.origin != second.origin and first.origin.startswith("router-0")


def test_a_refused_request_of_n_batch_choices_cancels_the_jobs_already_journaled(
    redis_server, cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its second choice refused (its id in flight), the request was refused and its charge given
    back, but its first choice, already journaled, ran to its end unbilled (an audit found it):
    refusing a request detached its batch jobs, as a client going away does, instead of cancelling them."""
    from router.api import RouterError
    from router.choices import Choices

    async def main() -> None:
        router, dispatcher = make_router(redis_server.url, cluster, (TenantConfig("alice", api_key="ka"),))
        dispatcher.hold = True
        await router.start()
        try:
            await router.generate(_batch_request(tenant="alice", request_id="z-1"))  # holds choice 1's id
            await async_wait_until(lambda: dispatcher.held, message="choice 1's job reaching a worker")
            try:
                await Choices.start(router, _batch_request(tenant="alice", request_id="z"), 2)
                raise AssertionError("admitted")
            except RouterError:
                pass
            await _until_cancelled(router, scoped_request_id("alice", "z-0"), "alice", or_unknown=True)
            claims = count_claims(router.batch.journal, monkeypatch)
            await async_wait_until(lambda: len(claims) >= 3, message="three polls of the journal")
            assert scoped_request_id("alice", "z-0") not in dispatcher.submitted  # no poll ran it
        finally:
            for rid in list(dispatcher.held):
                dispatcher.abort(rid)
            await router.stop()

    asyncio.run(main())
