"""AMX projections (engine/native/amx_linear.c): x and w split into three bf16 pieces, six tile
products a pair. The splits must be exact (an identity or permutation weight gives x back bit for
bit), products of bf16-exact operands exact, and every other product fp32-class against float64.
The kernel runs where the CPU has AMX-BF16 and Linux grants the tile state; the build without AMX
(any other CPU) must say so instead of failing."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.model.linear import Linear
from engine.native.amx_linear import NativeAmxLinear
from engine.native.build import bind, build_and_load

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def amx():
    kernel = NativeAmxLinear.load()
    if kernel is None:
        pytest.skip("AMX projections need an Intel CPU with AMX-BF16 (and Linux's tile permission): not this one")
    return kernel


def _x(rows: int, k: int, seed: int) -> torch.Tensor:
    """Activations with full 24-bit significands and a spread of magnitudes (the splits' hard case)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, k), generator=g).float())


def test_build_without_amx_says_unavailable(tmp_path):
    lib = build_and_load("amx_linear.c", cache_dir=tmp_path, extra_flags=("-mno-amx-tile", "-mno-amx-bf16")).lib
    if lib is None:
        pytest.skip("the compiler does not take -mno-amx-tile")
    assert bind(lib, "baton_amx_available", "", ctypes.c_int)() == 0
    assert bind(lib, "baton_amx_linear", "plpppllllpi", ctypes.c_int)(0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1) == 1


@pytest.mark.parametrize("rows,k", [(1, 7), (65, 576), (300, 100), (33, 1536)])
def test_identity_and_permutation_give_x_back_bit_for_bit(amx, rows, k):
    x = _x(rows, k, seed=rows)
    assert torch.equal(amx(x, amx.pack(torch.eye(k)), None), x)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(k))
    assert torch.equal(amx(x, amx.pack(torch.eye(k)[perm]), None), x[:, perm])


def test_bf16_exact_operands_give_exact_sums(amx):
    """Small integers: every product and every partial sum is exact in fp32, so the result must equal
    float64's exactly, whatever the order of the sums (a wrong pair or tile layout would not)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-100, 101, (130, 96), generator=g).float()
    w = torch.randint(-100, 101, (50, 96), generator=g).float() * 3.0
    want = (x.double() @ w.double().T).float()
    assert torch.equal(amx(x, amx.pack(w), None), want)


@pytest.mark.parametrize(
    "rows,k,n", [(1, 5, 3), (65, 64, 16), (129, 576, 192), (300, 1536, 576), (700, 576, 1536), (97, 100, 70)]
)
def test_products_are_fp32_class(amx, rows, k, n):
    """Against float64: no larger an error than MKL's fp32 product makes, within a factor."""
    x = _x(rows, k, seed=k)
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g)
    want = x.double() @ w.double().T + bias.double()
    got = amx(x, amx.pack(w), bias)
    scale = (x.double().abs() @ w.double().abs().T).clamp_min(1e-30)  # the sums' magnitudes
    amx_err = ((got.double() - want).abs() / scale).max().item()
    fp32_err = ((F.linear(x, w, bias).double() - want).abs() / scale).max().item()
    assert amx_err <= max(4 * fp32_err, 2 * 2.0**-24 * k**0.5), (amx_err, fp32_err)


@pytest.mark.parametrize("rows,k,n", [(300, 4100, 40), (70, 8192, 33)])
def test_a_long_k_goes_in_blocks_with_the_same_sums(amx, rows, k, n):
    """K past what a chunk of enough rows holds is split into blocks, the sums kept between them:
    fp32-class like the rest, and the blocks' sums exact (an identity weight gives x back), with
    bias, a row stride past the width and rows over more than one chunk."""
    wide = _x(rows, k + 3, seed=k)
    x = wide[:, :k]  # a view: row stride k + 3
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g)
    want = x.double() @ w.double().T + bias.double()
    got = amx(x, amx.pack(w), bias)
    scale = (x.double().abs() @ w.double().abs().T).clamp_min(1e-30)
    amx_err = ((got.double() - want).abs() / scale).max().item()
    fp32_err = ((F.linear(x, w, bias).double() - want).abs() / scale).max().item()
    assert amx_err <= max(4 * fp32_err, 2 * 2.0**-24 * k**0.5), (amx_err, fp32_err)
    pick = torch.zeros(n, k)
    pick[torch.arange(n), torch.arange(n) * (k // n)] = 1.0  # output j is x's column j * (k // n): every K block
    assert torch.equal(amx(x, amx.pack(pick), None), x[:, torch.arange(n) * (k // n)])


def test_strided_rows_and_many_chunks(amx):
    """x a view with a row stride past its width, and more rows than one chunk of the kernel holds."""
    base = _x(3000, 200, seed=3)
    x = base[:, :150]
    w = torch.randn(40, 150, generator=torch.Generator().manual_seed(2))
    got = amx(x, amx.pack(w), None)
    want = x.double() @ w.double().T
    assert ((got.double() - want).abs() / (x.double().abs() @ w.double().abs().T)).max() < 1e-6


def test_refuses_bad_shapes(amx):
    w = amx.pack(torch.randn(8, 32))
    with pytest.raises(ValueError, match="AMX linear"):
        amx(torch.randn(100, 16), w, None)
    with pytest.raises(ValueError, match="AMX projections"):
        amx.pack(torch.randn(8, 32, dtype=torch.float64))


def test_linear_sends_only_larger_products(amx, monkeypatch):
    w, b = torch.randn(96, 64), torch.randn(96)
    lin = Linear(w.clone(), b)
    lin.use_amx(amx)
    assert lin.amx is amx and lin.amx_weight is not None
    big, small = _x(200, 64, seed=5), _x(64, 64, seed=6)
    calls = []
    real = lin.amx
    monkeypatch.setattr(lin, "amx", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    lin(big), lin(small)
    assert calls == [200]  # 64 rows are a decode step's: the mode's own kernel
    lin.use_amx(None)
    assert lin.amx is None and torch.equal(lin(small), F.linear(small, w, b))


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("BATON_AMX", "0")
    assert NativeAmxLinear.load() is None
