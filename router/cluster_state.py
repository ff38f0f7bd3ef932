"""The router's shared state: Redis when it is there, this router's own memory when it is not.

One facade over ``router.state``: rate limits, idempotency keys, the cluster prefix index, the
worker/router registry (heartbeats with load reports) and the durable batch journal. While Redis
is away the router keeps serving in *degraded mode*: rate limits per replica, idempotency and the
prefix index local to this router, no durable batch lane (its requests run like any other); when
Redis returns, the prefix index is re-seeded from what this router saw meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from engine.kv_events import KVCacheEvent
from engine.outputs import RequestOutput
from engine.request import FinishReason
from router.admission import RateDecision
from router.api import ErrorKind, GenerationResult, RouterError, Usage
from router.lanes import TenantConfig
from router.request_context import RequestContext
from router.request_ids import shown_request_id
from router.state.connection import RedisState, StateUnavailable
from router.state.idempotency import IdempotencyStore, LocalIdempotencyStore
from router.state.journal import BatchJournal
from router.state.prefix_index import LocalPrefixIndex, RedisPrefixIndex
from router.state.rate_limit import LocalRateLimiter, RateLimiter, TenantLimits
from router.state.registry import WorkerRegistry
from router.task_stop import stop_tasks
from router.worker_pool import WorkerPool

log = logging.getLogger(__name__)
HEARTBEAT_S = 1.0
# A generation that ran to no answer worth keeping: a retry with its key may run it again.
_NO_ANSWER = frozenset({None, FinishReason.ABORT, FinishReason.ERROR})


class _Limiter:
    """Admission's rate limiter: shared buckets in Redis, per-replica buckets while it is away."""

    def __init__(self, redis: RedisState | None) -> None:
        self.local = LocalRateLimiter()
        self.shared = RateLimiter(redis, local=self.local) if redis is not None else None

    async def acquire(self, tenant: TenantConfig, n_tokens: int, n_requests: int = 1) -> RateDecision:
        limits = TenantLimits(tenant.requests_per_min, tenant.tokens_per_min)
        if limits.unlimited:
            return RateDecision(True)
        if self.shared is not None:
            d = await self.shared.acquire(tenant.name, n_requests, n_tokens, limits=limits)
        else:
            d = self.local.acquire(tenant.name, n_requests, n_tokens, limits=limits)
        if not d.allowed:
            return RateDecision(False, d.retry_after_s, d.reason)

        async def refund() -> None:  # to the buckets that were charged (shared, or local while degraded)
            if self.shared is not None:
                await self.shared.refund(tenant.name, n_requests, n_tokens, limits=limits, degraded=d.degraded)
            else:
                self.local.refund(tenant.name, n_requests, n_tokens, limits=limits)

        return RateDecision(True, refund=refund)


