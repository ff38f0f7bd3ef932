"""What a simulated cluster looks like (validated where built)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from router.admission import PACE_HEADROOM, SLO_HEADROOM
from router.lanes import LanePolicy


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class SimConfig:
    """A cluster and its router, as ``baton up`` would run it (defaults: ``baton/default_config.yaml``).

    ``prefill_max_num_batched_tokens`` is the prefill pool's token budget, i.e. its chunk size;
    ``decode_max_num_batched_tokens`` is the decode pool's, which bounds how much of a locally
    prefilled prompt rides along with a decode step (the chunk size when colocated).
    """

    prefill_workers: int = 1
    decode_workers: int = 1
    prefill_max_num_batched_tokens: int = 2048
    decode_max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    num_kv_blocks: int | None = None  # per worker; None: the cost model's serving pool
    enable_prefix_caching: bool = True
    kv_shared_memory: bool = False  # engine.kv_shared_memory: same-host transfers copy through /dev/shm
    local_prefill_threshold: int = 256
    # pools.decode_prefill_token_budget: with a prefill pool, the prompt tokens a decode worker's step
    # may compute (local prefills, recomputes; None: its whole budget)
    decode_prefill_token_budget: int | None = 256
    short_prompts_to_idle_prefill: bool = True  # pools.short_prompts_to_idle_prefill
    lanes: LanePolicy = field(default_factory=LanePolicy)
    slo_rejection: bool = True
    slo_headroom: float = SLO_HEADROOM  # router.slo_headroom
    pace_headroom: float = PACE_HEADROOM  # router.pace_headroom
    pace_guard: bool = True  # router.pace_guard
    lane_priority: bool = True  # router.lane_priority: decode slots by lane weight, preemption for pace
    initial_prefill_tokens_per_s: float = 1000.0
    # pools.transfer_timeout_s: the router keeps the prefill backlog within its share of it (the
    # decode workers' deadline itself is not simulated: a transfer here never stalls)
    transfer_timeout_s: float = 10.0
    tenant: str = "default"  # requests' tenant: its name salts the prefix cache (tenant isolation)
    dispatch_threads: int = 8  # the router's executor placing requests (blocking Ray calls)
    monitor_interval_s: float = 0.5  # the dispatcher polls prefill workers' loads this often
    housekeeping_s: float = 0.25  # the router folds load reports into its prefill rate this often
    dispatch_retry_s: float = 0.01  # the dispatch loop's wait while requests are queued
    step_scale: float = 1.0  # multiplies every step time (calibration, e.g. CPU contention)
    # multiplies steps that compute prompt tokens instead (None: step_scale). On a CPU the two kinds
    # drift apart: decode steps are memory-bound, prefill steps compute-bound (baton.perf.profile.speed).
    prefill_step_scale: float | None = None

    def __post_init__(self) -> None:
        _check(self.prefill_workers >= 0, "prefill_workers must be >= 0")
        _check(self.decode_workers >= 1, "a cluster needs at least one decode worker")
        for name in (
            "prefill_max_num_batched_tokens",
            "decode_max_num_batched_tokens",
            "max_num_seqs",
            "dispatch_threads",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v > 0, f"{name} must be a positive integer, got {v!r}")
        _check(self.num_kv_blocks is None or self.num_kv_blocks > 0, "num_kv_blocks must be > 0")
        _check(self.local_prefill_threshold >= 0, "local_prefill_threshold must be >= 0")
        _check(
            self.decode_prefill_token_budget is None or self.decode_prefill_token_budget > 0,
            f"decode_prefill_token_budget must be > 0 or None, got {self.decode_prefill_token_budget!r}",
        )
        _check(
            math.isfinite(self.step_scale) and self.step_scale > 0,
            f"step_scale must be a finite number > 0, got {self.step_scale!r}",
        )
        _check(
            self.prefill_step_scale is None or (math.isfinite(self.prefill_step_scale) and self.prefill_step_scale > 0),
            f"prefill_step_scale must be a finite number > 0, got {self.prefill_step_scale!r}",
        )
        _check(self.initial_prefill_tokens_per_s > 0, "initial_prefill_tokens_per_s must be > 0")
        _check(self.transfer_timeout_s > 0, f"transfer_timeout_s must be > 0, got {self.transfer_timeout_s!r}")

    @property
    def colocated(self) -> bool:
        return self.prefill_workers == 0

    @property
    def num_workers(self) -> int:
        return self.prefill_workers + self.decode_workers

    def label(self) -> str:
        if self.colocated:
            return f"P=0 D={self.decode_workers} budget={self.decode_max_num_batched_tokens}"
        return (
            f"P={self.prefill_workers} D={self.decode_workers} chunk={self.prefill_max_num_batched_tokens} "
            f"budget={self.decode_max_num_batched_tokens}"
        )


def sim_config_from_baton(cfg, cost) -> SimConfig:
    """The ``SimConfig`` of a ``baton.config.BatonConfig`` (what ``baton up --config`` would run),
    with the KV pool sized as the engine would size it for the profiled model."""
    e, pools, router = cfg.engine, cfg.pools, cfg.router
    blocks = None
    if e.kv_cache_memory_gb is not None:
        block_bytes = cost.model.kv_bytes_per_token * cost.model.block_size
        useful = e.max_num_seqs * -(-cost.model.max_model_len // cost.model.block_size)
        blocks = max(1, min(int(e.kv_cache_memory_gb * 2**30 // block_bytes), useful))
    return SimConfig(
        prefill_workers=pools.prefill.workers,
        decode_workers=pools.decode.workers,
        prefill_max_num_batched_tokens=e.max_num_batched_tokens,
        decode_max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        num_kv_blocks=blocks,
        enable_prefix_caching=e.enable_prefix_caching,
        kv_shared_memory=getattr(e, "kv_shared_memory", False),
        local_prefill_threshold=pools.local_prefill_threshold,
        decode_prefill_token_budget=pools.decode_prefill_token_budget,
        short_prompts_to_idle_prefill=pools.short_prompts_to_idle_prefill,
        lanes=cfg.lane_policy(),
        slo_rejection=router.slo_rejection,
        slo_headroom=router.slo_headroom,
        pace_headroom=router.pace_headroom,
        pace_guard=router.pace_guard,
        initial_prefill_tokens_per_s=router.initial_prefill_tokens_per_s,
        lane_priority=router.lane_priority,
        transfer_timeout_s=pools.transfer_timeout_s,
    )
