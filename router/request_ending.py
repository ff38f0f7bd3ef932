"""What the router does once per request when its stream ends (a mixin of ``Router``): counts it in
the metrics (an aborted or failed one without latencies), feeds the load signals admission predicts from,
frees its capacity slot and stores its idempotent result."""

from __future__ import annotations

import asyncio
import time

from router.router_stream import RequestContext


class RequestEnding:
    """Needs the ``Router``'s ``_requests``, ``_dispatched``, ``capacity``, ``signals``, ``prom``, ``state``
    and ``_loop``."""

    def _finished(self, ctx: RequestContext) -> None:
        """Called once per request when its stream ends: metrics, idempotency, bookkeeping."""
        if ctx.finished:
            return
        ctx.finished = True
        self._requests.pop(ctx.request_id, None)
        self._dispatched.pop(ctx.request_id, None)
        timer = ctx.deadline_task
        if timer is not None and timer is not asyncio.current_task():  # (its own abort ends it anyway)
            timer.cancel()  # else it would abort whatever holds this id when the deadline passes
        if ctx.dispatched is not None:
            self.capacity.release()
        now = time.monotonic()
        self.signals.completion_rate.tick(now)
        s = ctx.stream
        if s.finish_reason in ("abort", "error"):  # counted (admitted = finished + running), not timed:
            # a burst of failures would pull the latency histograms and admission's expected output
            # length (0 tokens each) towards zero, and admission would turn optimistic.
            self.prom.request_finished(ctx.lane, s.finish_reason, ctx.prompt_tokens, len(s.token_ids), None, None)
        elif s.finished_time is not None:
            ttft = s.first_token_time - ctx.arrival if s.first_token_time else None
            self.prom.request_finished(ctx.lane, s.finish_reason, ctx.prompt_tokens, len(s.token_ids), ttft,
                                       s.finished_time - ctx.arrival)  # (its ITL went in as it streamed)
            measured = ttft is not None and ctx.dispatched is not None
            bd = s.ttft_breakdown or {}
            if measured:
                self.prom.ttft_breakdown(ctx.lane, {"router_queue": ctx.dispatched - ctx.arrival, **bd})
            self.signals.finished(now, s.token_times[-17:], len(s.token_times),
                                  s.first_token_time - ctx.dispatched if measured else None,
                                  bd.get("prefill_queue", 0.0), bd.get("prefill_compute", 0.0))
        if ctx.idempotency is not None and self._loop is not None:
            final = s.final_output()
            self._loop.create_task(self.state.idempotency_finish(*ctx.idempotency, ctx, final))
