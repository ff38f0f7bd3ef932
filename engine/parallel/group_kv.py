"""A tensor-parallel group's KV blocks as one whole-head tensor: the interim KV handoff of a
group (a pool worker of tensor-parallel size > 1).

Each rank's cache holds only its KV heads. ``KVExport`` (prefill) gathers the shipped blocks'
heads from every rank to rank 0, which ships whole-head rows exactly as a one-rank worker does;
``KVImport`` (decode) broadcasts received whole-head rows from rank 0, and every rank keeps its
own heads. Both are plans like a step's: rank 0 broadcasts them on the engine thread, in order
with the steps, and every rank runs them over the group's collectives. So a group of any size
hands off to a group of any size (heads split or replicated), the wire format is unchanged, and
block ids stay the group's one block manager's. (Pool workers hand off rank to rank by default,
``direct_kv.py``; this path through rank 0 is the one a worker started with ``direct_kv=False``
uses, and what tests compare a group's KV with.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from engine.parallel.group import RankGroup
from engine.parallel.head_routes import head_owners, kv_head_range


@dataclass(frozen=True)
class KVExport:
    """Gather blocks ``block_ids`` (every head) to rank 0."""

    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class KVImport:
    """Rank 0 broadcasts whole-head rows of this shape next; each rank writes its heads into its
    blocks ``block_ids``."""

    block_ids: tuple[int, ...]
    shape: tuple[int, ...]


def whole_row_shape(kv_cache: torch.Tensor, num_kv_heads: int) -> tuple[int, ...]:
    """One block's row with every KV head (``[layers, 2, block_size, kv_heads, head_dim]``)."""
    layers, two, block_size, _, head_dim = kv_cache.shape[1:]
    return (layers, two, block_size, num_kv_heads, head_dim)


def export_step(group: RankGroup, kv_cache: torch.Tensor, num_kv_heads: int, plan: KVExport) -> torch.Tensor | None:
    """Every rank runs this; rank 0 gets the blocks' whole-head rows (the others None)."""
    idx = torch.tensor(plan.block_ids, dtype=torch.long, device=kv_cache.device)
    mine = kv_cache.index_select(0, idx).contiguous()
    parts = [torch.empty_like(mine) for _ in range(group.size)]
    group.dev.allgather([parts], [mine]).wait()
    if group.rank != 0:
        return None
    rows = torch.empty(
        (len(plan.block_ids), *whole_row_shape(kv_cache, num_kv_heads)), dtype=mine.dtype, device=mine.device
    )
    for head, owner in enumerate(head_owners(group.size, num_kv_heads)):
        lo, _ = kv_head_range(owner, group.size, num_kv_heads)
        rows[..., head, :] = parts[owner][..., head - lo, :]
    return rows


def import_step(
    group: RankGroup, kv_cache: torch.Tensor, num_kv_heads: int, plan: KVImport, rows: torch.Tensor | None = None
) -> None:
    """Every rank runs this after the plan's broadcast; rank 0 passes the rows."""
    if group.rank == 0:
        assert rows is not None
        rows = rows.to(kv_cache.device).contiguous()
    else:
        rows = torch.empty(plan.shape, dtype=kv_cache.dtype, device=kv_cache.device)
    group.dev.broadcast([rows], _root0()).wait()
    lo, hi = kv_head_range(group.rank, group.size, num_kv_heads)
    idx = torch.tensor(plan.block_ids, dtype=torch.long, device=kv_cache.device)
    kv_cache.index_copy_(0, idx, rows[..., lo:hi, :].contiguous())


class PlanBroadcaster(Protocol):
    """Rank 0's side of a group (``engine/parallel/launcher.Ranks``), as far as a handoff uses it."""

    group: RankGroup

    def broadcast_plan(self, plan: KVExport | KVImport) -> None: ...


def export_kv(
    ranks: PlanBroadcaster | None, kv_cache: torch.Tensor, num_kv_heads: int, block_ids: Sequence[int]
) -> torch.Tensor:
    """Rank 0 (or a one-rank engine): blocks ``block_ids`` with every KV head."""
    if ranks is None:
        return kv_cache.index_select(0, torch.tensor(list(block_ids), dtype=torch.long, device=kv_cache.device))
    plan = KVExport(tuple(block_ids))
    ranks.broadcast_plan(plan)
    rows = export_step(ranks.group, kv_cache, num_kv_heads, plan)
    assert rows is not None  # rank 0's
    return rows


def import_kv(
    ranks: PlanBroadcaster | None,
    kv_cache: torch.Tensor,
    num_kv_heads: int,
    block_ids: Sequence[int],
    rows: torch.Tensor,
) -> None:
    """Rank 0 (or a one-rank engine): write whole-head ``rows`` into blocks ``block_ids``."""
    if ranks is None:
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=kv_cache.device)
        kv_cache.index_copy_(0, idx, rows.to(kv_cache))
        return
    plan = KVImport(tuple(block_ids), tuple(rows.shape))
    ranks.broadcast_plan(plan)
    import_step(ranks.group, kv_cache, num_kv_heads, plan, rows)


def _root0() -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts
