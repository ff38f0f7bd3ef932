"""Triton paged prefill attention: ragged, causal, over each sequence's paged context.

Flash-attention style: a program owns a tile of one sequence's new query tokens for one KV head,
with the group's query heads packed into the tile's rows (row r is token r // GROUP, head
r % GROUP), so each K/V tile read through the block table serves the whole GQA group. Key tiles
wholly before the tile's first query position need no mask; only the tiles at the diagonal do.

Programs map to (sequence, query tile) through a small int32 table built on the device with torch
ops (no host sync, no per-token loops). Semantics are exactly those of
``engine.attention.reference.paged_prefill_attention`` (with a sliding window or soft-capped scores,
of its ``paged_windowed_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.attention.triton_common import (
    capped_scores,
    check_attention_inputs,
    check_window_and_cap,
    dot_pad,
    launch_options,
    online_softmax_step,
    score_scales,
)
from engine.attention.triton_decode import wide_tiles_fit


@dataclass(frozen=True)
class PrefillTiles:
    """Launch shape of the prefill kernel: ``block_m`` rows (tokens x group heads) per program
    (raised to the group size when a group is larger), ``block_n`` keys per loop step.
    ``num_stages=None``: Triton's default."""

    block_m: int = 64
    block_n: int = 32
    num_warps: int = 4
    num_stages: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")


DEFAULT_PREFILL_TILES = PrefillTiles()
# Wider tiles where they fit: faster than DEFAULT_PREFILL_TILES on every shape bench/kernel_sweep.py
# measured (docs/BENCHMARKS.md).
_WIDE_PREFILL_TILES = PrefillTiles(block_m=128, block_n=128, num_warps=4, num_stages=3)


