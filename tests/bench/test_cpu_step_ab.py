"""The same-run A/B of CPU step changes: each arm really switches the engine, and the table has a
row per step shape."""

import pytest

from bench.cpu_step_ab import main
from engine.native.paged_decode import NativePagedDecode
from engine.native.paged_prefill import NativePagedPrefill

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
    with pytest.raises(SystemExit, match="quantized-vs-packed: no GGUF blocks"):
        main(["--change", "quantized-vs-packed", *ARGS])


def test_prefill_after_a_cached_prefix(capsys):
    import engine.attention.cpu as cpu_attention

    if cpu_attention._FLASH_WITH_LSE is None:
        pytest.skip("this torch has no CPU flash attention op with log-sum-exp")
    args = [a if a != "16" else "16:32,8" for a in ARGS]  # --prompts T:C and T
    assert main(["--change", "prefix-flash", *args]) == 0
    out = capsys.readouterr().out
    assert "| prefill 16 after 32 cached | " in out and "| prefill 8 | " in out
    assert cpu_attention._FLASH_WITH_LSE is not None  # left on


@pytest.mark.skipif(NativePagedPrefill.load() is None,
                    reason="no compiled prefill kernel in use here (no compiler, or a build without AVX-512)")
def test_native_prefill_switches_the_kernel_and_leaves_it_on(capsys):
    from bench.cpu_step_ab import _switch
    from bench.profile.measure import Grid, engine_for_grid

    engine = engine_for_grid("tiny", Grid(decode=((1, 40),), ragged=(), prefill=((16, 0),), mixed=(), repeats=1,
                                          max_point_s=5.0), 1)
    cpu = engine.runner.attn.prefill.__self__
    kernel = cpu.native_prefill
    assert kernel is not None
    switch, names = _switch(engine, "native-prefill")
    assert names == ("torch path", "native")
    switch(False)
    assert cpu.native_prefill is None
    switch(True)
    assert cpu.native_prefill is kernel
    assert main(["--change", "native-prefill", *ARGS]) == 0
    assert "| prefill 16 | " in capsys.readouterr().out


def test_sampled_rows_runs_both_arms(capsys):
    assert main(["--change", "sampled-rows", *ARGS]) == 0
    assert "| step | every row ms | sampled rows ms | speed-up |" in capsys.readouterr().out


def test_q4_groups_turns_the_8_row_layout_back_into_the_files():
    import torch

    from bench.cpu_step_ab import _file_layout
    from engine.native.quant_linear import QuantizedWeight

    stored = torch.randint(0, 256, (24, 3 * 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    back = _file_layout(QuantizedWeight(stored, "Q4_1").regroup())
    assert back.qtype == "Q4_1" and torch.equal(back.blocks, stored)
    with pytest.raises(SystemExit, match="no Q4_1 blocks"):  # tiny is not a GGUF model
        main(["--change", "q4-groups", *ARGS])


def test_greedy_head_is_refused_where_the_model_has_none():
    with pytest.raises(SystemExit, match="greedy-head: not in use here"):  # tiny has no GGUF head
        main(["--change", "greedy-head", *ARGS])
