"""Packed and skinny projections compute the same products as F.linear; packed weights unpack to the
weight they packed; the model switches every projection between the modes."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.kernels import kernels_for
from engine.model.linear import Linear, ProjectionMode, can_pack
from engine.native.skinny_linear import NativeSkinnyLinear

needs_packing = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="torch without oneDNN")


@needs_packing
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_matches_f_linear_at_every_row_count(rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(160, 96, generator=g)
    b = torch.randn(160, generator=g) if with_bias else None
    proj = Linear(w.clone(), b, pack=True)
    assert proj.packed and proj.out_features == 160
    got = proj(x)
    assert got.shape == (rows, 160)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@needs_packing
def test_a_non_contiguous_input_is_multiplied_correctly():
    x = torch.randn(48, 5).t()  # [5, 48], strided
    w = torch.randn(24, 48)
    torch.testing.assert_close(Linear(w.clone(), pack=True)(x), x @ w.t(), rtol=1e-5, atol=1e-5)


@needs_packing
def test_unpack_restores_the_weight_bit_for_bit():
    w = torch.randn(40, 16)
    proj = Linear(w.clone(), pack=True)
    assert torch.equal(proj.dense_weight(), w)
    proj.unpack()
    assert not proj.packed and torch.equal(proj.weight, w)
    x = torch.randn(3, 16)
    assert torch.equal(proj(x), F.linear(x, w))


def test_dense_is_f_linear_bit_for_bit():
    x, w, b = torch.randn(2, 48), torch.randn(24, 48), torch.randn(24)
    assert torch.equal(Linear(w, b)(x), F.linear(x, w, b))


def test_only_cpu_fp32_packs():
    assert not can_pack(torch.device("cpu"), torch.bfloat16)
    assert not can_pack(torch.device("cuda"), torch.float32)


def _tiny_model(tied: bool = False):
    from engine.model.config import ModelConfig
    from engine.model.llama import LlamaModel
    from engine.model.tiny import CONFIG

    model = LlamaModel(
        ModelConfig.from_hf_dict({**CONFIG, "tie_word_embeddings": tied}),
        torch.device("cpu"),
        torch.float32,
        64,
        kernels_for(torch.device("cpu"), torch.float32),
    )
    g = torch.Generator().manual_seed(0)
    model.load_weights((n, torch.randn(*s, generator=g) * 0.02, "test") for n, s in model.expected_shapes().items())
    return model


@needs_packing
@pytest.mark.parametrize("tied", [False, True])
def test_the_cpu_model_switches_every_projection_between_modes(tied):
    model = _tiny_model(tied)

    def projections():
        return [model.lm_head, *(p for layer in model.layers for p in layer.projections())]

    def switch(mode: ProjectionMode) -> ProjectionMode:
        """The model's mode after switching to ``mode``, read afresh."""
        model.set_projections(mode)
        return model.projection_mode

    assert model.projection_mode in (ProjectionMode.PACKED, ProjectionMode.SKINNY)
    assert switch(ProjectionMode.PACKED) is ProjectionMode.PACKED
    assert all(p.packed and p.skinny is None for p in projections())
    assert switch(ProjectionMode.DENSE) is ProjectionMode.DENSE
    assert not any(p.packed or p.skinny for p in projections())
    if model.kernels.skinny is not None:
        model.set_projections(ProjectionMode.SKINNY)
        assert all(p.skinny is model.kernels.skinny and not p.packed for p in projections())
        # tied, the head multiplies the embedding itself (no second copy), also after packed mode
        assert (model.lm_head.weight is model.embed) == tied
    with pytest.raises(ValueError, match="projection mode must be one of"):
        model.set_projections("fast")
    with pytest.raises(ValueError, match="packed weights need fp32"):
        from engine.model.config import ModelConfig
        from engine.model.llama import LlamaModel
        from engine.model.tiny import CONFIG

        LlamaModel(
            ModelConfig.from_hf_dict(CONFIG),
            torch.device("cpu"),
            torch.bfloat16,
            64,
            kernels_for(torch.device("cpu"), torch.bfloat16),
        ).set_projections(ProjectionMode.PACKED)


