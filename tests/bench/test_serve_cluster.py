"""The load generator against a real cluster: an experiment server (``BatonServer`` in a child
process: Redis, Ray pools, router) with the tiny model, driven over HTTP and gRPC; and the
experiment setups' configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.perf.loadgen.runner import RunConfig, run_load_sync
from baton.perf.loadgen.workload import load_workload
from bench.experiments.server import ExperimentServer, ServerSetup, StaticBatchingConfig


def test_setups_build_the_configs_they_name() -> None:
    colocated = ServerSetup("c", {"pools.prefill.workers": 0, "pools.decode.workers": 2}).config()
    assert colocated.pools.prefill.workers == 0 and colocated.pools.decode.workers == 2
    assert colocated.router.http_port == 0 and colocated.router.grpc_port == 0  # free ports
    assert colocated.engine_config().scheduler.policy == "continuous"
    static = ServerSetup("s", {"router.slo_rejection": False}, static_batch_size=8).config()
    assert isinstance(static, StaticBatchingConfig) and not static.router.slo_rejection
    assert static.engine_config().scheduler.policy == "static"
    assert static.engine_config().scheduler.static_batch_size == 8
    with pytest.raises(ValueError, match="pools"):
        ServerSetup("bad", {"pools.decode.workers": 0}).config()


@pytest.mark.slow
def test_http_and_grpc_against_a_tiny_cluster(tiny_model_dir: Path) -> None:
    spec = load_workload("mixed")
    # No SLO rejections: on a loaded host the router would rightly refuse some interactive requests,
    # and this checks the load generator's two protocols, not admission
    setup = ServerSetup("tiny", {"model.path": str(tiny_model_dir), "router.slo_rejection": False})
    with ExperimentServer(setup, say=lambda m: None) as ep:
        http = run_load_sync(
            RunConfig(url=ep.http_url, spec=spec, rate=3.0, duration_s=3.0, progress=False, metrics_interval_s=0.25)
        )
        grpc = run_load_sync(
            RunConfig(
                url=ep.grpc_target,
                protocol="grpc",
                metrics_url=f"{ep.http_url}/metrics",
                spec=spec,
                rate=3.0,
                duration_s=2.0,
                progress=False,
            )
        )
    for result in (http, grpc):
        assert result.records and all(r.status == "ok" for r in result.records), [
            r.to_dict() for r in result.records if r.status != "ok"
        ]
        assert all(r.output_tokens == r.output_len for r in result.records)  # ignore_eos + max_tokens honoured
        assert {r.served_lane for r in result.records} <= {"interactive", "batch"}
        assert result.summary().ttft_s.n == len(result.records)
        scraped = [s for s in result.timeseries if s.scraped]
        assert scraped and {"interactive", "batch"} <= set(scraped[-1].waiting)
        assert any(w.startswith("decode/") for w in scraped[-1].kv_usage)
    assert http.server.model == ep.model
