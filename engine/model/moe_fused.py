"""The experts of a MoE layer as two grouped GEMMs in Triton, for CUDA (vLLM's fused_moe layout).

The torch path (``moe.moe_mlp``) multiplies expert by expert: two products per expert that has a
token, each launched from the host after reading the expert's token count back. Here the step's
(token, choice) rows are sorted by expert and padded to the row tile (``moe_align.py``), and ONE
launch per projection multiplies every tile by its own expert's weights:

    gate_up:  [T * top_k, 2I] = x[row // top_k] @ gate_up[expert].T
    act_mul:  [T * top_k, I]     (torch: the family's activation(gate) * up)
    down:     [T * top_k, H] = act[row] @ down[expert].T * top_k_weight[row]
    combine:  [T, H]           = the top_k rows of each token summed

Nothing reads the device back, so a decode step with MoE layers can be captured in a CUDA graph.
Products accumulate in float32 (``ieee`` precision: fp32 models get no TF32 rounding). The routing
(softmax, top-k, renormalisation) and Qwen2-MoE's shared expert stay in ``moe.py``, shared with
the torch path. Checked against it under the Triton interpreter (tests/engine/model/test_fused_moe.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.model.moe_align import ExpertAlignment, align_by_expert


@dataclass(frozen=True)
class MoeTiles:
    """Launch shape of the grouped GEMM: ``block_m`` sorted rows (one expert's) by ``block_n``
    outputs per program, ``block_k`` inputs per loop step."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")


# A decode step's few rows per expert waste most of a 64-row tile (as vLLM's default configs do).
_SMALL_BATCH_TILES = MoeTiles(block_m=16, block_n=64, block_k=64)


def default_moe_tiles(num_rows: int, num_experts: int) -> MoeTiles:
    """16-row tiles where experts average a tile's worth of rows or fewer, else 64."""
    return _SMALL_BATCH_TILES if num_rows <= 16 * num_experts else MoeTiles()


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    weights_ptr,
    sorted_ptr,
    experts_ptr,
    num_padded_ptr,
    num_rows,
    N,
    K,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    A_ROW_DIV: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """C[row] = A[row // A_ROW_DIV] @ B[expert].T (times the row's routing weight when MUL_WEIGHT)
    for the BLOCK_M sorted rows of this program's tile, all of one expert."""
    tile = tl.program_id(0)
    if tile * BLOCK_M < tl.load(num_padded_ptr):  # tiles past the real total: nothing to do
        ids = tl.load(sorted_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
        row_ok = ids < num_rows  # padding ids are num_rows
        expert = tl.load(experts_ptr + tile).to(tl.int64)
        a_rows = (ids // A_ROW_DIV).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        b_base = b_ptr + expert * stride_be
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(
                a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            b = tl.load(
                b_base + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                mask=k_ok[:, None] & col_ok[None, :],
                other=0.0,
            )  # [BLOCK_K, BLOCK_N]: the expert's rows for these outputs, transposed by the strides
            acc += tl.dot(a, b, input_precision="ieee")
        if MUL_WEIGHT:
            w = tl.load(weights_ptr + ids, mask=row_ok, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
        tl.store(
            c_ptr + ids.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn,
            acc.to(c_ptr.dtype.element_ty),
            mask=row_ok[:, None] & col_ok[None, :],
        )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    align: ExpertAlignment,
    a_row_div: int,
    num_rows: int,
    weights: torch.Tensor | None,
    tiles: MoeTiles,
) -> torch.Tensor:
    """[num_rows, b.shape[1]]: row r is ``a[r // a_row_div] @ b[expert of r].T`` (times ``weights[r]``)."""
    n_out, k_in = b.shape[1], b.shape[2]
    c = torch.empty(num_rows, n_out, device=a.device, dtype=a.dtype)
    grid = (align.sorted_ids.numel() // tiles.block_m, triton.cdiv(n_out, tiles.block_n))
    _grouped_gemm_kernel[grid](
        a,
        b,
        c,
        weights if weights is not None else c,
        align.sorted_ids,
        align.block_experts,
        align.num_padded,
        num_rows,
        n_out,
        k_in,
        *a.stride(),
        *b.stride(),
        *c.stride(),
        A_ROW_DIV=a_row_div,
        MUL_WEIGHT=weights is not None,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
    )
    return c


def fused_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_weights: torch.Tensor,
    top_experts: torch.Tensor,
    act_mul: Callable[[torch.Tensor], torch.Tensor],
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """x [T, H]; gate_up [E, 2I, H]; down [E, H, I]; top_weights, top_experts [T, top_k] -> [T, H]:
    each token's chosen experts' outputs weighted and summed (``moe.moe_mlp``'s routed part)."""
    t, top_k = top_experts.shape
    num_experts = gate_up.shape[0]
    if gate_up.shape[2] != x.shape[1] or down.shape[1] != x.shape[1] or down.shape[2] * 2 != gate_up.shape[1]:
        raise ValueError(
            f"MoE shapes: x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)} do not fit"
        )
    if t == 0:
        return torch.zeros_like(x)
    tiles = tiles or default_moe_tiles(t * top_k, num_experts)
    align = align_by_expert(top_experts, num_experts, tiles.block_m)
    rows = t * top_k
    h = grouped_gemm(x, gate_up, align, top_k, rows, None, tiles)
    act = act_mul(h).contiguous()
    weights = top_weights.reshape(-1).to(torch.float32).contiguous()
    y = grouped_gemm(act, down, align, 1, rows, weights, tiles)
    return y.view(t, top_k, -1).sum(dim=1)
