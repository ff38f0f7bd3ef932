"""The router's requests in flight, and what happens once per request when its stream ends.

Owns the table of requests from registration (their lane queue or a running durable job) to their
end, the dispatched ones among them (admission and each dispatch round read those), and the ids
held free by requests still on their way in. When a request ends it is counted in the metrics (an
aborted or failed one without latencies), feeds the load signals admission predicts from, frees
its capacity slot and stores its idempotent result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from engine.outputs import RequestOutput
from engine.request import FinishReason
from router.capacity import Capacity
from router.load_signals import LoadSignals
from router.metrics import RouterMetrics
from router.request_context import RequestContext

# (tenant, idempotency key, the request, its final output): stores the result for retries, or
# releases the key (ClusterState.idempotency_finish)
KeepResult = Callable[[str, str, RequestContext, RequestOutput], Coroutine[Any, Any, None]]

_UNTIMED = frozenset({FinishReason.ABORT, FinishReason.ERROR})


class RequestRegistry:
    def __init__(
        self, capacity: Capacity, signals: LoadSignals, metrics: RouterMetrics, keep_result: KeepResult
    ) -> None:
        self._capacity = capacity
        self._signals = signals
        self._metrics = metrics
        self._keep_result = keep_result
        self._requests: dict[str, RequestContext] = {}
        # The dispatched ones (until finished): admission and each dispatch round read these, and
        # scanning every request for them cost the loop O(requests) there (2 ms each at 4,000).
        self._dispatched: dict[str, RequestContext] = {}
        self._held: set[str] = set()  # ids checked free by a request still on its way in
        self._pace: tuple[float, float | None] = (-1.0, None)  # (when, the running streams' pace)

    # -- the table -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> RequestContext | None:
        return self._requests.get(request_id)

    def values(self) -> list[RequestContext]:
        return list(self._requests.values())

    def add(self, ctx: RequestContext) -> None:
        self._requests[ctx.request_id] = ctx

    def taken(self, request_id: str) -> bool:
        """In flight here, or held by a request on its way in."""
        return request_id in self._requests or request_id in self._held

    def hold(self, request_id: str) -> None:
        """Keep ``request_id`` taken until ``unhold``: the awaits between the id check and the
        registration (placement, rate limits, the journal) let a concurrent request with the same
        id through otherwise."""
        self._held.add(request_id)

    def unhold(self, request_id: str) -> None:
        self._held.discard(request_id)

    @property
    def num_held(self) -> int:
        return len(self._held)

    # -- dispatched and running ----------------------------------------------------------------
    def dispatched(self, ctx: RequestContext) -> None:
        self._dispatched[ctx.request_id] = ctx

    @property
    def num_dispatched(self) -> int:
        return len(self._dispatched)

    def dispatched_contexts(self) -> Iterator[RequestContext]:
        return iter(self._dispatched.values())

    def running(self) -> list[RequestContext]:
        """Dispatched, unfinished requests."""
        return [c for c in self._dispatched.values() if c.stream.finished_time is None]

    def decode_pace(self) -> float | None:
        """The running streams' pace (LoadSignals.decode_pace_s), computed at most every 20 ms: it
        reads every running stream, and admission and each dispatch round ask for it."""
        now = time.monotonic()
        if now - self._pace[0] > 0.02:
            live = [c.stream.token_times[-9:] for c in self.running()]
            self._pace = (now, self._signals.decode_pace_s(live, now))
        return self._pace[1]

    # -- endings -------------------------------------------------------------------------------
    def finished(self, ctx: RequestContext) -> None:
        """Called once per request when its stream ends (later calls do nothing): metrics,
        idempotency, bookkeeping. On the event loop."""
        if ctx.finished:
            return
        ctx.finished = True
        self._requests.pop(ctx.request_id, None)
        self._dispatched.pop(ctx.request_id, None)
        timer = ctx.deadline_task
        if timer is not None and timer is not asyncio.current_task():  # (its own abort ends it anyway)
            timer.cancel()  # else it would abort whatever holds this id when the deadline passes
        if ctx.dispatched is not None:
            self._capacity.release()
        now = time.monotonic()
        self._signals.completion_rate.tick(now)
        s = ctx.stream
        if s.finish_reason in _UNTIMED:  # counted (admitted = finished + running), not timed:
            # a burst of failures would pull the latency histograms and admission's expected output
            # length (0 tokens each) towards zero, and admission would turn optimistic.
            self._metrics.request_finished(ctx.lane, s.finish_reason, ctx.prompt_tokens, len(s.token_ids), None, None)
        elif s.finished_time is not None:
            first, dispatched = s.first_token_time, ctx.dispatched
            ttft = first - ctx.arrival if first else None
            self._metrics.request_finished(
                ctx.lane, s.finish_reason, ctx.prompt_tokens, len(s.token_ids), ttft, s.finished_time - ctx.arrival
            )  # (its ITL went in as it streamed)
            to_first = first - dispatched if first and dispatched is not None else None  # dispatch to first token
            bd = s.ttft_breakdown or {}
            if to_first is not None and dispatched is not None:
                self._metrics.ttft_breakdown(ctx.lane, {"router_queue": dispatched - ctx.arrival, **bd})
            self._signals.finished(
                now,
                s.token_times[-17:],
                len(s.token_times),
                to_first,
                bd.get("prefill_queue", 0.0),
                bd.get("prefill_compute", 0.0),
                lane=ctx.lane,
                first_token_time=first,
            )
        if ctx.idempotency is not None:
            asyncio.get_running_loop().create_task(self._keep_result(*ctx.idempotency, ctx, s.final_output()))
