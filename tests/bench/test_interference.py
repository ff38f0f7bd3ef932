"""The interference bench's latency summary (the cluster runs are a documented command, not a test)."""

from bench.interference import _quantiles


def test_the_summary_shows_a_tail_under_one_percent():
    gaps = [0.01] * 997 + [1.5] * 3  # three stalls in a thousand gaps: under p99, over p99.9
    q = _quantiles(gaps)
    assert q["p50"] == q["p99"] == 0.01 and q["n"] == 1000
    assert q["p999"] > 0.01 and q["max"] == 1.5


def test_too_few_gaps_give_no_quantiles():
    assert _quantiles([0.2]) == {"p50": None, "p90": None, "p99": None, "p999": None, "max": 0.2, "n": 1}
    assert _quantiles([])["max"] is None
