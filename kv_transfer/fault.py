"""Fault injection for KV transfers, shipped in the product so tests (and operators rehearsing
failures) can drop, delay or kill transfers on a live worker (pure Python).

Faults apply on the sending side, per transfer (a transfer is keyed by its peer and its id: each
decode worker numbers its transfers from 1, so an id alone names one transfer per peer): a dropped
transfer sends nothing at all (the FIFO stays well-formed, the receiver simply never hears of it); a
delayed one waits before its first message; ``die_after_chunks`` ends the sending process after that
many chunks, as a crash mid-transfer would; ``sever_after_chunks`` makes the channel's next send fail after that many
chunks, as a network error would, with both processes alive (the pair then forms again).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class FaultSpec:
    drop_next: int = 0  # drop this many upcoming transfers entirely
    delay_s: float = 0.0  # delay each upcoming transfer's first message by this much
    delay_next: int = 0  # ... for this many transfers (0: every transfer while delay_s > 0)
    die_after_chunks: int | None = None  # os._exit(1) after sending this many more chunks
    sever_after_chunks: int | None = None  # the channel fails (once) after sending this many more chunks

    def __post_init__(self) -> None:
        if self.drop_next < 0 or self.delay_next < 0 or self.delay_s < 0:
            raise ValueError("fault counts and delays must be >= 0")
        if any(n is not None and n < 0 for n in (self.die_after_chunks, self.sever_after_chunks)):
            raise ValueError("die_after_chunks and sever_after_chunks must be >= 0")


class FaultInjector:
    def __init__(self, spec: FaultSpec | None = None) -> None:
        self._lock = threading.Lock()
        self._spec = spec or FaultSpec()
        self._dropped: set[Hashable] = set()  # transfer keys, until the transfer ends (forget)
        self._delayed: set[Hashable] = set()
        self.num_dropped = 0

    def set(self, spec: FaultSpec) -> None:
        with self._lock:
            self._spec = spec

    def should_drop(self, transfer: Hashable) -> bool:
        with self._lock:
            if transfer in self._dropped:
                return True
            if self._spec.drop_next > 0:
                self._spec = replace(self._spec, drop_next=self._spec.drop_next - 1)
                self._dropped.add(transfer)
                self.num_dropped += 1
                return True
            return False

    def delay_for(self, transfer: Hashable) -> float:
        with self._lock:
            s = self._spec
            if s.delay_s <= 0 or transfer in self._delayed:
                return 0.0
            self._delayed.add(transfer)
            if s.delay_next:
                left = s.delay_next - 1
                self._spec = replace(s, delay_next=left, delay_s=s.delay_s if left else 0.0)
            return s.delay_s

    def forget(self, transfer: Hashable) -> None:
        """The transfer ended: its key may name a new transfer later."""
        with self._lock:
            self._dropped.discard(transfer)
            self._delayed.discard(transfer)

    def before_chunk(self) -> None:
        """Called before each KV chunk is sent (on the channel's send thread): ``die_after_chunks=n``
        and ``sever_after_chunks=n`` let n chunks through."""
        with self._lock:
            n = self._spec.die_after_chunks
            if n is not None:
                if n <= 0:
                    os._exit(1)  # a crash, not a clean shutdown: peers see the connection drop
                self._spec = replace(self._spec, die_after_chunks=n - 1)
            n = self._spec.sever_after_chunks
            if n is not None:
                self._spec = replace(self._spec, sever_after_chunks=n - 1 if n > 0 else None)
                if n <= 0:
                    raise ConnectionResetError("injected fault: the channel was severed")
