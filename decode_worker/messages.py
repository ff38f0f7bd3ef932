"""Messages between the router and decode workers (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_events import KVCacheEvent
from engine.outputs import RequestOutput
from engine.worker_stats import WorkerLoad


@dataclass(frozen=True)
class ReserveResult:
    accepted: bool
    transfer_id: int = -1
    num_cached_blocks: int = 0  # blocks the prefill worker need not ship
    reason: str = ""


@dataclass
class OutputBatch:
    """Everything a decode worker produced since the last poll: one message per poll, never per token."""

    worker_id: str
    incarnation: str
    outputs: list[RequestOutput] = field(default_factory=list)
    load: WorkerLoad | None = None
    kv_events: list[KVCacheEvent] = field(default_factory=list)  # since the last poll
    # This router's requests the worker dropped as orphans (it had not polled for the orphan timeout)
    # although it polls again: they have no outputs coming, so the router places them anew.
    dropped: list[str] = field(default_factory=list)
