"""Load-generator arithmetic on hand-built records: percentiles, TTFT/TPOT/ITL, SLO attainment,
goodput, rejection reasons, the goodput-rate search and SLO parsing (the experiments' burst and
admission analyses: tests/bench/test_experiment_stats.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from baton.perf.loadgen.records import RequestRecord, Status, chunk_arrived
from baton.perf.loadgen.search import search_goodput_rate
from baton.perf.loadgen.slo import DEFAULT_SLOS, LaneSLO, parse_slo, resolve_slos
from baton.perf.loadgen.stats import Dist, meets_slo, percentile, summarize, summarize_by_lane

ROOT = Path(__file__).resolve().parents[4]
SLO = LaneSLO(ttft_s=1.0, tpot_s=0.1)


def rec(
    i: int = 0,
    *,
    lane: str = "interactive",
    send: float = 0.0,
    ttft: float | None = 0.5,
    e2e: float | None = 2.0,
    tokens: int = 11,
    status: Status = "ok",
    **kw,
) -> RequestRecord:
    r = RequestRecord(i, lane, prompt_len=10, output_len=tokens, arrival_s=send, send_s=send, status=status, **kw)
    r.first_token_s = None if ttft is None else send + ttft
    r.end_s = None if e2e is None else send + e2e
    r.output_tokens = tokens if status == "ok" else 0
    return r


def test_percentile_matches_numpy_linear() -> None:
    xs = [0.3, 1.0, 7.5, 2.2, 9.9, 4.0, 0.01]
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile(xs, 101)
    d = Dist.of([1.0, 2.0, 3.0, 4.0])
    assert (d.n, d.mean, d.p50, d.max) == (4, 2.5, 2.5, 4.0)
    assert d.p90 == pytest.approx(3.7) and d.p99 == pytest.approx(3.97)
    assert Dist.of([]).to_dict()["p99"] is None


def test_ttft_tpot_and_itl_of_a_record() -> None:
    r = RequestRecord(0, "interactive", 10, 5, arrival_s=1.0, send_s=1.1)
    last = chunk_arrived(r, 1.6, 1, None)  # TTFT 0.5
    last = chunk_arrived(r, 1.8, 1, last)  # gap 0.2
    last = chunk_arrived(r, 2.4, 3, last)  # gap 0.6 over 3 tokens: 0.2 each
    r.end_s = 2.4
    assert r.ttft_s == pytest.approx(0.5)
    assert r.output_tokens == 5 and r.chunks == 3
    assert r.itl_s == pytest.approx([0.2, 0.2, 0.2, 0.2])
    assert r.e2e_s == pytest.approx(1.3)
    assert r.tpot_s == pytest.approx((1.3 - 0.5) / 4)
    first = RequestRecord(1, "interactive", 10, 3, 0.0, 0.0)
    chunk_arrived(first, 0.5, 3, None)  # three tokens with the first: zero gaps
    assert first.itl_s == [0.0, 0.0] and first.ttft_s == 0.5
    one = rec(tokens=1)
    assert one.tpot_s is None


def test_meets_slo_needs_both_objectives_and_success() -> None:
    assert meets_slo(rec(ttft=0.9, e2e=1.9, tokens=11), SLO)  # TPOT 0.1
    assert not meets_slo(rec(ttft=1.1, e2e=1.5), SLO)  # TTFT missed
    assert not meets_slo(rec(ttft=0.5, e2e=2.6, tokens=11), SLO)  # TPOT 0.21 missed
    assert meets_slo(rec(ttft=0.5, e2e=0.5, tokens=1), SLO)  # no TPOT: only TTFT counts
    assert not meets_slo(rec(status="rejected", ttft=None, e2e=0.01), SLO)
    assert not meets_slo(rec(status="error", ttft=0.1, e2e=0.2), SLO)


def test_summary_counts_rejections_against_attainment_and_goodput() -> None:
    records = [
        rec(0, ttft=0.2, e2e=1.2, send=0.0),  # meets (TPOT 0.1)
        rec(1, ttft=0.3, e2e=1.0, send=1.0),  # meets
        rec(2, ttft=2.0, e2e=3.0, send=2.0),  # TTFT missed
        rec(3, status="rejected", ttft=None, e2e=0.01, send=3.0, http_status=429, error_code="queue_full"),
        rec(4, status="rejected", ttft=None, e2e=0.01, send=4.0, http_status=429, error_code="queue_full"),
        rec(5, status="error", ttft=0.1, e2e=0.5, send=5.0, error_type="internal_error"),
        rec(6, status="timeout", ttft=None, e2e=9.0, send=6.0),
        rec(7, ttft=0.5, e2e=2.0, send=7.0, tokens=11),  # TPOT 0.15: missed
    ]
    s = summarize(records, SLO, duration_s=8.0, offered_rate=1.0)
    assert (s.requests, s.completed, s.rejected, s.errors) == (8, 4, 2, 2)
    assert s.rejections == {"HTTP 429 queue_full": 2, "error internal_error": 1, "client timeout": 1}
    assert s.slo_met == 2
    assert s.slo_attainment == pytest.approx(2 / 8)  # rejected and failed requests count as misses
    assert s.goodput_rps == pytest.approx(2 / 8.0)
    assert s.ttft_s.n == 4 and s.ttft_s.p50 == pytest.approx(0.4)  # latencies over ok requests only
    assert s.elapsed_s == pytest.approx(15.0)  # the timeout ended last
    assert s.request_throughput == pytest.approx(4 / 15.0)
    assert s.output_token_throughput == pytest.approx(44 / 15.0)
    d = s.to_dict()
    assert d["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1} and d["ttft_s"]["n"] == 4


def test_each_lane_is_scored_against_its_own_slo() -> None:
    slos = {"interactive": SLO, "batch": LaneSLO(ttft_s=100.0, tpot_s=5.0)}
    records = [rec(0, ttft=5.0, e2e=6.0), rec(1, lane="batch", ttft=5.0, e2e=6.0)]
    overall = summarize(records, slos, duration_s=2.0)
    assert overall.slo_met == 1 and overall.slo is None
    lanes = summarize_by_lane(records, slos, 2.0, lane_rates={"interactive": 0.5, "batch": 0.5, "idle": 0.0})
    assert lanes["interactive"].slo_attainment == 0.0
    assert lanes["batch"].slo_attainment == 1.0 and lanes["batch"].slo == slos["batch"]
    assert lanes["idle"].requests == 0 and lanes["idle"].slo_attainment is None


def test_rejection_reasons_name_the_protocol_status_and_code() -> None:
    assert rec(status="rejected", http_status=503, error_type="overloaded_error").reason == "HTTP 503 overloaded_error"
    assert (
        rec(status="rejected", grpc_code="RESOURCE_EXHAUSTED", error_code="slo").reason == "gRPC RESOURCE_EXHAUSTED slo"
    )
    assert rec(status="rejected", grpc_code="UNAVAILABLE").reason == "gRPC UNAVAILABLE"
    assert rec(status="error", error_type="ConnectError").reason == "error ConnectError"
    assert rec().reason is None


# -- goodput-rate search --------------------------------------------------------------------------
def _capacity(limit: float):
    calls = []

    def evaluate(rate: float):
        calls.append(rate)
        return (1.0 if rate <= limit else 0.5), f"run@{rate}"

    return evaluate, calls


@pytest.mark.parametrize("start", [0.5, 3.0, 40.0])
def test_search_brackets_then_bisects_to_the_capacity(start: float) -> None:
    evaluate, calls = _capacity(7.3)
    res = search_goodput_rate(evaluate, start, max_runs=20, rel_tol=0.02)
    assert 7.3 * 0.98 <= res.goodput_rate <= 7.3
    assert res.best.result == f"run@{res.goodput_rate}"
    assert all(p.passed == (p.rate <= 7.3) for p in res.points)
    assert len(calls) == len(res.points)


def test_search_respects_budget_bounds_and_never_reports_an_untested_rate() -> None:
    evaluate, calls = _capacity(7.3)
    res = search_goodput_rate(evaluate, 1.0, max_runs=3)
    assert calls == [1.0, 2.0, 4.0] and res.goodput_rate == 4.0
    evaluate, calls = _capacity(100.0)
    assert search_goodput_rate(evaluate, 1.0, max_runs=10, max_rate=5.0).goodput_rate == 5.0
    assert calls == [1.0, 2.0, 4.0, 5.0]
    evaluate, _ = _capacity(0.001)
    res = search_goodput_rate(evaluate, 1.0, max_runs=10, min_rate=0.1)
    assert res.goodput_rate == 0.0 and res.best is None and all(not p.passed for p in res.points)
    # No measured request is no evidence: it counts as a miss.
    assert search_goodput_rate(lambda r: (None, None), 1.0, max_runs=2).goodput_rate == 0.0
    with pytest.raises(ValueError):
        search_goodput_rate(evaluate, 0.0)


def test_search_target_is_at_least_not_more_than() -> None:
    res = search_goodput_rate(lambda r: (0.9 if r <= 2 else 0.89, None), 1.0, max_runs=12, rel_tol=0.01)
    assert 1.98 <= res.goodput_rate <= 2.0


# -- SLOs -----------------------------------------------------------------------------------------
def test_default_slos_match_the_default_config() -> None:
    lanes = yaml.safe_load((ROOT / "baton" / "default_config.yaml").read_text())["lanes"]
    assert {lane["name"]: LaneSLO(lane["ttft_slo_s"], lane["tpot_slo_s"]) for lane in lanes} == DEFAULT_SLOS


def test_slo_overrides() -> None:
    assert parse_slo("interactive:ttft=500,tpot=50") == ("interactive", {"ttft_s": 0.5, "tpot_s": 0.05})
    slos = resolve_slos(["interactive", "batch", "custom"], ["batch:tpot=100", "custom:ttft=250"])
    assert slos["batch"] == LaneSLO(600.0, 0.1)
    assert slos["custom"] == LaneSLO(0.25, DEFAULT_SLOS["interactive"].tpot_s)
    assert slos["interactive"] == DEFAULT_SLOS["interactive"]
    for bad, match in [
        ("interactive", "LANE:ttft"),
        ("i:ttft=abc", "number of milliseconds"),
        ("i:latency=5", "ttft=MS or tpot=MS"),
        ("i:ttft=0", "> 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_slo(bad)


def test_an_slo_override_for_a_lane_the_workload_lacks_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"no lane 'interactve'; its lanes: interactive, batch"):
        resolve_slos(("interactive", "batch"), ["interactve:ttft=100"])  # was: silently ignored


def test_refusals_for_pace_are_told_from_the_others_by_the_router_s_message():
    from baton.perf.loadgen.report import refused_send_times
    from router.admission import PACE_REFUSAL

    pace = RequestRecord(0, "interactive", 10, 5, arrival_s=1.0, send_s=1.0, status="rejected")
    pace.error_message = f"The interactive lane cannot meet its {PACE_REFUSAL} (0.25 s) now: tokens would take 0.4 s"
    ttft = RequestRecord(1, "interactive", 10, 5, arrival_s=2.0, send_s=2.0, status="rejected")
    ttft.error_message = "The interactive lane cannot meet its time-to-first-token objective (2 s) now: predicted 3 s"
    done = RequestRecord(2, "batch", 10, 5, arrival_s=3.0, send_s=3.0, status="ok")
    records = [pace, ttft, done]
    assert refused_send_times(records) == {"interactive": [1.0, 2.0]}
    assert refused_send_times(records, for_pace=True) == {"interactive": [1.0]}
