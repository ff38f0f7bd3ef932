"""Request tracing in the router (router/tracing.py): a real ``Router`` with an in-process dispatcher
that answers like a disaggregated pair (a TTFT breakdown on the first token), spans read back from
the SDK's in-memory exporter, and a real OTLP/HTTP export to a collector on loopback."""

from __future__ import annotations

import asyncio
import http.server
import tempfile
import threading
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from baton.config import ConfigError, load_config
from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.api import GenerateRequest, RouterError
from router.lanes import LanePolicy, default_lanes
from router.router import Router, RouterConfig
from router.tracing import Tracing
from router.worker_pool import WorkerHandle, WorkerPool
from tests.router.spans import attrs, end, in_order, start
from tests.waiting import async_wait_until, wait_until

BREAKDOWN = {"prefill_queue": 0.010, "prefill_compute": 0.020, "transfer": 0.005, "decode_queue": 0.003}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class PairDispatcher:
    """Places every request on prefill worker p0 and decode worker d0; the first token (with the
    workers' TTFT breakdown) comes back from another thread once the stages could have run, the end
    a little later."""

    def __init__(
        self, pool: WorkerPool, local: bool = False, preempted: list[tuple[float, float]] | None = None
    ) -> None:
        self.pool, self.router_id, self.origin = pool, "router-t", "router-t"
        self.preempted = preempted  # the final output's times out (relative to it)
        self.local_prefill_threshold = 0
        self.short_prompts_to_idle_prefill = True
        self.on_kv_events = self.on_worker_reset = None
        self.local = local

    def submit(self, spec, stream, hint) -> None:
        def first() -> None:
            stream.put(RequestOutput(spec.request_id, [7], "x", first_index=0, ttft_breakdown=dict(BREAKDOWN)))
            threading.Timer(0.02, last).start()

        def last() -> None:
            stream.put(
                RequestOutput(
                    spec.request_id,
                    [8],
                    "y",
                    first_index=1,
                    finished=True,
                    finish_reason=FinishReason.LENGTH,
                    token_ids=[7, 8],
                    text="xy",
                    preempted=self.preempted,
                )
            )

        threading.Timer(0.06, first).start()  # longer than the breakdown's 38 ms

    def abort(self, request_id: str) -> None:
        pass

    def placement(self, request_id: str) -> tuple[str | None, str | None]:
        return "d0", None if self.local else "p0"


def make_router(
    tracing: Tracing | None, local: bool = False, preempted: list[tuple[float, float]] | None = None
) -> Router:
    info = WorkerInfo(
        PeerInfo("d0", "inc", "decode"), num_blocks=1000, block_size=16, max_model_len=64, vocab_size=1000, model="m"
    )
    pool = WorkerPool([], [WorkerHandle("d0", "decode", None, info=info, alive=True)])
    config = RouterConfig(
        model_name="m",
        model_dir=Path(tempfile.mkdtemp()),
        slo_rejection=False,
        pace_guard=False,
        lanes=LanePolicy(lanes=default_lanes()),
    )
    return Router(config, pool, PairDispatcher(pool, local, preempted), tracing=tracing)  # type: ignore[arg-type]  # (a double)


def request(max_tokens: int = 2, traceparent: str | None = None) -> GenerateRequest:
    return GenerateRequest(
        sampling=SamplingParams(max_tokens=max_tokens), prompt_token_ids=(1, 2, 3), traceparent=traceparent
    )


async def run_one(router: Router, req: GenerateRequest) -> None:
    await router.start()
    try:
        stream = await router.generate(req)
        async for _ in stream:
            pass
        await async_wait_until(lambda: len(router.requests) == 0, timeout_s=5)
    finally:
        await router.stop()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    out = {s.name: s for s in spans}
    assert len(out) == len(spans), [s.name for s in spans]
    return out


def test_one_trace_per_request_joined_to_the_clients_traceparent_in_request_order() -> None:
    exporter = InMemorySpanExporter()
    router = make_router(Tracing(exporter, batch=False))
    asyncio.run(run_one(router, request(traceparent=PARENT)))
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {
        "baton.request",
        "router.admission",
        "router.lane_queue",
        "router.dispatch",
        "prefill",
        "prefill.queue",
        "prefill.compute",
        "kv_transfer",
        "decode",
        "decode.queue",
        "decode.generate",
    }
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE_ID}
    root = spans["baton.request"]
    assert root.kind is SpanKind.SERVER and format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    parent_of = {
        name: next(p.name for p in spans.values() if p.context.span_id == s.parent.span_id)
        for name, s in spans.items()
        if name != "baton.request"
    }
    assert parent_of == {
        "router.admission": "baton.request",
        "router.lane_queue": "baton.request",
        "router.dispatch": "baton.request",
        "prefill": "baton.request",
        "kv_transfer": "baton.request",
        "decode": "baton.request",
        "prefill.queue": "prefill",
        "prefill.compute": "prefill",
        "decode.queue": "decode",
        "decode.generate": "decode",
    }
    in_order(
        spans,
        [
            "router.admission",
            "router.lane_queue",
            "prefill.queue",
            "prefill.compute",
            "kv_transfer",
            "decode.queue",
            "decode.generate",
        ],
    )
    for s in spans.values():
        assert start(root) <= start(s) <= end(s) <= end(root), s.name
    # The worker stages are the workers' own measurements (to the nanosecond rounding).
    for name, stage in (
        ("prefill.queue", "prefill_queue"),
        ("prefill.compute", "prefill_compute"),
        ("kv_transfer", "transfer"),
        ("decode.queue", "decode_queue"),
    ):
        assert abs((end(spans[name]) - start(spans[name])) / 1e9 - BREAKDOWN[stage]) < 2e-6, name
    assert attrs(spans["prefill.compute"])["baton.worker"] == "p0"
    assert attrs(spans["prefill.compute"])["baton.role"] == "prefill"
    assert attrs(spans["decode.generate"])["baton.worker"] == "d0"
    assert [e.name for e in spans["decode.generate"].events] == ["first_token"]
    assert attrs(root)["baton.completion_tokens"] == 2 and attrs(root)["baton.lane"] == "interactive"


