"""The CPU attention path: the torch reference's math (``reference.py``) without its allocations.

Per layer, decode gathers every sequence's K and V blocks into one dense batch for SDPA. Advanced
indexing of the strided per-layer cache view (``k_cache[block_tables]``) copies element by element
into a fresh tensor; ``index_select`` into a buffer kept across layers and steps copies whole
blocks and allocates nothing. The
decode mask is built once per step (every layer sees the same ``seq_lens``) as the additive float
mask SDPA would otherwise convert the boolean one to in every layer, and rows of very different
lengths are attended in groups padded to their own longest row (``decode_groups.py``).

Where a C compiler is at hand, fp32 decode skips all of that: a native kernel
(``engine/native/paged_decode.c``) reads each sequence's blocks where they lie, once, with no padding.
Prefill likewise: ``engine/native/paged_prefill.c`` attends all of a step's chunks in one call
instead of one SDPA call (or two, after a cached prefix) per sequence per layer.

One instance per runner (it owns the buffers; the runner's stepping thread is its only caller).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.decode_groups import length_groups
from engine.native.paged_decode import NativePagedDecode
from engine.native.paged_prefill import NativePagedPrefill


class CpuPagedAttention:
    def __init__(
        self, native_decode: NativePagedDecode | None = None, native_prefill: NativePagedPrefill | None = None
    ) -> None:
        """``native_decode``, ``native_prefill``: the compiled kernels, used for every call they support."""
        self.native_decode = native_decode
        self.native_prefill = native_prefill
        self._buffer: torch.Tensor | None = None
        self._plan: list[DecodeGroup] | None = None
        self._plan_seq_lens: torch.Tensor | None = None
        self._plan_key: tuple[int, int] = (0, 0)

    # -- the shared signatures (engine/attention/__init__.py) ----------------------------------
    @staticmethod
    def write_kv(
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_block: torch.Tensor,
        slot_offset: torch.Tensor,
    ) -> None:
        k_cache[slot_block, slot_offset] = k
        v_cache[slot_block, slot_offset] = v

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        native = self.native_decode
        if native is not None and native.supports(q, k_cache, v_cache, block_tables, seq_lens):
            return native(q, k_cache, v_cache, block_tables, seq_lens, scale)
        groups = self._decode_plan(seq_lens, block_tables.shape[1], k_cache.shape[1], q.dtype)
        if len(groups) == 1:
            return self._decode_group(q, k_cache, v_cache, block_tables, groups[0].mask, scale)
        out = torch.empty_like(q)
        for g in groups:
            out[g.rows] = self._decode_group(
                q[g.rows], k_cache, v_cache, block_tables[g.rows, : g.num_blocks], g.mask, scale
            )
        return out

    def _decode_group(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        num_seqs, num_heads, head_dim = q.shape
        kv_heads, max_len = k_cache.shape[2], block_tables.shape[1] * k_cache.shape[1]
        k, v = self._gather(k_cache, v_cache, block_tables.reshape(-1))
        k = k.view(num_seqs, max_len, kv_heads, head_dim).transpose(1, 2)
        v = v.view(num_seqs, max_len, kv_heads, head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.view(num_seqs, num_heads, head_dim)

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        native = self.native_prefill
        if native is not None and native.supports(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens):
            return native(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale)
        kv_heads, head_dim, block_size = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
        out = torch.empty_like(q)
        cu = cu_seqlens_q.tolist()
        for s, ctx_len in enumerate(seq_lens.tolist()):
            q_start, q_end = cu[s], cu[s + 1]
            q_len = q_end - q_start
            if q_len == 0:
                continue
            k, v = self._gather(k_cache, v_cache, block_tables[s, : -(-ctx_len // block_size)])
            ks = k.view(-1, kv_heads, head_dim)[:ctx_len].transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
            vs = v.view(-1, kv_heads, head_dim)[:ctx_len].transpose(0, 1).unsqueeze(0)
            qs = q[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, nh, q_len, D]
            if ctx_len == q_len:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
            elif _FLASH_WITH_LSE is not None:
                o = _prefix_then_chunk(qs, ks, vs, ctx_len - q_len, scale)
            else:
                # Query i sits at context position (ctx_len - q_len + i) and sees keys up to it.
                qpos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
                mask = torch.arange(ctx_len, device=q.device)[None, :] <= qpos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
            out[q_start:q_end] = o[0].transpose(0, 1)
        return out

    # -- internals -------------------------------------------------------------------------------
    def _gather(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``blocks`` (1-D ids) as two dense ``[n, block_size, kv_heads, head_dim]`` views."""
        shape = (blocks.numel(), *k_cache.shape[1:])
        n = shape[0] * k_cache[0].numel()
        buf = self._buffer
        if buf is None or buf.numel() < 2 * n or buf.dtype != k_cache.dtype or buf.device != k_cache.device:
            buf = self._buffer = torch.empty(2 * n, dtype=k_cache.dtype, device=k_cache.device)
        k = torch.index_select(k_cache, 0, blocks, out=buf[:n].view(shape))
        v = torch.index_select(v_cache, 0, blocks, out=buf[n : 2 * n].view(shape))
        return k, v

    def _decode_plan(
        self, seq_lens: torch.Tensor, max_blocks: int, block_size: int, dtype: torch.dtype
    ) -> list[DecodeGroup]:
        """The step's groups (same for every layer: built on the first, reused while seq_lens holds)."""
        plan, known = self._plan, self._plan_seq_lens
        if (
            plan is None
            or known is None
            or plan[0].mask.dtype != dtype
            or self._plan_key != (max_blocks, block_size)
            or known.shape != seq_lens.shape
            or not torch.equal(known, seq_lens)
        ):
            lens = seq_lens.tolist()
            cuts = length_groups([-(-n // block_size) for n in lens], max_blocks)
            plan = []
            for rows, num_blocks in cuts:
                group_lens = seq_lens if len(cuts) == 1 else seq_lens[rows]
                width = num_blocks * block_size
                valid = torch.arange(width, device=seq_lens.device)[None, :] < group_lens[:, None]
                mask = torch.zeros(valid.shape, dtype=dtype, device=seq_lens.device).masked_fill_(~valid, float("-inf"))
                plan.append(DecodeGroup(torch.tensor(rows, device=seq_lens.device), num_blocks, mask[:, None, None, :]))
            self._plan, self._plan_seq_lens, self._plan_key = plan, seq_lens.clone(), (max_blocks, block_size)
        return plan


# torch's CPU flash attention, which also returns each query's log-sum-exp (private, so looked up
# once: without it, a chunk after a cached prefix takes the masked SDPA below).
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _prefix_then_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """A chunk's queries over [cached prefix, the chunk itself]: the prefix unmasked and the chunk
    causally, as two flash calls merged by their log-sum-exps, instead of one SDPA call with a
    [q_len, ctx_len] mask, which torch runs at a lower rate.
    q: [1, heads, q_len, D]; k, v: [1, kv_heads, ctx_len, D]."""
    assert _FLASH_WITH_LSE is not None  # (callers check)
    o1, lse1 = _FLASH_WITH_LSE(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False, scale=scale)
    o2, lse2 = _FLASH_WITH_LSE(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True, scale=scale)
    top = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - top).unsqueeze(-1), torch.exp(lse2 - top).unsqueeze(-1)
    out: torch.Tensor = (o1 * w1 + o2 * w2) / (w1 + w2)  # (the flash op is typed at run time only)
    return out


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    rows: torch.Tensor  # indices into the step's decode rows
    num_blocks: int  # the group's block-table width (its longest row's blocks)
    mask: torch.Tensor  # [rows, 1, 1, num_blocks * block_size] additive
