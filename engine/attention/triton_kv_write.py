"""Triton KV-cache write: scatter new tokens' K/V into their (block, offset) slots.

One fused kernel for K and V instead of two advanced-indexing assignments, and it writes through
the strided (block-major) cache views in place. Semantics are those of
``engine.attention.reference.write_kv`` for valid slots; a token whose ``slot_block`` is negative
(padding) is skipped rather than wrapped around as torch indexing would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    blk_ptr,
    off_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vct,
    stride_vch,
    stride_vcd,
    KV_HEADS: tl.constexpr,
    H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    block = tl.load(blk_ptr + tok).to(tl.int64)
    if block >= 0:
        slot = tl.load(off_ptr + tok).to(tl.int64)
        h = tl.arange(0, H_PAD)[:, None]
        d = tl.arange(0, D_PAD)[None, :]
        ok = (h < KV_HEADS) & (d < HEAD_DIM)
        k = tl.load(k_ptr + tok * stride_kt + h * stride_kh + d * stride_kd, mask=ok)
        v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d * stride_vd, mask=ok)
        kc = kc_ptr + block * stride_kcb + slot * stride_kct + h * stride_kch + d * stride_kcd
        vc = vc_ptr + block * stride_vcb + slot * stride_vct + h * stride_vch + d * stride_vcd
        tl.store(kc, k.to(kc_ptr.dtype.element_ty), mask=ok)
        tl.store(vc, v.to(vc_ptr.dtype.element_ty), mask=ok)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_block: torch.Tensor,
    slot_offset: torch.Tensor,
) -> None:
    """Write ``k``/``v`` ``[T, kv_heads, head_dim]`` into ``cache[slot_block[t], slot_offset[t]]``."""
    num_tokens, kv_heads, head_dim = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (kv_heads, head_dim) or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"write_kv: k {tuple(k.shape)}, v {tuple(v.shape)} do not fit the caches "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if slot_block.shape != (num_tokens,) or slot_offset.shape != (num_tokens,):
        raise ValueError(
            f"write_kv: slot_block {tuple(slot_block.shape)} and slot_offset {tuple(slot_offset.shape)} "
            f"must both be ({num_tokens},)"
        )
    if num_tokens == 0:
        return
    # The kernel indexes the slots as plain arrays: a strided view wrote to the wrong slots.
    slot_block, slot_offset = slot_block.contiguous(), slot_offset.contiguous()
    _kv_write_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_block,
        slot_offset,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        KV_HEADS=kv_heads,
        H_PAD=triton.next_power_of_2(kv_heads),
        HEAD_DIM=head_dim,
        D_PAD=triton.next_power_of_2(head_dim),
    )
