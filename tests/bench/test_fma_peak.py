"""The FMA peak probe compiles, runs and gives a positive rate (skipped where it cannot compile)."""

import pytest

from bench.fma_peak import main, measure


def test_the_probe_reports_a_rate(capsys):
    try:
        rates = measure(threads=1, runs=2, iters=100_000)
    except RuntimeError as e:
        pytest.skip(str(e))
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert main(["--threads", "1", "--runs", "1", "--iters", "100000"]) == 0
    assert "fp32 FMA peak, 1 thread(s)" in capsys.readouterr().out
