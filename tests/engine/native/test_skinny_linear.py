"""The skinny projection kernel (engine/native/skinny_linear.c) against F.linear: row counts across
tile and thread boundaries, weights whose rows are not a multiple of the tile, bias, strided input
rows; refused weights and the row limit leave the product to MKL."""

from typing import cast

import pytest
import torch
import torch.nn.functional as F

from engine.model.linear import Linear
from engine.native.skinny_linear import MAX_ROWS, NativeSkinnyLinear

_loaded = NativeSkinnyLinear.load()
needs_kernel = pytest.mark.skipif(
    _loaded is None, reason="skinny kernel not built here (no AVX-512 or AVX2 with FMA, or no compiler)"
)
kernel = cast(NativeSkinnyLinear, _loaded)  # (the tests that call it are skipped where it is None)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 16, 31, 63, 64])
@pytest.mark.parametrize(
    "out_features,in_features", [(1, 16), (7, 32), (8, 48), (13, 64), (96, 576), (19, 800), (203, 1536)]
)
def test_matches_f_linear(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(rows, in_features, generator=g)
    w = torch.randn(out_features, in_features, generator=g)
    torch.testing.assert_close(kernel(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_bias_and_strided_rows():
    g = torch.Generator().manual_seed(7)
    wide = torch.randn(5, 200, generator=g)
    x = wide[:, 8 : 8 + 64]  # rows 200 floats apart, unit column stride
    w, b = torch.randn(45, 64, generator=g), torch.randn(45, generator=g)
    assert not x.is_contiguous()
    torch.testing.assert_close(kernel(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_result(threads):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 96, generator=g), torch.randn(100, 96, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x, w, None)
        torch.set_num_threads(threads)
        assert torch.equal(kernel(x, w, None), one)  # each output is one thread's dot product: same sums
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_a_projection_takes_the_kernel_only_for_weights_and_rows_it_handles():
    g = torch.Generator().manual_seed(5)
    ok = Linear(torch.randn(24, 48, generator=g), torch.randn(24, generator=g))
    ok.use("skinny", kernel)
    assert ok.skinny is kernel
    odd = Linear(torch.randn(24, 40, generator=g))  # in-features not a multiple of 16
    odd.use("skinny", kernel)
    assert odd.skinny is None
    for rows in (0, 1, MAX_ROWS, MAX_ROWS + 1, 300):  # 0 and past MAX_ROWS: MKL
        x = torch.randn(rows, 48, generator=g)
        torch.testing.assert_close(ok(x), F.linear(x, ok.weight, ok.bias), rtol=1e-5, atol=1e-4)
    x = torch.randn(48, 3, generator=g).t()  # column stride 3: MKL
    torch.testing.assert_close(ok(x), F.linear(x, ok.weight, ok.bias), rtol=1e-5, atol=1e-4)
    x = torch.randn(3, 40, generator=g)
    torch.testing.assert_close(odd(x), F.linear(x, odd.weight), rtol=1e-5, atol=1e-4)


def test_without_the_kernel_skinny_mode_is_refused(monkeypatch):
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    assert NativeSkinnyLinear.load() is None
    proj = Linear(torch.randn(8, 16))
    with pytest.raises(ValueError, match="need the compiled kernel"):
        proj.use("skinny", None)
