"""Which GPU a thread works on. CUDA's current device is per host thread and starts at device 0, so
an engine on ``cuda:N`` binds every thread that touches the GPU: the worker's own thread before it
loads anything (weights, the layer-ops self-check), and the thread that runs the engine's steps
(eager kernels and Triton launches use the current device) before its first step. A Ray worker
with one visible GPU binds it too (its index 0), so no code path depends on the default."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

SetDevice = Callable[[torch.device], None]


def cuda_set_device(device: torch.device) -> None:
    torch.cuda.set_device(device)


def bind_device(device: torch.device, set_device: SetDevice = cuda_set_device) -> torch.device:
    """Make ``device`` the calling thread's current CUDA device; returns it with its index (``cuda``
    alone is device 0). Other devices are returned as they are, and nothing is called."""
    if device.type != "cuda":
        return device
    indexed = torch.device("cuda", 0 if device.index is None else device.index)
    set_device(indexed)
    return indexed


class ThreadDevice:
    """Binds ``device`` on each thread that calls ``enter`` (once per thread: the engine's steps run
    on a loop thread, its loading on the caller's)."""

    def __init__(self, device: torch.device, set_device: SetDevice = cuda_set_device) -> None:
        self.device = device
        self._set_device = set_device
        self._bound = threading.local()

    def enter(self) -> None:
        if self.device.type == "cuda" and not getattr(self._bound, "done", False):
            bind_device(self.device, self._set_device)
            self._bound.done = True


def bind_config_device(name: str, set_device: SetDevice = cuda_set_device) -> torch.device | None:
    """A worker's first step, before it builds its engine: bind the GPU an engine config's ``device``
    names (``cuda``, ``cuda:N``, or ``auto`` where CUDA is available). None where it names no GPU."""
    if name == "auto":
        if not torch.cuda.is_available():
            return None
        name = "cuda"
    device = torch.device(name)
    return bind_device(device, set_device) if device.type == "cuda" else None