@needs_packing
@pytest.mark.parametrize("tied", [False, True])
def test_every_mode_gives_the_same_logits(tied):
    model = _tiny_model(tied)
    x = torch.randn(70, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    modes = [ProjectionMode.DENSE, ProjectionMode.PACKED]
    if model.kernels.skinny is not None:
        modes.append(ProjectionMode.SKINNY)
    got = {}
    for mode in modes:
        model.set_projections(mode)
        got[mode] = [model.compute_logits(x[:rows]) for rows in (1, 5, 64, 70)]
    for mode in modes[1:]:
        for a, b in zip(got[ProjectionMode.DENSE], got[mode]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


class _TileWidth(NativeSkinnyLinear):
    """The skinny kernel's tile width alone, which the default mode reads: no library behind it, so
    the choice is checked for both tiles on any CPU."""

    def __init__(self, lanes: int) -> None:  # no super().__init__(): it binds the built library
        self.lanes = lanes


def test_the_default_mode_follows_the_device_and_the_kernel():
    from engine.model.linear import cpu_vendor, default_projections

    assert default_projections(torch.device("cpu"), torch.bfloat16, None) is ProjectionMode.DENSE
    avx512_tile, avx2_tile = _TileWidth(16), _TileWidth(8)
    assert default_projections(torch.device("cuda"), torch.float16, avx512_tile) is ProjectionMode.DENSE
    if can_pack(torch.device("cpu"), torch.float32):
        assert default_projections(torch.device("cpu"), torch.float32, None) is ProjectionMode.PACKED
        expected = ProjectionMode.SKINNY if cpu_vendor() == "GenuineIntel" else ProjectionMode.PACKED
        assert default_projections(torch.device("cpu"), torch.float32, avx512_tile) is expected
        # The AVX2 tile serves the quantized mode only: against oneDNN on dense weights it is unmeasured.
        assert default_projections(torch.device("cpu"), torch.float32, avx2_tile) is ProjectionMode.PACKED


def _blocked_model(tied: bool):
    """A tiny model whose weights are dequantized GGUF blocks (Q4_1 layers, a Q8_0 embedding; the
    688-wide down projection stays fp32), loaded, and those blocks (not attached yet)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight

    model = _tiny_model(tied)
    if not model.takes_blocks or NativeQuantLinear.load() is None:
        pytest.skip("the quantized mode needs the skinny and quantized kernels (AVX-512)")
    blocks: dict[str, QuantizedWeight] = {}
    floats: dict[str, torch.Tensor] = {}
    for name, shape in model.expected_shapes().items():
        if len(shape) == 2 and shape[1] % 32 == 0:  # the tiny down projection (688 in) stays fp32
            qtype = "Q8_0" if "embed" in name else "Q4_1"
            w = np.random.default_rng(len(blocks)).standard_normal(shape).astype(np.float32) * 0.05
            raw = quantize(w, GGMLQuantizationType[qtype])
            blocks[name] = QuantizedWeight(torch.from_numpy(raw.reshape(shape[0], -1).copy()), qtype)
            floats[name] = torch.from_numpy(
                np.asarray(dequantize(raw, GGMLQuantizationType[qtype])).reshape(shape).copy()
            )
        else:
            floats[name] = torch.randn(shape, generator=torch.Generator().manual_seed(len(floats))) * 0.05
    model.load_weights((n, t, "test") for n, t in floats.items())
    return model, blocks


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_blocks_give_the_skinny_logits_bit_for_bit(tied):
    """A model whose weights are dequantized blocks multiplies the blocks in decode-sized products
    (the quantized mode) with the skinny mode's results exactly; the tied head keeps its blocks across
    mode switches; blocks that do not dequantize to the weights fail the load (also from packed weights)."""
    from engine.errors import ModelLoadError

    model, blocks = _blocked_model(tied)
    stale = dict(blocks, **{"model.layers.1.self_attn.o_proj.weight": blocks["model.layers.0.self_attn.o_proj.weight"]})
    with pytest.raises(ModelLoadError, match=r"o_proj.weight do not dequantize"):
        model.attach_quantized(stale, "blocks.safetensors")
    model.set_projections(ProjectionMode.SKINNY)
    assert model.attach_quantized(blocks, "blocks.safetensors") and model.projection_mode is ProjectionMode.QUANTIZED
    projections = [model.lm_head, *(p for layer in model.layers for p in layer.projections())]
    downs = [layer.down for layer in model.layers]
    assert all((p.quant is model.kernels.quant) == (p not in downs) for p in projections)
    # Q4_1 is multiplied in the kernel's 8-row layout, the Q8_0 head (the tied embedding) as stored.
    assert {p.quantized.qtype for p in projections if p.quant is not None} == (
        {"Q4_1x8", "Q8_0"} if tied else {"Q4_1x8"}
    )
    x = torch.randn(64, model.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    quantized = [model.compute_logits(x[:rows]) for rows in (1, 5, 64)]
    quantized_layer = [model.layers[1].gate_up(x[:rows]) for rows in (1, 5, 64)]
    model.set_projections(ProjectionMode.PACKED)
    model.set_projections(ProjectionMode.SKINNY)
    assert all(torch.equal(a, model.compute_logits(x[:rows])) for a, rows in zip(quantized, (1, 5, 64)))
    assert all(torch.equal(a, model.layers[1].gate_up(x[:rows])) for a, rows in zip(quantized_layer, (1, 5, 64)))
    model.set_projections(ProjectionMode.QUANTIZED)
    assert model.lm_head.quant is model.kernels.quant  # the head's blocks survived the packed detour


@needs_packing
@pytest.mark.parametrize("tied", [False, True])
def test_where_mkl_is_slow_the_quantized_mode_keeps_packed_weights_for_larger_products(tied):
    """As on AMD (``packs_large_products``): projections with blocks hold oneDNN's packed weight
    instead of the dense one, so decode-sized products are the blocks' (the skinny results, bit for
    bit) and larger ones the packed mode's, bit for bit; one without blocks goes the skinny way; a tied
    head stays the embedding (no second copy). Attaching from the packed default checks the blocks."""
    from engine.errors import ModelLoadError

    model, blocks = _blocked_model(tied)
    model.use_kernels(replace(model.kernels, pack_large=True))
    model.set_projections(ProjectionMode.PACKED)
    stale = dict(blocks, **{"model.layers.0.mlp.gate_proj.weight": blocks["model.layers.1.mlp.gate_proj.weight"]})
    with pytest.raises(ModelLoadError, match=r"gate_proj.weight do not dequantize"):
        model.attach_quantized(stale, "blocks.safetensors")
    assert model.attach_quantized(blocks, "blocks.safetensors") and model.projection_mode is ProjectionMode.QUANTIZED
    layer_projections = [p for layer in model.layers for p in layer.projections()]
    downs = [layer.down for layer in model.layers]
    assert all(p.packed == (p not in downs) for p in layer_projections)
    assert all((p.quant is model.kernels.quant) == (p not in downs) for p in layer_projections)
    assert all(p.skinny is model.kernels.skinny for p in layer_projections)  # a decode step can run in C
    assert (model.lm_head.weight is model.embed) == tied and model.lm_head.packed != tied
    assert model.lm_head.quant is model.kernels.quant
    x = torch.randn(70, model.cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    up = model.layers[1].gate_up
    quantized = [up(x[:rows]) for rows in (1, 5, 64, 70)] + [model.compute_logits(x[:rows]) for rows in (1, 64)]
    model.set_projections(ProjectionMode.SKINNY)
    assert all(torch.equal(a, up(x[:rows])) for a, rows in zip(quantized, (1, 5, 64)))
    assert all(torch.equal(a, model.compute_logits(x[:rows])) for a, rows in zip(quantized[4:], (1, 64)))
    model.set_projections(ProjectionMode.PACKED)
    assert torch.equal(quantized[3], up(x))


def test_only_a_cpu_whose_mkl_is_slow_packs_larger_products():
    from engine.model.linear import cpu_vendor, packs_large_products

    assert not packs_large_products(torch.device("cpu"), torch.bfloat16)
    assert not packs_large_products(torch.device("cuda"), torch.float32)
    expected = can_pack(torch.device("cpu"), torch.float32) and cpu_vendor() != "GenuineIntel"
    assert packs_large_products(torch.device("cpu"), torch.float32) == expected


def test_blocks_that_fit_no_projection_leave_the_mode_alone():
    from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight

    model = _tiny_model(False)
    if not model.takes_blocks or NativeQuantLinear.load() is None:
        pytest.skip("the quantized mode needs the skinny and quantized kernels (AVX-512)")
    default = model.projection_mode
    only_q = {
        "model.layers.0.self_attn.q_proj.weight": QuantizedWeight(torch.zeros(256, 160, dtype=torch.uint8), "Q4_1")
    }
    assert not model.attach_quantized(only_q, "blocks.safetensors")  # k and v missing: the fused qkv cannot take it
    assert not model.attach_quantized({}, "blocks.safetensors")
    assert model.projection_mode == default
