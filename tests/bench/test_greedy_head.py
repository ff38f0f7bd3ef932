"""The greedy head's microbenchmark: both arms run, give the same tokens, and the table has a row per row count."""

import pytest

from bench.greedy_head import main, run
from engine.native.greedy_head import NativeGreedyHead


def test_refused_clearly_where_the_kernel_is_not(monkeypatch):
    monkeypatch.setattr(NativeGreedyHead, "load", classmethod(lambda cls: None))
    with pytest.raises(SystemExit, match="AVX-512 VNNI"):
        run([1], rounds=1)


@pytest.mark.skipif(NativeGreedyHead.load() is None, reason="no AVX-512 VNNI here: the greedy head is not built")
def test_small_run(capsys):
    assert main(["--rows", "1,3", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | " in out and "| 3 | " in out
    rows = run([2], rounds=1)["rows"]["2"]
    assert rows["same_tokens"] and rows["candidates_per_row"] >= 1
