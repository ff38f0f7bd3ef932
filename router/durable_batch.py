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
the process dies with no chance to say anything. So does a run that ends in an abort nobody asked
for (a decode worker handed the job to another replica that re-claimed it, or dropped this one as
stalled), or whose start or end Redis did not record: only the client's cancel
(``POST /v1/abort/{id}``, recorded in the journal and noticed by whichever replica runs the job)
ends a job early. A job submitted with an ``Idempotency-Key`` stores its result under that key
where it finishes (or releases the key where it fails), so a retry replays it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any, Protocol

from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from router.api import ErrorKind, GenerationResult, RouterError, StreamEvent, Usage
from router.request_ids import shown_request_id
from router.state.connection import StateUnavailable
from router.state.journal import BatchJournal, ClaimedJob, JobIdConflict
from router.task_stop import stop_tasks

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    """What the consumer needs of the router it runs jobs on."""

    @property
    def draining(self) -> bool: ...

    def lane_room(self, durable: bool = True) -> int:
        """How many more requests the durable lanes' queues take."""

    async def run_durable(
        self, job_id: str, tenant: str, lane: str, ids: list[int], sampling: SamplingParams, prompt_text: str | None
    ) -> GenerationResult:
        """Run the job through the lane queues to its end."""

    async def stop_durable(self, job_id: str) -> None:
        """End this replica's run of the job (its client cancelled it)."""


class ResultKeys(Protocol):
    """Where a job with an Idempotency-Key leaves its answer (``ClusterState``)."""

    async def idempotency_store(self, tenant: str, key: str, result: GenerationResult) -> None: ...

    async def idempotency_release(self, tenant: str, key: str) -> None: ...


class JobWaitStream:
    """What the submitting client gets: the job's whole result as one event when it is done."""

    def __init__(self, job_id: str, lane: str, tenant: str, batch: DurableBatch) -> None:
        self.job_id = job_id  # tenant-scoped (router.request_ids)
        self.request_id = shown_request_id(job_id)
        self.lane = lane
        self.tenant = tenant
        self._batch = batch

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        r = await self.result()
        yield StreamEvent(
            r.request_id,
            r.text,
            r.token_ids,
            finished=True,
            finish_reason=r.finish_reason,
            usage=r.usage,
            logprobs=r.logprobs,
            prompt_logprobs=r.prompt_logprobs,
        )

    async def result(self) -> GenerationResult:
        return await self._batch.wait(self.job_id, self.tenant, self.lane)

    async def abort(self) -> None:
        """The client went away: the job goes on (durable), nobody here waits for it any more."""
        self._batch.detach(self.job_id)

    async def cancel(self) -> None:
        """The request was refused after all (another of its choices was): the job must not run."""
        await self._batch.cancel(self.job_id, self.tenant)
        self._batch.detach(self.job_id)


