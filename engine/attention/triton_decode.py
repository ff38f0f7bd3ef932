"""Triton paged decode attention: one query token per sequence against its paged KV context.

Decode is memory-bound, so each program loads a KV tile once and uses it for every query head
that shares that KV head (GQA): the group's query heads are the rows of a small matmul. Long
contexts can be split into partitions (split-K) so that a small batch still fills the GPU; a second
kernel merges the partitions' partial softmax states.

Semantics are exactly those of ``engine.attention.reference.paged_decode_attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634

# Split a sequence into partitions only when the grid (seqs x kv heads) would leave SMs idle.
_MIN_PROGRAMS_WITHOUT_SPLIT = 256
_DEFAULT_PARTITION = 512


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
# A K or V row of D_PAD elements up to this many bytes keeps the wide tiles' pipelined K/V buffers
# well inside shared memory (bf16 up to head dim 64, fp32 up to 32); wider rows keep the old tiles.
_WIDE_TILE_ROW_BYTES = 128


def wide_tiles_fit(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the wide (measured fastest) tiles' K/V buffers fit in shared memory for this row size."""
    return dot_pad(head_dim) * dtype.itemsize <= _WIDE_TILE_ROW_BYTES


def check_attention_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, num_seqs: int) -> None:
    """What the kernels assume of their inputs, checked on the host without reading device memory
    (ValueError naming the mismatch: a wrong shape or dtype computed garbage, or read out of bounds)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    problems = [
        (num_heads % kv_heads != 0, f"{num_heads} query heads are not a multiple of {kv_heads} KV heads"),
        (k_cache.shape != v_cache.shape, f"K cache {tuple(k_cache.shape)} and V cache {tuple(v_cache.shape)} differ"),
        (k_cache.shape[3] != head_dim, f"head size {head_dim} of q, {k_cache.shape[3]} of the cache"),
        (q.dtype != k_cache.dtype or k_cache.dtype != v_cache.dtype,
         f"dtypes differ: q {q.dtype}, K cache {k_cache.dtype}, V cache {v_cache.dtype}"),
        (seq_lens.dtype != torch.int32 or block_tables.dtype != torch.int32,
         f"seq_lens and block_tables must be int32, got {seq_lens.dtype} and {block_tables.dtype}"),
        (tuple(seq_lens.shape) != (num_seqs,), f"seq_lens has shape {tuple(seq_lens.shape)}, want ({num_seqs},)"),
        (block_tables.dim() != 2 or block_tables.shape[0] != num_seqs,
         f"block_tables has shape {tuple(block_tables.shape)}, want ({num_seqs}, blocks per sequence)"),
    ]
    for bad, what in problems:
        if bad:
            raise ValueError(f"attention inputs: {what}")


def default_decode_tiles(head_dim: int, dtype: torch.dtype) -> DecodeTiles:
    """The fastest measured tiles where they fit in shared memory; the smaller original ones elsewhere."""
    return _WIDE_DECODE_TILES if wide_tiles_fit(head_dim, dtype) else DEFAULT_DECODE_TILES


# tl.dot on NVIDIA GPUs needs every operand dimension >= 16 (the interpreter does not check).
_MIN_DOT_DIM = 16


def launch_options(num_warps: int, num_stages: int | None) -> dict[str, int]:
    """A kernel launch's warp and pipeline-stage counts (Triton's default stages when None)."""
    return {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})


def dot_pad(n: int) -> int:
    """The padded size of a tl.dot operand dimension of real size ``n``: a power of two, >= 16."""
    return max(_MIN_DOT_DIM, triton.next_power_of_2(n))


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr,
    part_acc_ptr, part_ml_ptr,
    qk_scale,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_btb, stride_btn,
    stride_ob, stride_oh, stride_od,
    part_len, num_parts,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    start = part * part_len
    if start < seq_len:
        end = tl.minimum(start + part_len, seq_len)
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, D_PAD)
        heads = kvh * GROUP + rows
        row_ok = rows < GROUP
        dim_ok = dims < HEAD_DIM

        q = tl.load(
            q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
            mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
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
                k_ptr + block[None, :] * stride_kb + slot[None, :] * stride_kt + kvh * stride_kh
                + dims[:, None] * stride_kd,
                mask=key_ok[None, :] & dim_ok[:, None], other=0.0,
            )  # [D_PAD, BLOCK_N]
            # qk_scale folds in log2(e) so that the softmax uses exp2.
            s = tl.dot(q, k, input_precision="ieee") * qk_scale
            s = tl.where(key_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            v = tl.load(
                v_ptr + block[:, None] * stride_vb + slot[:, None] * stride_vt + kvh * stride_vh
                + dims[None, :] * stride_vd,
                mask=key_ok[:, None] & dim_ok[None, :], other=0.0,
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
                out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :],
            )


@triton.jit
def _reduce_kernel(
    part_acc_ptr, part_ml_ptr, lens_ptr, out_ptr,
    stride_ob, stride_oh, stride_od,
    part_len, num_parts,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, PARTS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(lens_ptr + seq)
    used = tl.cdiv(seq_len, part_len)  # partitions past the end were never written
    parts = tl.arange(0, PARTS_PAD)
    dims = tl.arange(0, D_PAD)
    part_ok = parts < used
    base = (seq * tl.num_programs(1) + head) * num_parts + parts
    m = tl.load(part_ml_ptr + base * 2, mask=part_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + base * 2 + 1, mask=part_ok, other=0.0)
    acc = tl.load(part_acc_ptr + base[:, None] * D_PAD + dims[None, :], mask=part_ok[:, None], other=0.0)
    w = tl.where(part_ok, tl.exp2(m - tl.max(m, 0)), 0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
        out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM,
    )


def _partition_len(num_seqs: int, kv_heads: int, max_len: int, partition_size: int | None, block_n: int) -> int:
    """Keys per partition, a multiple of the key tile. Without an explicit size, split only when
    the (seqs x kv heads) grid alone would leave the GPU underused."""
    if partition_size is None:
        small_grid = num_seqs * kv_heads < _MIN_PROGRAMS_WITHOUT_SPLIT
        partition_size = _DEFAULT_PARTITION if small_grid and max_len > _DEFAULT_PARTITION else max_len
    return triton.cdiv(max(partition_size, 1), block_n) * block_n


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    partition_size: int | None = None,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """Decode attention over a paged, possibly strided (block-major) KV cache.

    ``partition_size`` forces split-K with about that many keys per partition (rounded up to the
    key tile); ``None`` picks it from the grid size. A ``seq_lens`` entry of 0 (a CUDA graph's
    padding row, engine/cuda_graphs.py) computes nothing, and its output row is undefined (NaN
    after a split). The host never reads device tensors, so the call does not synchronise. ``tiles``: the launch shape
    (None: ``default_decode_tiles``; bench/kernel_sweep.py measures the choices).
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, num_seqs)
    seq_lens = seq_lens.contiguous()  # the kernels index it as a plain array (a strided view read garbage)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    tiles = tiles or default_decode_tiles(head_dim, q.dtype)

    max_len = block_tables.shape[1] * block_size
    part_len = _partition_len(num_seqs, kv_heads, max_len, partition_size, tiles.block_n)
    num_parts = triton.cdiv(max_len, part_len)
    split = num_parts > 1
    d_pad = dot_pad(head_dim)
    group_pad = dot_pad(group)

    if split:
        part_acc = torch.empty(num_seqs, num_heads, num_parts, d_pad, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(num_seqs, num_heads, num_parts, 2, device=q.device, dtype=torch.float32)
    else:
        part_acc = part_ml = out  # unused
    _decode_kernel[(num_seqs, kv_heads, num_parts)](
        q, k_cache, v_cache, block_tables, seq_lens, out,
        part_acc, part_ml,
        scale * _LOG2E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        part_len, num_parts,
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, D_PAD=d_pad,
        BLOCK_SIZE=block_size, BLOCK_N=tiles.block_n, SPLIT=split,
        **launch_options(tiles.num_warps, tiles.num_stages),
    )
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, seq_lens, out,
            *out.stride(),
            part_len, num_parts,
            HEAD_DIM=head_dim, D_PAD=d_pad, PARTS_PAD=triton.next_power_of_2(num_parts),
        )
    return out
