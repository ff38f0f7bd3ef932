"""The decode-kernel microbenchmark runs both arms and reports the speed-up."""

import shutil

import pytest

from bench.cpu_decode_kernel import main


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_small_run_reports_both_arms(capsys):
    assert main(["--seqs", "2", "--context", "40", "--threads", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "torch path" in out and "native" in out and "speed-up" in out
    assert "no read-ahead" in out and "native over no read-ahead" in out
