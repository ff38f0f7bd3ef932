"""The projection sweep times every mode this machine has at every row count asked for."""

import json

from bench.projections import main, run
from engine.native.quant_linear import NativeQuantLinear
from engine.native.skinny_linear import NativeSkinnyLinear


def test_small_sweep_reports_every_mode_at_every_row_count():
    r = run([1, 5], layers=1, rounds=1, threads=1)
    assert r["modes"][0] == "mkl" and ("skinny" in r["modes"]) == (NativeSkinnyLinear.load() is not None)
    assert ("quantized" in r["modes"]) == ("skinny" in r["modes"] and NativeQuantLinear.load() is not None)
    assert set(r["ms"]) == {"1", "5"}
    for ms in r["ms"].values():
        assert set(ms) == {f"{m}_ms" for m in r["modes"]} and all(v > 0 for v in ms.values())
    assert r["flop"]["5"] > r["flop"]["1"] > 0


def test_cli_prints_a_table_and_json(capsys):
    assert main(["--rows", "2", "--layers", "1", "--rounds", "1", "--threads", "1"]) == 0
    assert "| 2 |" in capsys.readouterr().out
    assert main(["--rows", "2", "--layers", "1", "--rounds", "1", "--threads", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ms"]["2"]
