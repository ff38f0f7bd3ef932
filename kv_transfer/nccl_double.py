"""An NCCL-semantics test double for the data plane: gloo on the CPU under the rules NCCL imposes
on the code that drives it, so the ordering a GPU pair needs is proven on every CPU run.

Shipped in the product, beside fault.py, because Ray workers must import it: tests pass
``NcclSemantics()`` as the cluster's (or the agent's) data-plane factory (kv_transfer/data_plane.py).

What it enforces:
- ``wait()`` never blocks the host. It only orders the calling thread's "stream" after the
  operation; the host learns of completion through an event (``record()`` then ``synchronize()``
  or ``wait()``), as on a GPU.
- Host reads before that event are errors: a receive fills its tensor with poison (NaN, or the
  integer minimum) when issued, and the data lands only when the operation runs. A send reads its
  tensor when it runs, not when issued, so a buffer reused too early ships the wrong bytes.
- A send and a receive to the peer are serialized in issue order on one stream (NCCL's
  ``getKeySendRecv``): one executor thread runs them in order, so a send queued behind a pending
  receive waits for that receive to match.
- An operation left pending without its peer committed to the matching one fails within
  ``bound_s`` instead of hanging CI. The n-th send of rank r matches the peer's n-th receive from
  r, and, as on NCCL, a pair of operations runs only when each is at the head of its side's
  stream: each side publishes its stream's head (and how many operations of each kind it
  completed) in the store, and an operation whose match has not reached the peer's head within
  ``bound_s`` of its issue fails. A match that was issued but sits behind another pending
  operation is no commitment: that is the cycle that hangs NCCL. The group is then aborted (a real
  communicator would be hung), and the violation is counted under ``VIOLATIONS_KEY`` in the
  rendezvous store's root, where tests read it (``violations``).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import queue
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kv_transfer.data_plane import DataPlane
from kv_transfer.pair_group import OP_TIMEOUT, PairGroup, as_pair_group, tear_down_group

log = logging.getLogger(__name__)

VIOLATIONS_KEY = "baton/nccl-double/violations"
_POLL_FIRST_S, _POLL_MAX_S = 0.0005, 0.02


class NcclSemanticsViolation(RuntimeError):
    """An operation stayed pending without its peer committed to the matching one."""


class OperationAborted(ConnectionAbortedError):
    """The group was closed (or aborted after a violation) before the operation ran."""


class _Kind(enum.Enum):
    SEND = "send"
    RECV = "recv"

    @property
    def match(self) -> _Kind:
        return _Kind.RECV if self is _Kind.SEND else _Kind.SEND


@dataclass(eq=False)
class _Op:
    kind: _Kind
    tensor: torch.Tensor
    seq: int
    issued: float
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class _Work:
    def __init__(self, group: NcclSemanticsGroup, op: _Op) -> None:
        self._group, self._op = group, op

    def wait(self, timeout: object = None) -> bool:
        """NCCL: the calling thread's stream is ordered after the operation; the host goes on."""
        self._group._order_stream(self._op)
        return True

    def is_completed(self) -> bool:
        return self._op.done.is_set()


class _Event:
    def __init__(self, ops: list[_Op]) -> None:
        self._ops = ops

    def synchronize(self) -> None:
        for op in self._ops:
            op.done.wait()
            if op.error is not None:
                raise op.error

    def wait(self) -> None:
        self.synchronize()  # the group's tensors live on the CPU: their "stream" is the host


