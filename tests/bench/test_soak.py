"""The soak (bench/soak.py), its 40-second variant: ``baton up`` (1 prefill, 2 decode workers, the
tiny model) under mixed interactive/batch load while the fault injector kills a worker every ~15 s
and the embedded Redis once; nothing lost, no stream hung or off by a token, no KV block held, no
RSS growth. (``make soak`` runs the 10-minute one.) Plus the report's parts on their own."""

from __future__ import annotations

import pytest

from bench.soak import SoakConfig, run_soak
from bench.soak_checks import worker_gauges
from bench.soak_load import LoadSpec
from bench.soak_processes import Proc, RssTrack


def test_rss_growth_is_measured_per_process_after_its_warm_up():
    track = RssTrack(warmup_s=10, load_start=1000.0)
    router, restarted, redis = Proc(1, "router", 900.0), Proc(2, "decode", 1030.0), Proc(3, "redis", 900.0)
    for now, rss in ((1005, 50), (1010, 100), (1020, 104), (1040, 108)):  # the router: 8% after warm-up
        track.samples.setdefault(router, []).append((now - 1000, rss))
    track.samples[restarted] = [(5, 10), (12, 200)]  # one sample after its own warm-up: not measured
    track.samples[redis] = [(10, 100), (20, 300)]  # its data, not Baton's memory
    assert track.growth() == {"router/1": pytest.approx(0.08)}


def test_worker_gauges_are_read_from_the_routers_metrics():
    text = (
        'baton_kv_cache_usage_ratio{role="decode",worker="decode-0",model="m"} 0.25\n'
        'baton_worker_requests_running{role="decode",worker="decode-0",model="m"} 0.0\n'
        'baton_worker_requests_waiting{role="prefill",worker="prefill-0",model="m"} 1.0\n'
    )
    assert worker_gauges(text) == {"decode-0": {"kv_usage": 0.25, "running": 0.0}, "prefill-0": {"waiting": 1.0}}


@pytest.mark.slow
def test_forty_seconds_of_mixed_load_with_workers_killed_and_redis_restarted_loses_nothing():
    # 40 s of load: two worker kills at most 37.5 s in (15 s apart, +-25%) and Redis at 20 s; RSS growth
    # from 20 s on.
    cfg = SoakConfig(
        duration_s=40,
        kill_every_s=15,
        warmup_s=20,
        seed=7,
        load=LoadSpec(interactive_rate=1.5, batch_rate=0.4, batch_patience_s=300, seed=7),
    )
    report = run_soak(cfg, say=lambda m: None)
    assert report.passed, report.failures
    kills = [f for f in report.faults if f["what"] in ("kill prefill", "kill decode")]
    assert len(kills) >= 2 and any(f["what"] == "kill redis" for f in report.faults), report.faults
    assert report.counts["stream"].get("finished", 0) > 0 and report.counts["batch"].get("finished", 0) > 0
