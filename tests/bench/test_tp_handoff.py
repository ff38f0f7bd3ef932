"""bench.tp_handoff runs both handoff paths between groups of different sizes and times them."""

from bench.tp_handoff import measure


def test_both_handoff_paths_run_and_are_timed():
    t = measure(prefill_tp=2, decode_tp=1, blocks=4, repeats=1, layers=2)
    assert (t.prefill_tp, t.decode_tp, t.blocks) == (2, 1, 4)
    assert t.mib > 0 and t.interim_ms > 0 and t.direct_ms > 0