class NcclSemanticsGroup:
    """A two-rank gloo group (``inner``) driven as NCCL would be. Also the pair's payload streams:
    each thread is one stream."""

    def __init__(self, inner: PairGroup, store: dist.Store, root: dist.Store, rank: int, bound_s: float) -> None:
        self._inner, self._store, self._root = inner, store, root
        self.rank, self.peer = rank, 1 - rank
        self.bound_s = bound_s
        self._seq = {kind: itertools.count() for kind in _Kind}
        self._lock = threading.Lock()
        self._streams: dict[int, list[_Op]] = {}  # thread id -> the operations its stream waits for
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._pending: set[_Op] = set()
        self._aborted = threading.Event()
        self.failure: BaseException | None = None
        threading.Thread(target=self._run, name=f"nccl-double-{rank}", daemon=True).start()

    # -- the group --------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        return self._issue(_Kind.SEND, tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Work:
        (t,) = tensors
        t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).min)
        return self._issue(_Kind.RECV, tensors, src, tag)

    def _issue(self, kind: _Kind, tensors: list[torch.Tensor], peer: int, tag: int) -> _Work:
        if peer != self.peer or tag != 0 or len(tensors) != 1:
            raise ValueError("the data plane carries one tensor at a time, to its peer, on tag 0")
        with self._lock:
            op = _Op(kind, tensors[0], next(self._seq[kind]), time.monotonic())
            self._pending.add(op)
        if self._aborted.is_set():
            self._finish(op, self.failure or OperationAborted("the group was closed"))
        else:
            self._queue.put(op)
        return _Work(self, op)

    def pending(self) -> int:
        """Operations issued and not complete (an idle pair has none)."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        self._abort(OperationAborted("the group was closed"))

    # -- the streams ------------------------------------------------------------------------
    def sending(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # each thread is a stream: the channel's send thread is the send stream

    def receiving(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self) -> _Event:
        with self._lock:
            ops = self._streams.get(threading.get_ident(), [])
            ops = [op for op in ops if not op.done.is_set() or op.error is not None]
            self._streams[threading.get_ident()] = ops
            return _Event(list(ops))

    def keep_alive(self, tensor: torch.Tensor) -> None:
        pass  # the operation holds its tensor until it ran

    def _order_stream(self, op: _Op) -> None:
        with self._lock:
            self._streams.setdefault(threading.get_ident(), []).append(op)

    # -- the one stream the operations run on -----------------------------------------------
    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            if op.done.is_set():  # failed by an abort while queued
                continue
            try:
                self._store.set(f"head/{self.rank}", f"{op.kind.value}:{op.seq}")
                self._await_match(op)
                call = self._inner.send if op.kind is _Kind.SEND else self._inner.recv
                call([op.tensor], self.peer, 0).wait()
                self._store.add(f"done/{self.rank}/{op.kind.value}", 1)
                self._finish(op, None)
            except NcclSemanticsViolation as e:
                self._violation(e)
            except Exception as e:  # noqa: BLE001 - a gloo error (the peer went): the op fails, as on NCCL
                self._abort(e)

    def _peer_at(self, match: _Kind, seq: int) -> bool:
        """Whether the peer's stream has reached its ``seq``-th operation of kind ``match`` (it is at
        its head, or done)."""
        head = f"head/{self.peer}"
        if self._store.check([head]) and self._store.get(head).decode() == f"{match.value}:{seq}":
            return True
        return self._store.add(f"done/{self.peer}/{match.value}", 0) > seq

    def _await_match(self, op: _Op) -> None:
        match = op.kind.match
        delay = _POLL_FIRST_S
        while not self._peer_at(match, op.seq):
            if self._aborted.is_set():
                raise self.failure or OperationAborted("the group was closed")
            if time.monotonic() - op.issued > self.bound_s:
                raise NcclSemanticsViolation(
                    f"rank {self.rank}'s {op.kind.value} #{op.seq} stayed pending {self.bound_s:g} s without the "
                    f"peer committed to the matching {match.value} (not at the head of its stream): on NCCL this "
                    "stream (and every operation queued behind it) would hang"
                )
            time.sleep(delay)
            delay = min(2 * delay, _POLL_MAX_S)

    def _violation(self, e: NcclSemanticsViolation) -> None:
        log.error("NCCL semantics violated: %s", e)
        try:
            n = self._root.add(VIOLATIONS_KEY, 1)
            self._root.set(f"{VIOLATIONS_KEY}/{n}", str(e))
        except Exception as store_error:  # noqa: BLE001 - the store is gone (the test ended): the op still fails
            log.warning("could not record the violation: %s", store_error)
        self._abort(e)

    def _abort(self, why: BaseException) -> None:
        with self._lock:
            if self._aborted.is_set():
                return
            self.failure = why
            self._aborted.set()
            stuck = list(self._pending)
        for op in stuck:
            self._finish(op, why)
        self._queue.put(None)
        tear_down_group(self._inner, self.peer, torch.device("cpu"))  # ends an operation blocked in gloo

    def _finish(self, op: _Op, error: BaseException | None) -> None:
        with self._lock:
            self._pending.discard(op)
        if not op.done.is_set():
            op.error = error
            op.done.set()


@dataclass(frozen=True)
class NcclSemantics:
    """A ``DataPlaneFactory`` (kv_transfer/data_plane.py): a gloo pair group under NCCL's rules.
    Picklable, so a cluster config can carry it to Ray workers."""

    bound_s: float = 5.0

    def __call__(self, store: dist.Store, prefix: str, rank: int, device: torch.device) -> DataPlane:
        if device.type != "cpu":
            raise ValueError(f"the NCCL-semantics double runs on CPU tensors, not {device}")
        prefixed = dist.PrefixStore(prefix, store)
        inner = as_pair_group(dist.ProcessGroupGloo(dist.PrefixStore("gloo", prefixed), rank, 2, OP_TIMEOUT))
        group = NcclSemanticsGroup(inner, dist.PrefixStore("streams", prefixed), store, rank, self.bound_s)
        return DataPlane(group, group, group.close)


def violations(store: dist.Store) -> list[str]:
    """What the doubles of every pair formed through ``store`` recorded as violations."""
    n = store.add(VIOLATIONS_KEY, 0)
    return [store.get(f"{VIOLATIONS_KEY}/{i}").decode() for i in range(1, n + 1)]
