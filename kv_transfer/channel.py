"""One pair's channel: a control plane apart from the payload's data plane.

(Over 400 lines as one concept: the pair's protocol, whose send and receive threads share one
state of announced, ready and acknowledged transfers; the wire format, the data plane and the
stream handling live in their own modules.)

*Control plane*: a gloo pair group over CPU tensors, full duplex, carrying fixed-size headers
(kv_transfer/wire.py) both ways: KV announcements, READY, ACK/NACK, ABORT. A receive is always
posted on it, on the channel's receive thread: a gloo receive blocks that CPU thread only; it holds
no CUDA stream and no NCCL watchdog watches it. The send thread drains a FIFO queue.

*Data plane*: a second pair group (kv_transfer/data_plane.py: NCCL between GPUs, gloo on the CPU)
that carries payloads only, in an order the control plane sets:
  sender: KV header ─control─► receiver: takes a buffer, posts the payload receive, answers READY
  sender, on READY: the payload send, on its send stream after the event of the KV it gathered
  ─data─► receiver: scatters into the reserved blocks on its receive stream and records the event
  the decode step that first reads those blocks waits on (kv_transfer/agent.py).
No data-plane operation is ever pending without its peer committed to the match, and an idle pair
has none pending. The tests run the data plane through an NCCL-semantics double
(kv_transfer/nccl_double.py) that fails any other order.

*Local* mode (both peers share a ``locality``: the same GPU, or one host with shared-memory
caches): no data plane. A KV header is followed on the control plane by the sender's block ids,
and the receiver gathers those rows from the sender's cache, mapped once when the pair forms
(kv_transfer/local_kv.py).

A dead peer shows as a connection error on the control plane (its process closed the sockets);
one that hangs without closing them is reported dead by the router's registry (``forget_peer``).
No heartbeat: a peer only stalled (SIGSTOP, a paused host) must not be taken for gone, and each
transfer has its own deadline above this layer.

The pair's groups are formed on the channel's own thread, so nobody else ever blocks on a peer
that has not joined yet (or never will). Each channel has its own store client: a client serves
one call at a time, and a call that waits (gloo's rendezvous with a peer that died halfway through
it) would hold every other pair's rendezvous behind it. A failed or closed channel stops waiting
for its peer and lets go of what was queued for it (staging buffers of tens of MiB).

A channel is one *epoch* of its pair. A failure of its groups while it carried messages (a send or
receive error, a stream out of sync) is *transient*: the agent forms the pair again at the next
epoch. This side writes the failure under the epoch's key, so the peer, whose own groups may look
healthy (it is blocked in a receive), learns of it (``TransferAgent``'s watcher) and dials again
too. A failure to form the groups, a close, or ``fail`` from outside (the peer is known dead or
replaced) is final for the incarnation."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kv_transfer.data_plane import DataPlane, DataPlaneFactory, default_data_plane
from kv_transfer.local_kv import LocalRows, PeerKV
from kv_transfer.pair_group import PairGroup, connect_store, form_pair_group, tear_down_group
from kv_transfer.peer import PeerInfo, StoreAddress, pair_key
from kv_transfer.streams import DONE, HostStreams, PayloadEvent, PayloadStreams, streams_for
from kv_transfer.wire import FLAG_DIRECT, Header, Kind, empty_header

log = logging.getLogger(__name__)

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Outgoing:
    header: Header
    payload: torch.Tensor | None = None  # the packed rows (group mode) or the block ids (local)
    on_sent: Callable[[], None] | None = None  # runs once the payload has left (or was dropped)
    written: PayloadEvent = DONE  # the KV it ships is written (and gathered) once this is reached


class GroupRows:
    """A received payload (group mode): the packed rows, complete once ``arrived`` is reached."""

    def __init__(self, rows: torch.Tensor, arrived: PayloadEvent) -> None:
        self.rows, self.arrived = rows, arrived

    @property
    def num_bytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def copy_into(self, cache: torch.Tensor, dst_block_ids: list[int]) -> None:
        """Scatter the rows into ``cache``'s blocks, on the current stream (the receive stream)."""
        self.arrived.wait()
        cache.index_copy_(0, torch.tensor(dst_block_ids, dtype=torch.long, device=cache.device), self.rows)

    def take(self) -> torch.Tensor:
        """The rows as a tensor of their own (the receive buffer is reused by the next chunk)."""
        self.arrived.wait()
        return self.rows.clone()


# What a received KV message carries: the packed rows (group mode), or where to copy them from (local).
Received = GroupRows | LocalRows


