"""Shared helpers for cluster tests."""

from __future__ import annotations

import random

from baton.cluster import ClusterConfig, LocalCluster
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams


def engine_config(model_dir, *, budget=32, blocks=512, block_size=16) -> EngineConfig:
    return EngineConfig(
        model=str(model_dir),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget),
        cache=CacheConfig(block_size=block_size, num_blocks=blocks),
    )


def start_cluster(model_dir, prefill, decode, **kw) -> LocalCluster:
    ecfg = engine_config(model_dir, **{k: kw.pop(k) for k in ("budget", "blocks", "block_size") if k in kw})
    return LocalCluster(ClusterConfig(prefill_workers=prefill, decode_workers=decode, engine=ecfg, **kw))


def prompts(seed: int, n: int, vocab: int, lo: int = 20, hi: int = 150, prefix: list[int] | None = None):
    rng = random.Random(seed)
    return [list(prefix or []) + [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def colocated(model_dir, ps, max_new, **kw):
    eng = LLMEngine(engine_config(model_dir, **kw))
    return [o.token_ids for o in eng.generate(ps, [greedy(n) for n in max_new])]


def nccl_violations(cluster: LocalCluster) -> list[str]:
    """What the NCCL-semantics double (a cluster started with ``kv_data_plane=NcclSemantics()``)
    recorded in the cluster's rendezvous store: payload operations left waiting without their peer
    committed to the match (kv_transfer/nccl_double.py)."""
    from kv_transfer.nccl_double import violations
    from kv_transfer.pair_group import connect_store

    return violations(connect_store(cluster.fleet.store, 10.0))
