"""The CPU attention path (reused buffers, per-step mask) against the torch reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.attention import reference as ref
from engine.attention.cpu import CpuPagedAttention
from tests.engine.attention.test_triton_kernels import DECODE_CASES, PREFILL_CASES, decode_inputs, prefill_inputs

FP32_DECODE = {k: v for k, v in DECODE_CASES.items() if "dtype" not in v}
FP32_PREFILL = {k: v for k, v in PREFILL_CASES.items() if "dtype" not in v}


@pytest.mark.parametrize("name", sorted(FP32_DECODE))
def test_decode_matches_the_reference(name):
    args = decode_inputs(FP32_DECODE[name])
    torch.testing.assert_close(
        CpuPagedAttention().decode(*args), ref.paged_decode_attention(*args), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("name", sorted(FP32_PREFILL))
def test_prefill_matches_the_reference(name):
    args = prefill_inputs(FP32_PREFILL[name])
    torch.testing.assert_close(
        CpuPagedAttention().prefill(*args), ref.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5
    )


def test_one_instance_across_shapes_and_steps_reuses_nothing_stale():
    """Buffers and the mask carry over between calls: every call must still see its own inputs."""
    attn = CpuPagedAttention()
    cases = [FP32_DECODE[n] for n in sorted(FP32_DECODE)] * 2
    for case in cases:
        args = decode_inputs(case)
        torch.testing.assert_close(attn.decode(*args), ref.paged_decode_attention(*args), rtol=1e-5, atol=1e-5)
    # Same shapes, new lengths written into the same seq_lens tensor (an in-place update): the mask
    # must follow the values, not the tensor object.
    q, kc, vc, bt, seq_lens, scale = decode_inputs(FP32_DECODE["gqa3_bs16_d64_smollm2"])
    attn.decode(q, kc, vc, bt, seq_lens, scale)
    seq_lens[0] = 5
    torch.testing.assert_close(
        attn.decode(q, kc, vc, bt, seq_lens, scale),
        ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale),
        rtol=1e-5,
        atol=1e-5,
    )
    for name in sorted(FP32_PREFILL):  # prefill shares the gather buffer with decode
        chunk = prefill_inputs(FP32_PREFILL[name])
        torch.testing.assert_close(attn.prefill(*chunk), ref.paged_prefill_attention(*chunk), rtol=1e-5, atol=1e-5)


def test_the_cpu_backend_is_this_path():
    from engine.attention.backend import select_backend

    backend = select_backend(torch.device("cpu"))
    assert backend.name == "torch" and isinstance(backend.decode.__self__, CpuPagedAttention)  # type: ignore[attr-defined]  # the backend's bound method
    # Each selection owns its buffers (one per runner).
    assert select_backend(torch.device("cpu")).decode.__self__ is not backend.decode.__self__  # type: ignore[attr-defined]  # the backend's bound method


def test_spread_lengths_attend_in_groups_and_match_the_reference():
    from engine.attention.decode_groups import length_groups

    case: dict[str, Any] = dict(
        heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[1, 700, 3, 650, 20, 640, 2, 300, 310]
    )
    q, kc, vc, bt, seq_lens, scale = decode_inputs(case)
    assert len(length_groups([-(-n // 16) for n in case["lens"]], bt.shape[1])) > 1  # the grouped path runs
    torch.testing.assert_close(
        CpuPagedAttention().decode(q, kc, vc, bt, seq_lens, scale),
        ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale),
        rtol=1e-5,
        atol=1e-5,
    )


def test_length_groups_partition_the_rows_and_cover_their_lengths():
    import random

    from engine.attention.decode_groups import MAX_GROUPS, length_groups

    rng = random.Random(0)
    for _ in range(200):
        blocks = [rng.randint(1, rng.choice([2, 10, 80])) for _ in range(rng.randint(1, 70))]
        width = max(blocks) + rng.randint(0, 3)
        groups = length_groups(blocks, width)
        rows = sorted(r for g, _ in groups for r in g)
        assert rows == list(range(len(blocks)))
        assert 1 <= len(groups) <= MAX_GROUPS
        assert all(blocks[r] <= w for g, w in groups for r in g)
        if len(groups) == 1:
            assert groups[0] == (list(range(len(blocks))), width)  # the ungrouped path: rows in order
        else:  # grouping only when it saves padded work
            assert sum(len(g) * w for g, w in groups) < len(blocks) * max(blocks)
    assert len(length_groups([7] * 40, 7)) == 1


@pytest.mark.parametrize("without_lse_op", [False, True])
def test_a_chunk_after_a_cached_prefix_matches_the_reference_either_way(monkeypatch, without_lse_op):
    """Chunks after a prefix go through two flash calls merged by log-sum-exp where torch has the
    op, and a masked SDPA where it has not: both are the reference's attention."""
    import engine.attention.cpu as cpu

    if without_lse_op:
        monkeypatch.setattr(cpu, "_FLASH_WITH_LSE", None)
    elif cpu._FLASH_WITH_LSE is None:
        pytest.skip("this torch has no CPU flash attention op with log-sum-exp")
    case = dict(heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[300, 1, 17], ctx=[1100, 50, 17])
    args = prefill_inputs(case)
    torch.testing.assert_close(
        CpuPagedAttention().prefill(*args), ref.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5
    )
