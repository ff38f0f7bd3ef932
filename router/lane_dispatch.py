"""The router's dispatch side (a mixin of ``Router``): the loop that takes requests from the lane
queues when the pools have room and hands them to the dispatcher's threads, the pace guard's held
lanes, the housekeeping (prefill rate, lane gauges), and the running requests' decode pace that
admission and the guard read."""

from __future__ import annotations

import asyncio
import logging
import time

from router.lane_queues import Pending, Room
from router.placement import NO_HINT
from router.router_stream import RequestContext

log = logging.getLogger("router.router")


class LaneDispatch:
    """Needs the ``Router``'s ``queues``, ``capacity``, ``policy``, ``prom``, ``dispatcher``, ``pace_guard``,
    ``signals``, ``pool``, ``prefill_rate``, ``block_size``, ``_dispatched``, ``_pace``, ``_wake`` and
    ``_executor``."""

    # -- dispatch -------------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = (self.queues.take(self._has_room, idle=self.capacity.idle(), held=self._held_lanes())
                     if len(self.queues) else [])
            now = time.monotonic()
            for p in batch:
                ctx: RequestContext = p.payload
                ctx.dispatched = now
                self._dispatched[ctx.request_id] = ctx
                window = self.policy.lane(ctx.lane).batch_window_s
                waited = now - ctx.arrival
                ctx.window_s = min(window, waited)
                self.prom.queued(ctx.lane, waited, ctx.window_s)
                loop.run_in_executor(self._executor, self._submit, ctx)
            self._wake.clear()
            if len(self.queues):
                nxt = self.queues.next_deadline()
                wait = 0.01 if nxt is None else min(0.01, max(0.0, nxt - time.monotonic()))
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.002))
                except asyncio.TimeoutError:
                    pass
            else:
                await self._wake.wait()

    def _held_lanes(self) -> dict[str, float]:
        guard = self.pace_guard
        if guard is None or not any(self.queues.depth(n) for n in guard.holdable):
            return {}
        active = {c.lane for c in self._dispatched.values()} | {n for n, q in self.queues.queues.items() if q}
        return guard.held(self._decode_pace(), active, time.monotonic())

    def _has_room(self, p: Pending) -> Room:
        return self.capacity.reserve(p.payload.prompt_tokens, p.payload.max_tokens, self.block_size)

    def _submit(self, ctx: RequestContext) -> None:
        try:
            self.dispatcher.submit(ctx.spec, ctx.stream, ctx.hint or NO_HINT)
        except Exception as e:  # never lose a request silently
            log.exception("dispatch of %s failed", ctx.request_id)
            ctx.stream.fail(f"dispatch failed: {e}")

    # -- housekeeping ---------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            for w in self.pool.all():
                if w.load is not None:
                    self.prefill_rate.observe(w.worker_id, w.load.prompt_tokens_computed, w.load.busy_seconds)
            waiting = {lane.name: self.queues.depth(lane.name) for lane in self.policy.lanes}
            running: dict[str, int] = {lane.name: 0 for lane in self.policy.lanes}
            for ctx in self._dispatched.values():
                running[ctx.lane] += 1
            self.prom.set_lane_gauges(waiting, running)

    def _running(self) -> list[RequestContext]:
        """Dispatched, unfinished requests."""
        return [c for c in self._dispatched.values() if c.stream.finished_time is None]

    def _decode_pace(self) -> float | None:
        """The running streams' pace (LoadSignals.decode_pace_s), computed at most every 20 ms: it
        reads every running stream, and admission and each dispatch round ask for it."""
        now = time.monotonic()
        if now - self._pace[0] > 0.02:
            live = [c.stream.token_times[-9:] for c in self._running()]
            self._pace = (now, self.signals.decode_pace_s(live, now))
        return self._pace[1]
