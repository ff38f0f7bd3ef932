"""Where payload operations run and how their completion is passed on: streams and events.

On CUDA a pair's payload operations run on two dedicated streams (send, receive), never the
default stream the engine computes on; NCCL's ``wait()`` only makes the caller's current stream
wait, so every hand-over is an event: the prefill side records one after the KV it ships was
gathered (the send stream waits on it), the decode side records one after a chunk's scatter (the
decode step that first reads those blocks waits on it). Nothing here calls
``torch.cuda.synchronize()``; a host wait is one event's ``synchronize`` on a channel thread, only
where the host must know (a staging buffer going back to its pool, a peer reading our cache).

On the CPU there is no stream apart from the host: ``wait()`` means the host waits. With gloo every
operation is already complete when its ``wait()`` returns, so the events are no-ops; the
NCCL-semantics double (kv_transfer/nccl_double.py) brings its own, whose events do wait.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol

import torch


class PayloadEvent(Protocol):
    def wait(self) -> None:
        """Order the calling thread's current stream after this event (on the CPU: the host waits)."""

    def synchronize(self) -> None:
        """The host waits for this event (and raises what the operations before it raised)."""


class PayloadStreams(Protocol):
    """One side of a pair's payload streams."""

    def sending(self) -> AbstractContextManager[None]:
        """Run what is issued inside on the send stream."""

    def receiving(self) -> AbstractContextManager[None]:
        """Run what is issued inside on the receive stream."""

    def record(self) -> PayloadEvent:
        """An event after everything issued so far on the current stream."""

    def keep_alive(self, tensor: torch.Tensor) -> None:
        """``tensor`` is in use on the current stream: its memory is not reused before that is done."""


class _Done:
    """An event already reached (gloo on the CPU: the host waited for the operation)."""

    def wait(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


DONE: PayloadEvent = _Done()


class HostStreams:
    """The CPU with gloo: the host is the only stream and operations complete in ``wait()``."""

    def sending(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def receiving(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self) -> PayloadEvent:
        return DONE

    def keep_alive(self, tensor: torch.Tensor) -> None:
        pass


class CudaEvent:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves __init__ unannotated
        self.event.record(torch.cuda.current_stream(device))

    def wait(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self.event)

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaStreams:
    """A channel's own send and receive streams (created on its thread, once per pair)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.send_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # (unannotated in torch)
        self.recv_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # (unannotated in torch)

    def sending(self) -> AbstractContextManager[None]:
        return torch.cuda.stream(self.send_stream)

    def receiving(self) -> AbstractContextManager[None]:
        return torch.cuda.stream(self.recv_stream)

    def record(self) -> PayloadEvent:
        return CudaEvent(self.device)

    def keep_alive(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(torch.cuda.current_stream(self.device))


def streams_for(device: torch.device) -> PayloadStreams:
    return CudaStreams(device) if device.type == "cuda" else HostStreams()


def record_current(device: torch.device) -> PayloadEvent:
    """An event after the work issued so far on the calling thread's current stream of ``device``
    (the engine's, when called from its thread); on the CPU that work is done already."""
    return CudaEvent(device) if device.type == "cuda" else DONE
