"""The host model: the rest of the stack's CPU, fitted from experiment runs, and what it does to steps."""

import json

import pytest

from baton.perf.profile.cost_model import CostModel
from baton.perf.profile.fit_host import main
from baton.perf.profile.host import HostModel, HostSample, fit_host, samples_from_experiment
from baton.perf.profile.synthetic import synthetic_cost_model
from baton.perf.sim.config import SimConfig
from baton.perf.sim.requests import SimRequest
from baton.perf.sim.simulator import simulate
from baton.perf.sim.worker import Host


def test_fit_recovers_base_and_per_token_cost():
    truth = HostModel(2, base_cores=0.12, cpu_s_per_token=0.004)
    samples = [
        HostSample(w, truth.base_cores * w + truth.cpu_s_per_token * t, t, t // 60)
        for w, t in ((140.0, 1500), (140.0, 3100), (141.0, 4700), (60.0, 900))
    ]
    got = fit_host(samples, cores=2)
    assert got.base_cores == pytest.approx(0.12, rel=1e-6)
    assert got.cpu_s_per_token == pytest.approx(0.004, rel=1e-6)


def test_fit_never_returns_a_negative_cost():
    # more tokens, less CPU: no non-negative line through both; keep one parameter, never < 0
    got = fit_host([HostSample(100.0, 30.0, 1000, 10), HostSample(100.0, 10.0, 5000, 50)], cores=2)
    assert got.base_cores >= 0 and got.cpu_s_per_token >= 0
    with pytest.raises(ValueError, match="no run with CPU"):
        fit_host([], cores=2)


def test_stretch_is_fair_sharing_once_demand_exceeds_the_cores():
    h = HostModel(2, base_cores=0.1, cpu_s_per_token=0.01)
    assert h.stretch(1, 0.5) == 1.0  # 1.5 cores wanted of 2
    assert h.stretch(2, 0.0) == 1.0
    assert h.stretch(2, 0.5) == pytest.approx(1.25)
    assert h.demand_cores(tokens_per_s=40, requests_per_s=1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="cores"):
        HostModel(0)
    with pytest.raises(ValueError, match="cpu_s_per_token"):
        HostModel(2, cpu_s_per_token=-1.0)


def test_the_sim_host_counts_only_the_recent_window():
    host = Host(HostModel(1, cpu_s_per_token=0.01), window_s=2.0)
    host.note_tokens(0.5, 100)  # 50 tokens/s over the window: 0.5 cores
    assert host.stretch(1.0, 1) == pytest.approx(1.5)
    assert host.stretch(3.0, 1) == 1.0  # out of the window
    assert Host().stretch(1.0, 5) == 1.0  # no model: the workers have the host to themselves


def test_a_busy_host_stretches_the_steps_of_two_busy_workers():
    reqs = [SimRequest(i, 0.0, "interactive", 32, 40) for i in range(2)]
    cfg = SimConfig(prefill_workers=0, decode_workers=2, slo_rejection=False)
    alone = simulate(synthetic_cost_model(const_s=0.04), cfg, reqs)
    # 0.004 CPU s per token: two workers streaming ~45 tokens/s ask for 0.18 more cores
    busy = simulate(synthetic_cost_model(const_s=0.04, host=HostModel(2, 0.2, 0.004)), cfg, reqs)
    a, b = alone.summary["summary"]["itl_s"]["p50"], busy.summary["summary"]["itl_s"]["p50"]
    assert 1.10 < b / a < 1.25
    # the same host with one worker busy leaves room: no stretch
    one = SimConfig(prefill_workers=0, decode_workers=1, slo_rejection=False)
    a1 = simulate(synthetic_cost_model(const_s=0.04), one, reqs[:1]).records[0].itl_s
    b1 = simulate(synthetic_cost_model(const_s=0.04, host=HostModel(2, 0.2, 0.004)), one, reqs[:1]).records[0].itl_s
    assert b1 == pytest.approx(a1)


def _experiment(runs):
    return {
        "schema": "baton.bench.experiment/1",
        "machine": {"cpus": 2},
        "setups": {
            "s": {
                "runs": [
                    {
                        "cpu": {
                            "wall_s": w,
                            "cpu_s": {"router": r, "redis": 0.5, "ray": 1.0, "client": c, "decode_worker": 99.0},
                        },
                        "requests": [{"output_tokens": tokens // 10}] * 10,
                    }
                    for w, r, c, tokens in runs
                ]
                + [{"requests": []}]
            }
        },
    }  # a run from before the meter: skipped


def test_samples_count_everything_but_the_workers():
    s = samples_from_experiment(_experiment([(100.0, 5.0, 2.0, 1000)]))
    assert s == [HostSample(100.0, 8.5, 1000, 10)]


def test_cli_adds_the_host_model_to_the_cost_model(tmp_path, capsys):
    cm = tmp_path / "cm.json"
    synthetic_cost_model().save(cm)
    exp = tmp_path / "exp.json"
    # host CPU = 0.1 x wall + 0.005 x tokens
    exp.write_text(json.dumps(_experiment([(100.0, 10.0 + 5 - 1.5, 0.0, 1000), (100.0, 10.0 + 15 - 1.5, 0.0, 3000)])))
    assert main(["--cost-model", str(cm), "--from", str(exp)]) == 0
    host = CostModel.load(cm).host
    assert host.cores == 2
    assert host.base_cores == pytest.approx(0.1) and host.cpu_s_per_token == pytest.approx(0.005)
    assert "5.00 ms CPU per output token" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "baton.bench.experiment/1", "machine": {"cpus": 2}, "setups": {}}))
    assert main(["--cost-model", str(cm), "--from", str(bad)]) == 2
    assert "no run with CPU" in capsys.readouterr().err


def test_the_workers_cpu_outside_their_steps_counts_as_host_demand():
    doc = _experiment([(100.0, 5.0, 2.0, 1000)])
    run = doc["setups"]["s"]["runs"][0]
    run["workers"] = {"decode/d": {"busy_cpu_s": 95.0}}  # of the worker process's 99 CPU seconds
    assert samples_from_experiment(doc) == [HostSample(100.0, 12.5, 1000, 10)]
