"""The decode layer loop in C (engine/native/decode_layers.c): a decode step's hidden states and KV
writes equal the Python forward's bit for bit, dense (skinny) and with GGUF blocks (Q4_1 layers, a
dense down projection, a Q8_0 embedding), with and without
a qkv bias, at row counts across the kernels' tile and thread boundaries; and the loop stands aside
wherever some call would not be a compiled kernel."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.attention.backend import AttentionBackend, select_backend
from engine.attention.metadata import AttentionMetadata
from engine.kernels import kernels_for
from engine.model.config import ModelConfig
from engine.model.linear import ProjectionMode
from engine.model.llama import LlamaModel
from engine.model.reference_ops import TorchLayerOps
from engine.model.tiny import CONFIG
from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight
from engine.native.skinny_linear import MAX_ROWS

BLOCK = 16


def _model(overrides: dict | None = None, blocks: bool = False) -> LlamaModel:
    model = LlamaModel(
        ModelConfig.from_hf_dict(dict(CONFIG, **(overrides or {}))),
        torch.device("cpu"),
        torch.float32,
        512,
        kernels_for(torch.device("cpu"), torch.float32),
    )
    if model.kernels.decode_layers is None or model.kernels.skinny is None:
        pytest.skip("the C layer loop needs the compiled kernels (CPU fp32 with AVX-512 or AVX2)")
    weights = {
        n: torch.randn(*s, generator=torch.Generator().manual_seed(i)) * 0.05
        for i, (n, s) in enumerate(model.expected_shapes().items())
    }
    quantized = {}
    if blocks:
        if NativeQuantLinear.load() is None:
            pytest.skip("no quantized kernel here")
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quantize

        for name, w in weights.items():
            if w.dim() == 2 and w.shape[1] % 32 == 0:  # not the 688-wide down projection: it stays dense
                qtype = "Q8_0" if "embed" in name else "Q4_1"
                raw = quantize(w.numpy(), GGMLQuantizationType[qtype])
                quantized[name] = QuantizedWeight(torch.from_numpy(raw.reshape(w.shape[0], -1).copy()), qtype)
                weights[name] = torch.from_numpy(
                    np.asarray(dequantize(raw, GGMLQuantizationType[qtype])).reshape(w.shape).copy()
                )
    model.load_weights((n, t, "test") for n, t in weights.items())
    model.set_projections(
        ProjectionMode.SKINNY
    )  # the default on Intel; on AMD the default (packed) leaves it only with blocks
    if blocks:
        assert model.attach_quantized(quantized, "test")
    return model


def _cache_with_contexts(model: LlamaModel, lens: list[int], attn: AttentionBackend, block: int = BLOCK):
    """A cache whose sequences hold ``lens`` tokens (prefilled in one Python step), and their tables."""
    blocks_per = [-(-(n + 1) // block) for n in lens]  # room for the decode token
    cache = torch.zeros(sum(blocks_per) + 1, model.cfg.num_hidden_layers, 2, block, model.num_kv_heads, model.head_dim)
    tables = torch.zeros(len(lens), max(blocks_per), dtype=torch.int32)
    first = 1  # block 0 unused: a wrong table read shows
    for s, n in enumerate(blocks_per):
        tables[s, :n] = torch.arange(first, first + n, dtype=torch.int32)
        first += n
    positions = torch.cat([torch.arange(n) for n in lens])
    slot = torch.cat([tables[s, torch.arange(n) // block].long() for s, n in enumerate(lens)])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        0, sum(lens), slot, positions % block, None, None, tables, cu, torch.tensor(lens, dtype=torch.int32)
    )
    ids = torch.randint(3, model.cfg.vocab_size, (sum(lens),), generator=torch.Generator().manual_seed(1))
    model.forward(ids, positions, cache, meta, attn)
    return cache, tables


def _decode_step(
    model: LlamaModel, cache: torch.Tensor, tables: torch.Tensor, lens: list[int], attn: AttentionBackend
) -> torch.Tensor:
    pos, block = torch.tensor(lens), cache.shape[3]
    meta = AttentionMetadata(
        len(lens),
        0,
        tables[torch.arange(len(lens)), pos // block].long(),
        pos % block,
        tables,
        torch.tensor([n + 1 for n in lens], dtype=torch.int32),
        None,
        None,
        None,
    )
    ids = torch.randint(3, model.cfg.vocab_size, (len(lens),), generator=torch.Generator().manual_seed(2))
    return model.forward(ids, pos, cache, meta, attn, keep=torch.arange(len(lens)))


def _both_ways(model: LlamaModel, lens: list[int], block: int = BLOCK):
    """(hidden, cache) of one decode step through the C loop and through the Python forward."""
    attn = select_backend(torch.device("cpu"))
    cache, tables = _cache_with_contexts(model, lens, attn, block)
    before = cache.clone()
    looped = _decode_step(model, cache, tables, lens, attn)
    assert model._decode_plan is not None  # the loop ran
    kernels = model.kernels
    model.use_kernels(replace(kernels, decode_layers=None))
    try:
        python_cache = before.clone()
        python = _decode_step(model, python_cache, tables, lens, attn)
    finally:
        model.use_kernels(kernels)
    return (looped, cache), (python, python_cache)


@pytest.mark.parametrize("blocks", [False, True], ids=["skinny", "gguf-blocks"])
@pytest.mark.parametrize(
    "lens",
    [[5], [40, 17, 3], [31] * 4 + [100, 1, 64], [7 + 9 * i for i in range(33)]],
    ids=["1-row", "3-rows", "7-rows", "33-rows"],
)
def test_the_loop_is_the_python_forward_bit_for_bit(blocks, lens):
    model = _model(blocks=blocks)
    (looped, cache), (python, python_cache) = _both_ways(model, lens)
    assert torch.equal(looped, python)
    assert torch.equal(cache, python_cache)  # every layer's K/V of the new token, in its slot


@pytest.mark.parametrize("block", [8, 32, 64])
def test_other_block_sizes(block):
    model = _model()
    (looped, cache), (python, python_cache) = _both_ways(model, [3, 70, 129], block)
    assert torch.equal(looped, python) and torch.equal(cache, python_cache)


def test_a_smollm2_shaped_model():  # 9 query heads on 3 KV heads of 64: the default model's attention shape
    model = _model(
        {
            "hidden_size": 576,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "intermediate_size": 1536,
            "num_hidden_layers": 2,
        },
        blocks=True,
    )
    (looped, cache), (python, python_cache) = _both_ways(model, [20, 90, 33])
    assert torch.equal(looped, python) and torch.equal(cache, python_cache)


def test_a_qkv_bias_and_threads():
    model = _model({"attention_bias": True})  # Qwen2's q/k/v bias
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        (looped, _), (python, _) = _both_ways(model, [12, 50])
        assert torch.equal(looped, python)
        torch.set_num_threads(2)
        (looped2, _), _ = _both_ways(model, [12, 50])
        assert torch.equal(looped2, looped)
    finally:
        torch.set_num_threads(before)


def test_the_loop_stands_aside_where_a_call_would_not_be_a_compiled_kernel():
    attn = select_backend(torch.device("cpu"))
    model = _model()
    cache, tables = _cache_with_contexts(model, [9, 20], attn)
    _decode_step(model, cache, tables, [9, 20], attn)
    plan = model._decode_plan
    assert plan is not None
    model.set_projections(ProjectionMode.PACKED)  # oneDNN multiplies: no plan
    _decode_step(model, cache, tables, [9, 20], attn)
    assert model._decode_plan is None
    model.set_projections(ProjectionMode.SKINNY)  # a fresh plan, not the old one's pointers
    _decode_step(model, cache, tables, [9, 20], attn)
    assert model._decode_plan is not None and model._decode_plan is not plan
    no_kernel = AttentionBackend(attn.name, attn.write_kv, attn.decode, attn.prefill)  # no compiled decode kernel
    _decode_step(model, cache, tables, [9, 20], no_kernel)
    assert model._decode_plan is None
    h = torch.zeros(MAX_ROWS + 1, model.cfg.hidden_size)
    plan = model.kernels.decode_layers.plan(model, cache, attn.decode_kernel())
    int64 = torch.zeros(MAX_ROWS + 1, dtype=torch.int64)
    assert (
        model.kernels.decode_layers.run(
            plan,
            h,
            int64,
            int64,
            int64,
            torch.zeros((MAX_ROWS + 1, 1), dtype=torch.int32),
            torch.ones(MAX_ROWS + 1, dtype=torch.int32),
        )
        is None
    )  # past the row limit
    native = model.kernels
    model.use_kernels(replace(native, layer_ops=TorchLayerOps()))  # norms and rotary embedding in torch: no plan
    _decode_step(model, cache, tables, [9, 20], attn)
    assert model._decode_plan is None
    model.use_kernels(native)
    _decode_step(model, cache, tables, [9, 20], attn)
    assert model._decode_plan is not None
