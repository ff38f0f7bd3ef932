"""The Grafana dashboard, its ConfigMap and the Ray PodMonitor in the chart (real helm), and the
dashboard's queries against the metrics RouterMetrics exports (every name it reads is one a router
exposes; tests/e2e/test_observability.py checks the same against a live cluster's /metrics)."""

from __future__ import annotations

import json

import yaml
from prometheus_client.parser import text_string_to_metric_families

from baton.config import BatonConfig
from engine.request import FinishReason
from engine.worker_stats import WorkerLoad
from router.metrics import RouterMetrics
from tests.deploy.chart import RELEASE, baton_config, by_kind, manifest_errors, one, render, requires_helm
from tests.deploy.dashboard import DASHBOARD, DASHBOARD_LINK, load, metric_names, queries

FULLNAME = f"{RELEASE}-baton"
ON = (
    "grafana.dashboards=true",
    "podMonitor.enabled=true",
    "podMonitor.labels.release=prom",
    "grafana.annotations.grafana_folder=Baton",
)


def sample_names(exposition: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def test_the_dashboard_is_one_file_with_well_formed_panels() -> None:
    assert DASHBOARD_LINK.resolve() == DASHBOARD.resolve()
    d = load()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in d["panels"]}
    for wanted in (
        "Time to first token",
        "Time per output token",
        "Inter-token latency",
        "Queue depth by lane (router)",
        "Admission rejections by lane and reason",
        "SLO attainment by lane",
        "KV cache usage by pool",
        "Prefix cache hit rate by pool",
        "Transfer latency (decode side)",
        "Transfer failures",
        "Worker restarts",
    ):
        assert wanted in titles
    for p in d["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].count("(") == t["expr"].count(")")
    assert all(n.startswith("baton_") for q in queries(d) for n in metric_names(q))


def test_every_metric_the_dashboard_reads_is_exported() -> None:
    m = RouterMetrics(
        "m",
        loads=lambda: [
            WorkerLoad("p0", "i", "prefill", 0, 0, 10, 10, 0),
            WorkerLoad("d0", "i", "decode", 0, 0, 10, 10, 0),
        ],
        slos={"interactive": (1.0, 0.1)},
        workers=[("prefill", "p0"), ("decode", "d0")],
    )
    m.request_finished("interactive", FinishReason.LENGTH, 10, 4, 0.5, 0.8)
    m.token_gaps("interactive", [0.1])
    m.queued("interactive", 0.01, 0.0)
    m.ttft_breakdown("interactive", {"router_queue": 0.01, "transfer": 0.02})
    m.rejection("interactive", "queue_full")
    m.set_lane_gauges({"interactive": 0}, {"interactive": 0})
    exposed = sample_names(m.exposition()[0].decode())
    wanted = {n for q in queries(load()) for n in metric_names(q)}
    assert wanted - exposed == set()


def test_slo_attainment_and_tpot() -> None:
    m = RouterMetrics("m", slos={"interactive": (1.0, 0.1)})
    m.request_finished("interactive", FinishReason.LENGTH, 10, 5, 0.5, 0.9)  # TPOT 0.1: both met
    m.request_finished("interactive", FinishReason.LENGTH, 10, 5, 2.0, 3.0)  # TPOT 0.25: neither
    m.request_finished("interactive", FinishReason.LENGTH, 10, 1, 0.5, 0.5)  # one token: no TPOT
    values = {
        (s.name, s.labels.get("slo")): s.value
        for f in text_string_to_metric_families(m.exposition()[0].decode())
        for s in f.samples
    }
    assert values[("baton_requests_slo_met_total", "ttft")] == 2
    assert values[("baton_requests_slo_met_total", "tpot")] == 1
    assert values[("baton_time_per_output_token_seconds_count", None)] == 2
    assert values[("baton_time_to_first_token_seconds_count", None)] == 3


@requires_helm
def test_dashboard_configmap_and_podmonitor_are_optional() -> None:
    docs = render(sets=())
    assert not by_kind(docs, "PodMonitor")
    assert all("grafana_dashboard" not in (d["metadata"].get("labels") or {}) for d in by_kind(docs, "ConfigMap"))


@requires_helm
def test_dashboard_configmap_and_podmonitor_render_and_validate() -> None:
    docs = render(sets=ON)
    assert [e for d in docs for e in manifest_errors(d)] == []
    cm = one(docs, "ConfigMap", f"{FULLNAME}-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Baton"}
    assert json.loads(cm["data"]["baton.json"]) == load()
    pm = one(docs, "PodMonitor", f"{FULLNAME}-ray")
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["selector"]["matchLabels"]["ray.io/cluster"] == FULLNAME
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    # every Ray pod of the release carries the selector's labels; other pods (Redis) do not
    selector = pm["spec"]["selector"]["matchLabels"]
    rc = one(docs, "RayCluster", FULLNAME)
    templates = [rc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in rc["spec"]["workerGroupSpecs"]]
    for t in templates:  # (KubeRay adds ray.io/cluster itself)
        labels = {**t["metadata"]["labels"], "ray.io/cluster": rc["metadata"]["name"]}
        assert all(labels.get(k) == v for k, v in selector.items())


@requires_helm
def test_tracing_settings_pass_through_to_baton() -> None:
    docs = render(
        set_jsons=('baton.observability={"otlp_endpoint": "http://otel-collector:4318", "sample_ratio": 0.25}',)
    )
    cfg = baton_config(docs)
    assert cfg["observability"] == {"otlp_endpoint": "http://otel-collector:4318", "sample_ratio": 0.25}
    assert BatonConfig.model_validate(yaml.safe_load(yaml.safe_dump(cfg))).observability.sample_ratio == 0.25
