"""Tokens sorted by expert, each expert's run padded to the grouped GEMM's row tile (as vLLM's
``moe_align_block_size`` does): the layout the fused MoE kernel (``moe_fused.py``) reads.

Every (token, choice) pair of a step's routing is one row id ``token * top_k + choice``. The ids are
sorted by expert (stably, so a token's rows keep their order) and each expert's run is padded up to
a multiple of ``block_m`` with the id ``T * top_k`` (one past the last: the kernel skips it), so each
row tile of the sorted ids belongs to one expert, named in ``block_experts``.

Torch ops on the device only, with shapes fixed by (tokens, top_k, experts, block_m): no host
synchronisation, so a decode step with MoE layers can be captured in a CUDA graph. The padded
length is an upper bound (each expert that has a token pads at most ``block_m - 1`` rows); tiles
past the real total (``num_padded``) name expert ``num_experts``, and the kernel's programs for
them exit at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertAlignment:
    sorted_ids: torch.Tensor  # int32 [padded bound]: row ids by expert; T * top_k marks padding
    block_experts: torch.Tensor  # int32 [padded bound / block_m]: each row tile's expert
    num_padded: torch.Tensor  # int32 [1]: rows of sorted_ids in use (on the device)
    block_m: int


def padded_bound(num_rows: int, num_experts: int, block_m: int) -> int:
    """Rows the sorted ids may need, a multiple of ``block_m``: every row, plus the padding of each
    expert that can have one (at most ``min(experts, rows)`` of them)."""
    bound = num_rows + min(num_experts, num_rows) * (block_m - 1)
    return max(-(-bound // block_m), 1) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    """``topk_ids``: [T, top_k] the experts each token chose."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    # Counts by scatter_add (bincount would read its maximum back to the host).
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    # A row's place in its expert's run: its index in the sorted order less the rows of earlier experts.
    rank = torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    bound = padded_bound(n, num_experts, block_m)
    sorted_ids = torch.full((bound,), n, dtype=torch.int32, device=device)
    sorted_ids[(ends - padded)[expert_of] + rank] = order.to(torch.int32)
    tile_starts = torch.arange(0, bound, block_m, device=device)
    block_experts = torch.searchsorted(ends, tile_starts, right=True).to(torch.int32)
    return ExpertAlignment(sorted_ids, block_experts, ends[-1:].to(torch.int32), block_m)
