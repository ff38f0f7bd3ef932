"""The durable batch lane's consumer (router/durable_batch.py) over a real Redis: a router that
stops leaves its jobs pending, not failed, and another replica finishes them; a job that really
fails is recorded as failed; a run aborted by nobody's request, or whose start or end Redis missed,
is run or recorded again, never lost; a client's cancel ends the job wherever it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerationResult, RouterError, Usage
from router.durable_batch import DurableBatch, job_payload
from router.state import RedisState
from router.state.connection import StateUnavailable
from router.state.journal import BatchJournal
from tests.router.state.journal_watch import count_claims
from tests.waiting import async_wait_until


class FakeState:
    """What the consumer calls of ``ClusterState`` (``durable_batch.ResultKeys``)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], GenerationResult] = {}
        self.released: list[tuple[str, str]] = []

    async def idempotency_store(self, tenant: str, key: str, result: GenerationResult) -> None:
        self.stored[(tenant, key)] = result

    async def idempotency_release(self, tenant: str, key: str) -> None:
        self.released.append((tenant, key))


class FakeRouter:
    """What the consumer needs of a router; ``behaviours`` decide how each job's runs end, in turn
    (the last one repeats): ``finish``, ``fail``, ``hang`` (until ``stop_durable``), ``abort``."""

    def __init__(self, *behaviours: str, by_id: dict[str, str] | None = None) -> None:
        self.behaviours = list(behaviours)
        self.by_id = by_id or {}  # job id -> its behaviour, whatever the order the jobs start in
        self.draining = False
        self.started: list[str] = []
        self.state = FakeState()
        self._stops: dict[str, asyncio.Event] = {}

    def lane_room(self, durable: bool = True) -> int:
        return 8

    async def run_durable(self, job_id, tenant, lane, ids, sampling, prompt_text) -> GenerationResult:
        self.started.append(job_id)
        behaviour = self.by_id.get(job_id) or (
            self.behaviours.pop(0) if len(self.behaviours) > 1 else self.behaviours[0]
        )
        if behaviour == "hang":
            stop = self._stops[job_id] = asyncio.Event()
            await stop.wait()
            return GenerationResult(job_id, "o", (1,), "abort", Usage(3, 1, 0), lane)
        if behaviour == "fail":
            raise RouterError(ErrorKind.INTERNAL, "the worker rejected it")
        if behaviour == "abort":  # a decode worker handed the id to another replica's copy
            return GenerationResult(job_id, "", (), "abort", Usage(3, 0, 0), lane)
        return GenerationResult(job_id, "ok", (1, 2), "length", Usage(3, 2, 0), lane)

    async def stop_durable(self, job_id: str) -> None:
        self._stops[job_id].set()


async def _submit(journal: BatchJournal, n: int) -> list[str]:
    return [
        await journal.submit(
            job_payload(f"job-{i}", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), None), job_id=f"job-{i}"
        )
        for i in range(n)
    ]


async def _stop(batch: DurableBatch, consumer: asyncio.Task) -> None:
    """As the router stops it: stop() first (a cancel alone can be lost inside a Redis call)."""
    await batch.stop()
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)


async def _status_becomes(journal: BatchJournal, job_id: str, status: str) -> None:
    async def reached() -> bool:
        s = await journal.get(job_id, "t")
        return s is not None and s.status == status

    await async_wait_until(reached, message=f"job {job_id} {status}")