class ClusterState:
    def __init__(self, router_id: str, redis: RedisState | None = None, *, job_idle_ms: int = 15_000) -> None:
        self.router_id = router_id
        self.redis = redis
        self.rate_limiter = _Limiter(redis)
        self.local_index = LocalPrefixIndex()
        self.index = RedisPrefixIndex(redis) if redis else None
        self.idem = IdempotencyStore(redis) if redis else None
        self.registry = WorkerRegistry(redis) if redis else None
        self.journal = BatchJournal(redis) if redis else None
        self.job_idle_ms = job_idle_ms
        self._local_idem = (
            LocalIdempotencyStore(ttl_s=self.idem.ttl_s, lease_s=self.idem.lease_s)
            if self.idem
            else LocalIdempotencyStore()
        )
        # Retries waiting on a key in progress, per (tenant, key): bounded, so a flood of retries is
        # refused at once instead of each polling (they pass no rate limit before they wait).
        self._idem_waiters: dict[tuple[str, str], int] = {}
        self.max_idem_waiters = 8
        self.idem_poll_s = (0.1, 2.0)  # first and longest wait between polls, doubling between
        self._index_stale = False  # events were applied locally only: re-seed Redis when it returns
        self._unsynced: set[str] = set()  # workers whose index changed while stale (emptied ones too)
        self._redis_run_id: str | None = None  # another one: Redis restarted, and may have lost the index
        self._tasks: list[asyncio.Task[object]] = []
        self.degraded_since: float | None = None

    @classmethod
    def local(cls, router_id: str) -> ClusterState:
        return cls(router_id, None)

    @property
    def available(self) -> bool:
        return self.redis is not None and self.redis.available

    async def start(self, router_payload: Callable[[], dict[str, Any]], pool: WorkerPool) -> None:
        """Heartbeats: this router's ``router_payload()`` and the load reports of ``pool``'s workers."""
        if self.redis is not None and self.registry is not None and self.index is not None:  # (all three or none)
            beats = self._heartbeats(self.redis, self.registry, self.index, router_payload, pool)
            self._tasks.append(asyncio.create_task(beats, name="redis-heartbeats"))

    async def stop(self) -> None:
        await stop_tasks(self._tasks, "cluster state")
        if self.registry is not None:
            try:
                await self.registry.remove(self.router_id)
            except StateUnavailable:
                pass
        if self.redis is not None:
            await self.redis.close()

    # -- prefix index ----------------------------------------------------------------------------
    async def prefix_apply(self, worker_id: str, events: Sequence[KVCacheEvent]) -> None:
        await self.local_index.apply(worker_id, events)
        if self.index is None:
            return
        if self._index_stale:
            self._unsynced.add(worker_id)
        try:
            if self._index_stale:
                await self._reseed_index(self.index)  # from the local view, which has these events
            else:
                await self.index.apply(worker_id, events)
        except StateUnavailable:
            self._mark_stale(worker_id)

    async def prefix_lookup(self, hashes: list[bytes], workers: list[str]) -> dict[str, int]:
        if self.index is not None and not self._index_stale:
            try:
                return await self.index.longest_prefix(hashes, workers)
            except StateUnavailable:
                pass
        return await self.local_index.longest_prefix(hashes, workers)

    async def forget_worker(self, worker_id: str) -> None:
        """A worker restarted or died: its cache is gone."""
        await self.local_index.clear_worker(worker_id)
        if self.index is not None:
            try:
                await self.index.clear_worker(worker_id)
            except StateUnavailable:
                self._mark_stale(worker_id)

    def _mark_stale(self, worker_id: str | None = None) -> None:
        self._index_stale = True
        if worker_id is not None:
            self._unsynced.add(worker_id)

    async def _reseed_index(self, index: RedisPrefixIndex) -> None:
        """Every worker this router knows blocks of, and every one whose blocks changed while Redis was
        away (one emptied then is in no snapshot, and Redis would keep its old blocks for an hour)."""
        snapshot = self.local_index.snapshot()
        for worker_id in set(snapshot) | self._unsynced:
            await index.replace_worker(worker_id, list(snapshot.get(worker_id, ())))
        self._unsynced.clear()
        self._index_stale = False
        log.info("prefix index re-seeded in Redis from this router's view")

    # -- idempotency -----------------------------------------------------------------------------
    async def idempotency_begin(
        self, tenant: str, key: str, fingerprint: str, wait_s: float = 600.0
    ) -> GenerationResult | None:
        """None: run the request. A result: it already ran, replay it. Waits while another attempt
        with the same key is in flight (polling at ``idem_poll_s``, doubling), up to ``wait_s``;
        raises CONFLICT when the key was used for another request, and ``idempotency_in_progress``
        at once when ``max_idem_waiters`` already wait on this key here."""
        deadline = time.monotonic() + wait_s
        k, waiting = (tenant, key), False
        delay, longest = self.idem_poll_s
        try:
            while True:
                state, stored = await self._begin(tenant, key, fingerprint)
                if state == "new":
                    return None
                if state == "mismatch":
                    raise RouterError(
                        ErrorKind.CONFLICT,
                        "This Idempotency-Key was already used with a different request.",
                        param="Idempotency-Key",
                        code="idempotency_key_reused",
                    )
                if state == "done" and stored is not None:
                    return GenerationResult.from_dict(stored)
                if not waiting and self._idem_waiters.get(k, 0) < self.max_idem_waiters:
                    self._idem_waiters[k] = self._idem_waiters.get(k, 0) + 1
                    waiting = True
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    raise RouterError(
                        ErrorKind.CONFLICT,
                        "A request with this Idempotency-Key is still running.",
                        param="Idempotency-Key",
                        code="idempotency_in_progress",
                    )
                # Backing off: a long generation's waiters would otherwise poll Redis 10 times a second each.
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, longest)
        finally:
            if waiting:
                n = self._idem_waiters[k] - 1
                if n:
                    self._idem_waiters[k] = n
                else:
                    del self._idem_waiters[k]

    async def _begin(self, tenant: str, key: str, fingerprint: str) -> tuple[str, dict[str, Any] | None]:
        held = self._local_idem.peek(tenant, key, fingerprint)
        if held is not None:  # claimed here while Redis was away, which then knows nothing of it
            return held.state, held.result
        if self.idem is not None:
            try:
                b = await self.idem.begin(tenant, key, fingerprint)
                return b.state, b.result
            except StateUnavailable:
                pass  # degraded: this router's memory only
        b = self._local_idem.begin(tenant, key, fingerprint)
        return b.state, b.result

    async def idempotency_release(self, tenant: str, key: str) -> None:
        self._local_idem.release(tenant, key)
        if self.idem is not None:
            try:
                await self.idem.release(tenant, key)
            except StateUnavailable:
                pass

    async def idempotency_finish(self, tenant: str, key: str, ctx: RequestContext, final: RequestOutput) -> None:
        if final.finish_reason in _NO_ANSWER:
            await self.idempotency_release(tenant, key)  # a retry may run it again
            return
        logprobs = None if final.logprobs is None else tuple(final.logprobs)
        prompt_logprobs = None if final.prompt_logprobs is None else tuple(final.prompt_logprobs)
        await self.idempotency_store(
            tenant,
            key,
            GenerationResult(
                shown_request_id(ctx.request_id),
                final.text,
                tuple(final.token_ids),
                final.finish_reason,
                Usage(ctx.prompt_tokens, len(final.token_ids), final.num_cached_tokens),
                ctx.lane,
                ctx.prompt_text,
                logprobs,
                prompt_logprobs,
            ),
        )

    async def idempotency_store(self, tenant: str, key: str, result: GenerationResult) -> None:
        """Keep ``result`` as the answer to retries with this key (an aborted one releases the key)."""
        if result.finish_reason in _NO_ANSWER:
            await self.idempotency_release(tenant, key)
            return
        stored = result.to_dict()
        self._local_idem.complete(tenant, key, stored)  # only where this replica holds the claim
        if self.idem is not None:
            try:
                await self.idem.complete(tenant, key, stored)
            except StateUnavailable:
                pass

    # -- durable batch lane ----------------------------------------------------------------------
    async def batch_get(self, job_id: str, tenant: str) -> dict[str, Any] | None:
        if self.journal is None:
            return None
        try:
            st = await self.journal.get(job_id, tenant)
        except StateUnavailable:
            raise RouterError(
                ErrorKind.OVERLOADED, "The batch journal (Redis) is unavailable; retry later.", retry_after_s=2.0
            ) from None
        if st is None:
            return None
        out: dict[str, Any] = {"id": job_id, "object": "batch.job", "status": st.status}
        if st.result is not None:
            out["result"] = st.result
        if st.error:
            out["error"] = st.error
        return out

    # -- heartbeats ------------------------------------------------------------------------------
    async def _heartbeats(
        self,
        redis: RedisState,
        registry: WorkerRegistry,
        index: RedisPrefixIndex,
        router_payload: Callable[[], dict[str, Any]],
        pool: WorkerPool,
    ) -> None:
        """Register this router and publish the workers' load reports it sees (TTL 3 heartbeats)."""
        was_up = True
        while True:
            try:
                await registry.heartbeat(self.router_id, "router", router_payload(), 3 * HEARTBEAT_S)
                for w in pool.all():
                    if w.alive and w.load is not None:
                        await registry.heartbeat(w.worker_id, w.role, asdict(w.load), 3 * HEARTBEAT_S)
                run_id = await redis.run_id()
                if self._redis_run_id not in (None, run_id):  # restarted between two beats, maybe empty
                    log.warning("Redis restarted: re-seeding the prefix index")
                    self._mark_stale()
                self._redis_run_id = run_id
                if not was_up:
                    log.info("Redis is back: leaving degraded mode")
                if self._index_stale:
                    await self._reseed_index(index)
                was_up, self.degraded_since = True, None
            except StateUnavailable:
                if was_up:
                    log.warning("Redis is unavailable: degraded mode (local rate limits, local prefix index)")
                    self.degraded_since = time.monotonic()
                    self._mark_stale()  # it may come back without the index (a restart, no persistence)
                was_up = False
            await asyncio.sleep(HEARTBEAT_S)
