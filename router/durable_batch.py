"""The durable batch lane: admitted requests of a ``durable`` lane are journaled in Redis (a Stream
with a consumer group) before anything runs, so they survive a router restart and complete; their
results are kept in Redis and fetched by id (``GET /v1/batches/{id}``; the id is the request id,
which a client may choose with ``X-Request-Id``).

Every router replica is a consumer: it claims journaled jobs (new ones, and ones left pending by a
router that died, once they have been idle for ``idle_ms``), runs them through its lane queues like
any request, and acknowledges them with the result. The client that submitted a job waits for its
result (locally, or by polling the journal if another replica runs it); the job does not depend on
that client: a disconnect does not cancel it (``POST /v1/abort/{id}`` does).

A router that stops (drained, shut down, or killed) does not fail or finish the jobs it holds:
``stop`` cancels them where they are, unacknowledged, and whichever replica claims next (this one
restarted, or another) re-runs them once they have been idle for ``idle_ms`` -- the same as when
the process dies with no chance to say anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, AsyncIterator

from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerationResult, RouterError, StreamEvent
from router.state.connection import StateUnavailable
from router.state.journal import BatchJournal, ClaimedJob, JobIdConflict
from router.task_stop import stop_tasks

if TYPE_CHECKING:
    from router.router import Router

log = logging.getLogger(__name__)


class JobWaitStream:
    """What the submitting client gets: the job's whole result as one event when it is done."""

    def __init__(self, job_id: str, lane: str, tenant: str, batch: DurableBatch) -> None:
        self.request_id = job_id
        self.lane = lane
        self.tenant = tenant
        self._batch = batch

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        r = await self.result()
        yield StreamEvent(r.request_id, r.text, r.token_ids, finished=True, finish_reason=r.finish_reason,
                          usage=r.usage, logprobs=r.logprobs, prompt_logprobs=r.prompt_logprobs)

    async def result(self) -> GenerationResult:
        return await self._batch.wait(self.request_id, self.tenant)

    async def abort(self) -> None:
        return None  # durable: the client going away does not cancel the job


