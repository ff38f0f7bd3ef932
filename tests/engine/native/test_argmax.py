"""The compiled row argmax (engine/native/argmax.c) gives torch.argmax's indices, edge cases included."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.native.argmax import NativeArgmax

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def argmax() -> NativeArgmax:
    kernel = NativeArgmax.load()
    assert kernel is not None, "a C compiler is here, so the kernel must build"
    return kernel


@pytest.mark.parametrize("rows,cols", [(1, 49152), (8, 49152), (3, 1), (5, 7), (4, 8), (2, 9), (64, 4096), (0, 16)])
def test_random_rows_match_torch(argmax, rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 1000 + cols))
    assert torch.equal(argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize(
    "row",
    [
        [1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 0.0, 0.0, 3.0],  # ties: the first
        [0.0, -0.0, 0.0, -1.0, -0.0, -2.0, -3.0, -4.0, -0.0],  # -0.0 equals 0.0: the first of either
        [-0.0, 0.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
        [-INF] * 9,  # nothing larger than -inf: index 0
        [-INF] * 8 + [-5.0],  # the largest in the scalar tail
        [1.0, INF, 2.0, INF, 0.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 2.0, NAN, 3.0, NAN, 0.0, 0.0, 0.0, 9.0],  # a NaN is the largest: the first NaN
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, NAN],  # ... in the tail too
        [INF, 2.0, 3.0, 4.0, 5.0, 6.0, NAN, 8.0, 9.0],
        [-1e-45, -1e-38, -3.4e38, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0],
    ],
)
def test_edge_rows_match_torch(argmax, row):
    x = torch.tensor([row, row[::-1]])
    assert torch.equal(argmax(x), x.argmax(dim=-1)), row


def test_strided_rows_and_what_it_does_not_take(argmax):
    base = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    rows = base[::2, 3:30]  # rows 80 floats apart, unit column stride: the kernel takes them
    assert torch.equal(argmax(rows), rows.argmax(dim=-1))
    for x in (base.t(), base.double(), base.bfloat16(), base[0]):  # column-strided, other dtypes, 1-D: torch's
        assert torch.equal(argmax(x), x.argmax(dim=-1))


def test_the_cpu_sampler_takes_it_for_greedy_and_sampled_rows(argmax):
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams

    sampler = Sampler(0, torch.device("cpu"))
    assert isinstance(sampler._argmax, NativeArgmax)
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(2))
    logits[1, 7] = float("nan")  # a NaN row samples the NaN's index, as torch.argmax would
    greedy = sampler.sample(logits, [SamplingParams(max_tokens=1)] * 4, [0] * 4)
    assert torch.equal(greedy, logits.argmax(dim=-1))
    seeded = [SamplingParams(max_tokens=1, temperature=0.8, seed=5)] * 2
    a = sampler.sample(logits[2:], seeded, [3, 3])
    assert torch.equal(a, Sampler(0, torch.device("cpu")).sample(logits[2:], seeded, [3, 3]))
