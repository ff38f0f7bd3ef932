"""The cost model: fitting, step shapes, the JSON file and its errors (pure Python + numpy, fast)."""

import json
import random

import numpy as np
import pytest

from baton.perf.profile.cost_model import SCHEMA, CostModel, CostModelError, Sample
from baton.perf.profile.fit import fit_step_model, nnls, report
from baton.perf.profile.step_shape import FEATURES, StepShape, shape_of_rows
from baton.perf.profile.synthetic import synthetic_cost_model

KNOWN = {
    "const": 0.035,
    "multi_token": 0.025,
    "tokens": 0.0022,
    "sampled": 0.004,
    "decode_ctx_padded": 2.2e-5,
    "decode_ctx_sum": 0.0,
    "prefill_pairs": 7e-7,
}


def _grid_shapes() -> list[StepShape]:
    """Decode, ragged decode, prefill and mixed shapes, as the profile's grid makes them."""
    out = []
    for b in (1, 2, 4, 8, 16, 32):
        for n in (64, 256, 1024):
            out.append(shape_of_rows([1] * b, [n] * b, [n] * b, 16))
        out.append(shape_of_rows([1] * b, [64] * (b - 1) + [2048], [64] * (b - 1) + [2048], 16))
    for t in (16, 64, 256, 1024):
        for c in (0, 512):
            out.append(shape_of_rows([t], [c + t], [c + t], 16))
            out.append(shape_of_rows([1] * 4 + [t], [128] * 4 + [c + t], [128] * 4 + [c + t], 16))
    return out


def _truth(shape: StepShape) -> float:
    f = shape.features()
    return sum(KNOWN[k] * f[k] for k in FEATURES)


def test_fit_recovers_known_coefficients():
    shapes = _grid_shapes()
    coefs = fit_step_model([s.features() for s in shapes], [_truth(s) for s in shapes], FEATURES)
    for k, v in KNOWN.items():
        assert coefs[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def test_fit_with_noise_stays_close_and_reports_its_error():
    rng = random.Random(0)
    shapes = _grid_shapes()
    secs = [_truth(s) * (1 + rng.uniform(-0.03, 0.03)) for s in shapes]
    rows = [s.features() for s in shapes]
    coefs = fit_step_model(rows, secs, FEATURES)
    for k in ("const", "tokens", "prefill_pairs", "decode_ctx_padded"):
        assert coefs[k] == pytest.approx(KNOWN[k], rel=0.15), k
    r = report(coefs, rows, secs, ["x"] * len(rows))
    assert r.n == len(rows) and 0 < r.median_abs_rel_error < 0.03 and r.max_abs_rel_error < 0.1
    assert set(r.by_kind) == {"x"}


def test_fit_never_goes_negative():
    # Step time falls slightly with one feature: unconstrained least squares would give it a negative cost.
    rows = [
        {
            "const": 1.0,
            "multi_token": 1.0,
            "tokens": float(t),
            "sampled": 0.0,
            "decode_ctx_padded": 0.0,
            "decode_ctx_sum": 0.0,
            "prefill_pairs": float(100 - t),
        }
        for t in range(1, 40)
    ]
    secs = [0.01 + 0.001 * t - 1e-6 * (100 - t) for t in range(1, 40)]
    coefs = fit_step_model(rows, secs, FEATURES)
    assert all(v >= 0 for v in coefs.values())
    assert coefs["sampled"] == 0.0 and coefs["decode_ctx_sum"] == 0.0  # never exercised: stays 0


def test_nnls_equals_least_squares_when_the_solution_is_positive():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1, size=(30, 4))
    x = np.array([0.5, 1.0, 2.0, 0.25])
    assert np.allclose(nnls(a, a @ x), x)
    b = a @ np.array([1.0, -1.0, 0.5, 0.0])
    got = nnls(a, b)
    assert (got >= 0).all()


