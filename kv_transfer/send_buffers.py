"""Reusable CPU staging buffers for outgoing KV chunks (the pair-group path).

A chunk's blocks are gathered out of the block-major cache into one contiguous tensor for the
wire. A fresh tensor per chunk faults its pages in on every chunk, and on CPU that cost about as
much as the gather and the send together (a 2,048-token chunk of SmolLM2 is 90 MiB). So the
sender gathers into a buffer it keeps, and the channel's send thread hands it back once the
payload has left. CUDA's caching allocator already reuses memory: there the gather allocates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


class SendBuffers:
    def __init__(self, row_shape: tuple[int, ...], dtype: torch.dtype, keep: int = 2) -> None:
        self.row_shape, self.dtype, self.keep = row_shape, dtype, keep
        self._free: list[torch.Tensor] = []  # idle buffers, at most ``keep``, largest kept
        self._lock = threading.Lock()  # the engine thread takes, send threads give back
        self.allocated = 0  # buffers created so far (tests and stats)

    def gather(self, cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """``cache[block_ids]`` in a reused buffer, and the call that returns the buffer when sent."""
        n = len(block_ids)
        with self._lock:
            fitting = [i for i, b in enumerate(self._free) if b.shape[0] >= n]
            buf = self._free.pop(min(fitting, key=lambda i: self._free[i].shape[0])) if fitting else None
        if buf is None:
            buf = torch.empty((n, *self.row_shape), dtype=self.dtype)
            self.allocated += 1
        payload = torch.index_select(cache, 0, block_ids, out=buf[:n])
        return payload, lambda: self._give_back(buf)

    def _give_back(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                self._free.pop(min(range(len(self._free)), key=lambda i: self._free[i].shape[0]))

    def idle(self) -> int:
        with self._lock:
            return len(self._free)
