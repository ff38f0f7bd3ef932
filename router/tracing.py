"""OpenTelemetry traces of requests: one trace per request, joined to the client's W3C ``traceparent``.

A request's spans are built when it ends, from timestamps the router records anyway (``RequestTrace``,
``RequestContext``, ``RequestStream``) and the TTFT breakdown the workers measure and ship with the
first token (``RequestOutput.ttft_breakdown``)::

    baton.request                    SERVER span; parent: the client's traceparent
    ├─ router.admission              received → admitted (tokenize, classify, rate limits, SLO check)
    ├─ router.lane_queue             admitted → taken from the lane queue
    ├─ router.dispatch               placement calls (D.reserve, P.prefill)
    ├─ prefill                       on the prefill worker (or the decode worker prefilling locally)
    │  ├─ prefill.queue
    │  └─ prefill.compute
    ├─ kv_transfer                   prefill worker → decode worker
    ├─ decode                        on the decode worker, to the request's end
    │  ├─ decode.queue
    │  └─ decode.generate            first token (an event) → last token
    └─ preempted                     one per time the decode worker preempted it (for KV blocks, or
                                     for a more important lane's pace), to when it ran again

Why the router emits the workers' spans rather than the workers: the stages are measured on the
workers already (their own clocks, shipped as durations with the first token), so no Ray call, no
message field and no exporter in any worker process is added, and each router replica holds the one
OTLP connection. The worker stages are laid back to back ending when the first token reached the
router, so their ends are late by the output's trip back (milliseconds); their lengths are the
workers' own. Each carries ``baton.worker`` and ``baton.role``: which process ran it. The
``preempted`` spans come with the request's last output, relative to it, and are laid back from
when it reached the router. A preemption before the first token is also the TTFT breakdown's
``preempted`` stage (the workers take it out of ``prefill_compute``).

The spans are built on a thread of their own: the SDK takes tens of microseconds a span, and a
request has eleven, which the event loop should not wait for.

Off (no ``observability.otlp_endpoint``) the router holds no ``Tracing`` and requests carry no
trace: nothing here is imported or run. A durable batch job (journaled, possibly run by another
replica) is not traced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.request import FinishReason
from router.request_trace import RequestTrace

if TYPE_CHECKING:
    from router.api import RouterError
    from router.request_context import RequestContext

_PROPAGATOR = TraceContextTextMapPropagator()
_FAILED = (FinishReason.ERROR,)


class TracingUnavailable(RuntimeError):
    """``otlp_endpoint`` is set but the OTLP exporter is not installed."""


def otlp_exporter(endpoint: str) -> SpanExporter:
    """OTLP over HTTP/protobuf to ``endpoint`` (a collector's base URL, e.g. http://otel-collector:4318;
    ``/v1/traces`` is added when the URL has no path)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        raise TracingUnavailable(
            "observability.otlp_endpoint is set but the OTLP exporter is not installed: "
            "pip install 'baton[otlp]' (opentelemetry-exporter-otlp-proto-http)"
        ) from e
    url = endpoint.rstrip("/")
    if url.count("/") <= 2:  # scheme://host[:port] only
        url += "/v1/traces"
    return OTLPSpanExporter(endpoint=url)


