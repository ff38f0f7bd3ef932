"""The prefill-kernel microbenchmark runs both arms and reports the speed-up; bad lengths are refused."""

import shutil

import pytest

from bench.cpu_prefill_kernel import main, parse_lens


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_small_run_reports_both_arms(capsys):
    assert main(["--lens", "3x5-40", "--prefix", "7", "--threads", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "3 chunks" in out and "torch path" in out and "native" in out and "speed-up" in out


def test_lengths_are_drawn_or_listed():
    drawn = parse_lens("13x64-256")
    assert len(drawn) == 13 and all(64 <= n <= 256 for n in drawn) and drawn == parse_lens("13x64-256")
    assert parse_lens("2048,160") == [2048, 160]
    with pytest.raises(SystemExit, match="positive lengths"):
        main(["--lens", "0,4"])