def test_a_stopping_router_leaves_its_jobs_to_another_replica(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        ids = await _submit(journal, 3)
        stuck = FakeRouter("hang")
        a = DurableBatch(stuck, stuck.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(a.run())
        await async_wait_until(lambda: len(stuck.started) == 3)  # each marked running, then started
        await a.stop()  # what Router.stop / Router.drain do before the dispatcher fails the streams
        consumer.cancel()
        for job_id in ids:
            status = await journal.get(job_id, "t")
            assert status is not None and status.status == "running", status  # not failed, not done
        assert await journal.pending_count() == 3

        b = DurableBatch(FakeRouter("finish"), FakeState(), BatchJournal(st), "router-b", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(b.run())
        await async_wait_until(lambda: b.jobs_completed == 3)
        consumer.cancel()
        for job_id in ids:
            status = await journal.get(job_id, "t")
            assert status is not None and status.status == "done"
            assert status.result is not None and status.result["text"] == "ok"
        assert await journal.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_a_stopped_consumer_claims_nothing_more(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        router = FakeRouter("finish")
        batch = DurableBatch(router, router.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        await batch.stop()
        consumer = asyncio.create_task(batch.run())
        await _submit(journal, 2)
        await asyncio.wait_for(consumer, 10)  # it ended by itself: nothing can be claimed any more
        assert router.started == [] and await journal.pending_count() == 2
        await st.close()

    asyncio.run(main())


def test_a_job_that_fails_while_the_router_runs_is_recorded_failed(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        [job_id] = await _submit(journal, 1)
        batch = DurableBatch(FakeRouter("fail"), FakeState(), journal, "router-a", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(batch.run())
        await _status_becomes(journal, job_id, "failed")
        consumer.cancel()
        status = await journal.get(job_id, "t")
        assert (
            status is not None
            and status.status == "failed"
            and "rejected" in (status.error or "")
            and await journal.pending_count() == 0
        )
        await st.close()

    asyncio.run(main())


def test_a_reused_request_id_with_another_prompt_is_a_409_not_the_earlier_answer(
    make_state: Callable[..., RedisState],
) -> None:
    async def main() -> None:
        st = make_state()
        batch = DurableBatch(FakeRouter("finish"), FakeState(), BatchJournal(st), "router-a", idle_ms=200, poll_s=0.01)
        first = job_payload("bj-1", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), "first prompt")
        await batch.submit(first, "batch")
        await batch.submit(dict(first), "batch")  # the same request again (a retry): the same job
        other = job_payload("bj-1", "t", "batch", [4, 5, 6, 7], SamplingParams(max_tokens=2), "another prompt")
        try:
            await batch.submit(other, "batch")
            raise AssertionError("a different request under the same id was accepted")
        except RouterError as e:
            assert e.kind is ErrorKind.CONFLICT and e.param == "request_id"
        assert "bj-1" in batch._done  # the first request's waiters are untouched
        await st.close()

    asyncio.run(main())


def test_a_run_aborted_by_nobody_is_left_for_the_next_claim(make_state: Callable[..., RedisState]) -> None:
    """An abort the client did not ask for (a worker gave the id to a replica that re-claimed the
    job) is not the job's result: the entry stays pending and the job runs again."""

    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        [job_id] = await _submit(journal, 1)
        router = FakeRouter("abort", "finish")
        batch = DurableBatch(router, router.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(batch.run())
        await _status_becomes(journal, job_id, "done")
        await _stop(batch, consumer)
        status = await journal.get(job_id, "t")
        assert status is not None and status.result is not None
        assert status.result["finish_reason"] == "length" and router.started == [job_id, job_id]
        assert await journal.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_a_client_cancel_stops_the_job_on_the_replica_running_it(make_state: Callable[..., RedisState]) -> None:
    """The cancel arrives at replica B; replica A runs the job, notices within idle_ms / 3, stops
    it and records it cancelled with what it had produced; B's waiting client gets the abort."""

    async def main() -> None:
        st = make_state()
        journal_a, journal_b = BatchJournal(st), BatchJournal(st)
        runner_a = FakeRouter("hang")
        a = DurableBatch(runner_a, FakeState(), journal_a, "router-a", idle_ms=300, poll_s=0.01)
        b = DurableBatch(FakeRouter("finish"), FakeState(), journal_b, "router-b", idle_ms=300, poll_s=0.01)
        waiting = await b.submit(
            job_payload("c-1", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), None), "batch"
        )
        consumer = asyncio.create_task(a.run())
        await async_wait_until(lambda: "c-1" in a._running)
        assert not await b.cancel("c-1", "someone-else")  # another tenant's abort: nothing of theirs
        assert await b.cancel("c-1", "t")
        result = await asyncio.wait_for(waiting.result(), 10)
        assert result.finish_reason == "abort" and result.token_ids == (1,)
        await _status_becomes(journal_a, "c-1", "cancelled")
        await _stop(a, consumer)
        assert await journal_a.pending_count() == 0 and runner_a.started == ["c-1"]
        assert not await b.cancel("c-1", "t")  # it ended: nothing to cancel any more
        await st.close()

    asyncio.run(main())


def test_a_job_cancelled_while_queued_never_runs(
    make_state: Callable[..., RedisState], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        [job_id] = await _submit(journal, 1)
        router = FakeRouter("finish")
        batch = DurableBatch(router, router.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        assert await batch.cancel(job_id, "t")
        claims = count_claims(journal, monkeypatch)
        consumer = asyncio.create_task(batch.run())
        await async_wait_until(lambda: len(claims) >= 3, message="three polls of the journal")
        await _stop(batch, consumer)
        assert sum(claims) == 0  # the cancelled job left the stream: no poll handed it out
        assert router.started == [] and (await journal.get(job_id, "t")).status == "cancelled"
        assert await journal.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_a_redis_blip_at_a_jobs_start_or_end_loses_nothing(
    make_state: Callable[..., RedisState], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis fails the ``running`` mark of one job and the first two attempts to record the other's
    result: the first is left pending and re-run (its waiting client is not failed), the second's
    result is recorded once Redis answers; both end done, nothing stays in the stream."""

    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        router = FakeRouter("finish")
        batch = DurableBatch(router, router.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        waiting = await batch.submit(
            job_payload("job-0", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), None), "batch"
        )
        real_running, real_complete = journal.set_running, journal.complete
        missed = {"running": 1, "complete": 2}

        async def set_running(job_id: str, consumer: str = "") -> bool:
            if job_id == "job-0" and missed["running"]:
                missed["running"] -= 1
                raise StateUnavailable("blip")
            return await real_running(job_id, consumer)

        async def complete(job_id: str, *args: Any, **kw: Any) -> Any:
            if job_id == "job-1" and missed["complete"]:
                missed["complete"] -= 1
                raise StateUnavailable("blip")
            return await real_complete(job_id, *args, **kw)

        monkeypatch.setattr(journal, "set_running", set_running)
        monkeypatch.setattr(journal, "complete", complete)
        await journal.submit(
            job_payload("job-1", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), None), job_id="job-1"
        )
        batch._record_retry_s = 0.05
        consumer = asyncio.create_task(batch.run())
        assert (await asyncio.wait_for(waiting.result(), 10)).finish_reason == "length"
        await _status_becomes(journal, "job-0", "done")
        await _status_becomes(journal, "job-1", "done")
        await _stop(batch, consumer)
        assert missed == {"running": 0, "complete": 0} and await journal.pending_count() == 0
        assert sorted(router.started) == ["job-0", "job-1"]  # job-0's first claim never started it
        await st.close()

    asyncio.run(main())


def test_a_waiter_whose_job_redis_lost_gets_an_error_not_a_hang(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        batch = DurableBatch(
            FakeRouter("finish"), FakeState(), journal, "router-a", idle_ms=200, poll_s=0.01, lost_after_polls=2
        )
        waiting = await batch.submit(
            job_payload("gone", "t", "batch", [1, 2], SamplingParams(max_tokens=2), None), "batch"
        )
        await st.run(lambda r: r.delete(journal._job_key("gone"), journal.stream))  # a restart without persistence
        try:
            await asyncio.wait_for(waiting.result(), 20)
            raise AssertionError("the waiter got a result for a job nobody has")
        except RouterError as e:
            assert e.kind is ErrorKind.OVERLOADED and "gone from the journal" in str(e)
        assert not batch.holds("gone")
        await st.close()

    asyncio.run(main())


def test_a_client_that_leaves_frees_its_request_id_here(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        batch = DurableBatch(FakeRouter("finish"), FakeState(), BatchJournal(st), "router-a", idle_ms=200, poll_s=0.01)
        waiting = await batch.submit(
            job_payload("left", "t", "batch", [1, 2], SamplingParams(max_tokens=2), None), "batch"
        )
        assert batch.holds("left")
        await waiting.abort()  # the client went away; the job itself stays journaled
        assert not batch.holds("left") and await batch.journal.pending_count() == 1
        await st.close()

    asyncio.run(main())


def test_an_idempotency_key_gets_the_jobs_result_or_is_released(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        router = FakeRouter("finish", by_id={"k-1": "fail"})
        batch = DurableBatch(router, router.state, journal, "router-a", idle_ms=200, poll_s=0.01)
        for i in range(2):
            await journal.submit(
                job_payload(
                    f"k-{i}", "t", "batch", [1, 2], SamplingParams(max_tokens=2), None, idempotency_key=f"key-{i}"
                ),
                job_id=f"k-{i}",
            )
        consumer = asyncio.create_task(batch.run())
        await _status_becomes(journal, "k-0", "done")
        await _status_becomes(journal, "k-1", "failed")
        await async_wait_until(lambda: router.state.released)
        await _stop(batch, consumer)
        assert router.state.stored[("t", "key-0")].text == "ok"
        assert router.state.released == [("t", "key-1")]
        await st.close()

    asyncio.run(main())