class Channel:
    def __init__(
        self,
        store_addr: StoreAddress,
        me: PeerInfo,
        peer: PeerInfo,
        device: torch.device,
        payload_shape: tuple[int, ...],
        payload_dtype: torch.dtype,
        on_message: Callable[[Channel, Header, Received | None], None],
        on_failure: Callable[[Channel, str, bool], None],
        connect_timeout_s: float = 30.0,
        before_send: Callable[[Header], bool] | None = None,
        *,
        kv_export: bytes | None = None,
        epoch: int = 0,
        join_timeout_s: float | None = None,
        data_plane: DataPlaneFactory = default_data_plane,
        direct: bool = False,
    ) -> None:
        """``on_failure(channel, reason, transient)`` runs once, on whichever thread saw the failure.
        ``join_timeout_s`` bounds the wait for the peer (None: unbounded; the agent bounds the wait
        of a pair formed again, ``pair_group.py``). ``data_plane`` forms the payload group.
        ``direct``: the pair's ranks move the payloads themselves (kv_transfer/group_handoff.py);
        headers flagged ``FLAG_DIRECT`` carry none here."""
        self.me, self.peer, self.device = me, peer, device
        self.direct = direct
        self.epoch = epoch
        self._join_timeout_s = join_timeout_s
        prefill, decode = (me, peer) if me.role == "prefill" else (peer, me)
        self._pair_prefix = pair_key(prefill, decode, epoch)
        self.local = self.is_local(me, peer)
        if self.local and kv_export is None:
            raise ValueError(f"{me.key} claims locality {me.locality!r} but exports no KV cache")
        self._kv_export = kv_export
        self._peer_kv: PeerKV | None = None
        self._rx_buffer: torch.Tensor | None = None  # receive thread only (_receive_buffer)
        self._rx_arrived: PayloadEvent = DONE  # the last payload received into it
        self.payload_shape, self.payload_dtype = payload_shape, payload_dtype
        self._store_addr = store_addr
        self._store: dist.Store | None = None  # connected on the channel's thread
        self._on_message, self._on_failure = on_message, on_failure
        self._before_send = before_send  # fault injection: returns False to skip a message
        self._connect_timeout_s = connect_timeout_s
        self._data_plane_factory = data_plane
        self._queue: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        self._ready: queue.SimpleQueue[Header | None] = queue.SimpleQueue()  # READYs; None: the channel ended
        self._control: PairGroup | None = None
        self._control_lock = threading.Lock()  # the send thread and the receive thread (READY) both send
        self._data: DataPlane | None = None
        self._streams: PayloadStreams = HostStreams()  # the data plane's (or the device's, local) once formed
        self._peer_rank = 0
        self._failed = threading.Event()
        self._fail_lock = threading.Lock()  # the send and receive threads may fail at once
        self._stop = threading.Event()  # set on failure or close: a wait for the peer ends
        self._closed = False
        self.failure: str | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages = 0  # sent and received: a channel that carried none failing again is not retried
        self._severed = False  # failed because the peer recorded the failure (see sever)
        threading.Thread(target=self._connect_and_send, name=f"kv-send-{peer.key}", daemon=True).start()

    @staticmethod
    def is_local(me: PeerInfo, peer: PeerInfo) -> bool:
        # Both sides decide from the two localities alone, so they always agree on the mode.
        return bool(me.locality) and me.locality == peer.locality

    @property
    def failed(self) -> bool:
        return self._failed.is_set()

    @property
    def streams(self) -> PayloadStreams:
        """Where this pair's payload work runs (its receive stream scatters what arrives)."""
        return self._streams

    @property
    def data_plane(self) -> DataPlane | None:
        return self._data

    @property
    def failure_key(self) -> str:
        """Where either side writes that this epoch's group failed (the store's root namespace)."""
        return self._pair_prefix + "/failed"

    def send(
        self,
        header: Header,
        payload: torch.Tensor | None = None,
        on_sent: Callable[[], None] | None = None,
        written: PayloadEvent = DONE,
    ) -> bool:
        """Queue a message (FIFO). False if the channel has already failed. ``on_sent`` runs on the
        send thread once the payload has left (or was dropped by fault injection); not after a
        failure. ``written``: the payload's KV is there once this event is reached."""
        if self._failed.is_set():
            return False
        self._queue.put(Outgoing(header, payload, on_sent, written))
        return True

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        self._queue.put(None)
        self._ready.put(None)
        self._tear_down()

    @property
    def _row_bytes(self) -> int:
        n = 1
        for d in self.payload_shape:
            n *= d
        return n * torch.empty((), dtype=self.payload_dtype).element_size()

    @property
    def rows(self) -> str:
        """What one payload row is, for the peer to check against its own (pair_group.py)."""
        # (The handoff's mode too: both sides must ship the same way.)
        return f"{list(self.payload_shape)} {self.payload_dtype}" + (" rank-to-rank" if self.direct else "")

    # -- the send thread ---------------------------------------------------------------------
    def _connect_and_send(self) -> None:
        try:
            self._store = store = connect_store(self._store_addr, self._connect_timeout_s)
            self._control, self._peer_rank = form_pair_group(
                store,
                self.me,
                self.peer,
                _CPU,
                self._connect_timeout_s,
                self.rows,
                self._stop,
                epoch=self.epoch,
                join_timeout_s=self._join_timeout_s,
            )
            if self.local:
                self._exchange_kv_handles(store)
                self._streams = streams_for(self.device)
            else:
                self._data = self._data_plane_factory(
                    store, self._pair_prefix + "/data", 1 - self._peer_rank, self.device
                )
                self._streams = self._data.streams
        except Exception as e:  # noqa: BLE001 - any failure to form the pair fails the channel
            if self._closed:  # (a channel closed while it waited has not failed: nothing was lost)
                self._drain()
            else:
                self._fail(f"could not form the pair group with {self.peer.key}: {e}")  # (drains too)
            return
        if self._closed or self._failed.is_set():  # (while the groups formed)
            self._tear_down()
            self._drain()
            return
        threading.Thread(target=self._receive_loop, name=f"kv-recv-{self.peer.key}", daemon=True).start()
        try:
            while True:
                item = self._queue.get()
                if item is None or self._failed.is_set():
                    if item is not None and item.on_sent is not None:
                        item.on_sent()
                    self._drain()
                    return
                if self._before_send is None or self._before_send(item.header):
                    self._transmit(item)
                    self.messages += 1
                if item.on_sent is not None:
                    item.on_sent()
        except Exception as e:  # noqa: BLE001 - any send error fails the channel (transient)
            if not self._closed:
                self._fail(f"send to {self.peer.key} failed: {e}", transient=True)  # (which drains the queue)
            else:
                self._drain()

    def _transmit(self, item: Outgoing) -> None:
        header, payload = item.header, item.payload
        if payload is not None and self.local:
            item.written.synchronize()  # the peer reads these blocks of our cache as soon as it has the ids
            with self._control_lock:
                self._formed_control().send([header.to_tensor(_CPU)], self._peer_rank, 0).wait()
                self._formed_control().send([payload], self._peer_rank, 0).wait()
            self.bytes_sent += payload.numel() * self._row_bytes
            return
        self._send_control(header)
        if payload is None:
            return
        self._await_ready(header)  # the peer has posted the matching receive: no send is left pending
        streams = self._streams
        with streams.sending():
            item.written.wait()  # the send stream waits for the gather, not the engine's whole stream
            self._formed_data().group.send([payload], self._peer_rank, 0).wait()
            streams.keep_alive(payload)
            sent = streams.record() if item.on_sent is not None else None
        if sent is not None:
            sent.synchronize()  # a staging buffer goes back to its pool only once its payload has left
        self.bytes_sent += payload.numel() * payload.element_size()

    def _send_control(self, header: Header) -> None:
        with self._control_lock:
            self._formed_control().send([header.to_tensor(_CPU)], self._peer_rank, 0).wait()

    def _formed_control(self) -> PairGroup:
        """The control group: the channel's threads use it only once it formed."""
        if self._control is None:
            raise ConnectionError(f"the pair group with {self.peer.key} has not formed")
        return self._control

    def _formed_data(self) -> DataPlane:
        """The data plane: formed with the control group, where the pair is not local."""
        if self._data is None:
            raise ConnectionError(f"the data plane with {self.peer.key} has not formed")
        return self._data

    def _await_ready(self, header: Header) -> None:
        ready = self._ready.get()
        if ready is None:
            raise ConnectionAbortedError(f"the channel to {self.peer.key} ended while a payload waited for READY")
        if (ready.transfer_id, ready.chunk_index) != (header.transfer_id, header.chunk_index):
            raise ValueError(
                f"READY for transfer {ready.transfer_id} chunk {ready.chunk_index} while "
                f"{header.transfer_id}/{header.chunk_index} waits: the control plane is out of sync"
            )

    def _drain(self) -> None:
        """Drop what is still queued: its transfers have failed (or the channel closed). Staging
        buffers go back to their pool."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item.on_sent is not None:
                item.on_sent()

    def _exchange_kv_handles(self, root: dist.Store) -> None:
        """Local mode: each side publishes its cache's export under the pair's prefix; the
        receiving (decode) side maps the sender's."""
        store = dist.PrefixStore(self._pair_prefix + "/kv", root)
        assert self._kv_export is not None  # checked at construction for a local pair
        store.set(self.me.role, self._kv_export)  # type: ignore[arg-type]  # Store.set takes bytes; the stub says str
        if self.me.role == "decode":
            self._peer_kv = PeerKV(store.get("prefill"))

    # -- the receive thread --------------------------------------------------------------------
    def _receive_loop(self) -> None:
        control = self._formed_control()
        header_buf = empty_header(_CPU)
        try:
            while not self._closed:
                control.recv([header_buf], self._peer_rank, 0).wait()
                header = Header.from_tensor(header_buf)
                if header.kind is Kind.READY:
                    self._ready.put(header)
                    continue
                payload: Received | None = None
                if header.kind is Kind.KV and header.num_blocks > 0 and self.local:
                    ids = torch.empty(header.num_blocks, dtype=torch.long)
                    control.recv([ids], self._peer_rank, 0).wait()
                    payload = self._mapped_peer_kv().rows(ids)  # copied into our blocks by the agent, under its lock
                elif header.kind is Kind.KV and header.num_blocks > 0 and not header.flags & FLAG_DIRECT:
                    payload = self._receive_payload(header)
                if payload is not None:
                    self.bytes_received += payload.num_bytes
                self.messages += 1
                self._on_message(self, header, payload)
        except Exception as e:  # noqa: BLE001 - any receive error fails the channel (transient)
            if not self._closed:
                self._fail(f"receive from {self.peer.key} failed: {e}", transient=True)
        finally:
            if self._peer_kv is not None:  # this thread is its only user
                self._peer_kv.close()

    def _mapped_peer_kv(self) -> PeerKV:
        """The sender's cache, mapped by a local pair's decode side (_exchange_kv_handles)."""
        if self._peer_kv is None:
            raise ConnectionError(f"{self.peer.key}'s KV cache is not mapped here")
        return self._peer_kv

    def _receive_payload(self, header: Header) -> GroupRows:
        """Post the payload's receive, then tell the sender it may send (READY)."""
        streams = self._streams
        with streams.receiving():
            rows = self._receive_buffer(header.num_blocks)
            work = self._formed_data().group.recv([rows], self._peer_rank, 0)
            self._send_control(Header(Kind.READY, header.transfer_id, header.chunk_index, num_blocks=header.num_blocks))
            work.wait()
            arrived = streams.record()
        if self.device.type == "cpu":
            self._rx_arrived = arrived
        return GroupRows(rows, arrived)

    def _receive_buffer(self, num_blocks: int) -> torch.Tensor:
        """Room for a chunk's rows. On CPU one buffer per channel, grown to the largest chunk and
        reused: a fresh allocation per chunk faults its pages in again, which costs more than the
        copy out of it. Reused only once the previous payload has landed in it (and was scattered:
        the agent does so before the next header is read). CUDA's caching allocator already reuses
        memory, in the receive stream's order."""
        shape = (num_blocks, *self.payload_shape)
        if self.device.type != "cpu":
            return torch.empty(shape, dtype=self.payload_dtype, device=self.device)
        self._rx_arrived.synchronize()  # (a payload the agent drained without reading it)
        if self._rx_buffer is None or self._rx_buffer.shape[0] < num_blocks:
            self._rx_buffer = torch.empty(shape, dtype=self.payload_dtype)
        return self._rx_buffer[:num_blocks]

    # -- failures ----------------------------------------------------------------------------
    def _tear_down(self) -> None:
        """Close this side of both groups, so that both sides' blocked operations end and their
        threads exit (the peer's with "connection closed", which fails its channel too)."""
        if self._control is not None:
            tear_down_group(self._control, self._peer_rank, _CPU)
        if self._data is not None:
            self._data.close()

    def fail(self, reason: str, transient: bool = False) -> None:
        """Fail the channel from outside (its peer is known gone or replaced; ``transient``: the pair
        broke while the peer may live); once, like any failure."""
        self._fail(reason, transient)

    def sever(self, reason: str) -> None:
        """The peer recorded that this epoch's group failed on its side: fail it here too (transient)."""
        self._severed = True
        self._fail(reason, transient=True)

    def record_failure_for_peer(self, counter_key: str) -> None:
        """Record this epoch's failure under its key, then bump the peer's counter (its watcher reads
        the counter, then the keys), unless the failure came from the peer's own record."""
        if self._severed or self._store is None:
            return
        self._store.set(self.failure_key, self.failure or "")
        self._store.add(counter_key, 1)

    def _fail(self, reason: str, transient: bool = False) -> None:
        with self._fail_lock:
            if self._failed.is_set():
                return
            self.failure = reason
            self._failed.set()
        self._stop.set()
        self._drain()  # now, not when the send thread gets to it (it may be stuck in a send to the peer)
        self._queue.put(None)  # the send thread, if waiting for work, ends (it was left blocked forever)
        self._ready.put(None)  # ... and if waiting for a READY
        self._rx_buffer = None  # (a receive blocked in the dead group may still hold its slice)
        self._tear_down()
        log.warning("KV channel %s -> %s (epoch %d) failed: %s", self.me.key, self.peer.key, self.epoch, reason)
        self._on_failure(self, reason, transient)
