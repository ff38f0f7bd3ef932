"""The load report every worker sends with its outputs and heartbeats (pure Python).

It carries what placement and admission need (free KV, queued prefill tokens, running sequences)
and the counters the router turns into metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from engine.block_manager import BlockManager
from engine.lane_shares import LaneCounters
from engine.request import Request
from engine.scheduler import Scheduler


@dataclass(frozen=True)
class WorkerLoad:
    worker_id: str
    incarnation: str
    role: str
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    queued_prefill_tokens: int  # prompt tokens admitted but not yet computed
    num_reserved: int = 0  # decode role: reservations waiting for KV
    num_transferring: int = 0  # prefill role: KV shipped, not yet acknowledged
    transfers_completed: int = 0
    transfers_failed: int = 0
    transfer_bytes: int = 0
    transfer_seconds: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    steps: int = 0
    busy_seconds: float = 0.0  # wall time in steps
    busy_cpu_seconds: float = 0.0  # the stepping thread's CPU time in them (less: it waited for a core)
    prompt_tokens_computed: int = 0  # cumulative: with busy_seconds, the measured prefill rate
    preemptions: int = 0  # cumulative: requests preempted (recompute) for KV blocks
    preempted_tokens: int = 0  # cumulative: computed tokens those preemptions threw away
    draft_tokens: int = 0  # cumulative, speculative decoding: drafted tokens computed ...
    accepted_draft_tokens: int = 0  # ... and of those, the ones kept
    # Prefill role: prompt tokens of the tasks it has queued since it started, by the router that
    # sent them (``RequestSpec.origin``). A router subtracts them from what it has dispatched there
    # to know what is still on the way (router/worker_pool.py).
    prompt_tokens_received: dict[str, int] = field(default_factory=dict)
    # Decode role: prompt tokens of the requests placed here (reserved or added) since it started, by
    # router. The same reconciliation for decode placement: what a router placed here that no report
    # includes yet will take KV blocks the report still shows free (router/worker_pool.py).
    prompt_tokens_placed: dict[str, int] = field(default_factory=dict)
    # Decode role with lane shares on (engine/lane_shares.py): decode tokens and preemptions for pace by lane.
    lane_counters: LaneCounters | None = None
    # The most prompt tokens one step computes (SchedulerConfig.prefill_token_budget, else the step's
    # token budget; 0: not reported): with ``steps``, ``busy_seconds`` and ``prompt_tokens_computed``
    # the router predicts the pace a decode worker's own prompt work leaves its streams.
    step_prompt_budget: int = 0
    # Of ``queued_prefill_tokens``, the waiting requests' by priority (lane): a request goes ahead of
    # less important ones there (the waiting queue is in priority order), so they are not ahead of it.
    waiting_tokens_by_priority: dict[int, int] = field(default_factory=dict)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks if self.num_total_blocks else 0.0


class PrefillQueues(Protocol):
    """What ``queued_prefill_tokens`` reads of a scheduler."""

    @property
    def waiting(self) -> Iterable[Request]: ...

    @property
    def running(self) -> Iterable[Request]: ...


def queued_prefill_tokens_by_priority(scheduler: PrefillQueues) -> dict[int, int]:
    """``queued_prefill_tokens`` by request priority (lane)."""
    out: dict[int, int] = {}
    for r in scheduler.waiting:
        out[r.priority] = out.get(r.priority, 0) + r.num_tokens - r.num_computed_tokens
    for r in scheduler.running:
        if r.num_prompt_tokens > r.num_computed_tokens:
            out[r.priority] = out.get(r.priority, 0) + r.num_prompt_tokens - r.num_computed_tokens
    return out


def queued_prefill_tokens(scheduler: PrefillQueues) -> int:
    """Prompt tokens not yet computed, over waiting and running requests."""
    waiting = sum(r.num_tokens - r.num_computed_tokens for r in scheduler.waiting)
    running = sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in scheduler.running)
    return waiting + running


class StepCounters(Protocol):
    """The engine loop's step counters (engine/engine_loop.py)."""

    num_steps: int
    busy_seconds: float
    busy_cpu_seconds: float


def engine_load(
    worker_id: str, incarnation: str, role: str, scheduler: Scheduler, blocks: BlockManager, loop: StepCounters
) -> WorkerLoad:
    """The fields of a load report both roles fill alike (each worker adds its role's with ``replace``)."""
    return WorkerLoad(
        worker_id=worker_id,
        incarnation=incarnation,
        role=role,
        num_running=scheduler.num_running,
        num_waiting=scheduler.num_waiting,
        num_free_blocks=blocks.num_free_blocks,
        num_total_blocks=blocks.num_blocks,
        queued_prefill_tokens=queued_prefill_tokens(scheduler),
        prefix_queries=blocks.num_prefix_queries,
        prefix_hits=blocks.num_prefix_hits,
        steps=loop.num_steps,
        busy_seconds=loop.busy_seconds,
        busy_cpu_seconds=loop.busy_cpu_seconds,
        prompt_tokens_computed=scheduler.prompt_tokens_computed,
        preemptions=scheduler.num_preemptions,
        preempted_tokens=scheduler.preempted_tokens,
        step_prompt_budget=scheduler.config.prefill_token_budget or scheduler.config.max_num_batched_tokens,
        waiting_tokens_by_priority=scheduler.waiting.tokens_by_priority(),
    )
