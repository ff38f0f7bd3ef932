"""The greedy head (engine/native/greedy_head.c): an int8 screen of a Q8_0 head with a proven bound,
then the exact logits of the tokens it cannot rule out, must give the fp32 head's argmax (the
quantized kernel's logits, then torch's argmax rules) for every row: near ties, exact ties (first
index), outlier features, one row to 64. Runs where the kernel builds (AVX-512 VNNI)."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.native.greedy_head import GreedyHeadWeights, NativeGreedyHead
from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def kernels():
    head, linear = NativeGreedyHead.load(), NativeQuantLinear.load()
    if head is None or linear is None:
        pytest.skip("the greedy head needs AVX-512 VNNI (and the quantized kernel): not this CPU")
    return head, linear


def q8_0_head(n: int, k: int, seed: int = 0) -> QuantizedWeight:
    """Random Q8_0 blocks: quants over the whole int8 range, scales of a real model's spread."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, k // 32, 34), dtype=torch.uint8, generator=g)
    scales = (torch.rand(n, k // 32, generator=g) * 0.004 + 0.0005).half()
    blocks[..., 0:2] = scales.view(torch.uint8).view(n, k // 32, 2)
    return QuantizedWeight(blocks.view(n, -1).contiguous(), "Q8_0")


def full_argmax(linear: NativeQuantLinear, x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    return linear(x, weight, None).argmax(dim=-1)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17, 64])
def test_tokens_equal_the_fp32_heads_argmax(kernels, rows):
    head, linear = kernels
    weight = q8_0_head(4096, 576)
    prepared = GreedyHeadWeights.of(weight)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=g)
    x[:, 7] *= 40  # an outlier feature, as final hidden states have: one block's scale is large
    x[rows // 2, 100:132] = 0  # a block of zeros (scale 0)
    tokens, candidates = head(x, prepared)
    assert torch.equal(tokens, full_argmax(linear, x, weight))
    assert rows <= candidates < rows * 4096 // 8  # the screen ruled most tokens out


def test_near_ties_go_to_the_exact_logits(kernels):
    """Tokens whose logits differ in the last bits: the screen cannot tell them apart, the exact
    logits can, and the answer is the fp32 head's."""
    head, linear = kernels
    n, k = 1024, 256
    weight = q8_0_head(n, k, seed=3)
    blocks = weight.blocks.view(n, k // 32, 34)
    g = torch.Generator().manual_seed(4)
    for t in range(1, 64):  # tokens 1..63: token 0's blocks with one quant nudged by one
        blocks[t] = blocks[0]
        at = int(torch.randint(0, k, (1,), generator=g))
        q = blocks[t, at // 32, 2 + at % 32].view(torch.int8)
        q += 1 if int(q) < 127 else -1
    x = torch.randn(16, k, generator=g) * 1e-3
    x[:, :] += torch.randn(k, generator=g)  # rows alike, so the nudged tokens compete with token 0
    tokens, candidates = head(x, GreedyHeadWeights.of(weight))
    assert torch.equal(tokens, full_argmax(linear, x, weight))
    assert candidates >= 16 * 2  # the near-ties were recomputed, not screened out


def test_exact_ties_take_the_first_index(kernels):
    """Tokens 17, 300 and 301 have the same blocks, made the largest logit: 17, as torch's argmax says."""
    head, linear = kernels
    n, k = 512, 128
    weight = q8_0_head(n, k, seed=5)
    blocks = weight.blocks.view(n, k // 32, 34)
    g = torch.Generator().manual_seed(6)
    base = torch.randn(k, generator=g)
    x = base + 1e-3 * torch.randn(4, k, generator=g)
    aligned = torch.where(base > 0, 127, -127).to(torch.int8).view(k // 32, 32)
    for t in (17, 300, 301):
        blocks[t, :, 2:] = aligned.view(torch.uint8)
        blocks[t, :, 0:2] = torch.full((k // 32,), 0.004, dtype=torch.float16).view(torch.uint8).view(k // 32, 2)
    assert full_argmax(linear, x, weight).tolist() == [17] * 4
    tokens, candidates = head(x, GreedyHeadWeights.of(weight))
    assert tokens.tolist() == [17] * 4
    assert candidates >= 3 * 4  # all three recomputed in every row


def test_many_random_rows_and_heads(kernels):
    """The bound is a proof, not a tuning: every row of many random heads and inputs, of every scale."""
    head, linear = kernels
    for seed in range(6):
        weight = q8_0_head(2048, 64 * (seed + 1), seed=10 + seed)
        prepared = GreedyHeadWeights.of(weight)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(64, weight.shape[1], generator=g) * 10.0 ** (seed - 3)
        tokens, _ = head(x, prepared)
        assert torch.equal(tokens, full_argmax(linear, x, weight)), seed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_row_that_is_not_finite_is_left_to_the_full_head(kernels, bad):
    head, _ = kernels
    x = torch.randn(3, 64)
    x[1, 5] = bad
    assert head(x, GreedyHeadWeights.of(q8_0_head(256, 64))) is None


@pytest.mark.parametrize("scale", [1e30, 1e36, 1e38, 2.9e38])
def test_rows_near_the_float_range_give_the_full_heads_token_or_defer_to_it(kernels, scale):
    """Where logits or the screen's bounds overflow (inf, inf - inf), the kernel hands the rows back
    rather than guess (at 2.9e38 it must: the full head's logits hold NaN there)."""
    head, linear = kernels
    weight = q8_0_head(512, 64, seed=8)
    x = (torch.rand(4, 64, generator=torch.Generator().manual_seed(9)) * 2 - 1) * scale
    got = head(x, GreedyHeadWeights.of(weight))
    if scale == 2.9e38:
        assert got is None
    else:
        assert got is not None and torch.equal(got[0], full_argmax(linear, x, weight))


def test_weights_it_does_not_take():
    assert GreedyHeadWeights.of(q8_0_head(100, 64)) is None  # tokens not a multiple of 32
    q4 = QuantizedWeight(torch.zeros(64, 2 * 20, dtype=torch.uint8), "Q4_1")
    assert GreedyHeadWeights.of(q4) is None


def test_rows_it_does_not_take(kernels):
    head, _ = kernels
    prepared = GreedyHeadWeights.of(q8_0_head(256, 64))
    for x in (torch.randn(65, 64), torch.randn(2, 32), torch.randn(2, 64, dtype=torch.float64)):
        with pytest.raises(ValueError, match="greedy head takes"):
            head(x, prepared)
