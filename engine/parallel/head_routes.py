"""Which rank of a tensor-parallel group holds which KV heads, and so which heads of a KV handoff
go from which prefill rank to which decode rank (pure Python).

Where the size exceeds the KV heads they are replicated (``layout.ShardLayout``): several ranks
hold one head, and the handoff reads it from the first of them (the copies are equal).
"""

from __future__ import annotations

from dataclasses import dataclass


def kv_head_range(rank: int, size: int, num_kv_heads: int) -> tuple[int, int]:
    """The KV heads ``[lo, hi)`` rank ``rank`` of ``size`` holds."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a group of {size}")
    if num_kv_heads % size and size % num_kv_heads:
        raise ValueError(f"a group of {size} neither splits nor replicates {num_kv_heads} KV heads")
    if size > num_kv_heads:
        head = rank // (size // num_kv_heads)
        return head, head + 1
    per = num_kv_heads // size
    return rank * per, (rank + 1) * per


def head_owners(size: int, num_kv_heads: int) -> tuple[int, ...]:
    """For each KV head, the first rank holding it (the one a handoff reads it from)."""
    owners = [-1] * num_kv_heads
    for rank in reversed(range(size)):
        lo, hi = kv_head_range(rank, size, num_kv_heads)
        owners[lo:hi] = [rank] * (hi - lo)
    return tuple(owners)


@dataclass(frozen=True)
class HeadRoute:
    """KV heads ``[first_head, end_head)`` travel from prefill rank ``src`` to decode rank ``dst``."""

    src: int
    dst: int
    first_head: int
    end_head: int


def handoff_routes(num_kv_heads: int, prefill_size: int, decode_size: int) -> tuple[HeadRoute, ...]:
    """Every decode rank's heads, each run from the prefill rank that holds it first: what a sharded
    handoff between groups of these sizes ships (a replicated head reaches every decode rank that
    holds it)."""
    for size in (prefill_size, decode_size):
        if size < 1:
            raise ValueError(f"a group of {size} ranks")
    owners = head_owners(prefill_size, num_kv_heads)
    routes: list[HeadRoute] = []
    for dst in range(decode_size):
        lo, hi = kv_head_range(dst, decode_size, num_kv_heads)
        for head in range(lo, hi):
            last = routes[-1] if routes else None
            if last is not None and last.dst == dst and last.src == owners[head] and last.end_head == head:
                routes[-1] = HeadRoute(last.src, dst, last.first_head, head + 1)
            else:
                routes.append(HeadRoute(owners[head], dst, head, head + 1))
    return tuple(routes)