class DurableBatch:
    def __init__(self, router: Router, journal: BatchJournal, consumer: str, *, idle_ms: int = 15_000,
                 poll_s: float = 0.1, result_ttl_s: float = 86_400.0) -> None:
        self.router = router
        self.journal = journal
        self.consumer = consumer
        self.idle_ms = idle_ms
        self.poll_s = poll_s
        self.result_ttl_s = result_ttl_s
        self._done: dict[str, asyncio.Future] = {}  # job id -> result, for clients waiting on this replica
        self._running: dict[str, str] = {}  # job id -> stream entry id
        self._tasks: set[asyncio.Task] = set()  # the jobs this replica is running
        self._stopping = False
        self.jobs_completed = 0

    async def submit(self, job: dict, lane: str) -> JobWaitStream:
        job_id = job["request_id"]
        created = job_id not in self._done
        self._done.setdefault(job_id, asyncio.get_running_loop().create_future())
        try:
            await self.journal.submit(job, job_id=job_id)
        except JobIdConflict:
            if created:
                self._done.pop(job_id, None)
            raise RouterError(ErrorKind.CONFLICT, f"request id {job_id!r} already names another batch request; "
                                                  "choose another one", param="request_id") from None
        except BaseException:
            if created:
                self._done.pop(job_id, None)
            raise
        return JobWaitStream(job_id, lane, job["tenant"], self)

    def is_running(self, job_id: str) -> bool:
        return job_id in self._running

    def holds(self, job_id: str) -> bool:
        """Whether ``job_id`` names a job submitted through this replica and not yet answered, or one
        it is running: no other request may take that id meanwhile."""
        return job_id in self._done or job_id in self._running

    async def wait(self, job_id: str, tenant: str) -> GenerationResult:
        fut = self._done.get(job_id)
        try:
            while True:
                if fut is not None:
                    try:
                        return await asyncio.wait_for(asyncio.shield(fut), timeout=1.0)
                    except asyncio.TimeoutError:
                        pass
                status = await self._status(job_id, tenant)
                if status is not None and status.status == "done" and status.result:
                    return GenerationResult.from_dict(status.result)
                if status is not None and status.status == "failed":
                    raise RouterError(ErrorKind.INTERNAL, f"batch job {job_id} failed: {status.error}")
                if fut is None:
                    await asyncio.sleep(0.5)
        finally:
            self._done.pop(job_id, None)

    async def _status(self, job_id: str, tenant: str):
        try:
            return await self.journal.get(job_id, tenant)
        except StateUnavailable:
            return None

    # -- the consumer ------------------------------------------------------------------------------
    async def run(self) -> None:
        last_touch = time.monotonic()
        # Ends on stop() as well as on cancel: a cancellation can be lost inside a Redis call on the
        # way out (seen once Redis had gone away and come back: the task stayed "cancelling" at its
        # poll sleep, looping), and the router's shutdown then waited for it forever.
        while not self._stopping:
            try:
                room = self.router.lane_room(durable=True)
                if room > 0 and not self._stopping and not self.router.draining:
                    for job in await self.journal.claim(self.consumer, count=min(room, 16), min_idle_ms=self.idle_ms):
                        task = asyncio.create_task(self._run_job(job))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                if self._running and time.monotonic() - last_touch > self.idle_ms / 3000:
                    await self.journal.touch(self.consumer, list(self._running.values()))
                    last_touch = time.monotonic()
            except StateUnavailable:
                await asyncio.sleep(1.0)  # the batch lane pauses while Redis is away
            except Exception:
                log.exception("durable batch consumer")
            await asyncio.sleep(self.poll_s)

    async def stop(self) -> None:
        """Stop claiming and drop the jobs in flight here, leaving them pending in the journal (not
        failed, not acknowledged) for the next claim by any replica. Call before the router's
        requests are aborted or its dispatcher fails their streams: those endings are this
        replica's, not the jobs'."""
        self._stopping = True
        await stop_tasks(self._tasks, "durable batch jobs (they stay pending in the journal)")

    async def _run_job(self, claimed: ClaimedJob) -> None:
        job = claimed.job
        job_id = claimed.job_id
        self._running[job_id] = claimed.entry_id
        try:
            await self.journal.set_running(job_id, self.consumer)
            sp = SamplingParams(**job["sampling"])
            result = await self.router.run_durable(job_id, claimed.tenant, job["lane"], job["prompt_token_ids"], sp,
                                                   job.get("prompt_text"))
        except Exception as e:
            if self._stopping:  # the router is going away under the job, which stays pending
                log.info("batch job %s left to the next claim: %s", job_id, e)
                return
            log.warning("batch job %s failed: %s", job_id, e)
            await self._safe(self.journal.fail(job_id, claimed.entry_id, str(e), ttl_s=self.result_ttl_s))
            fut = self._done.get(job_id)
            if fut is not None and not fut.done():
                fut.set_exception(RouterError(ErrorKind.INTERNAL, f"batch job {job_id} failed: {e}"))
            return
        finally:
            self._running.pop(job_id, None)
        if self._stopping and result.finish_reason == "abort":
            return  # aborted because this router stopped, not by the client: left to the next claim
        await self._safe(self.journal.complete(job_id, claimed.entry_id, result.to_dict(), ttl_s=self.result_ttl_s))
        self.jobs_completed += 1
        fut = self._done.get(job_id)
        if fut is not None and not fut.done():
            fut.set_result(result)

    @staticmethod
    async def _safe(coro) -> None:
        try:
            await coro
        except StateUnavailable:
            log.warning("Redis unavailable while recording a batch job; it will be re-run after it returns")


def job_payload(request_id: str, tenant: str, lane: str, ids: list[int], sampling: SamplingParams,
                prompt_text: str | None) -> dict:
    return {"request_id": request_id, "tenant": tenant, "lane": lane, "prompt_token_ids": list(ids),
            "sampling": asdict(sampling), "prompt_text": prompt_text}
