"""Serving workloads: arrival processes, bursts, length distributions, lane mixes, prefix groups,
prompts, and workload-file parsing (pure Python, milliseconds)."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest

from baton.perf.loadgen.arrivals import Burst, PlannedRequest, plan_requests, sample_requests
from baton.perf.loadgen.prompts import DEFAULT_TOKEN_RANGE, PromptFactory, clip_prompt_len
from baton.perf.loadgen.workload import BUILTIN_WORKLOADS, LengthDist, WorkloadSpec, load_workload, workload_from_dict

FIXED = WorkloadSpec("t", {"interactive": 1.0}, LengthDist.fixed(10), LengthDist.fixed(5))


def _gaps(plan: list[PlannedRequest]) -> list[float]:
    times = [r.arrival_s for r in plan]
    return [b - a for a, b in itertools.pairwise(times)]


# -- arrivals -------------------------------------------------------------------------------------
def test_poisson_mean_rate_and_cv() -> None:
    plan = plan_requests(FIXED, rate=5.0, duration_s=4000.0, seed=3)
    assert len(plan) / 4000.0 == pytest.approx(5.0, rel=0.03)
    gaps = _gaps(plan)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    assert all(0 <= r.arrival_s < 4000.0 for r in plan)
    assert [r.arrival_s for r in plan] == sorted(r.arrival_s for r in plan)
    assert [r.index for r in plan] == list(range(len(plan)))


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_keeps_the_rate_and_sets_the_burstiness(shape: float) -> None:
    spec = WorkloadSpec(
        "g", {"interactive": 1.0}, LengthDist.fixed(1), LengthDist.fixed(1), arrival="gamma", gamma_shape=shape
    )
    plan = plan_requests(spec, rate=4.0, duration_s=5000.0, seed=1)
    assert len(plan) / 5000.0 == pytest.approx(4.0, rel=0.05)
    gaps = _gaps(plan)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1 / shape**0.5, rel=0.08)


def test_burst_multiplies_the_rate_only_inside_its_window() -> None:
    burst = Burst(factor=3.0, start_s=1000.0, length_s=1000.0)
    plan = plan_requests(FIXED, rate=2.0, duration_s=3000.0, seed=5, burst=burst)
    count = lambda a, b: sum(1 for r in plan if a <= r.arrival_s < b)  # noqa: E731
    assert count(0, 1000) / 1000 == pytest.approx(2.0, rel=0.06)
    assert count(1000, 2000) / 1000 == pytest.approx(6.0, rel=0.06)
    assert count(2000, 3000) / 1000 == pytest.approx(2.0, rel=0.06)


def test_a_burst_past_the_end_or_of_factor_one_changes_nothing() -> None:
    plain = plan_requests(FIXED, 3.0, 50.0, seed=2)
    same = plan_requests(FIXED, 3.0, 50.0, seed=2, burst=Burst(1.0, 10.0, 10.0))
    assert [r.arrival_s for r in same] == pytest.approx([r.arrival_s for r in plain], abs=1e-9)
    assert plan_requests(FIXED, 3.0, 50.0, seed=2, burst=Burst(4.0, 60.0, 10.0)) == plain


def test_plans_are_deterministic_and_the_rate_does_not_change_the_requests() -> None:
    spec = load_workload("mixed")
    a = plan_requests(spec, 2.0, 100.0, seed=7)
    assert a == plan_requests(spec, 2.0, 100.0, seed=7)
    assert a != plan_requests(spec, 2.0, 100.0, seed=8)
    b = plan_requests(spec, 4.0, 100.0, seed=7)
    content = lambda p: [(r.lane, r.prompt_len, r.output_len) for r in p]  # noqa: E731
    assert content(b)[: len(a)] == content(a)  # same requests, arriving twice as fast
    assert content(sample_requests(spec, len(a), seed=7)) == content(a)  # what closed-loop clients send


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rate"):
        plan_requests(FIXED, 0.0, 10.0)
    with pytest.raises(ValueError, match="duration"):
        plan_requests(FIXED, 1.0, -1.0)


def test_burst_parsing() -> None:
    assert Burst.parse("2:30:10") == Burst(2.0, 30.0, 10.0)
    with pytest.raises(ValueError, match="FACTOR:START:LEN"):
        Burst.parse("2:30")
    with pytest.raises(ValueError, match="--burst"):
        Burst.parse("x:1:2")
    with pytest.raises(ValueError, match="burst factor must be a finite number > 0"):
        Burst.parse("0:1:2")


@pytest.mark.parametrize(
    "rate, duration", [(float("inf"), 10.0), (float("nan"), 10.0), (1.0, float("inf")), (1.0, float("nan"))]
)
def test_plan_refuses_infinite_or_nan_rates_and_durations(rate: float, duration: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number"):  # was: looped forever, eating memory
        plan_requests(FIXED, rate, duration)


@pytest.mark.parametrize(
    "text, match",
    [
        ("inf:1:2", "burst factor must be a finite number > 0"),
        ("nan:1:2", "burst factor"),
        ("2:nan:1", "burst start must be a finite number >= 0"),
        ("2:inf:1", "burst start"),
        ("2:1:nan", "burst length must be a finite number >= 0"),
        ("2:1:inf", "burst length"),
    ],
)
def test_bursts_need_finite_values(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):  # a NaN start made plan_requests loop forever
        Burst.parse(text)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rate": float("inf")}, "rate must be a finite number > 0"),
        ({"rate": float("nan")}, "rate must be a finite number > 0"),
        ({"duration_s": float("inf")}, "duration must be a finite number > 0"),
        ({"duration_s": float("nan")}, "duration must be a finite number > 0"),
        ({"drain_s": -1.0}, "drain must be a finite number >= 0"),
        ({"drain_s": float("nan")}, "drain must be a finite number >= 0"),
        ({"drain_s": float("inf")}, "drain must be a finite number >= 0"),
    ],
)
def test_serving_run_config_refuses_values_that_hang_or_drop_requests(kwargs: dict, match: str) -> None:
    from baton.perf.loadgen.runner import RunConfig

    cfg = {"url": "http://127.0.0.1:1", "spec": FIXED, "rate": 1.0, "duration_s": 10.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        RunConfig(**cfg)
    RunConfig(**{**cfg, **{k: 1.0 for k in kwargs}})  # the same with a sane value is fine


# -- lengths, lanes, prefixes ---------------------------------------------------------------------
def test_length_distributions() -> None:
    rng = random.Random(0)
    assert {LengthDist.fixed(7).sample(rng) for _ in range(100)} == {7}
    u = [LengthDist.uniform(10, 20).sample(rng) for _ in range(20000)]
    assert min(u) == 10 and max(u) == 20
    assert statistics.fmean(u) == pytest.approx(15.0, abs=0.1)
    s = [LengthDist.sharegpt(mean=200, low=1, high=100000, sigma=0.9).sample(rng) for _ in range(40000)]
    assert statistics.fmean(s) == pytest.approx(200, rel=0.04)  # unclipped mean is the parameter
    assert statistics.median(s) < statistics.fmean(s)  # right-skewed, like ShareGPT turns
    clipped = [LengthDist.sharegpt(mean=200, low=50, high=300).sample(rng) for _ in range(5000)]
    assert min(clipped) == 50 and max(clipped) == 300


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "fixed", "value": 0}, "value >= 1"),
        ({"kind": "uniform", "low": 5, "high": 4}, "low <= high"),
        ({"kind": "sharegpt", "mean": 0, "low": 1, "high": 5}, "mean > 0"),
        ({"kind": "zipf"}, "kind"),
    ],
)
def test_length_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LengthDist(**kwargs)


def test_lane_shares_and_per_lane_lengths() -> None:
    spec = load_workload("mixed")
    plan = plan_requests(spec, 10.0, 2000.0, seed=0)
    batch = [r for r in plan if r.lane == "batch"]
    inter = [r for r in plan if r.lane == "interactive"]
    assert len(batch) / len(plan) == pytest.approx(0.3, abs=0.02)
    assert statistics.fmean(r.output_len for r in batch) > 1.5 * statistics.fmean(r.output_len for r in inter)
    assert spec.max_total_len() <= 8192


def test_prefix_groups_add_the_shared_prefix() -> None:
    spec = load_workload("shared-prefix")
    plan = plan_requests(spec, 5.0, 200.0, seed=0)
    assert {r.prefix_group for r in plan} == set(range(spec.prefix_groups))
    assert all(spec.prefix_len + 16 <= r.prompt_len <= spec.prefix_len + 64 for r in plan)
    assert all(r.prefix_group is None for r in plan_requests(FIXED, 5.0, 20.0))


def test_prompts_are_exact_shared_only_within_a_group_and_salted_per_run() -> None:
    spec = load_workload("shared-prefix")
    plan = plan_requests(spec, 5.0, 20.0, seed=0)
    f = PromptFactory(spec, salt=1)
    a, b = plan[0], next(r for r in plan[1:] if r.prefix_group == plan[0].prefix_group)
    other = next(r for r in plan if r.prefix_group != a.prefix_group)
    ia, ib, io = f.token_ids(a), f.token_ids(b), f.token_ids(other)
    assert len(ia) == a.prompt_len and len(ib) == b.prompt_len
    assert ia[: spec.prefix_len] == ib[: spec.prefix_len]
    assert ia[spec.prefix_len :] != ib[spec.prefix_len :]
    assert ia[:16] != io[:16]
    assert all(DEFAULT_TOKEN_RANGE[0] <= t < DEFAULT_TOKEN_RANGE[1] for t in ia)
    assert f.token_ids(a) == ia  # deterministic for a salt...
    assert PromptFactory(spec, salt=2).token_ids(a)[:16] != ia[:16]  # ...and new for another run
    assert len(f.token_ids(a, prompt_len=10)) == 10


def test_prompt_clipping_leaves_room_for_the_output() -> None:
    r = PlannedRequest(0, 0.0, "interactive", prompt_len=900, output_len=200, prefix_group=None)
    assert clip_prompt_len(r, None) == 900
    assert clip_prompt_len(r, 1000) == 800
    assert clip_prompt_len(r, 100) == 1


# -- workload files -------------------------------------------------------------------------------
def test_every_builtin_loads() -> None:
    for name in BUILTIN_WORKLOADS:
        spec = load_workload(name)
        assert spec.name == name and abs(sum(spec.lanes.values()) - 1) < 1e-9


def test_yaml_and_json_files(tmp_path) -> None:
    y = tmp_path / "w.yaml"
    y.write_text("""