def default_prefill_tiles(head_dim: int, dtype: torch.dtype) -> PrefillTiles:
    """The fastest measured tiles where their K/V buffers fit in shared memory (the same row-size
    rule as decode's); the smaller original ones elsewhere."""
    return _WIDE_PREFILL_TILES if wide_tiles_fit(head_dim, dtype) else DEFAULT_PREFILL_TILES


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    n0,
    k_head,
    v_head,
    bt_row,
    qpos,
    dims,
    dim_ok,
    kv_end,
    qk_scale,
    cap_log2e,
    window,
    stride_kb,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vd,
    stride_btn,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step over keys [n0, n0 + BLOCK_N) of one KV head (``k_head``, ``v_head``: its
    K and V); MASKED applies bounds + causality (and the window, when WINDOWED)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    key_ok = pos < kv_end
    block = tl.load(bt_row + (pos // BLOCK_SIZE) * stride_btn, mask=key_ok, other=0).to(tl.int64)
    slot = pos % BLOCK_SIZE
    k = tl.load(
        k_head + block[None, :] * stride_kb + slot[None, :] * stride_kt + dims[:, None] * stride_kd,
        mask=key_ok[None, :] & dim_ok[:, None],
        other=0.0,
    )  # [D_PAD, BLOCK_N]
    s = capped_scores(tl.dot(q, k, input_precision="ieee") * qk_scale, cap_log2e, SOFTCAP)
    if MASKED:
        seen = key_ok[None, :] & (pos[None, :] <= qpos[:, None])
        if WINDOWED:
            seen = seen & (pos[None, :] > qpos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
    p, alpha, m_new = online_softmax_step(s, m_i, WINDOWED)
    v = tl.load(
        v_head + block[:, None] * stride_vb + slot[:, None] * stride_vt + dims[None, :] * stride_vd,
        mask=key_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [BLOCK_N, D_PAD]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    l_i = l_i * alpha + tl.sum(p, 1)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    cu_ptr,
    lens_ptr,
    tiles_ptr,
    out_ptr,
    qk_scale,
    cap_log2e,
    window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_btb,
    stride_btn,
    stride_ot,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    TOKENS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.load(tiles_ptr + tl.program_id(0) * 2)
    if seq < num_seqs:  # the grid is an upper bound on the tile count
        tile_start = tl.load(tiles_ptr + tl.program_id(0) * 2 + 1)
        kvh = tl.program_id(1)
        q_start = tl.load(cu_ptr + seq)
        q_len = tl.load(cu_ptr + seq + 1) - q_start
        ctx_len = tl.load(lens_ptr + seq)
        first_pos = ctx_len - q_len  # context position of the sequence's first new token

        rows = tl.arange(0, BLOCK_M)
        tok = tile_start + rows // GROUP
        heads = kvh * GROUP + rows % GROUP
        row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
        dims = tl.arange(0, D_PAD)
        dim_ok = dims < HEAD_DIM
        # Padding rows get a position too (>= 0), so no row ever sees only masked keys.
        qpos = first_pos + tok

        row_off = (q_start + tok).to(tl.int64)
        q = tl.load(
            q_ptr + row_off[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
            mask=row_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        bt_row = bt_ptr + seq * stride_btb
        k_head, v_head = k_ptr + kvh * stride_kh, v_ptr + kvh * stride_vh

        # Keys before the tile's first query position are visible to every row: no mask.
        tile_first = first_pos + tile_start
        kv_end = tl.minimum(ctx_len, tile_first + TOKENS)
        full_end = (tile_first // BLOCK_N) * BLOCK_N
        if WINDOWED:
            # No row sees a key before ``lo``: blocks the window has left are not read. Keys in
            # [lo, free) have left some rows' windows (masked); whole tiles in [free, full_end) no one's.
            lo = tl.maximum(tile_first - window + 1, 0)
            full_end = tl.maximum(full_end, lo)
            in_all = tl.minimum(tl.maximum(tile_first + TOKENS - window, lo), full_end)
            free = full_end - ((full_end - in_all) // BLOCK_N) * BLOCK_N
            for n0 in range(lo, free, BLOCK_N):
                acc, m_i, l_i = _attend_tile(
                    q,
                    acc,
                    m_i,
                    l_i,
                    n0,
                    k_head,
                    v_head,
                    bt_row,
                    qpos,
                    dims,
                    dim_ok,
                    free,
                    qk_scale,
                    cap_log2e,
                    window,
                    stride_kb,
                    stride_kt,
                    stride_kd,
                    stride_vb,
                    stride_vt,
                    stride_vd,
                    stride_btn,
                    BLOCK_SIZE=BLOCK_SIZE,
                    BLOCK_N=BLOCK_N,
                    MASKED=True,
                    WINDOWED=WINDOWED,
                    SOFTCAP=SOFTCAP,
                )
        else:
            free = 0
        for n0 in range(free, full_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                q,
                acc,
                m_i,
                l_i,
                n0,
                k_head,
                v_head,
                bt_row,
                qpos,
                dims,
                dim_ok,
                kv_end,
                qk_scale,
                cap_log2e,
                window,
                stride_kb,
                stride_kt,
                stride_kd,
                stride_vb,
                stride_vt,
                stride_vd,
                stride_btn,
                BLOCK_SIZE=BLOCK_SIZE,
                BLOCK_N=BLOCK_N,
                MASKED=False,
                WINDOWED=WINDOWED,
                SOFTCAP=SOFTCAP,
            )
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                q,
                acc,
                m_i,
                l_i,
                n0,
                k_head,
                v_head,
                bt_row,
                qpos,
                dims,
                dim_ok,
                kv_end,
                qk_scale,
                cap_log2e,
                window,
                stride_kb,
                stride_kt,
                stride_kd,
                stride_vb,
                stride_vt,
                stride_vd,
                stride_btn,
                BLOCK_SIZE=BLOCK_SIZE,
                BLOCK_N=BLOCK_N,
                MASKED=True,
                WINDOWED=WINDOWED,
                SOFTCAP=SOFTCAP,
            )

        out = acc / l_i[:, None]
        tl.store(
            out_ptr + row_off[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


def _tile_table(cu_seqlens_q: torch.Tensor, tokens: int, num_tiles_bound: int) -> torch.Tensor:
    """int32 ``[num_tiles_bound, 2]`` of (sequence, first token in the sequence) per program.

    Built with device-side torch ops: ``searchsorted`` on the cumulative tile counts finds each
    program's sequence. Programs past the real tile count get sequence index ``num_seqs``.
    """
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    tiles = (q_lens + tokens - 1) // tokens
    cu_tiles = torch.cumsum(tiles, 0)
    prog = torch.arange(num_tiles_bound, device=cu_seqlens_q.device)
    seq = torch.searchsorted(cu_tiles, prog, right=True)
    seq_c = seq.clamp(max=max(len(q_lens) - 1, 0))
    first_tile = cu_tiles[seq_c] - tiles[seq_c]
    return torch.stack([seq, (prog - first_tile) * tokens], 1).to(torch.int32).contiguous()


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    *,
    tiles: PrefillTiles | None = None,
) -> torch.Tensor:
    """Causal prefill of ragged query chunks against a paged, possibly strided KV cache.

    Requires ``seq_lens[s] >= q_len[s]``. ``window``: a query sees only keys less than ``window``
    positions back (key tiles wholly before every row's window are not read); ``softcap``: scores
    become ``softcap * tanh(s / softcap)`` (``reference.paged_windowed_attention``'s semantics).
    The host never reads device tensors (no syncs).
    ``tiles``: the launch shape (None: ``default_prefill_tiles``; bench/kernel_sweep.py measures
    the choices).
    """
    total, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    num_seqs = seq_lens.shape[0]
    check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, num_seqs)
    check_window_and_cap(window, softcap)
    if tuple(cu_seqlens_q.shape) != (num_seqs + 1,):
        raise ValueError(
            f"attention inputs: cu_seqlens_q has shape {tuple(cu_seqlens_q.shape)}, want ({num_seqs + 1},)"
        )
    # The kernel indexes these as plain arrays (strided views read garbage or out of bounds).
    seq_lens, cu_seqlens_q = seq_lens.contiguous(), cu_seqlens_q.contiguous()
    out = torch.empty_like(q)
    if total == 0 or num_seqs == 0:
        return out

    tiles = tiles or default_prefill_tiles(head_dim, q.dtype)
    block_m = max(tiles.block_m, triton.next_power_of_2(group))
    tokens = block_m // group  # query tokens per program
    bound = triton.cdiv(total, tokens) + num_seqs  # >= sum of per-sequence tile counts
    tile_table = _tile_table(cu_seqlens_q, tokens, bound)
    _prefill_kernel[(bound, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        tile_table,
        out,
        *score_scales(scale, softcap),
        window or 0,
        num_seqs,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        GROUP=group,
        TOKENS=tokens,
        HEAD_DIM=head_dim,
        D_PAD=dot_pad(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=tiles.block_n,
        WINDOWED=window is not None,
        SOFTCAP=softcap is not None,
        **launch_options(tiles.num_warps, tiles.num_stages),
    )
    return out
