"""The durable batch lane's consumer (router/durable_batch.py) over a real Redis: a router that
stops leaves its jobs pending, not failed, and another replica finishes them; a job that really
fails is recorded as failed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerationResult, RouterError, Usage
from router.durable_batch import DurableBatch, job_payload
from router.state import RedisState
from router.state.journal import BatchJournal


class FakeRouter:
    """What the consumer needs of a router; ``behaviour`` decides how each job's run ends."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.draining = False
        self.started: list[str] = []

    def lane_room(self, durable: bool = True) -> int:
        return 8

    async def run_durable(self, job_id, tenant, lane, ids, sampling, prompt_text) -> GenerationResult:
        self.started.append(job_id)
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        if self.behaviour == "fail":
            raise RouterError(ErrorKind.INTERNAL, "the worker rejected it")
        return GenerationResult(job_id, "ok", (1, 2), "length", Usage(3, 2, 0), lane)


async def _submit(journal: BatchJournal, n: int) -> list[str]:
    return [await journal.submit(job_payload(f"job-{i}", "t", "batch", [1, 2, 3], SamplingParams(max_tokens=2), None),
                                 job_id=f"job-{i}") for i in range(n)]


async def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


def test_a_stopping_router_leaves_its_jobs_to_another_replica(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        ids = await _submit(journal, 3)
        stuck = FakeRouter("hang")
        a = DurableBatch(stuck, journal, "router-a", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(a.run())
        await _until(lambda: len(a._running) == 3)
        await a.stop()  # what Router.stop / Router.drain do before the dispatcher fails the streams
        consumer.cancel()
        for job_id in ids:
            status = await journal.get(job_id, "t")
            assert status is not None and status.status == "running", status  # not failed, not done
        assert await journal.pending_count() == 3

        b = DurableBatch(FakeRouter("finish"), BatchJournal(st), "router-b", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(b.run())
        await _until(lambda: b.jobs_completed == 3)
        consumer.cancel()
        for job_id in ids:
            status = await journal.get(job_id, "t")
            assert status is not None and status.status == "done" and status.result["text"] == "ok"
        assert await journal.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_a_stopped_consumer_claims_nothing_more(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        router = FakeRouter("finish")
        batch = DurableBatch(router, journal, "router-a", idle_ms=200, poll_s=0.01)
        await batch.stop()
        consumer = asyncio.create_task(batch.run())
        await _submit(journal, 2)
        await asyncio.sleep(0.3)
        consumer.cancel()
        assert router.started == [] and await journal.pending_count() == 2
        await st.close()

    asyncio.run(main())


def test_a_job_that_fails_while_the_router_runs_is_recorded_failed(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        journal = BatchJournal(st)
        [job_id] = await _submit(journal, 1)
        batch = DurableBatch(FakeRouter("fail"), journal, "router-a", idle_ms=200, poll_s=0.01)
        consumer = asyncio.create_task(batch.run())

        async def failed() -> bool:
            s = await journal.get(job_id, "t")
            return s is not None and s.status == "failed"

        for _ in range(250):
            if await failed():
                break
            await asyncio.sleep(0.02)
        consumer.cancel()
        status = await journal.get(job_id, "t")
        assert status.status == "failed" and "rejected" in status.error and await journal.pending_count() == 0
        await st.close()

    asyncio.run(main())


def test_a_reused_request_id_with_another_prompt_is_a_409_not_the_earlier_answer(
        make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        batch = DurableBatch(FakeRouter("finish"), BatchJournal(st), "router-a", idle_ms=200, poll_s=0.01)
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