class DurableBatch:
    def __init__(
        self,
        runner: JobRunner,
        keys: ResultKeys,
        journal: BatchJournal,
        consumer: str,
        *,
        idle_ms: int = 15_000,
        poll_s: float = 0.1,
        result_ttl_s: float = 86_400.0,
        lost_after_polls: int = 3,
    ) -> None:
        self.runner = runner
        self.keys = keys
        self.journal = journal
        self.consumer = consumer
        self.idle_ms = idle_ms
        self.poll_s = poll_s
        self.result_ttl_s = result_ttl_s
        self.lost_after_polls = lost_after_polls  # a waited-for job Redis no longer knows, polls in a row
        # job id -> result, for clients waiting on this replica
        self._done: dict[str, asyncio.Future[GenerationResult]] = {}
        self._running: dict[str, ClaimedJob] = {}  # the jobs this replica runs, by id
        self._cancelled: set[str] = set()  # of those, the ones their client cancelled
        self._tasks: set[asyncio.Task[object]] = set()  # the jobs this replica is running
        self._stopping = False
        self._record_retry_s = 1.0
        self.jobs_completed = 0

    async def submit(self, job: dict[str, Any], lane: str) -> JobWaitStream:
        job_id = job["request_id"]
        created = job_id not in self._done
        self._done.setdefault(job_id, asyncio.get_running_loop().create_future())
        try:
            await self.journal.submit(job, job_id=job_id)
        except JobIdConflict:
            if created:
                self._done.pop(job_id, None)
            raise RouterError(
                ErrorKind.CONFLICT,
                f"request id {shown_request_id(job_id)!r} already names another batch request; choose another one",
                param="request_id",
            ) from None
        except BaseException:
            if created:
                self._done.pop(job_id, None)
            raise
        return JobWaitStream(job_id, lane, job["tenant"], self)

    def holds(self, job_id: str) -> bool:
        """Whether ``job_id`` names a job submitted through this replica and not yet answered, or one
        it is running: no other request may take that id meanwhile."""
        return job_id in self._done or job_id in self._running

    def detach(self, job_id: str) -> None:
        """No client here waits for ``job_id`` any more (the job itself goes on)."""
        fut = self._done.pop(job_id, None)
        if fut is not None and not fut.done():
            fut.cancel()

    async def wait(self, job_id: str, tenant: str, lane: str = "") -> GenerationResult:
        fut = self._done.get(job_id)
        shown = shown_request_id(job_id)  # in what the client reads
        unknown = 0  # polls in a row that found no such job in a reachable Redis
        try:
            while True:
                if fut is not None:
                    try:
                        return await asyncio.wait_for(asyncio.shield(fut), timeout=1.0)
                    except TimeoutError:
                        pass
                try:
                    status = await self.journal.get(job_id, tenant)
                except StateUnavailable:
                    status, unknown = None, 0  # Redis is away: the job is not lost, wait for it
                else:
                    unknown = 0 if status is not None or job_id in self._running else unknown + 1
                if status is not None and status.status == "done" and status.result:
                    return GenerationResult.from_dict(status.result)
                if status is not None and status.status == "failed":
                    raise RouterError(ErrorKind.INTERNAL, f"batch job {shown} failed: {status.error}")
                if status is not None and status.status == "cancelled":
                    return (
                        GenerationResult.from_dict(status.result)
                        if status.result
                        else GenerationResult(shown, "", (), FinishReason.ABORT, Usage(0, 0, 0), lane)
                    )
                if unknown >= self.lost_after_polls:  # e.g. Redis restarted without persistence
                    raise RouterError(
                        ErrorKind.OVERLOADED,
                        f"batch job {shown} is gone from the journal (Redis lost its data); submit it again",
                        retry_after_s=1.0,
                    )
                if fut is None:
                    await asyncio.sleep(0.5)
        finally:
            self._done.pop(job_id, None)

    async def cancel(self, job_id: str, tenant: str) -> bool:
        """The client's abort of its job ``job_id``, wherever the job is: queued in the journal, or
        running here or on another replica (which notices within ``idle_ms / 3``). False if the job
        is unknown to ``tenant`` or already ended."""
        mine = self._running.get(job_id)
        try:
            had = await self.journal.cancel(job_id, tenant, ttl_s=self.result_ttl_s)
        except StateUnavailable:  # Redis is away: only a job running here can be stopped
            had = "running" if mine is not None and mine.tenant == tenant else None
        if had not in ("queued", "running"):
            return False
        if mine is not None:
            self._cancelled.add(job_id)
            await self.runner.stop_durable(job_id)
        return True

    # -- the consumer ------------------------------------------------------------------------------
    async def run(self) -> None:
        last_touch = time.monotonic()
        # Ends on stop() as well as on cancel: a cancellation can be lost inside a Redis call on the
        # way out (seen once Redis had gone away and come back: the task stayed "cancelling" at its
        # poll sleep, looping), and the router's shutdown then waited for it forever.
        while not self._stopping:
            try:
                room = self.runner.lane_room(durable=True)
                if room > 0 and not self._stopping and not self.runner.draining:
                    for job in await self.journal.claim(self.consumer, count=min(room, 16), min_idle_ms=self.idle_ms):
                        task = asyncio.create_task(self._run_job(job))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                if self._running and time.monotonic() - last_touch > self.idle_ms / 3000:
                    await self.journal.touch(self.consumer, [c.entry_id for c in self._running.values()])
                    last_touch = time.monotonic()
                    await self._stop_cancelled()
            except StateUnavailable:
                await asyncio.sleep(1.0)  # the batch lane pauses while Redis is away
            except Exception:
                log.exception("durable batch consumer")
            await asyncio.sleep(self.poll_s)

    async def _stop_cancelled(self) -> None:
        """Stop the jobs running here that their clients cancelled through another replica."""
        for job_id, status in (await self.journal.statuses(list(self._running))).items():
            if status == "cancelled" and job_id not in self._cancelled and job_id in self._running:
                self._cancelled.add(job_id)
                await self.runner.stop_durable(job_id)

    async def stop(self) -> None:
        """Stop claiming and drop the jobs in flight here, leaving them pending in the journal (not
        failed, not acknowledged) for the next claim by any replica. Call before the router's
        requests are aborted or its dispatcher fails their streams: those endings are this
        replica's, not the jobs'."""
        self._stopping = True
        await stop_tasks(self._tasks, "durable batch jobs (they stay pending in the journal)")

    async def _run_job(self, claimed: ClaimedJob) -> None:
        job, job_id, entry = claimed.job, claimed.job_id, claimed.entry_id
        self._running[job_id] = claimed
        try:
            if not await self.journal.set_running(job_id, self.consumer):
                self.journal.forget(entry)  # cancelled before it started: its entry is gone already
                return
            sp = SamplingParams(**job["sampling"])
            result = await self.runner.run_durable(
                job_id, claimed.tenant, job["lane"], job["prompt_token_ids"], sp, job.get("prompt_text")
            )
        except StateUnavailable as e:  # its start went unrecorded: left pending, re-run once Redis is back
            log.warning("batch job %s left to the next claim: %s", job_id, e)
            self.journal.forget(entry)
            return
        except Exception as e:  # noqa: BLE001 - any failure of the job is its result (journaled)
            if self._stopping:  # the router is going away under the job, which stays pending
                log.info("batch job %s left to the next claim: %s", job_id, e)
                self.journal.forget(entry)
                return
            error = str(e)
            log.warning("batch job %s failed: %s", job_id, error)
            failed = f"batch job {shown_request_id(job_id)} failed: {error}"
            self._answer(job_id, RouterError(ErrorKind.INTERNAL, failed))
            if await self._record(entry, lambda: self.journal.fail(job_id, entry, error, ttl_s=self.result_ttl_s)):
                await self._release_idempotency(claimed)
            return
        finally:
            self._running.pop(job_id, None)
            cancelled = job_id in self._cancelled
            self._cancelled.discard(job_id)
        aborted = result.finish_reason == FinishReason.ABORT
        if aborted and cancelled:
            self._answer(job_id, result)
            if await self._record(
                entry, lambda: self.journal.finish_cancelled(job_id, entry, result.to_dict(), ttl_s=self.result_ttl_s)
            ):
                await self._release_idempotency(claimed)
            return
        if aborted:
            # Not the client's: this router stopping, or a worker that gave the job to a replica that
            # re-claimed it (or dropped this copy as stalled). The job stays pending for that claim.
            log.info("batch job %s: this run was aborted under it; left to the next claim", job_id)
            self.journal.forget(entry)
            return
        self._answer(job_id, result)
        if await self._record(
            entry, lambda: self.journal.complete(job_id, entry, result.to_dict(), ttl_s=self.result_ttl_s)
        ):
            self.jobs_completed += 1
            key = job.get("idempotency_key")
            if key:
                await self.keys.idempotency_store(claimed.tenant, key, result)

    def _answer(self, job_id: str, outcome: GenerationResult | BaseException) -> None:
        fut = self._done.get(job_id)
        if fut is not None and not fut.done():
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    async def _record(self, entry_id: str, write: Callable[[], Awaitable[object]]) -> bool:
        """Write a job's end to the journal, retrying while Redis is away; if this router stops
        first, the entry stays pending and the job runs again elsewhere (at least once)."""
        while True:
            try:
                await write()
                return True
            except StateUnavailable:
                if self._stopping:
                    self.journal.forget(entry_id)
                    return False
                log.warning("Redis unavailable while recording a batch job's end; retrying")
                await asyncio.sleep(self._record_retry_s)

    async def _release_idempotency(self, claimed: ClaimedJob) -> None:
        key = claimed.job.get("idempotency_key")
        if key:
            await self.keys.idempotency_release(claimed.tenant, key)


def job_payload(
    request_id: str,
    tenant: str,
    lane: str,
    ids: list[int],
    sampling: SamplingParams,
    prompt_text: str | None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    job = {
        "request_id": request_id,
        "tenant": tenant,
        "lane": lane,
        "prompt_token_ids": list(ids),
        "sampling": asdict(sampling),
        "prompt_text": prompt_text,
    }
    if idempotency_key:  # (absent otherwise: the same job's fingerprint as before keys existed)
        job["idempotency_key"] = idempotency_key
    return job
