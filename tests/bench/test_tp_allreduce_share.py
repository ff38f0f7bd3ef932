"""bench/tp_allreduce_share.py: the all-reduce's share of a TP-2 decode step on the tiny model."""

from bench.tp_allreduce_share import main, measure


def test_times_every_all_reduce_of_the_decode_steps(tiny_model_dir):
    r = measure(str(tiny_model_dir), tp=2, batch=2, context=8, steps=3)
    # The tiny Llama's 4 layers: o_proj's and the MLP's sums each, and the embedding's; one gather.
    assert r["all_reduces_per_step"] == 2 * 4 + 1
    assert r["all_reduce_ms_per_step"] > 0 and r["gather_ms_per_step"] > 0
    assert 0 < r["all_reduce_share"] + r["gather_share"] < 1
    assert r["step_ms"] > 0


def test_tp1_has_nothing_to_reduce(tiny_model_dir, capsys):
    assert main(["--model", str(tiny_model_dir), "--tp", "1", "--batch", "1", "--context", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "TP 1 (1 thread(s) a rank), batch 1:" in out and "(0 calls, 0.0% of the step)" in out
