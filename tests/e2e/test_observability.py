"""Tracing and the dashboard against the whole stack (``baton up`` in-process: real Ray with one
prefill and one decode worker, each its own process, the tiny model, HTTP and gRPC on loopback):

- one trace per request, joined to the client's ``traceparent`` (HTTP header, gRPC metadata), with
  the router's spans and the prefill and decode workers' stages in request order, the stages equal
  to the TTFT breakdown the router records in ``baton_ttft_breakdown_seconds``;
- every metric the Grafana dashboard queries is in a live ``/metrics``."""

from __future__ import annotations

import grpc
import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from baton.config import load_config
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pbg
from router.tracing import Tracing
from tests.deploy.dashboard import load, metric_names, queries
from tests.e2e.server_thread import ServerThread
from tests.router.spans import attrs, end, in_order, start
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
LIMITED_KEY = "sk-obs-limited"
STAGES = ("router_queue", "prefill_queue", "prefill_compute", "transfer", "decode_queue")
SPAN_OF_STAGE = {
    "router_queue": "router.lane_queue",
    "prefill_queue": "prefill.queue",
    "prefill_compute": "prefill.compute",
    "transfer": "kv_transfer",
    "decode_queue": "decode.queue",
}


@pytest.fixture(scope="module")
def srv(ray_session, tiny_model_dir):
    cfg = load_config(
        overrides={
            "model.path": str(tiny_model_dir),
            "model.served_name": "tiny",
            "engine.max_num_seqs": 8,
            "engine.max_num_batched_tokens": 256,
            "engine.kv_cache_memory_gb": 0.25,
            "router.http_port": 0,
            "router.grpc_port": 0,
            "pools.prefill.workers": 1,
            "pools.decode.workers": 1,
            "pools.local_prefill_threshold": 0,
            "pools.max_restarts": 0,  # every prompt through the prefill worker
            "tenants": [{"name": "limited", "api_key": {"value": LIMITED_KEY}, "requests_per_min": 1}],
        }
    )
    s = ServerThread(cfg).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def exporter(srv) -> InMemorySpanExporter:
    e = InMemorySpanExporter()
    srv.router.tracing = Tracing(e, batch=False)  # the in-memory exporter in place of OTLP
    return e


def stage_sums(srv) -> dict[str, float]:
    text = httpx.get(f"{srv.http}/metrics").text
    out = dict.fromkeys(STAGES, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "baton_ttft_breakdown_seconds_sum":
                out[s.labels["stage"]] += s.value
    return out


def trace_spans(exporter: InMemorySpanExporter, trace_id: str) -> dict[str, ReadableSpan]:
    spans = [s for s in exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    out = {s.name: s for s in spans}
    assert len(out) == len(spans), [s.name for s in spans]
    return out


def test_one_trace_across_the_router_and_both_workers(srv, exporter) -> None:
    before = stage_sums(srv)
    r = httpx.post(
        f"{srv.http}/v1/completions",
        timeout=60,
        headers={"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"},
        json={"model": "tiny", "prompt": "trace me through both pools", "max_tokens": 5},
    )
    assert r.status_code == 200, r.text
    wait_until(lambda: "baton.request" in trace_spans(exporter, TRACE_ID), timeout_s=10)
    after = stage_sums(srv)
    spans = trace_spans(exporter, TRACE_ID)
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
    root = spans["baton.request"]
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"
    assert attrs(root)["baton.completion_tokens"] == 5
    # The stages ran in the two worker processes: the prefill worker, then the decode worker.
    p_id, d_id = srv.router.pool.prefill[0].worker_id, srv.router.pool.decode[0].worker_id
    assert p_id != d_id
    for name in ("prefill.queue", "prefill.compute"):
        assert attrs(spans[name])["baton.worker"] == p_id and attrs(spans[name])["baton.role"] == "prefill"
    for name in ("decode.queue", "decode.generate"):
        assert attrs(spans[name])["baton.worker"] == d_id and attrs(spans[name])["baton.role"] == "decode"
    assert spans["router.dispatch"].attributes == {"baton.prefill_worker": p_id, "baton.decode_worker": d_id}
    # In request order, each within the request.
    in_order(spans, ["router.admission", "router.lane_queue", "router.dispatch"])
    in_order(
        spans,
        ["router.lane_queue", "prefill.queue", "prefill.compute", "kv_transfer", "decode.queue", "decode.generate"],
    )
    for s in spans.values():
        assert start(root) <= start(s) <= end(s) <= end(root), s.name
    # The spans are the TTFT breakdown the router recorded for this request (to rounding).
    for stage, name in SPAN_OF_STAGE.items():
        recorded = after[stage] - before[stage]
        assert recorded > 0 or stage == "router_queue", stage
        assert abs((end(spans[name]) - start(spans[name])) / 1e9 - recorded) < 1e-5, (stage, recorded)


def test_grpc_metadata_traceparent_is_honoured(srv, exporter) -> None:
    trace_id = "1bf92f3577b34da6a3ce929d0e0e4736"
    with grpc.insecure_channel(srv.grpc) as ch:
        msgs = list(
            pbg.GenerationStub(ch).Generate(
                pb.GenerateRequest(text="grpc trace", sampling=pb.SamplingParameters(max_tokens=3)),
                metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),),
                timeout=60,
            )
        )
    assert msgs[-1].finished
    wait_until(lambda: "baton.request" in trace_spans(exporter, trace_id), timeout_s=10)
    assert {"prefill.compute", "kv_transfer", "decode.generate"} <= set(trace_spans(exporter, trace_id))


def test_every_metric_the_dashboard_queries_is_in_a_live_scrape(srv) -> None:
    headers = {"Authorization": f"Bearer {LIMITED_KEY}"}
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
    assert httpx.post(f"{srv.http}/v1/completions", json=body, headers=headers, timeout=60).status_code == 200
    assert httpx.post(f"{srv.http}/v1/completions", json=body, headers=headers, timeout=60).status_code == 429
    text = httpx.get(f"{srv.http}/metrics").text
    exposed = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    wanted = {n for q in queries(load()) for n in metric_names(q)}
    assert len(wanted) > 20
    assert wanted - exposed == set()
