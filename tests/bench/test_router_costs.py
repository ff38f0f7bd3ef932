"""bench/router_costs.py runs and reports both measurements (the full run is in BENCHMARKS)."""

from bench.router_costs import main


def test_router_costs_reports_admission_and_request_end(tmp_path):
    out = main(["--running", "10", "--lengths", "50", "--json", str(tmp_path / "r.json")])
    assert out["admission"][0]["running"] == 10 and out["admission"][0]["generate_ms"] > 0
    assert out["request_end"][0]["length"] == 50 and out["request_end"][0]["loop_lag_max_ms"] >= 0
    assert (tmp_path / "r.json").exists()