def test_step_shape_counts_decodes_prefills_and_sampling_rows():
    # two decodes (contexts 100, 300), a mid-prompt chunk (no sample) and a last chunk (samples)
    s = shape_of_rows([1, 1, 64, 32], [100, 300, 128, 532], [100, 300, 500, 532], 16)
    assert (s.num_tokens, s.num_seqs, s.num_sampled, s.num_decode) == (98, 4, 3, 2)
    assert s.decode_ctx_sum == 400 and s.decode_ctx_max == 304  # padded to whole blocks
    assert s.prefill_pairs == 64 * 128 + 32 * 532
    f = s.features()
    assert f["decode_ctx_padded"] == 2 * 304 and f["const"] == 1.0
    assert StepShape.from_json(s.to_json()) == s


def test_padded_decode_context_follows_the_cpu_length_groups():
    # One long row among short ones: the CPU path attends it in a group of its own.
    s = shape_of_rows([1] * 16, [64] * 15 + [1024], [64] * 15 + [1024], 16)
    assert s.decode_ctx_max == 1024 and s.features()["decode_ctx_padded"] == 15 * 64 + 1024
    even = shape_of_rows([1] * 4, [100] * 4, [100] * 4, 16)
    assert even.features()["decode_ctx_padded"] == 4 * 112
    # A shape saved before groups existed reads as every row padded to the longest.
    old = {k: v for k, v in s.to_json().items() if k != "decode_ctx_padded"}
    assert StepShape.from_json(old).features()["decode_ctx_padded"] == 16 * 1024


def test_step_seconds_is_the_linear_model():
    cm = synthetic_cost_model(
        const_s=0.01, per_token_s=0.002, per_sampled_s=0.003, decode_ctx_s=1e-5, prefill_pair_s=1e-7
    )
    s = shape_of_rows([1, 1, 100], [64, 64, 100], [64, 64, 100], 16)
    want = 0.01 + 0.002 * 102 + 0.003 * 3 + 1e-5 * 2 * 64 + 1e-7 * 100 * 100
    assert cm.step_seconds(s) == pytest.approx(want)
    assert cm.step_seconds(shape_of_rows([], [], [], 16)) == 0.0
    gemm = synthetic_cost_model(const_s=0.01, multi_token_s=0.02, per_token_s=0.0)
    assert gemm.step_seconds(shape_of_rows([1], [64], [64], 16)) == pytest.approx(0.01)  # a matrix-vector step
    assert gemm.step_seconds(shape_of_rows([1, 1], [64, 64], [64, 64], 16)) == pytest.approx(0.03)
    assert cm.transfer_seconds(1000) == pytest.approx(0.005 + 1000 * 46080 / 0.65e9)


def test_file_round_trip(tmp_path):
    cm = synthetic_cost_model()
    cm = CostModel(
        **{
            **cm.__dict__,
            "samples": (Sample("decode", shape_of_rows([1], [64], [64], 16), 0.04, 3),),
            "machine": {"cpu": "test"},
        }
    )
    path = tmp_path / "cm.json"
    cm.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["step"]["features"] == list(FEATURES)
    back = CostModel.load(path)
    assert back.to_json() == cm.to_json()
    assert back.samples[0].point == 3 and back.model.num_kv_blocks == cm.model.num_kv_blocks


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(schema="baton.cost_model/0"), "schema is 'baton.cost_model/0'"),
        (lambda d: d.pop("model"), "missing field model"),
        (lambda d: d["model"].pop("kv_bytes_per_token"), "missing field model.kv_bytes_per_token"),
        (lambda d: d["model"].update(vocab_size="many"), "model.vocab_size has the wrong type"),
        (lambda d: d["step"].pop("coefficients"), "missing field step.coefficients"),
        (lambda d: d["step"]["coefficients"].update(tokens="fast"), "step.coefficients.tokens must be a number"),
        (lambda d: d["step"]["coefficients"].update(tokens=-1.0), "'tokens' must be a finite number >= 0"),
        (lambda d: d["step"]["coefficients"].update(flops=1.0), "unknown step feature 'flops'"),
        (lambda d: d["transfer"].update(bandwidth_bytes_per_s=0), "bandwidth must be a finite number > 0"),
        # From a planner audit: each was accepted, and `baton plan` hung (NaN times never pass the
        # simulator's clock), printed NaN latencies, or drew token ids from an empty range.
        (lambda d: d["transfer"].update(bandwidth_bytes_per_s=float("nan")), "bandwidth must be a finite number > 0"),
        (lambda d: d["transfer"].update(latency_s=float("inf")), "latency a finite number >= 0"),
        (lambda d: d.setdefault("overheads", {}).update(rpc_s=float("nan")), "overheads.rpc_s must be a finite number"),
        (
            lambda d: d.setdefault("overheads", {}).update(step_s=float("inf")),
            "overheads.step_s must be a finite number",
        ),
        (lambda d: d["model"].update(kv_bytes_per_token=0), "model.kv_bytes_per_token must be > 0"),
        (lambda d: d["model"].update(max_model_len=0), "model.max_model_len must be > 0"),
        (lambda d: d["model"].update(vocab_size=3), "model.vocab_size must be > 3"),
        (lambda d: d.update(device="tpu"), "device must be 'cpu' or 'cuda'"),
        (lambda d: d.update(threads="two"), "threads must be a positive integer"),
    ],
)
def test_schema_errors_name_the_field(tmp_path, mutate, needle):
    d = synthetic_cost_model().to_json()
    mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(CostModelError) as e:
        CostModel.load(path)
    assert needle in str(e.value) and str(path) in str(e.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(CostModelError, match="cannot read cost model"):
        CostModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="not valid JSON"):
        CostModel.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CostModelError, match="not a JSON object"):
        CostModel.load(bad)


