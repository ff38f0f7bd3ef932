"""The interference bench's latency summary (the cluster runs are a documented command, not a test)."""

import pytest

from baton.perf.interference import _quantiles, _stalls


def test_the_summary_shows_a_tail_under_one_percent():
    gaps = [0.01] * 997 + [1.5] * 3  # three stalls in a thousand gaps: under p99, over p99.9
    q = _quantiles(gaps)
    assert q["p50"] == q["p99"] == 0.01 and q["n"] == 1000
    assert q["p999"] > 0.01 and q["max"] == 1.5


def test_stalls_are_counted_as_a_share_of_the_gaps_and_of_the_waiting_time():
    gaps = [0.015] * 100 + [1.5]  # one stall behind a long prefill among a hundred ordinary gaps
    s = _stalls(gaps, 0.5)
    assert s["n"] == 1 and s["gap_share"] == pytest.approx(1 / 101)
    assert s["time_share"] == pytest.approx(1.5 / 3.0)
    assert _stalls([0.015] * 10, 0.5)["time_share"] == 0.0
    assert _stalls([], 0.5) == {"threshold_s": 0.5, "n": 0, "gap_share": None, "time_share": None}


def test_too_few_gaps_give_no_quantiles():
    assert _quantiles([0.2]) == {"p50": None, "p90": None, "p99": None, "p999": None, "max": 0.2, "n": 1}
    assert _quantiles([])["max"] is None


def _args(*argv):
    import argparse

    from baton.perf.interference_workload import add_arguments

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return ap.parse_args(list(argv))


def test_interactive_output_lengths_are_a_range_so_the_streams_do_not_restart_in_lockstep():
    from baton.perf.interference_workload import InterferenceWorkload, workload_from_args

    assert workload_from_args(_args()).interactive_max_tokens == (64, 192)
    assert workload_from_args(_args()) == InterferenceWorkload()  # the CLI's defaults are the workload's
    assert workload_from_args(_args("--interactive-max-tokens", "128")).interactive_max_tokens == (128, 128)


@pytest.mark.parametrize(
    "argv, names",
    [
        (("--interactive-max-tokens", "192-64"), "--interactive-max-tokens"),
        (("--interactive-max-tokens", "lots"), "--interactive-max-tokens"),
        (("--interactive", "0"), "--interactive"),
        (("--decode-prefill-budget", "-1"), "--decode-prefill-budget"),
    ],
)
def test_bad_arguments_are_named(argv, names):
    from baton.perf.interference_workload import workload_from_args

    with pytest.raises(ValueError, match=names):
        workload_from_args(_args(*argv))
