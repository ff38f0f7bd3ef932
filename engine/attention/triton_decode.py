"""Triton paged decode attention: one query token per sequence against its paged KV context.

Decode is memory-bound, so each program loads a KV tile once and uses it for every query head
that shares that KV head (GQA): the group's query heads are the rows of a small matmul. A small
batch is split along its contexts (split-K) so that it still fills the GPU: a fixed number of
splits per sequence, chosen from the batch size and the SM count, each covering
``cdiv(seq_len, splits)`` of that sequence's own context (read on the device). Nothing depends on
the block-table width (the model's whole context inside CUDA graphs) or on the longest context, so
no variant is compiled as contexts grow. A second kernel merges the splits' partial softmax states.

Semantics are exactly those of ``engine.attention.reference.paged_decode_attention`` (with a sliding
window or soft-capped scores, of its ``paged_windowed_attention``).
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
    device_shared_memory,
    device_sm_count,
    dot_pad,
    launch_options,
    online_softmax_step,
    score_scales,
)

# Split the contexts only when the grid (seqs x kv heads) gives fewer than this many programs per SM.
_PROGRAMS_PER_SM = 2
# At most this many splits per sequence (each one's partial state is a row the reduce kernel reads).
_MAX_SPLITS = 32
# Shared memory a block may use on the smallest GPUs in use (A10, L4, consumer Ampere/Ada: 99 KiB
# opt-in); where the device's own limit is unknown (the interpreter), tiles are chosen for it.
SMALL_GPU_SHARED_MEMORY = 99 * 1024
# Triton's default pipeline depth for these loops on NVIDIA GPUs.
_DEFAULT_STAGES = 3


@dataclass(frozen=True)
class DecodeTiles:
    """Launch shape of the decode kernel. ``block_n``: keys per loop step, independent of the cache
    block size (keys are gathered one by one). ``num_stages=None``: Triton's default."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int | None = None

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")


DEFAULT_DECODE_TILES = DecodeTiles()
# Wider tiles where they fit: faster than DEFAULT_DECODE_TILES on every shape bench/kernel_sweep.py
# measured (docs/BENCHMARKS.md).
_WIDE_DECODE_TILES = DecodeTiles(block_n=128, num_warps=4)
# Most preferred first: the first whose K/V buffers fit in the device's shared memory is used.
_DECODE_TILE_PREFERENCE = (_WIDE_DECODE_TILES, DEFAULT_DECODE_TILES)
# A K or V row of D_PAD elements up to this many bytes keeps the wide tiles' pipelined K/V buffers
# well inside shared memory (bf16 up to head dim 64, fp32 up to 32); wider rows keep the old tiles.
_WIDE_TILE_ROW_BYTES = 128