def test_a_request_prefilled_on_its_decode_worker_has_no_transfer_span() -> None:
    exporter = InMemorySpanExporter()
    asyncio.run(run_one(make_router(Tracing(exporter, batch=False), local=True), request()))
    spans = by_name(exporter.get_finished_spans())
    assert "kv_transfer" not in spans
    assert attrs(spans["prefill.compute"])["baton.worker"] == "d0"
    assert attrs(spans["prefill.compute"])["baton.role"] == "decode"
    assert spans["baton.request"].parent is None  # no traceparent: a new trace


def test_each_time_a_request_was_preempted_is_a_span() -> None:
    exporter = InMemorySpanExporter()
    router = make_router(Tracing(exporter, batch=False), preempted=[(-0.012, -0.008), (-0.006, -0.002)])
    asyncio.run(run_one(router, request()))
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "baton.request")
    out = sorted((s for s in spans if s.name == "preempted"), key=start)
    assert [attrs(s)["baton.preemption"] for s in out] == [1, 2]
    for s, (since, until) in zip(out, [(-0.012, -0.008), (-0.006, -0.002)]):
        assert s.parent is not None and s.parent.span_id == root.context.span_id
        assert attrs(s)["baton.worker"] == "d0" and attrs(s)["baton.role"] == "decode"
        assert abs((end(s) - start(s)) / 1e9 - (until - since)) < 2e-6
        assert abs((end(root) - end(s)) / 1e9 + until) < 2e-6  # laid back from the end, as measured


def test_a_rejected_request_is_an_error_span() -> None:
    exporter = InMemorySpanExporter()
    router = make_router(Tracing(exporter, batch=False))

    async def go() -> None:
        await router.start()
        try:
            with pytest.raises(RouterError):
                await router.generate(request(max_tokens=1000, traceparent=PARENT))  # over max_model_len
        finally:
            await router.stop()

    asyncio.run(go())
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"baton.request", "router.admission"}
    assert spans["baton.request"].status.status_code is StatusCode.ERROR
    assert format(spans["baton.request"].context.trace_id, "032x") == TRACE_ID


def test_sampled_out_and_malformed_traceparents() -> None:
    exporter = InMemorySpanExporter()
    router = make_router(Tracing(exporter, batch=False))
    asyncio.run(run_one(router, request(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-00")))  # not sampled
    assert exporter.get_finished_spans() == ()
    exporter = InMemorySpanExporter()  # (the router's stop shut the last one down)
    asyncio.run(run_one(make_router(Tracing(exporter, batch=False)), request(traceparent="garbage")))
    spans = by_name(exporter.get_finished_spans())
    assert spans["baton.request"].parent is None and format(spans["baton.request"].context.trace_id, "032x") != TRACE_ID


def test_off_builds_nothing() -> None:
    assert Tracing.from_settings(None) is None
    router = make_router(None)
    seen = []

    async def go() -> None:
        await router.start()
        try:
            stream = await router.generate(request(traceparent=PARENT))
            seen.append(stream.ctx.trace)
            async for _ in stream:
                pass
        finally:
            await router.stop()

    asyncio.run(go())
    assert seen == [None]


def test_config_otlp_endpoint() -> None:
    cfg = load_config(overrides={"observability.otlp_endpoint": "http://127.0.0.1:4318"})
    assert cfg.observability.otlp_endpoint == "http://127.0.0.1:4318" and cfg.observability.sample_ratio == 1.0
    assert load_config().observability.otlp_endpoint is None
    with pytest.raises(ConfigError, match="otlp_endpoint"):
        load_config(overrides={"observability.otlp_endpoint": "otel:4317"})
    with pytest.raises(ConfigError, match="sample_ratio"):
        load_config(overrides={"observability.sample_ratio": 2})


def test_spans_reach_an_otlp_collector_over_http() -> None:
    received: list[ExportTraceServiceRequest] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracing = Tracing.from_settings(f"http://127.0.0.1:{server.server_port}", service_name="baton-test")
        asyncio.run(run_one(make_router(tracing), request(traceparent=PARENT)))  # router.stop() flushes
        wait_until(lambda: received, timeout_s=10)
    finally:
        server.shutdown()
    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {s.trace_id.hex() for s in spans} == {TRACE_ID}
    assert "baton.request" in {s.name for s in spans}
    attrs = {a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes}
    assert attrs["service.name"] == "baton-test"
