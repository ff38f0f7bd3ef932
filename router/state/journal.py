"""The durable batch-lane journal: batch jobs queued in a Redis Stream, shared by all routers.

A job is submitted once (``XADD`` to ``baton:<c>:batch:stream``) and then handed to exactly one
router at a time through the consumer group ``routers``. A router that claims a job and dies
before acknowledging it leaves the entry pending; after ``min_idle_ms`` any router (including the
restarted one, under the same consumer name) re-claims it with ``XAUTOCLAIM``. Delivery is
therefore *at least once*: a job may run twice if its router was only slow, not dead — routers
running long jobs call :meth:`BatchJournal.touch` to keep their claims fresh, and a job
re-claimed more than ``max_attempts`` times is failed instead of crashing router after router.

Each job also has a status hash ``baton:<c>:batch:job:<id>`` (status, tenant, fingerprint, stream
entry, timestamps, attempts, result/error) that clients poll through :meth:`get`; it gets a TTL
once the job ends. Acknowledged entries are deleted from the stream, so its length is the number of
unfinished jobs. A job's life: ``queued`` -> ``running`` (claimed) -> ``done`` | ``failed`` |
``cancelled`` (:meth:`cancel`: the client's abort, wherever the job is; the replica running it
notices through :meth:`statuses` and stops it). Submitting and cancelling are Lua scripts: the
check and the writes are one step, so two submits of one id queue it once.

Durability is Redis's: with persistence off (the embedded default) a Redis restart loses the
queue; use ``EmbeddedRedis(data_dir=...)`` (appendonly) or a persistent Redis in production.
Degraded mode: every method raises :class:`StateUnavailable`; the batch lane pauses (it is not
latency-critical) and resumes when Redis returns, re-creating the consumer group if needed.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis.exceptions as rexc
from redis.typing import EncodableT

from router.state.connection import RedisState

T = TypeVar("T")
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
ENDED: frozenset[str] = frozenset({"done", "failed", "cancelled"})


class JobIdConflict(Exception):
    """A batch job id already names another job (another body or another tenant)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"batch job id {job_id!r} already names another request")
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    entry_id: str  # stream entry id, needed to acknowledge
    job_id: str
    tenant: str
    job: dict[str, Any]  # the submitted JSON payload
    attempt: int  # 1 on first delivery
    reclaimed: bool  # taken over from a consumer that went idle (probably died)


@dataclass(frozen=True, slots=True)
class JobStatus:
    job_id: str
    tenant: str
    status: JobState
    result: dict[str, Any] | None
    error: str | None
    created_at: float
    updated_at: float
    attempts: int