def wide_tiles_fit(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the wide (measured fastest) tiles' K/V buffers fit in shared memory for this row size."""
    return dot_pad(head_dim) * dtype.itemsize <= _WIDE_TILE_ROW_BYTES


def decode_tile_shared_memory(tiles: DecodeTiles, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of shared memory the pipelined K and V tiles of one program take (an estimate: the
    buffers of every stage; Q, the scores and the accumulators live in registers)."""
    stages = _DEFAULT_STAGES if tiles.num_stages is None else tiles.num_stages
    return stages * 2 * dot_pad(head_dim) * tiles.block_n * dtype.itemsize


def default_decode_tiles(head_dim: int, dtype: torch.dtype, shared_memory: int | None = None) -> DecodeTiles:
    """The fastest measured tiles whose K/V buffers fit in ``shared_memory`` bytes (a block's limit,
    as the device reports it; None: ``SMALL_GPU_SHARED_MEMORY``); the smallest ones where none fits.

    Head dim 128 in bf16 gets the wide tiles on an H100/H200 (227 KiB) and the narrower original
    ones on a 99 KiB GPU, where the wide ones would fail to compile."""
    limit = SMALL_GPU_SHARED_MEMORY if shared_memory is None else shared_memory
    for tiles in _DECODE_TILE_PREFERENCE:
        if decode_tile_shared_memory(tiles, head_dim, dtype) <= limit:
            return tiles
    return _DECODE_TILE_PREFERENCE[-1]


def decode_num_splits(num_seqs: int, kv_heads: int, sm_count: int) -> int:
    """KV splits per sequence: enough programs for ``_PROGRAMS_PER_SM`` on every SM, at most
    ``_MAX_SPLITS``; 1 (no split) where the (seqs x kv heads) grid already gives that. Depends on
    the batch's shape only, never on its contexts."""
    programs = max(num_seqs * kv_heads, 1)
    target = sm_count * _PROGRAMS_PER_SM
    return 1 if programs >= target else min(_MAX_SPLITS, -(-target // programs))


@triton.jit
def _part_len(seq_len, fixed_part_len, num_parts, BLOCK_N: tl.constexpr, BY_LENGTH: tl.constexpr):
    """Keys per split of this sequence: ``cdiv(seq_len, num_parts)`` rounded up to the key tile (at
    least one tile, so a padding row of length 0 divides by nothing), or the fixed length given."""
    if BY_LENGTH:
        return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_parts), BLOCK_N), 1) * BLOCK_N
    else:
        return fixed_part_len


@triton.jit
def _window_start(seq_len, window, WINDOWED: tl.constexpr):
    """The first key the query (position ``seq_len - 1``) sees: splits and loops start there, so the
    blocks a sliding window has left behind are never read."""
    if WINDOWED:
        return tl.maximum(seq_len - window, 0)
    else:
        return 0


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qk_scale,
    cap_log2e,
    window,
    stride_qb,
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
    stride_ob,
    stride_oh,
    stride_od,
    fixed_part_len,
    num_parts,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    BY_LENGTH: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    lo = _window_start(seq_len, window, WINDOWED)
    part_len = _part_len(seq_len - lo, fixed_part_len, num_parts, BLOCK_N, BY_LENGTH)
    start = lo + part * part_len
    if start < seq_len:
        end = tl.minimum(start + part_len, seq_len)
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, D_PAD)
        heads = kvh * GROUP + rows
        row_ok = rows < GROUP
        dim_ok = dims < HEAD_DIM

        q = tl.load(
            q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
            mask=row_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )

        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        bt_row = bt_ptr + seq * stride_btb
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            key_ok = pos < end
            block = tl.load(bt_row + (pos // BLOCK_SIZE) * stride_btn, mask=key_ok, other=0).to(tl.int64)
            slot = pos % BLOCK_SIZE
            k = tl.load(
                k_ptr
                + block[None, :] * stride_kb
                + slot[None, :] * stride_kt
                + kvh * stride_kh
                + dims[:, None] * stride_kd,
                mask=key_ok[None, :] & dim_ok[:, None],
                other=0.0,
            )  # [D_PAD, BLOCK_N]
            # Base-2 units (triton_common.score_scales), soft-capped where the model caps.
            s = capped_scores(tl.dot(q, k, input_precision="ieee") * qk_scale, cap_log2e, SOFTCAP)
            s = tl.where(key_ok[None, :], s, float("-inf"))
            p, alpha, m_new = online_softmax_step(s, m_i, False)  # every tile has a key for every row
            v = tl.load(
                v_ptr
                + block[:, None] * stride_vb
                + slot[:, None] * stride_vt
                + kvh * stride_vh
                + dims[None, :] * stride_vd,
                mask=key_ok[:, None] & dim_ok[None, :],
                other=0.0,
            )  # [BLOCK_N, D_PAD]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new

        if SPLIT:
            # Partial state: unnormalised acc plus (m, l), merged by _reduce_kernel.
            base = (seq * tl.num_programs(1) * GROUP + heads) * num_parts + part
            tl.store(part_acc_ptr + base[:, None] * D_PAD + dims[None, :], acc, mask=row_ok[:, None])
            tl.store(part_ml_ptr + base * 2, m_i, mask=row_ok)
            tl.store(part_ml_ptr + base * 2 + 1, l_i, mask=row_ok)
        else:
            out = acc / l_i[:, None]
            tl.store(
                out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                out.to(out_ptr.dtype.element_ty),
                mask=row_ok[:, None] & dim_ok[None, :],
            )


@triton.jit
def _reduce_kernel(
    part_acc_ptr,
    part_ml_ptr,
    lens_ptr,
    out_ptr,
    window,
    stride_ob,
    stride_oh,
    stride_od,
    fixed_part_len,
    num_parts,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PARTS_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BY_LENGTH: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(lens_ptr + seq)
    span = seq_len - _window_start(seq_len, window, WINDOWED)
    part_len = _part_len(span, fixed_part_len, num_parts, BLOCK_N, BY_LENGTH)
    used = tl.cdiv(span, part_len)  # partitions past the end were never written
    parts = tl.arange(0, PARTS_PAD)
    dims = tl.arange(0, D_PAD)
    part_ok = parts < used
    base = (seq * tl.num_programs(1) + head) * num_parts + parts
    m = tl.load(part_ml_ptr + base * 2, mask=part_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + base * 2 + 1, mask=part_ok, other=0.0)  # noqa: E741 - the softmax's (m, l), as in the papers
    acc = tl.load(part_acc_ptr + base[:, None] * D_PAD + dims[None, :], mask=part_ok[:, None], other=0.0)
    w = tl.where(part_ok, tl.exp2(m - tl.max(m, 0)), 0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    *,
    num_splits: int | None = None,
    partition_size: int | None = None,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """Decode attention over a paged, possibly strided (block-major) KV cache.

    ``window``: the query sees only the last ``window`` keys (splits cover those alone; blocks
    before them are not read); ``softcap``: scores become ``softcap * tanh(s / softcap)``.
    Semantics of ``reference.paged_windowed_attention`` where either is given.

    ``num_splits``: splits per sequence, each over ``cdiv(seq_len, num_splits)`` of its own context
    (None: ``decode_num_splits`` for this batch and the device's SM count). ``partition_size``
    instead splits the block table's whole width into fixed partitions of about that many keys
    (rounded up to the key tile): the layout before splits followed the lengths, kept for
    comparison (bench/gpu_check_decode_split.py). A ``seq_lens`` entry of 0 (a CUDA graph's
    padding row, engine/cuda_graphs.py) computes nothing, and its output row is undefined (NaN
    after a split). The host never reads device tensors, so the call does not synchronise. ``tiles``:
    the launch shape (None: ``default_decode_tiles`` for the device's shared memory;
    bench/kernel_sweep.py measures the choices).
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, num_seqs)
    check_window_and_cap(window, softcap)
    seq_lens = seq_lens.contiguous()  # the kernels index it as a plain array (a strided view read garbage)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    tiles = tiles or default_decode_tiles(head_dim, q.dtype, device_shared_memory(q.device))

    by_length = partition_size is None
    if partition_size is None:
        fixed_part_len = 0
        num_parts = (
            num_splits if num_splits is not None else decode_num_splits(num_seqs, kv_heads, device_sm_count(q.device))
        )
        if num_parts < 1:
            raise ValueError(f"num_splits must be at least 1, got {num_parts}")
    else:
        fixed_part_len = triton.cdiv(max(partition_size, 1), tiles.block_n) * tiles.block_n
        num_parts = triton.cdiv(block_tables.shape[1] * block_size, fixed_part_len)
    split = num_parts > 1
    d_pad = dot_pad(head_dim)
    group_pad = dot_pad(group)

    if split:
        part_acc = torch.empty(num_seqs, num_heads, num_parts, d_pad, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(num_seqs, num_heads, num_parts, 2, device=q.device, dtype=torch.float32)
    else:
        part_acc = part_ml = out  # unused
    _decode_kernel[(num_seqs, kv_heads, num_parts)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_acc,
        part_ml,
        *score_scales(scale, softcap),
        window or 0,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        fixed_part_len,
        num_parts,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=tiles.block_n,
        SPLIT=split,
        BY_LENGTH=by_length,
        WINDOWED=window is not None,
        SOFTCAP=softcap is not None,
        **launch_options(tiles.num_warps, tiles.num_stages),
    )
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            part_acc,
            part_ml,
            seq_lens,
            out,
            window or 0,
            *out.stride(),
            fixed_part_len,
            num_parts,
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            PARTS_PAD=triton.next_power_of_2(num_parts),
            BLOCK_N=tiles.block_n,
            BY_LENGTH=by_length,
            WINDOWED=window is not None,
        )
    return out
