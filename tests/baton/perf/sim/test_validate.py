"""``python -m baton.perf.sim.validate``: replaying an experiment report through the simulator."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from baton.perf.loadgen.workload import load_workload
from baton.perf.profile.synthetic import synthetic_cost_model
from baton.perf.sim.cli import sim_requests
from baton.perf.sim.config import SimConfig
from baton.perf.sim.simulator import Simulation
from baton.perf.sim.validate import compare

ROOT = Path(__file__).resolve().parents[4]


def _experiment(cost, decode_scale: float = 1.0, prefill_scale: float = 1.0) -> dict:
    """An experiment report whose "measurements" are the simulator's own predictions (on a machine
    whose decode and prefill steps take ``decode_scale`` / ``prefill_scale`` times the cost model's)."""
    spec = load_workload("sharegpt")
    setups = {}
    for name, p, d in (("colocated", 0, 2), ("disaggregated", 1, 1)):
        runs = []
        for rate in (2.0, 4.0):
            reqs = sim_requests(spec, rate, 20.0, 0, cost.model.max_model_len)
            cfg = SimConfig(
                prefill_workers=p,
                decode_workers=d,
                slo_rejection=False,
                step_scale=decode_scale,
                prefill_step_scale=prefill_scale,
            )
            res = Simulation(cost, cfg).run(
                reqs, duration_s=20.0, rate=rate, drain_s=20.0, warmup_s=2.0, lanes=list(spec.lanes)
            )
            runs.append(
                {
                    "config": {
                        "mode": "open",
                        "rate": rate,
                        "duration_s": 20.0,
                        "warmup_s": 2.0,
                        "seed": 0,
                        "burst": None,
                        "workload": spec.to_dict(),
                        "slos": {},
                    },
                    "summary": res.summary["summary"],
                    "lanes": res.summary["lanes"],
                }
            )
        overrides = {"router.slo_rejection": False, "pools.prefill.workers": p, "pools.decode.workers": d}
        setups[name] = {"setup": {"name": name, "overrides": overrides, "static_batch_size": None}, "runs": runs}
    return {
        "schema": "baton.bench.experiment/1",
        "command": "python -m bench.experiments.x --drain 20",
        "setups": setups,
    }


def test_replaying_the_simulators_own_predictions_matches_exactly():
    cost = synthetic_cost_model(const_s=0.03, per_token_s=0.002)
    rows = compare(cost, _experiment(cost))
    assert [(r["setup"], r["rate"]) for r in rows] == [
        ("colocated", 2.0),
        ("colocated", 4.0),
        ("disaggregated", 2.0),
        ("disaggregated", 4.0),
    ]
    for r in rows:
        assert r["within"] and all(e == 0 for e in r["errors"].values()), r
    slower = compare(cost, _experiment(cost), step_scale=1.5)
    assert not any(r["within"] for r in slower)
    assert all(r["errors"]["itl_s.p50"] > 0.3 for r in slower)


def test_validate_cli(tmp_path):
    cost = synthetic_cost_model(const_s=0.03, per_token_s=0.002)
    cm, exp = tmp_path / "cm.json", tmp_path / "exp.json"
    cost.save(cm)
    exp.write_text(json.dumps(_experiment(cost)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "baton.perf.sim.validate",
            "--cost-model",
            str(cm),
            "--experiment",
            str(exp),
            "--json",
            str(tmp_path / "v.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "4 of 4 runs have p50 and p90 TTFT and ITL within 20%" in r.stdout
    assert json.loads((tmp_path / "v.json").read_text())["schema"] == "baton.sim.validate/1"
    exp.write_text(json.dumps({"schema": "other"}))
    r = subprocess.run(
        [sys.executable, "-m", "baton.perf.sim.validate", "--cost-model", str(cm), "--experiment", str(exp)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and "not an experiment report" in r.stderr


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--json", "/nonexistent/v.json"], "the directory /nonexistent does not exist"),  # a traceback after the run
        (["--band", "1"], "--band must be in [0, 1)"),
        (["--tolerance", "-1"], "--tolerance must be a finite number >= 0"),
        (["--step-scale", "inf"], "--step-scale must be a finite number > 0"),
    ],
)
def test_validate_refuses_bad_flags_before_simulating(tmp_path, capsys, flags, words):
    from baton.perf.sim.validate import main

    cm, exp = tmp_path / "cm.json", tmp_path / "exp.json"
    synthetic_cost_model().save(cm)
    exp.write_text("{}")
    assert main(["--cost-model", str(cm), "--experiment", str(exp), *flags]) == 2
    assert words in capsys.readouterr().err


def test_a_repeat_measurement_shows_the_noise_floor(tmp_path):
    from baton.perf.sim.validate import format_repeat, repeat_errors

    cost = synthetic_cost_model(const_s=0.03, per_token_s=0.002)
    exp = _experiment(cost)
    again = json.loads(json.dumps(exp))
    run = again["setups"]["colocated"]["runs"][1]
    run["summary"]["itl_s"]["p50"] *= 1.3  # the second measurement's ITL p50 came out 30% higher
    diffs = repeat_errors(exp, again)
    itl_error = diffs[("colocated", 4.0)]["itl_s.p50"]
    assert itl_error is not None and abs(itl_error - 0.3) < 1e-9
    assert diffs[("disaggregated", 2.0)] == {k: 0.0 for k in diffs[("disaggregated", 2.0)]}
    del again["setups"]["disaggregated"]
    assert ("disaggregated", 2.0) not in repeat_errors(exp, again)
    rows = [{"setup": s, "rate": r, "repeat": d} for (s, r), d in diffs.items()]
    assert "| colocated | 4 | +0% / +0% | +30% / +0% |" in format_repeat(rows)


def _probe(cost, decode: float, prefill: float) -> dict:
    from baton.perf.profile.speed import SpeedProbe

    return SpeedProbe(decode, prefill, cost.created, 1.0, 8.0).to_json()


def test_runs_are_replayed_on_the_machine_their_speed_probes_measured():
    cost = replace(synthetic_cost_model(const_s=0.03, per_token_s=0.002), created="profile-1")
    exp = _experiment(cost, decode_scale=1.3, prefill_scale=1.1)  # the machine was slower during the runs
    blind = compare(cost, exp)
    assert not any(r["within"] for r in blind) and all(r["speed"] is None for r in blind)
    for setup in exp["setups"].values():
        for run in setup["runs"]:  # probes before and after: the run saw their mean
            run["speed"] = {"before": _probe(cost, 1.2, 1.0), "after": _probe(cost, 1.4, 1.2)}
    rows = compare(cost, exp)
    for r in rows:
        assert r["speed"] == pytest.approx({"decode": 1.3, "prefill": 1.1})
        assert r["within"] and all(abs(e) < 1e-9 for e in r["errors"].values()), r
    assert not any(r["within"] for r in compare(cost, exp, use_speed=False))
    # probes taken against another profile do not calibrate this one
    with pytest.raises(ValueError, match="speed probes compare with the cost model created"):
        compare(replace(cost, created="profile-2"), exp)