def _s(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b


# KEYS: status hash, stream. ARGV: tenant, fingerprint, now, job id, job json.
# Returns 'conflict', 'exists' or 'queued'.
_SUBMIT = """
local had = redis.call('HMGET', KEYS[1], 'tenant', 'fp')
if had[1] then
  if had[1] ~= ARGV[1] or (had[2] and had[2] ~= ARGV[2]) then return 'conflict' end
  return 'exists'
end
local entry = redis.call('XADD', KEYS[2], '*', 'job_id', ARGV[4], 'tenant', ARGV[1], 'job', ARGV[5])
redis.call('HSET', KEYS[1], 'status', 'queued', 'tenant', ARGV[1], 'created_at', ARGV[3], 'updated_at', ARGV[3],
           'attempts', 0, 'fp', ARGV[2], 'entry', entry)
return 'queued'
"""

# KEYS: status hash. ARGV: now, consumer. 0 when the job was cancelled meanwhile (do not run it).
_SET_RUNNING = """
if redis.call('HGET', KEYS[1], 'status') == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[1], 'consumer', ARGV[2])
return 1
"""

# KEYS: status hash, stream. ARGV: tenant, group, now, ttl ms. Returns the status the job had
# ('' if unknown or another tenant's); a queued or running job becomes 'cancelled' and its entry
# leaves the stream (nobody claims it again).
_CANCEL = """
local h = redis.call('HMGET', KEYS[1], 'tenant', 'status', 'entry')
if h[1] ~= ARGV[1] then return '' end
local status = h[2] or 'queued'
if status == 'queued' or status == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'error', 'cancelled by the client', 'updated_at', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  if h[3] then
    redis.call('XACK', KEYS[2], ARGV[2], h[3])
    redis.call('XDEL', KEYS[2], h[3])
  end
end
return status
"""


class BatchJournal:
    """Batch jobs in a Redis Stream with a consumer group of routers."""

    def __init__(
        self, state: RedisState, *, group: str = "routers", max_attempts: int = 3, ttl_s: float = 86_400.0
    ) -> None:
        self.state = state
        self.group = group
        self.max_attempts = max_attempts
        self.ttl_s = ttl_s  # default lifetime of a finished job's status and result
        self.stream = state.key("batch", "stream")
        self._cursor = "0-0"  # XAUTOCLAIM scan position, so successive claims cover the whole PEL
        # Entries this object handed to each consumer and not yet finished: when XAUTOCLAIM returns
        # one of them to the same consumer, it is still being worked on here (the claim merely
        # refreshed it), unlike after a restart, when a fresh object re-delivers it.
        self._inflight: dict[str, set[str]] = {}
        self._submit = state.client.register_script(_SUBMIT)
        self._set_running = state.client.register_script(_SET_RUNNING)
        self._cancel = state.client.register_script(_CANCEL)

    def _job_key(self, job_id: str) -> str:
        return self.state.key("batch", "job", job_id)

    async def _grouped(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``op`` creating the consumer group on demand (first use, or Redis lost its data)."""

        async def wrapped(r: Any) -> T:
            try:
                return await op(r)
            except rexc.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
            try:
                await r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except rexc.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
            return await op(r)

        return await self.state.run(wrapped)

    async def submit(self, job: dict[str, Any], job_id: str | None = None) -> str:
        """Queue ``job`` (a JSON object with a string ``tenant``); returns the job id (``job_id`` if
        given: a client-chosen id lets it find the result after losing its connection). Submitting
        an id that already exists with the same job queues nothing and returns it; with another job
        (or tenant) it raises :class:`JobIdConflict`: the earlier job's result is not this one's."""
        tenant = job.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("a batch job needs a non-empty string 'tenant'")
        job_id, now = job_id or uuid.uuid4().hex, time.time()
        body = json.dumps(job, sort_keys=True)
        fingerprint = hashlib.sha256(body.encode()).hexdigest()
        keys = [self._job_key(job_id), self.stream]
        args: list[EncodableT] = [tenant, fingerprint, now, job_id, body]
        got = await self.state.run(lambda r: self._submit(keys=keys, args=args, client=r))
        if _s(got) == "conflict":
            raise JobIdConflict(job_id)
        return job_id

    async def claim(self, consumer: str, count: int = 10, min_idle_ms: int = 60_000) -> list[ClaimedJob]:
        """Up to ``count`` jobs for ``consumer``: first ones abandoned by idle consumers (pending
        longer than ``min_idle_ms``), then new ones. Never blocks; poll it."""

        async def op(r: Any) -> list[tuple[str, dict[bytes, bytes] | None, bool]]:
            got: list[tuple[str, dict[bytes, bytes] | None, bool]] = []
            res = await r.xautoclaim(self.stream, self.group, consumer, min_idle_ms, self._cursor, count=count)
            self._cursor = _s(res[0])
            mine = self._inflight.get(consumer, set())
            got += [(_s(eid), fields, True) for eid, fields in res[1] if _s(eid) not in mine]
            if len(got) < count:
                new = await r.xreadgroup(self.group, consumer, {self.stream: ">"}, count=count - len(got))
                for _stream, entries in new or []:
                    got += [(_s(eid), fields, False) for eid, fields in entries]
            return got

        entries = await self._grouped(op)
        if not entries:
            return []
        ids = [_s(f[b"job_id"]) if f else "" for _e, f, _r in entries]

        async def count_attempts(r: Any) -> list[int]:
            async with r.pipeline(transaction=True) as p:
                for job_id in ids:
                    if job_id:  # (no status hash to count in for a deleted entry)
                        p.hincrby(self._job_key(job_id), "attempts", 1)
                counts = iter(await p.execute())
                return [next(counts) if job_id else 0 for job_id in ids]

        attempts = await self.state.run(count_attempts)
        out: list[ClaimedJob] = []
        for (entry_id, fields, reclaimed), job_id, attempt in zip(entries, ids, attempts):
            if not fields:  # entry deleted under us: nothing to run, just drop it
                await self._finish(job_id, entry_id, {}, None)
            elif attempt > self.max_attempts:
                await self.fail(job_id, entry_id, f"gave up after {attempt - 1} attempts")
            else:
                job = json.loads(fields[b"job"])
                out.append(ClaimedJob(entry_id, job_id, _s(fields[b"tenant"]), job, attempt, reclaimed))
                self._inflight.setdefault(consumer, set()).add(entry_id)
        return out

    async def touch(self, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of entries ``consumer`` is still working on, so they are not
        re-claimed by others (call well within ``min_idle_ms`` for long jobs)."""
        if entry_ids:
            await self._grouped(lambda r: r.xclaim(self.stream, self.group, consumer, 0, entry_ids, justid=True))

    async def set_running(self, job_id: str, consumer: str = "") -> bool:
        """Mark the job running under ``consumer``; False if it was cancelled meanwhile (skip it)."""
        keys = [self._job_key(job_id)]
        args: list[EncodableT] = [time.time(), consumer]
        return bool(await self.state.run(lambda r: self._set_running(keys=keys, args=args, client=r)))

    def forget(self, entry_id: str) -> None:
        """This object no longer works on ``entry_id`` although it is not finished (its run was
        cut short): the next claim past ``min_idle_ms`` re-delivers it, to any consumer."""
        for mine in self._inflight.values():
            mine.discard(entry_id)

    async def cancel(self, job_id: str, tenant: str, ttl_s: float | None = None) -> JobState | None:
        """Cancel ``tenant``'s job ``job_id`` if it is queued or running (it becomes ``cancelled``
        and leaves the stream). Returns the status it had, or None if unknown to this tenant."""
        ttl_ms = max(1, int((ttl_s if ttl_s is not None else self.ttl_s) * 1000))
        keys = [self._job_key(job_id), self.stream]
        args: list[EncodableT] = [tenant, self.group, time.time(), ttl_ms]
        had = _s(await self.state.run(lambda r: self._cancel(keys=keys, args=args, client=r)))
        return had or None  # type: ignore[return-value]

    async def statuses(self, job_ids: list[str]) -> dict[str, str | None]:
        """Each job's status (None: unknown), in one round trip."""
        if not job_ids:
            return {}

        async def op(r: Any) -> list[Any]:
            async with r.pipeline(transaction=False) as p:
                for job_id in job_ids:
                    p.hget(self._job_key(job_id), "status")
                replies: list[Any] = await p.execute()  # one status (bytes or None) per job
                return replies

        got = await self.state.run(op)
        return {job_id: (_s(v) if v is not None else None) for job_id, v in zip(job_ids, got)}

    async def _finish(self, job_id: str, entry_id: str, mapping: dict[str, Any], ttl_s: float | None) -> None:
        """Record the end state and acknowledge + delete the entry, atomically."""

        async def op(r: Any) -> None:
            async with r.pipeline(transaction=True) as p:
                if job_id and mapping:
                    key = self._job_key(job_id)
                    p.hset(key, mapping={**mapping, "updated_at": time.time()})
                    p.pexpire(key, max(1, int((ttl_s if ttl_s is not None else self.ttl_s) * 1000)))
                p.xack(self.stream, self.group, entry_id)
                p.xdel(self.stream, entry_id)
                await p.execute()

        await self.state.run(op)
        for mine in self._inflight.values():
            mine.discard(entry_id)

    async def complete(self, job_id: str, entry_id: str, result: dict[str, Any], ttl_s: float | None = None) -> None:
        """Store the result (kept ``ttl_s``), mark the job done and acknowledge its entry."""
        await self._finish(job_id, entry_id, {"status": "done", "result": json.dumps(result)}, ttl_s)

    async def finish_cancelled(
        self, job_id: str, entry_id: str, result: dict[str, Any], ttl_s: float | None = None
    ) -> None:
        """A cancelled job's run ended: keep what it had produced, and acknowledge its entry."""
        await self._finish(
            job_id,
            entry_id,
            {"status": "cancelled", "error": "cancelled by the client", "result": json.dumps(result)},
            ttl_s,
        )

    async def fail(self, job_id: str, entry_id: str, error: str, ttl_s: float | None = None) -> None:
        """Mark the job failed (no retry) and acknowledge its entry."""
        await self._finish(job_id, entry_id, {"status": "failed", "error": str(error)}, ttl_s)

    async def get(self, job_id: str, tenant: str) -> JobStatus | None:
        """The job's status, or None if unknown, expired, or owned by another tenant."""
        raw = await self.state.run(lambda r: r.hgetall(self._job_key(job_id)))
        h = {_s(k): _s(v) for k, v in raw.items()}
        if not h or h.get("tenant") != tenant:
            return None
        return JobStatus(
            job_id=job_id,
            tenant=tenant,
            status=h.get("status", "queued"),  # type: ignore[arg-type]
            result=json.loads(h["result"]) if "result" in h else None,
            error=h.get("error"),
            created_at=float(h.get("created_at", 0.0)),
            updated_at=float(h.get("updated_at", 0.0)),
            attempts=int(h.get("attempts", 0)),
        )

    async def pending_count(self) -> int:
        """Unfinished jobs: queued plus claimed but not yet completed or failed."""
        return int(await self.state.run(lambda r: r.xlen(self.stream)))
