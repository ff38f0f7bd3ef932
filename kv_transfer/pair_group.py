"""A two-rank process group for one prefill/decode pair, formed from the rendezvous store: the
pair's control plane (gloo over CPU tensors; kv_transfer/channel.py), and the rendezvous its data
plane forms after (kv_transfer/data_plane.py).

No global world: ``ProcessGroupGloo`` (CPU tensors) or ``ProcessGroupNCCL`` (CUDA tensors) is built
directly over ``PrefixStore(pair_key, TCPStore client)``, so a pair can be formed at any time, and
formed again with a restarted peer (its new incarnation gives a new key).

Before the group, each side writes what its KV rows are (shape and dtype) under the pair's prefix
and reads the other's: rows that differ (another block size, head count or dtype) fail the pair
with both geometries named. Without it the payload was cut short or read as the wrong layout, and
gloo aborted the receiving process on a payload larger than its buffer.

The wait for the peer is not bounded by ``connect_timeout_s``: a pair forms once per pair of
incarnations (its key), and a side may dial long before the other needs to (a decode worker dials
when it reserves; the router may then prefill that request locally, and the prefill worker dials
only with its first task for that decode worker). A side that gave up after a timeout could never
form the pair again on the same key (the other would rendezvous with stale entries), so it would
have to mark a live peer gone. Transfers have deadlines of their own above this layer. The wait
ends early when ``cancelled`` is set (the peer is known dead, or the channel closes).

A pair whose group failed while both processes live (a network error, a stream out of sync)
forms again under the next *epoch* of its key (``kv_transfer/agent.py``); fresh keys, so nothing
stale from the failed group is read. That wait is bounded (``join_timeout_s``): both sides dial
again at once when they learn of the failure, so a peer that does not come is gone. Both sides
agree on the outcome through one atomic decision in the store (``_join_or_give_up``).

The wait polls ``check`` instead of calling the store's blocking ``wait``: a TCPStore client holds
its connection for the whole of a ``wait``, so every other call on that client (another pair's
rendezvous) queued behind a peer that had not dialed yet.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Protocol, cast

import torch
import torch.distributed as dist

from kv_transfer.peer import PeerInfo, StoreAddress, pair_key

# Idle channels wait for their next message indefinitely; liveness comes from connection errors
# and from the transfer deadlines enforced above this layer.
OP_TIMEOUT = datetime.timedelta(hours=24)
_TEARDOWN_TAG = 1  # never sent on: a receive on it that times out closes the group's connection


class PairWork(Protocol):
    def wait(self, timeout: datetime.timedelta = ..., /) -> object: ...


class PairGroup(Protocol):
    """What this package uses of a two-rank process group (positional: torch names them dstRank, srcRank)."""

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int, /) -> PairWork: ...

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int, /) -> PairWork: ...

    def abort(self) -> None: ...


def as_pair_group(backend: dist.ProcessGroupGloo | dist.ProcessGroupNCCL) -> PairGroup:
    """gloo's and NCCL's groups, as what they are at run time: torch's stubs leave out the send and
    recv that every Backend binds."""
    return cast(PairGroup, backend)


_POLL_FIRST_S, _POLL_MAX_S = 0.002, 0.05  # the peer's rows are polled for, backing off to 50 ms


class PairingCancelled(ConnectionAbortedError):
    """The wait for the peer was cancelled (it is gone, or this side closed the channel)."""


class PairingTimedOut(TimeoutError):
    """The peer did not join a pair formed again after a failure within ``join_timeout_s``."""


def connect_store(addr: StoreAddress, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(
        addr.host, addr.port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


def form_pair_group(
    store: dist.Store,
    me: PeerInfo,
    peer: PeerInfo,
    device: torch.device,
    connect_timeout_s: float,
    rows: str = "",
    cancelled: threading.Event | None = None,
    *,
    epoch: int = 0,
    join_timeout_s: float | None = None,
) -> tuple[PairGroup, int]:
    """Blocks until the peer joins, ``cancelled`` is set (PairingCancelled) or ``join_timeout_s``
    passes (PairingTimedOut; None: no limit). ``rows`` describes this side's KV rows; the peer's
    must be the same (ValueError). ``connect_timeout_s`` bounds the store calls once both are
    there. Returns (group, peer rank)."""
    prefill, decode = (me, peer) if me.role == "prefill" else (peer, me)
    if prefill.role != "prefill" or decode.role != "decode":
        raise ValueError(f"a pair is one prefill and one decode worker, got {me.role} and {peer.role}")
    rank = 0 if me is prefill else 1
    prefixed = dist.PrefixStore(pair_key(prefill, decode, epoch), store)
    prefixed.set(f"rows/{rank}", rows)
    cancelled = cancelled or threading.Event()
    if join_timeout_s is None:
        _wait_for(prefixed, f"rows/{1 - rank}", cancelled, peer, None)
    else:
        _join_or_give_up(prefixed, rank, cancelled, peer, time.monotonic() + join_timeout_s)
    prefixed.set_timeout(datetime.timedelta(seconds=connect_timeout_s))
    theirs = prefixed.get(f"rows/{1 - rank}").decode()
    if theirs != rows:
        raise ValueError(
            f"the two workers' KV rows differ: {me.key} has {rows}, {peer.key} has {theirs} "
            "(run both pools with the same model, dtype and block size)"
        )
    # Both are here now, or the peer wrote its rows and died since (it dials at a reservation, maybe
    # long ago). gloo's rendezvous below waits for the peer with the op timeout (24 h), and nothing
    # can cancel it: each side first says it is here *now*, and waits for the other to say so where
    # a known death (forget_peer) or a close can end the wait. Not on a timeout: a peer only stalled
    # (SIGSTOP, a paused host) would be taken for gone, and the pair lost for good.
    prefixed.set(f"here/{rank}", "1")
    _wait_for(prefixed, f"here/{1 - rank}", cancelled, peer, None)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = OP_TIMEOUT
        return as_pair_group(dist.ProcessGroupNCCL(prefixed, rank, 2, opts)), 1 - rank
    return as_pair_group(dist.ProcessGroupGloo(prefixed, rank, 2, OP_TIMEOUT)), 1 - rank


def tear_down_group(group: PairGroup, peer_rank: int, device: torch.device) -> None:
    """Close this side of a pair group, so that both sides' blocked operations end (the peer's with
    "connection closed"). gloo has no abort: an operation that times out closes the connection, so
    wait 1 ms for a message never sent."""
    try:
        if device.type == "cuda":
            group.abort()
        else:
            group.recv([torch.empty(1)], peer_rank, _TEARDOWN_TAG).wait(datetime.timedelta(milliseconds=1))
    except Exception:  # noqa: BLE001 - the expected timeout, or the connection was already closed
        pass


def _join_or_give_up(store: dist.Store, rank: int, cancelled: threading.Event, peer: PeerInfo, deadline: float) -> None:
    """A bounded wait for the peer's rows whose outcome both sides agree on: the first side to
    decide (it saw the peer's rows: "formed"; its deadline passed: "abandoned") sets the decision
    atomically, and the other follows it. A side giving up alone could leave the other, which saw
    its rows, waiting in gloo's rendezvous for the op timeout (24 h)."""
    try:
        _wait_for(store, f"rows/{1 - rank}", cancelled, peer, deadline)
        mine = "formed"
    except PairingTimedOut:
        mine = "abandoned"
    if store.compare_set("decision", "", mine).decode() == "abandoned":
        raise PairingTimedOut(f"{peer.key} did not join the pair again after its failure")


def _wait_for(store: dist.Store, key: str, cancelled: threading.Event, peer: PeerInfo, deadline: float | None) -> None:
    delay = _POLL_FIRST_S
    while not store.check([key]):
        if cancelled.wait(delay):
            raise PairingCancelled(f"stopped waiting for {peer.key} to join the pair")
        if deadline is not None and time.monotonic() > deadline and not store.check([key]):
            raise PairingTimedOut(f"{peer.key} did not join the pair again after its failure")
        delay = min(2 * delay, _POLL_MAX_S)
