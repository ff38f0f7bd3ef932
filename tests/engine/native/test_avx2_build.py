"""The kernels' AVX2 build (8-lane tile, dequantization without AVX-512's 16-entry table, the decode
attention's 8-lane task, the layer ops' vectorised clamp), built with AVX-512 turned off so it is
tested on AVX-512 hosts too (the CI host): gguf's floats bit for bit, the quantized and skinny
kernels' products equal bit for bit within the build, and close to torch's; decode attention
against the reference; SiLU * up against torch. The default builds are tested by
test_quant_linear.py, test_skinny_linear.py, test_paged_decode.py and test_layer_ops.py."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

from engine.attention import reference as ref
from engine.cpu_info import cpuinfo_field
from engine.model.reference_ops import TorchLayerOps
from engine.native.build import bind, build_and_load
from engine.native.layer_ops import NativeLayerOps
from engine.native.paged_decode import NativePagedDecode
from engine.native.paged_prefill import NativePagedPrefill
from engine.native.quant_linear import NativeQuantLinear
from engine.native.skinny_linear import NativeSkinnyLinear
from tests.engine.attention.test_triton_kernels import decode_inputs, prefill_inputs
from tests.engine.native.test_paged_decode import FP32_DECODE, MORE_CASES
from tests.engine.native.test_paged_prefill import FP32_PREFILL
from tests.engine.native.test_paged_prefill import MORE_CASES as MORE_PREFILL
from tests.engine.native.test_quant_linear import quantized

AVX2_FLAGS = ("-mno-avx512f",)  # after -march=native: what an AVX2-only CPU of the same family builds
cpu_flags = set(cpuinfo_field("flags").split())
pytestmark = pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= cpu_flags, reason="this CPU lacks AVX2, FMA or F16C")


@pytest.fixture(scope="module")
def kernels():
    quant_lib = build_and_load("quant_linear.c", extra_flags=AVX2_FLAGS).lib
    skinny_lib = build_and_load("skinny_linear.c", extra_flags=AVX2_FLAGS).lib
    if quant_lib is None or skinny_lib is None:
        pytest.skip("no C compiler here")
    assert bind(quant_lib, "baton_quant_linear_tuned", "", ctypes.c_int)() == 1
    lanes = bind(skinny_lib, "baton_skinny_linear_tuned", "", ctypes.c_int)()
    assert lanes == 8  # the AVX2 tile
    return NativeQuantLinear(quant_lib), NativeSkinnyLinear(skinny_lib, lanes)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_1x8"])
def test_avx2_dequantization_is_gguf_bit_for_bit(kernels, qtype):
    quant, _ = kernels
    weight, floats = quantized(40, 96, "Q4_1" if qtype == "Q4_1x8" else qtype, seed=3)
    if qtype == "Q4_1x8":
        weight = weight.regroup()
        assert weight.qtype == "Q4_1x8"
    assert torch.equal(quant.dequantize(weight).view(torch.int32), floats.view(torch.int32))


def test_avx2_three_row_tile_gives_the_one_row_tiles_floats(kernels):
    """The tile's two passes of 4 weight rows against 3 rows of x (the default) and its one pass of 8
    against one row (-DMB=1, what it was) give the same floats bit for bit: each column's lane
    sums are reduced alone."""
    lib = build_and_load("skinny_linear.c", extra_flags=(*AVX2_FLAGS, "-DMB=1")).lib
    if lib is None:
        pytest.skip("no C compiler here")
    one_row = NativeSkinnyLinear(lib, 8)
    _, skinny = kernels
    g = torch.Generator().manual_seed(11)
    for rows, n, k in [(2, 5, 32), (3, 8, 800), (7, 13, 1536), (33, 203, 576), (64, 24, 1600)]:
        x = torch.randn(rows, k + 16, generator=g)[:, 16:]
        w, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        assert torch.equal(skinny(x, w, bias), one_row(x, w, bias)), (rows, n, k)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_1x8"])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33, 64])
@pytest.mark.parametrize("out_features,in_features", [(1, 32), (8, 32), (9, 800), (24, 800), (203, 1536)])
def test_avx2_products_are_the_skinny_kernels_bit_for_bit(kernels, qtype, rows, out_features, in_features):
    quant, skinny = kernels
    if qtype == "Q4_1x8":
        out_features = max(8, out_features - out_features % 8)  # it takes whole groups of 8 rows
    weight, floats = quantized(out_features, in_features, "Q4_1" if qtype == "Q4_1x8" else qtype, seed=rows)
    if qtype == "Q4_1x8":
        weight = weight.regroup()
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features + 16, generator=g)[:, 16:]  # strided rows
    bias = torch.randn(out_features, generator=g)
    got = quant(x, weight, bias)
    assert torch.equal(got, skinny(x, floats, bias))
    torch.testing.assert_close(got, F.linear(x, floats, bias), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def avx2_decode() -> NativePagedDecode:
    library = build_and_load("paged_decode.c", extra_flags=AVX2_FLAGS)
    if library.lib is None:
        pytest.skip("no C compiler here")
    return NativePagedDecode(library)


# Beyond the shared cases: the specialised group of 8 at head_dim 128 (two passes of 8 output
# vectors), head_dim 16 (one 16-wide chunk: 2 vectors), and odd blocks.
AVX2_DECODE = {
    "gqa8_d128": dict(heads=16, kv_heads=2, head_dim=128, block_size=16, lens=[1, 70, 300]),
    "gqa2_d16_bs3": dict(heads=4, kv_heads=2, head_dim=16, block_size=3, lens=[1, 2, 3, 40]),
    "gqa6_d80_bs64": dict(heads=6, kv_heads=1, head_dim=80, block_size=64, lens=[63, 64, 129]),
}


@pytest.mark.parametrize("name", sorted(FP32_DECODE) + sorted(MORE_CASES) + sorted(AVX2_DECODE))
def test_avx2_decode_attention_matches_the_reference(avx2_decode, name):
    """Every (group, head_dim) case: the specialised ones (G x 8-lane vectors of head_dim 32, 64 and
    128: one or two passes of 8 output vectors), the generic one, split long contexts, partial blocks."""
    args = decode_inputs({**FP32_DECODE, **MORE_CASES, **AVX2_DECODE}[name])
    torch.testing.assert_close(avx2_decode(*args), ref.paged_decode_attention(*args), rtol=1e-5, atol=1e-5)


def test_avx2_decode_gives_a_sequence_the_same_floats_in_any_batch(avx2_decode):
    q, kc, vc, bt, seq_lens, scale = decode_inputs(MORE_CASES["split_mixed_bs32"])
    together = avx2_decode(q, kc, vc, bt, seq_lens, scale)
    for row in range(len(seq_lens)):
        alone = avx2_decode(q[row : row + 1], kc, vc, bt[row : row + 1], seq_lens[row : row + 1], scale)
        assert torch.equal(alone[0], together[row])


def test_avx2_decode_reading_pieces_ahead_changes_no_float(avx2_decode):
    """touch_piece (the AVX2 build reads a piece's K and V rows ahead with plain loads) only reads:
    the same floats as the build without it, in batches where it runs (heads together: at least
    twice as many pieces as threads) and where it does not."""
    off = NativePagedDecode(build_and_load("paged_decode.c", extra_flags=(*AVX2_FLAGS, "-DTOUCH_BYTES=0")))
    before = torch.get_num_threads()
    try:
        for name in ("split_mixed_bs32", *sorted(AVX2_DECODE)):
            args = decode_inputs({**MORE_CASES, **AVX2_DECODE}[name])
            for threads in (1, 2):
                torch.set_num_threads(threads)
                assert torch.equal(avx2_decode(*args), off(*args)), (name, threads)
    finally:
        torch.set_num_threads(before)


def test_avx2_silu_mul_matches_torch_across_the_range():
    """exp_poly's clamp, vectorised as a blend on AVX2 (-fno-trapping-math), saturates as the scalar one did."""
    library = build_and_load("layer_ops.c", extra_flags=("-ffp-contract=off", *AVX2_FLAGS))
    if library.lib is None:
        pytest.skip("no C compiler here")
    gen = torch.Generator().manual_seed(5)
    gate_up = torch.randn(9, 2 * 1536, generator=gen) * 8
    gate_up[0, :10] = torch.tensor([-1e4, -100.0, -88.0, -87.0, -20.0, 0.0, 1e-30, 20.0, 88.0, 1e4])
    got = NativeLayerOps(library.lib).silu_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, TorchLayerOps.silu_mul(gate_up), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FP32_PREFILL) + sorted(MORE_PREFILL))
def test_avx2_prefill_attention_matches_the_reference(name):
    """8 query lanes a tile and register blocks halved for 16 registers: every (group, head_dim)
    case, chunks after cached prefixes, partial tiles."""
    library = build_and_load("paged_prefill.c", extra_flags=AVX2_FLAGS)
    if library.lib is None:
        pytest.skip("no C compiler here")
    assert bind(library.lib, "baton_paged_prefill_tuned", "", ctypes.c_int)() == 1
    kernel = NativePagedPrefill(library)
    args = prefill_inputs({**FP32_PREFILL, **MORE_PREFILL}[name])
    torch.testing.assert_close(kernel(*args), ref.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5)
