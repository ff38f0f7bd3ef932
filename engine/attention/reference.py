"""Torch reference paged attention: the CPU implementation, and the oracle for the Triton kernels.

Decode is batched (one gather of every sequence's blocks, then one masked attention); prefill loops
over the (few) prefilling sequences of a step, each attending to its paged context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_block: torch.Tensor,
    slot_offset: torch.Tensor,
) -> None:
    """Scatter new tokens' K/V ``[T, kv_heads, head_dim]`` into their (block, offset) slots."""
    k_cache[slot_block, slot_offset] = k
    v_cache[slot_block, slot_offset] = v


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    block_size = k_cache.shape[1]
    max_len = block_tables.shape[1] * block_size
    idx = block_tables.long()
    # One gather of every sequence's blocks: [B, max_blocks, bs, H, D] -> [B, H, max_len, D] (a view).
    k = k_cache[idx].view(num_seqs, max_len, kv_heads, head_dim).transpose(1, 2)
    v = v_cache[idx].view(num_seqs, max_len, kv_heads, head_dim).transpose(1, 2)
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]
    # SDPA's fused CPU kernel reads the strided views and shares KV heads across the query group
    # without copies (faster than matmul + softmax).
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True
    )
    return out.view(num_seqs, num_heads, head_dim)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    head_dim = q.shape[2]
    kv_heads = k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for s, ctx_len in enumerate(lens):
        q_start, q_end = cu[s], cu[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        n_blocks = -(-ctx_len // block_size)
        idx = block_tables[s, :n_blocks].long()
        k = k_cache[idx].reshape(-1, kv_heads, head_dim)[:ctx_len]
        v = v_cache[idx].reshape(-1, kv_heads, head_dim)[:ctx_len]
        qs = q[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, nh, q_len, D]
        ks = k.transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
        vs = v.transpose(0, 1).unsqueeze(0)
        if ctx_len == q_len:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            # Query i sits at context position (ctx_len - q_len + i) and sees keys up to it.
            qpos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
            mask = torch.arange(ctx_len, device=q.device)[None, :] <= qpos[:, None]
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[q_start:q_end] = o[0].transpose(0, 1)
    return out


def paged_windowed_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Decode or prefill rows (decode: ``cu_seqlens_q`` = 0, 1, ..., D) attending within a sliding
    ``window`` (query i sees key j when 0 <= i - j < window) with scores soft-capped to
    ``softcap * tanh(s / softcap)``, in transformers' eager arithmetic (SDPA has no soft-capping).
    Only the blocks the window reaches are read."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for s, ctx_len in enumerate(seq_lens.tolist()):
        q_start, q_end = cu[s], cu[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        first = 0 if window is None else max(0, ctx_len - q_len - window + 1) // block_size  # first block in reach
        idx = block_tables[s, first : -(-ctx_len // block_size)].long()
        base = first * block_size
        k = k_cache[idx].reshape(-1, kv_heads, head_dim)[: ctx_len - base].transpose(0, 1)  # [H, L, D]
        v = v_cache[idx].reshape(-1, kv_heads, head_dim)[: ctx_len - base].transpose(0, 1)
        k = k.repeat_interleave(heads // kv_heads, dim=0)
        v = v.repeat_interleave(heads // kv_heads, dim=0)
        qs = q[q_start:q_end].transpose(0, 1)  # [nh, q_len, D]
        scores = torch.matmul(qs, k.transpose(1, 2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        qpos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)[:, None]
        kpos = torch.arange(base, ctx_len, device=q.device)[None, :]
        seen = kpos <= qpos
        if window is not None:
            seen &= kpos > qpos - window
        scores = scores.masked_fill(~seen, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1)
    return out
