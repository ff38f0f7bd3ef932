"""The router's view of the workers: Ray handles, identity (incarnation), liveness and the latest
load report of each, and the placement choices made from them (pure Python + Ray handles)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.worker_stats import WorkerLoad
from kv_transfer.peer import PeerInfo, WorkerInfo


@dataclass
class WorkerHandle:
    worker_id: str
    role: str  # "prefill" | "decode"
    actor: Any  # a Ray ActorHandle (its remote methods are typed at run time only) or a test double
    info: WorkerInfo | None = None
    load: WorkerLoad | None = None
    # When ``load`` arrived: a prefill worker's report is taken between two steps, so the step it
    # started then has run since (router.placement.yielding_tokens). None: no report yet.
    load_at: float | None = None
    alive: bool = False
    failures: int = 0
    requests: set[str] = field(default_factory=set)  # decode: requests it is serving
    # Prompt tokens sent to this (prefill) worker since it started, by router id. Its load report
    # says how many of them it has queued (WorkerLoad.prompt_tokens_received); the rest are on the
    # way. Not reset by a report: a report computed before a dispatch arrived would wipe it and
    # show a worker busy with a long prompt as idle until its next report, after that prompt.
    dispatched_by_router: dict[str, int] = field(default_factory=dict)
    # Decode: prompt tokens of the requests placed here, by router id, reconciled the same way with
    # WorkerLoad.prompt_tokens_placed. Without it a burst placed between two reports all went to the
    # worker whose last report showed the most free KV.
    placed_by_router: dict[str, int] = field(default_factory=dict)

    @property
    def reported_info(self) -> WorkerInfo:
        """``info``, which every live worker has (``WorkerPool.live`` lists only those)."""
        if self.info is None:
            raise RuntimeError(f"worker {self.worker_id} has not reported its info yet")
        return self.info

    @property
    def dispatched_tokens(self) -> int:
        """Prompt tokens dispatched here that its latest load report does not include yet."""
        return _unreported(self.dispatched_by_router, self.load.prompt_tokens_received if self.load else {})

    @property
    def placed_tokens(self) -> int:
        """Prompt tokens of requests placed here (decode) that its latest load report does not include yet."""
        return _unreported(self.placed_by_router, self.load.prompt_tokens_placed if self.load else {})

    def count_placed(self, router_id: str, tokens: int) -> None:
        """``tokens`` more placed here by ``router_id`` (negative: a placement that did not happen)."""
        _add(self.placed_by_router, router_id, tokens)

    def count_dispatched(self, router_id: str, tokens: int) -> None:
        """``tokens`` more (or, for a dispatch that never arrived, fewer) sent by ``router_id``."""
        _add(self.dispatched_by_router, router_id, tokens)

    def forget_dispatched(self) -> None:
        """A new incarnation counts from zero; so does a new router."""
        self.dispatched_by_router.clear()
        self.placed_by_router.clear()

    def update_load(self, load: WorkerLoad | None, at: float | None = None) -> None:
        """``at``: when it arrived (default: now, ``time.monotonic``; the simulator passes its clock)."""
        if load is not None:
            self.load = load
            self.load_at = time.monotonic() if at is None else at

    @property
    def peer(self) -> PeerInfo:
        assert self.info is not None, f"{self.worker_id} has not reported yet"
        return self.info.peer


def _unreported(counted: dict[str, int], reported: dict[str, int]) -> int:
    """What the routers counted beyond what the worker's report includes, summed over routers."""
    # tuple(): one C-level copy, so a dispatch thread adding a router's first count cannot change
    # the dict under this (unlocked) reader's iteration.
    return sum(max(0, n - reported.get(router, 0)) for router, n in tuple(counted.items()))


def _add(counts: dict[str, int], router_id: str, tokens: int) -> None:
    counts[router_id] = max(0, counts.get(router_id, 0) + tokens)


class WorkerPool:
    """Both pools. Thread-safe: pollers update loads while dispatch reads them."""

    def __init__(self, prefill: list[WorkerHandle], decode: list[WorkerHandle]) -> None:
        self.prefill = prefill
        self.decode = decode
        self.lock = threading.RLock()

    def all(self) -> list[WorkerHandle]:
        return self.prefill + self.decode

    def live(self, role: str) -> list[WorkerHandle]:
        with self.lock:
            return [w for w in (self.prefill if role == "prefill" else self.decode) if w.alive and w.info]

    def get(self, worker_id: str) -> WorkerHandle | None:
        return next((w for w in self.all() if w.worker_id == worker_id), None)
