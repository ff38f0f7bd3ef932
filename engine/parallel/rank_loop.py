"""What a tensor-parallel rank other than 0 runs: load its shard, then run every step plan rank 0
broadcasts, until the plan that says stop (None).

The rank keeps the same persistent batch as rank 0 (the plans are the scheduler's deltas) and
samples the same tokens (the logits are gathered on every rank, the sampler seeded alike), so it
holds no scheduler, block manager or request state of its own: there is nothing to drift.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import EngineConfig
from engine.model_loader import load_model, pick_device
from engine.parallel.direct_kv import HandoffClose, HandoffJoin, HandoffRecv, HandoffSend, RankHandoffs, report
from engine.parallel.group import GroupAddress, RankGroup
from engine.parallel.group_kv import KVExport, KVImport, export_step, import_step
from engine.runner import ModelRunner


@dataclass(frozen=True)
class RankSetup:
    """What rank 0 tells the others once loaded (what they cannot work out alike)."""

    eos_token_ids: tuple[int, ...]


def run_rank(config: EngineConfig, address: GroupAddress, rank: int, device: torch.device | None = None) -> None:
    """The body of rank ``rank`` (1..N-1) of a group: a local process's (``device`` None: its own
    ``cuda:rank``) or a Ray actor's (``device``: the one GPU Ray gave it, or the CPU)."""
    size = config.tensor_parallel_size
    # Each rank computes its own shard: its threads are its own (one by default on CPU, so N ranks
    # use N cores like one rank with N threads).
    config = replace(config, num_threads=config.num_threads or 1)
    group = RankGroup.join(address, rank, size, device if device is not None else rank_device(config, rank))
    loaded = load_model(config, group=group)
    setup: RankSetup = group.broadcast_object()
    runner = ModelRunner(
        loaded.model,
        loaded.kv_cache,
        loaded.attention,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_model_len=loaded.max_model_len,
        block_size=config.cache.block_size,
        seed=config.seed,
        eos_token_ids=setup.eos_token_ids,
    )
    num_kv_heads = loaded.model_config.num_key_value_heads
    handoffs = RankHandoffs(rank, size, runner.kv_cache, num_kv_heads)  # the direct handoff (direct_kv.py)
    while (plan := group.broadcast_object()) is not None:
        if isinstance(plan, HandoffJoin | HandoffSend | HandoffRecv | HandoffClose):
            failed, received = handoffs.apply(plan)
            if isinstance(plan, HandoffRecv):
                report(group, failed, received)
        elif isinstance(plan, KVExport):  # a pool worker's KV handoff (engine/parallel/group_kv.py)
            export_step(group, runner.kv_cache, num_kv_heads, plan)
        elif isinstance(plan, KVImport):
            import_step(group, runner.kv_cache, num_kv_heads, plan)
        else:
            runner.execute(plan)


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """A local rank's device: its own GPU (``cuda:rank``) where the engine runs on CUDA."""
    device = pick_device(config.device)
    return torch.device("cuda", rank) if device.type == "cuda" and device.index is None else device