def test_transfer_line_recovers_latency_and_bandwidth():
    from baton.perf.profile.overheads import _line

    t = _line([(b, 0.005 + b / 0.65e9) for b in (11_000_000, 45_000_000, 90_000_000)], "measured")
    assert t.latency_s == pytest.approx(0.005) and t.bandwidth_bytes_per_s == pytest.approx(0.65e9)
    flat = _line([(1_000_000, 0.010), (2_000_000, 0.008)], "measured")  # noise: no fixed cost, the largest one's rate
    assert flat.latency_s == 0.0 and flat.bandwidth_bytes_per_s == pytest.approx(2e6 / 0.008)


def test_typical_over_fastest_is_the_mean_repeat_over_the_fastest():
    from baton.perf.profile.measure import typical_over_fastest

    shape = StepShape(1, 1, 1, 16, 16, 16, 0)
    samples = [Sample("decode", shape, t, point=p) for p, t in ((0, 1.0), (0, 1.2), (1, 2.0), (1, 2.0), (2, 9.0))]
    assert typical_over_fastest(samples) == pytest.approx((1.1 + 1.0) / 2)  # point 2 has no repeats
    assert typical_over_fastest([]) == 1.0


def test_typical_over_fastest_round_trips_and_is_checked():
    from dataclasses import replace

    cm = replace(synthetic_cost_model(), typical_over_fastest=1.07)
    assert CostModel.from_json(json.loads(json.dumps(cm.to_json()))).typical_over_fastest == 1.07
    with pytest.raises(CostModelError, match="typical_over_fastest"):
        replace(cm, typical_over_fastest=0.9)


def test_a_failed_save_leaves_no_temp_file(tmp_path):
    target = tmp_path / "cm"
    target.mkdir()  # the rename onto a directory fails
    with pytest.raises(OSError):
        synthetic_cost_model().save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cm"]  # was: cm.tmp left behind


def test_a_fit_of_a_single_batch_shape_is_refused():
    """One sample gave {'const': 0.03} with a "perfect" fit: a 2,048-token prefill predicted at 30 ms."""
    row = shape_of_rows([1], [64], [64], 16).features()
    for rows in ([row], [row, row, row]):
        with pytest.raises(ValueError, match="single batch shape"):
            fit_step_model(rows, [0.03] * len(rows), FEATURES)


def test_a_refit_without_prefill_samples_is_refused():
    from baton.perf.profile.run import fit_samples

    samples = [Sample("decode", shape_of_rows([n], [64 * n], [64 * n], 16), 0.01 * n, n) for n in range(1, 9)]
    with pytest.raises(ValueError, match="no prefill steps"):
        fit_samples(samples)
