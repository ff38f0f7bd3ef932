"""The router's view of the workers: Ray handles, identity (incarnation), liveness and the latest
load report of each, and the placement choices made from them (pure Python + Ray handles)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from engine.worker_stats import WorkerLoad
from kv_transfer.peer import PeerInfo, WorkerInfo


@dataclass
class WorkerHandle:
    worker_id: str
    role: str  # "prefill" | "decode"
    actor: Any  # ray.actor.ActorHandle
    info: WorkerInfo | None = None
    load: WorkerLoad | None = None
    alive: bool = False
    failures: int = 0
    requests: set[str] = field(default_factory=set)  # decode: requests it is serving
    # Prefill tokens dispatched since the last load report (which will include them).
    dispatched_tokens: int = 0

    def update_load(self, load: WorkerLoad | None) -> None:
        if load is not None:
            self.load = load
            self.dispatched_tokens = 0

    @property
    def peer(self) -> PeerInfo:
        assert self.info is not None, f"{self.worker_id} has not reported yet"
        return self.info.peer


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
