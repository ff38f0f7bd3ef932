"""The same-run A/B of CPU step changes: each arm really switches the engine, and the table has a
row per step shape."""

import pytest

from bench.cpu_step_ab import main
from engine.native.paged_decode import NativePagedDecode

ARGS = ["--model", "tiny", "--rows", "1,2", "--contexts", "40", "--prompts", "16", "--ragged", "", "--rounds", "1"]


@pytest.mark.skipif(NativePagedDecode.load() is None, reason="no compiled decode kernel here")
def test_decode_split_runs_both_arms(capsys):
    assert main(["--change", "decode-split", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "| step | whole ms | pieces ms | speed-up |" in out
    for row in ("decode 1 x 40", "decode 2 x 40", "prefill 16"):
        assert f"| {row} | " in out


def test_a_change_this_model_cannot_make_is_refused():
    with pytest.raises(SystemExit, match="no GGUF blocks"):  # tiny is not a GGUF model
        main(["--change", "quantized", *ARGS])
