"""The AMX kernel's microbenchmark: refused clearly where AMX is not, a table row per shape where it is."""

import pytest

from bench.amx_linear import main
from engine.native.amx_linear import NativeAmxLinear


def test_refused_clearly_where_amx_is_not(monkeypatch):
    monkeypatch.setattr(NativeAmxLinear, "load", classmethod(lambda cls: None))
    with pytest.raises(SystemExit, match="AMX-BF16"):
        main(["--rows", "80", "--shapes", "64x32", "--repeats", "1"])


@pytest.mark.skipif(NativeAmxLinear.load() is None, reason="no AMX-BF16 here: the kernel is not built")
def test_small_run(capsys):
    assert main(["--rows", "80", "--shapes", "64x32,96x48", "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 80 x 64 x 32 |" in out and "| 80 x 96 x 48 |" in out
