"""The lane dispatcher: takes requests from the lane queues when the pools have room (capacity
credits, the pace guard's held lanes) and hands them to the pool dispatcher on its threads; and
withdraws a request again (an abort), from its queue or from the pools.

Moves a request from its lane queue to dispatched (``RequestRegistry.dispatched``), and an
aborted one to its end (``RequestRegistry.finished``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.request_spec import RequestSpec
from router.capacity import Capacity
from router.decode_backlog import merge_holds
from router.lane_queues import LaneQueues, Pending, Room
from router.lanes import LanePolicy
from router.metrics import RouterMetrics
from router.pace_guard import PaceGuard
from router.placement import NO_HINT, PlacementHint
from router.request_context import RequestContext
from router.request_registry import RequestRegistry
from router.stream import RequestStream

log = logging.getLogger("router.router")


class PoolDispatcher(Protocol):
    """What the lane dispatcher needs of ``router.dispatcher.Dispatcher``: both calls block (Ray
    calls), and run on this part's threads."""

    def submit(self, spec: RequestSpec, stream: RequestStream, hint: PlacementHint) -> object: ...

    def abort(self, request_id: str) -> object: ...

    def placement(self, request_id: str) -> tuple[str | None, str | None]: ...  # (decode, prefill) worker


class LaneDispatcher:
    def __init__(
        self,
        queues: LaneQueues,
        capacity: Capacity,
        dispatcher: PoolDispatcher,
        requests: RequestRegistry,
        policy: LanePolicy,
        metrics: RouterMetrics,
        pace_guard: PaceGuard | None,
        block_size: int,
        decode_backlog: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        """``decode_backlog``: lanes the decode pool already holds back -> their longest hold
        (``router.decode_backlog``; None: lane priority off)."""
        self._queues = queues
        self._capacity = capacity
        self._dispatcher = dispatcher
        self._requests = requests
        self._policy = policy
        self._metrics = metrics
        self._pace_guard = pace_guard
        self._block_size = block_size
        self._decode_backlog = decode_backlog
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dispatch")
        # Aborts on their own threads: a placement may wait for a decode worker to come back
        # (Dispatcher.placement_wait_s), and an abort queued behind eight of them waited as long.
        self._abort_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="abort")

    def enqueue(self, pending: Pending) -> None:
        self._queues.push(pending)
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = (
                self._queues.take(self._has_room, idle=self._capacity.idle(), held=self._held_lanes())
                if len(self._queues)
                else []
            )
            now = time.monotonic()
            for p in batch:
                ctx: RequestContext = p.payload
                ctx.dispatched = now
                self._requests.dispatched(ctx)
                window = self._policy.lane(ctx.lane).batch_window_s
                waited = now - ctx.arrival
                ctx.window_s = min(window, waited)
                self._metrics.queued(ctx.lane, waited, ctx.window_s)
                loop.run_in_executor(self._executor, self.submit, ctx)
            self._wake.clear()
            if len(self._queues):
                nxt = self._queues.next_deadline()
                wait = 0.01 if nxt is None else min(0.01, max(0.0, nxt - time.monotonic()))
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.002))
                except TimeoutError:
                    pass
            else:
                await self._wake.wait()

    def _held_lanes(self) -> dict[str, float]:
        backlog = self._decode_backlog() if self._decode_backlog is not None else {}
        guard = self._pace_guard
        if guard is None or not any(self._queues.depth(n) for n in guard.holdable):
            return backlog
        active = {c.lane for c in self._requests.dispatched_contexts()} | {
            n for n, q in self._queues.queues.items() if q
        }
        return merge_holds(backlog, guard.held(self._requests.decode_pace(), active, time.monotonic()))

    def _has_room(self, p: Pending) -> Room:
        return self._capacity.reserve(p.payload.prompt_tokens, p.payload.max_tokens, self._block_size)

    def submit(self, ctx: RequestContext) -> None:
        """Place ``ctx`` on the pools (blocking: on a dispatch thread)."""
        try:
            self._dispatcher.submit(ctx.spec, ctx.stream, ctx.hint or NO_HINT)
            if ctx.trace is not None:  # (tracing on) its dispatch span ends here
                ctx.trace.placed = time.monotonic()
                ctx.trace.decode_worker, ctx.trace.prefill_worker = self._dispatcher.placement(ctx.request_id)
        except Exception as e:  # never lose a request silently
            log.exception("dispatch of %s failed", ctx.request_id)
            ctx.stream.fail(f"dispatch failed: {e}")

    async def abort(self, ctx: RequestContext) -> None:
        """Withdraw ``ctx`` from its lane queue, or from the pools once dispatched, and end it."""
        if self._queues.remove(ctx.request_id) is not None:
            ctx.stream.put(RequestOutput(ctx.request_id, [], "", finished=True, finish_reason=FinishReason.ABORT))
        else:
            await asyncio.get_running_loop().run_in_executor(
                self._abort_executor, self._dispatcher.abort, ctx.request_id
            )
        self._requests.finished(ctx)

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._abort_executor.shutdown(wait=False, cancel_futures=True)
