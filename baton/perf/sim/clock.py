"""The simulator's event loop: a heap of (time, sequence, callback). Ties run in scheduling order,
so a run is a pure function of its inputs."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        if t < self.now:
            t = self.now  # never schedule into the past
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Process events in time order until none is left, the next is after ``until``, or ``stop()``."""
        heap = self._heap
        while heap:
            t = heap[0][0]
            if until is not None and t > until:
                self.now = until
                return
            _, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if stop is not None and stop():
                return

    def __len__(self) -> int:
        return len(self._heap)