class Tracing:
    """Builds and exports the spans of this router's requests."""

    def __init__(
        self, exporter: SpanExporter, *, service_name: str = "baton", sample_ratio: float = 1.0, batch: bool = True
    ) -> None:
        # Its own provider, not the process-global one: a test's (or an embedding app's) tracing is
        # left alone, and two routers in one process do not share exporters.
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("baton.router")
        self._emitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracing")

    @classmethod
    def from_settings(
        cls, otlp_endpoint: str | None, service_name: str = "baton", sample_ratio: float = 1.0
    ) -> Tracing | None:
        """None (off) without an endpoint."""
        if not otlp_endpoint:
            return None
        return cls(otlp_exporter(otlp_endpoint), service_name=service_name, sample_ratio=sample_ratio)

    def begin(self, traceparent: str | None, tracestate: str | None) -> RequestTrace:
        return RequestTrace(traceparent, tracestate, time.monotonic(), time.time_ns())

    def shutdown(self) -> None:
        """Emit and export what is pending, and stop."""
        self._emitter.shutdown(wait=True)
        self._provider.shutdown()

    # -- emitting -----------------------------------------------------------------------------
    def _root(self, t: RequestTrace, attributes: Mapping[str, str | int]) -> Span:
        carrier = {"traceparent": t.traceparent} if t.traceparent else {}
        if t.traceparent and t.tracestate:
            carrier["tracestate"] = t.tracestate
        parent: Context = _PROPAGATOR.extract(carrier)  # an empty or malformed traceparent starts a new trace
        return self._tracer.start_span(
            "baton.request", context=parent, kind=SpanKind.SERVER, start_time=t.received_ns, attributes=attributes
        )

    def _child(
        self,
        parent: Span,
        name: str,
        t: RequestTrace,
        start: float,
        end: float,
        attributes: Mapping[str, str | int] | None = None,
    ) -> Span:
        span = self._tracer.start_span(
            name, context=trace.set_span_in_context(parent), start_time=t.wall_ns(start), attributes=attributes
        )
        span.end(end_time=t.wall_ns(max(start, end)))
        return span

    def rejected(self, t: RequestTrace, err: RouterError) -> None:
        """A request refused before it was queued (validation, rate limit, SLO, draining)."""
        self._submit(self._emit_rejected, t, err, time.monotonic())

    def finished(self, ctx: RequestContext) -> None:
        """``ctx`` has ended (its stream finished): emit its spans. On the event loop."""
        if ctx.trace is not None:
            self._submit(self._emit_finished, ctx)  # (nothing changes an ended request's records)

    def _submit(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self._emitter.submit(fn, *args)
        except RuntimeError:  # shut down: a request ending after the router stopped goes untraced
            pass

    def _emit_rejected(self, t: RequestTrace, err: RouterError, now: float) -> None:
        root = self._root(t, {"baton.error.kind": err.kind.name, "baton.error.code": err.code or ""})
        if not root.is_recording():
            return
        self._child(root, "router.admission", t, t.received, now, {"baton.error.code": err.code or ""})
        root.set_status(Status(StatusCode.ERROR, err.message))
        root.end(end_time=t.wall_ns(now))

    def _emit_finished(self, ctx: RequestContext) -> None:
        t = ctx.trace
        if t is None:
            return
        s = ctx.stream
        end = s.finished_time or time.monotonic()
        root = self._root(
            t,
            {
                "baton.request_id": ctx.request_id,
                "baton.tenant": ctx.tenant,
                "baton.lane": ctx.lane,
                "baton.prompt_tokens": ctx.prompt_tokens,
                "baton.completion_tokens": len(s.token_ids),
                "baton.finish_reason": str(s.finish_reason or ""),
            },
        )
        if not root.is_recording():  # sampled out
            return
        self._child(root, "router.admission", t, t.received, ctx.arrival)
        if ctx.dispatched is None:  # ended in its lane queue (aborted, or the router stopped)
            self._child(root, "router.lane_queue", t, ctx.arrival, end)
        else:
            self._child(root, "router.lane_queue", t, ctx.arrival, ctx.dispatched)
            if t.placed is not None:
                self._child(
                    root,
                    "router.dispatch",
                    t,
                    ctx.dispatched,
                    t.placed,
                    {"baton.prefill_worker": t.prefill_worker or "", "baton.decode_worker": t.decode_worker or ""},
                )
            self._worker_spans(root, ctx, t, end)
        if s.finish_reason in _FAILED:
            root.set_status(Status(StatusCode.ERROR, s.error or "failed"))
        root.end(end_time=t.wall_ns(end))

    def _worker_spans(self, root: Span, ctx: RequestContext, t: RequestTrace, end: float) -> None:
        s = ctx.stream
        first, bd = s.first_token_time, s.ttft_breakdown
        if first is None or bd is None or ctx.dispatched is None:
            return  # no token came back (or no breakdown): nothing the workers measured
        decode_w = t.decode_worker or ""
        local = t.prefill_worker is None  # the decode worker prefilled it itself
        prefill_w, prefill_role = (decode_w, "decode") if local else (t.prefill_worker or "", "prefill")
        # Back to back, ending when the first token reached the router; never before dispatch.
        stages = [
            bd.get("prefill_queue", 0.0),
            bd.get("prefill_compute", 0.0),
            bd.get("transfer", 0.0),
            bd.get("decode_queue", 0.0),
        ]
        edges = [first]
        for d in reversed(stages):
            edges.append(max(ctx.dispatched, edges[-1] - max(0.0, d)))
        e_pq, e_pc, e_tr, e_dq, e_end = reversed(edges)  # stage i runs from edge i to edge i + 1
        at_p = {"baton.worker": prefill_w, "baton.role": prefill_role}
        at_d = {"baton.worker": decode_w, "baton.role": "decode"}
        prefill = self._tracer.start_span(
            "prefill", context=trace.set_span_in_context(root), start_time=t.wall_ns(e_pq), attributes=at_p
        )
        self._child(prefill, "prefill.queue", t, e_pq, e_pc, at_p)
        self._child(prefill, "prefill.compute", t, e_pc, e_tr, at_p)
        prefill.end(end_time=t.wall_ns(e_tr))
        if not local:
            self._child(
                root, "kv_transfer", t, e_tr, e_dq, {"baton.prefill_worker": prefill_w, "baton.decode_worker": decode_w}
            )
        decode = self._tracer.start_span(
            "decode", context=trace.set_span_in_context(root), start_time=t.wall_ns(e_dq), attributes=at_d
        )
        self._child(decode, "decode.queue", t, e_dq, e_end, at_d)
        gen = self._tracer.start_span(
            "decode.generate", context=trace.set_span_in_context(decode), start_time=t.wall_ns(first), attributes=at_d
        )
        gen.add_event("first_token", timestamp=t.wall_ns(first))
        gen.set_attribute("baton.completion_tokens", len(s.token_ids))
        gen.end(end_time=t.wall_ns(max(first, end)))
        decode.end(end_time=t.wall_ns(max(first, end)))
        for n, (since, until) in enumerate(s.preempted or (), 1):
            self._child(root, "preempted", t, since, until, {**at_d, "baton.preemption": n})
