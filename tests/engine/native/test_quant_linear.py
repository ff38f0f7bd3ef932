"""The quantized projection kernel (engine/native/quant_linear.c): its dequantization gives gguf's
floats bit for bit, and its products are the dense skinny kernel's on those floats, bit for bit, at
row counts across tile and thread boundaries, K in one, one and a part, and two chunks, N not a
multiple of the tile, with bias and strided rows. A projection uses the blocks only where it has them
and only up to the row limit."""

from typing import cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.model.linear import Linear
from engine.native.quant_linear import MAX_ROWS, NativeQuantLinear, QuantizedWeight
from engine.native.skinny_linear import NativeSkinnyLinear

_kernel, _skinny = NativeQuantLinear.load(), NativeSkinnyLinear.load()
needs_kernel = pytest.mark.skipif(
    _kernel is None or _skinny is None,
    reason="quantized kernel not built here (no AVX-512 or AVX2 with FMA, no F16C, or no compiler)",
)
# (the tests that call them are skipped where they are None)
kernel, skinny = cast(NativeQuantLinear, _kernel), cast(NativeSkinnyLinear, _skinny)
QTYPES = ("Q4_1", "Q8_0")


def quantized(out_features: int, in_features: int, qtype: str, seed: int) -> tuple[QuantizedWeight, torch.Tensor]:
    """Random weights quantized by gguf, and gguf's own dequantization of them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(seed).standard_normal((out_features, in_features)).astype(np.float32)
    kind = GGMLQuantizationType[qtype]
    blocks = quantize(w, kind)
    floats = np.asarray(dequantize(blocks, kind), dtype=np.float32).reshape(out_features, in_features)
    return QuantizedWeight(torch.from_numpy(blocks.reshape(out_features, -1).copy()), qtype), torch.from_numpy(
        floats.copy()
    )


@needs_kernel
@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantization_is_gguf_bit_for_bit(qtype):
    weight, floats = quantized(37, 96, qtype, seed=1)
    assert weight.shape == (37, 96)
    assert torch.equal(kernel.dequantize(weight).view(torch.int32), floats.view(torch.int32))


@needs_kernel
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16, 33, 64])
@pytest.mark.parametrize("out_features,in_features", [(1, 32), (7, 64), (13, 576), (19, 800), (203, 1536)])
def test_products_are_the_skinny_kernels_bit_for_bit(qtype, rows, out_features, in_features):
    weight, floats = quantized(out_features, in_features, qtype, seed=rows + out_features)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = kernel(x, weight, None)
    assert torch.equal(got, skinny(x, floats, None))
    torch.testing.assert_close(got, F.linear(x, floats), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("out_features,in_features", [(8, 32), (16, 576), (24, 800), (200, 1536)])
def test_q4_1_in_8_row_groups_gives_the_same_floats_and_products(out_features, in_features):
    """regroup's layout (the model's, for Q4_1) dequantizes to gguf's floats and multiplies them as the
    skinny kernel does, bit for bit, at row counts across tile and thread boundaries."""
    weight, floats = quantized(out_features, in_features, "Q4_1", seed=out_features)
    grouped = weight.regroup()
    assert grouped.qtype == "Q4_1x8" and grouped.shape == weight.shape
    assert torch.equal(kernel.dequantize(grouped).view(torch.int32), floats.view(torch.int32))
    b = torch.randn(out_features, generator=torch.Generator().manual_seed(1))
    for rows in (1, 2, 3, 5, 8, 16, 33, 64):
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(kernel(x, grouped, None), skinny(x, floats, None))
        assert torch.equal(kernel(x, grouped, b), kernel(x, weight, b))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_one_row_multiplies_the_8_row_groups_straight_from_registers_with_the_same_floats(rows):
    """One row skips the L1 buffer (direct_row_q4_1x8; 2 and 3 rows go through it, beside it): strided
    rows, a bias, K over two chunks and a part (each chunk's sums added to out), several threads: the
    skinny kernel's floats either way."""
    weight, floats = quantized(48, 1600, "Q4_1", seed=5)
    grouped = weight.regroup()
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1700, generator=g)[:, 50 : 50 + 1600]
    b = torch.randn(48, generator=g)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            assert torch.equal(kernel(x, grouped, b), skinny(x, floats, b))
            assert torch.equal(kernel(x, grouped, None), skinny(x, floats, None))
    finally:
        torch.set_num_threads(before)


def test_regroup_takes_q4_1_in_whole_groups_only():
    q4, _ = quantized(12, 64, "Q4_1", seed=2)
    q8, _ = quantized(16, 64, "Q8_0", seed=2)
    assert q4.regroup() is q4 and q8.regroup() is q8  # 12 rows: no whole groups; Q8_0: as stored
    grouped = quantized(16, 64, "Q4_1", seed=3)[0].regroup()
    with pytest.raises(ValueError, match="groups of 8 rows"):
        QuantizedWeight(grouped.blocks[:12].contiguous(), "Q4_1x8")
    assert QuantizedWeight.cat([grouped, grouped]) is None  # byte rows are not weight rows: fuse before


@needs_kernel
def test_bias_strided_rows_and_threads():
    weight, floats = quantized(45, 64, "Q4_1", seed=3)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 200, generator=g)[:, 8 : 8 + 64]  # rows 200 floats apart
    b = torch.randn(45, generator=g)
    assert torch.equal(kernel(x, weight, b), skinny(x, floats, b))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x, weight, b)
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(kernel(x, weight, b), one)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_a_projection_multiplies_its_blocks_only_where_it_has_them():
    weight, floats = quantized(24, 64, "Q8_0", seed=5)
    with_blocks, without = Linear(floats.clone()), Linear(floats.clone())
    with_blocks.quantized = weight
    for proj in (with_blocks, without):
        proj.use("quantized", skinny, kernel)
    assert with_blocks.quant is kernel and without.quant is None and without.skinny is skinny
    g = torch.Generator().manual_seed(6)
    for rows in (1, MAX_ROWS):
        x = torch.randn(rows, 64, generator=g)
        assert torch.equal(with_blocks(x), skinny(x, floats, None))
    x = torch.randn(MAX_ROWS + 1, 64, generator=g)  # past the limit: MKL on the dense weight
    assert torch.equal(with_blocks(x), F.linear(x, floats))
    with_blocks.use("skinny", skinny)
    assert with_blocks.quant is None and with_blocks.quantized is weight  # blocks kept for the way back


def test_blocks_are_validated():
    with pytest.raises(ValueError, match="must be one of"):
        QuantizedWeight(torch.zeros(2, 20, dtype=torch.uint8), "Q4_0")
    with pytest.raises(ValueError, match="contiguous uint8"):
        QuantizedWeight(torch.zeros(2, 21, dtype=torch.uint8), "Q4_1")
    with pytest.raises(ValueError, match="contiguous uint8"):
        QuantizedWeight(torch.zeros(2, 20), "Q4_1")
    a = QuantizedWeight(torch.zeros(2, 20, dtype=torch.uint8), "Q4_1")
    assert QuantizedWeight.cat([a, a]).shape == (4, 32)
    assert QuantizedWeight.cat([a, QuantizedWeight(torch.zeros(2, 34, dtype=torch.uint8), "Q8_0")]) is None
    assert QuantizedWeight.cat([]) is None


def test_without_the_kernel_quantized_mode_is_refused(monkeypatch):
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    assert NativeQuantLinear.load() is None
    with pytest.raises(ValueError, match="need the compiled kernel"):
        Linear(torch.randn(8, 32)).use("quantized", skinny, None)