name: mine
lanes: {interactive: 0.5, batch: 0.5}
input_len: {kind: uniform, low: 10, high: 20}
output_len: 16
prefix_groups: 2
prefix_len: 32
arrival: gamma
gamma_shape: 0.5
lane_output_len:
  batch: {kind: sharegpt, mean: 100, low: 10, high: 400}
""")
    spec = load_workload(str(y))
    assert spec.name == "mine" and spec.output_len == LengthDist.fixed(16) and spec.arrival == "gamma"
    assert spec.output_dist("batch").kind == "sharegpt" and spec.output_dist("interactive").value == 16
    j = tmp_path / "w2.json"
    j.write_text(json.dumps(spec.to_dict()))
    again = load_workload(str(j))
    assert again == spec
    lst = workload_from_dict({"lanes": ["a", "b"], "input_len": 5, "output_len": 5})
    assert lst.lanes == {"a": 0.5, "b": 0.5} and lst.name == "custom"


@pytest.mark.parametrize(
    "data, match",
    [
        ({"input_len": 5, "output_len": 5}, r"^lanes: required"),
        ({"lanes": {"a": 1}, "output_len": 5}, r"^input_len: required"),
        (
            {"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "colour": 1},
            r"unknown workload field\(s\) \['colour'\]",
        ),
        ({"lanes": {"a": 0.5}, "input_len": 5, "output_len": 5}, r"lanes: shares must sum to 1"),
        ({"lanes": {"a": -1, "b": 2}, "input_len": 5, "output_len": 5}, r"lanes: the share of lane 'a'"),
        ({"lanes": "a", "input_len": 5, "output_len": 5}, r"^lanes: expected a mapping"),
        ({"lanes": {"a": 1}, "input_len": {"kind": "zipf"}, "output_len": 5}, r"^input_len.kind: must be one of"),
        (
            {"lanes": {"a": 1}, "input_len": {"kind": "uniform", "low": 1}, "output_len": 5},
            r"^input_len.high: required",
        ),
        (
            {"lanes": {"a": 1}, "input_len": {"kind": "fixed", "value": "8"}, "output_len": 5},
            r"^input_len.value: expected an integer",
        ),
        (
            {"lanes": {"a": 1}, "input_len": 5, "output_len": {"kind": "fixed", "value": 1, "mode": 2}},
            r"^output_len: unknown field\(s\) \['mode'\]",
        ),
        ({"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "arrival": "uniform"}, r"^arrival: must be one of"),
        ({"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "gamma_shape": 0}, r"^gamma_shape: must be > 0"),
        ({"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "prefix_groups": 2}, r"^prefix_len: must be >= 1"),
        (
            {"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "prefix_groups": "2"},
            r"^prefix_groups: expected an integer",
        ),
        ({"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "streaming": "yes"}, r"^streaming: expected a boolean"),
        (
            {"lanes": {"a": 1}, "input_len": 5, "output_len": 5, "lane_input_len": {"b": 4}},
            r"^lane_input_len: lane 'b'",
        ),
        ([1, 2], r"must hold a mapping"),
    ],
)
def test_bad_workloads_name_the_field(data: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        workload_from_dict(data)


def test_bad_files_name_the_file(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*sharegpt"):
        load_workload("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lanes: [a\n")
    with pytest.raises(ValueError, match=r"bad.yaml: not valid YAML"):
        load_workload(str(bad))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"lanes": {"a": 1}, "input_len": 5}))
    with pytest.raises(ValueError, match=r"wrong.json: output_len: required"):
        load_workload(str(wrong))


def test_workload_module_is_pure_python() -> None:
    """The simulator and the load generator share it; it must import without numpy or torch."""
    import subprocess
    import sys

    code = (
        "import sys, baton.perf.loadgen.workload, baton.perf.loadgen.prompts, baton.perf.loadgen.stats, "
        "baton.perf.loadgen.search; "
        "bad = [m for m in ('torch', 'numpy', 'httpx', 'grpc') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
