"""``baton.perf.profile.speed``: the machine's speed now against a cost model (a real engine on the tiny model)."""

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from baton.perf.profile.speed import PROBES, ProbePoint, SpeedProbe, mean_probe, measure_speed, ratios
from baton.perf.profile.synthetic import synthetic_cost_model

ROOT = Path(__file__).resolve().parents[4]


def test_ratios_are_the_geometric_mean_per_kind():
    pts = [
        ProbePoint("d1", "decode", 0.02, 0.01),
        ProbePoint("d2", "decode", 0.01, 0.02),
        ProbePoint("p1", "prefill", 0.3, 0.2),
    ]
    decode, prefill = ratios(pts)
    assert decode == pytest.approx(1.0) and prefill == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no prefill point"):
        ratios(pts[:2])


def test_probe_json_round_trip_and_validation():
    p = SpeedProbe(
        1.25, 0.97, "2026-11-22T08:00:00+00:00", 123.0, 8.1, (ProbePoint("decode 1x64", "decode", 0.03, 0.024),)
    )
    assert SpeedProbe.from_json(p.to_json()) == p
    with pytest.raises(ValueError, match="not a speed probe"):
        SpeedProbe.from_json({"schema": "baton.cost_model/1"})
    with pytest.raises(ValueError, match="decode must be a finite number > 0"):
        SpeedProbe(0.0, 1.0)
    with pytest.raises(ValueError, match="prefill must be a finite number > 0"):
        SpeedProbe(1.0, math.nan)


def test_mean_probe_averages_the_probes_around_a_run():
    assert mean_probe([]) is None
    m = mean_probe([SpeedProbe(1.2, 1.0, "a", 10.0, 8.0), SpeedProbe(1.4, 1.1, "a", 200.0, 7.0)])
    assert (m.decode, m.prefill, m.reference, m.at_unix, m.seconds) == pytest.approx((1.3, 1.05, "a", 10.0, 15.0))
    with pytest.raises(ValueError, match="different cost models"):
        mean_probe([SpeedProbe(1.2, 1.0, "a"), SpeedProbe(1.2, 1.0, "b")])


def _tiny_cost(tiny_model_dir, per_token_s: float):
    cm = synthetic_cost_model(const_s=0.001, per_token_s=per_token_s, vocab_size=4096)
    return replace(cm, model=replace(cm.model, spec=str(tiny_model_dir), num_layers=4))


def test_a_probe_times_real_steps_and_compares_them_with_the_cost_model(tiny_model_dir):
    cost = _tiny_cost(tiny_model_dir, per_token_s=1e-4)
    probe = measure_speed(cost, repeats=2)
    assert [pt.label for pt in probe.points] == [f"{k} {a}x{b}" for k, a, b in PROBES]
    assert all(pt.measured_s > 0 and pt.predicted_s > 0 for pt in probe.points)
    assert (probe.decode, probe.prefill) == pytest.approx(ratios(list(probe.points)))
    assert probe.reference == cost.created and probe.seconds > 0
    # the predictions are the cost model's for the shapes the engine ran: const + 1e-4 s per token
    # (decode: one token per row; prefill: the new tokens), times the typical/fastest ratio
    want = [(0.001 + 1e-4 * a) * cost.typical_over_fastest for k, a, _ in PROBES]
    assert [pt.predicted_s for pt in probe.points] == pytest.approx(want, rel=1e-9)


def test_a_probe_refuses_a_cost_model_of_another_model(tiny_model_dir):
    cost = synthetic_cost_model()  # one layer, 1000 tokens: not the tiny model
    cost = replace(cost, model=replace(cost.model, spec=str(tiny_model_dir)))
    with pytest.raises(ValueError, match="is not the cost model's"):
        measure_speed(cost, repeats=1)


def test_speed_cli_errors_name_the_problem(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "baton.perf.profile.speed", "--cost-model", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and "none.json" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "baton.perf.profile.speed", "--cost-model", "x", "--repeats", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and "--repeats must be >= 1" in r.stderr
