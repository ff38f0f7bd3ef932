"""bench.cpu_small_ops completes and reports every arm (the timings themselves are not checked)."""

from __future__ import annotations

import shutil

import pytest

from bench.cpu_small_ops import main, run


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the compiled arms would be missing")
def test_it_reports_every_arm_at_every_row_count(capsys):
    r = run([1, 3], repeats=2)
    for m in ("1", "3"):
        assert set(r["ms"][m]) == {"silu_torch_ms", "silu_native_ms", "argmax_torch_ms", "argmax_native_ms"}
        assert all(v > 0 for v in r["ms"][m].values())
    assert main(["--rows", "2", "--repeats", "1"]) == 0
    assert "silu_native" in capsys.readouterr().out
