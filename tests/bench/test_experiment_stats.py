"""The serving experiments' analyses of a load-generator report, on hand-built reports: the burst
experiment's windows and drain time, and the admission experiment's shares."""

from __future__ import annotations

import pytest

from bench.experiments.admission import admission_stats
from bench.experiments.burst import analyze_burst


def _report(requests: list[dict], timeseries: list[dict], burst: dict | None = None) -> dict:
    return {
        "config": {
            "warmup_s": 0.0,
            "duration_s": 30.0,
            "burst": burst,
            "slos": {"interactive": {"ttft_s": 1.0, "tpot_s": 0.1}},
        },
        "requests": requests,
        "timeseries": timeseries,
    }


def _req(
    i: int, arrival: float, ttft: float | None, status: str = "ok", lane: str = "interactive", reason: str | None = None
) -> dict:
    return {
        "index": i,
        "lane": lane,
        "arrival_s": arrival,
        "send_s": arrival,
        "status": status,
        "reason": reason,
        "prompt_len": 10,
        "output_len": 11,
        "output_tokens": 11 if status == "ok" else 0,
        "ttft_s": ttft,
        "e2e_s": None if ttft is None else ttft + 0.5,
    }


def test_burst_analysis_windows_and_drain_time() -> None:
    requests = [_req(0, 5.0, 0.1), _req(1, 12.0, 3.0), _req(2, 14.0, None, "rejected"), _req(3, 25.0, 0.2)]

    def sample(t: float, n: int, q: int) -> dict:
        return {"t": t, "in_flight": n, "scraped": True, "waiting": {"interactive": 0, "batch": q}}

    ts = [sample(t / 2, 2, 0) for t in range(0, 20)]  # steady: 2 in flight, empty queue until t=10
    ts += [sample(10 + t / 2, 9, 5) for t in range(0, 10)]  # the burst, 10-15 s
    ts += [sample(15 + t / 2, 9 if t < 8 else 2, 5 if t < 8 else 0) for t in range(0, 30)]  # drains at t=19
    a = analyze_burst(_report(requests, ts, {"factor": 2.0, "start_s": 10.0, "length_s": 5.0}))
    inter = a["lanes"]["interactive"]
    assert inter["before"]["p99"] == pytest.approx(0.1) and inter["before"]["requests"] == 1
    assert inter["during"]["requests"] == 2 and inter["during"]["not_ok"] == 1 and inter["during"]["p50"] == 3.0
    assert inter["after"]["p50"] == pytest.approx(0.2)
    assert a["drain"]["client_in_flight"] == {"steady_level": 2.0, "peak": 9, "drain_s": 4.0}
    assert a["drain"]["router_queue:batch"]["drain_s"] == 4.0 and a["drain"]["router_queue:batch"]["peak"] == 5
    never = analyze_burst(
        _report(requests, [s for s in ts if s["t"] < 18.0], {"factor": 2.0, "start_s": 10.0, "length_s": 5.0})
    )
    assert never["drain"]["client_in_flight"]["drain_s"] is None


def test_admission_share_counts_admitted_requests_only() -> None:
    requests = [
        _req(0, 1.0, 0.2),
        _req(1, 2.0, 0.3),
        _req(2, 3.0, 5.0),  # two meet, one misses TTFT
        _req(3, 4.0, None, "rejected", reason="HTTP 503 slo_unattainable"),
        _req(4, 5.0, None, "rejected", reason="HTTP 503 slo_unattainable"),
        _req(5, 6.0, None, "timeout"),
    ]  # admitted, never finished: a miss
    a = admission_stats(_report(requests, []))
    assert (a["requests"], a["admitted"], a["rejected"]) == (6, 4, 2)
    assert a["admitted_slo_share"] == pytest.approx(2 / 4)
    assert a["slo_attainment_of_all"] == pytest.approx(2 / 6)
    assert a["rejections"] == {"HTTP 503 slo_unattainable": 2}
    assert a["goodput_rps"] == pytest.approx(2 / 30.0)
    assert a["admitted_not_finished"] == 1
