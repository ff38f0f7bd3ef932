"""One pair's full-duplex message channel: a sender thread draining a FIFO queue and a receiver
thread reading header → payload → dispatch. The pair group is formed on the channel's own thread,
so nobody else ever blocks on a peer that has not joined yet (or never will).

Two payload modes, one message format. *Group*: the payload is the packed KV rows, sent over the
pair group (gloo for CPU tensors, NCCL for CUDA). *Local* (both peers share a ``locality``: the
same GPU, or one host with shared-memory caches): the group is gloo over CPU tensors, the payload
is the sender's block ids, and the receiver gathers those rows from the sender's cache, mapped once
when the pair forms (kv_transfer/local_kv.py).

Each channel has its own store client: a client serves one call at a time, and a call that waits
(gloo's rendezvous with a peer that died halfway through it) would hold every other pair's
rendezvous behind it. A failed or closed channel stops waiting for its peer and lets go of what
was queued for it (staging buffers of tens of MiB).

A channel is one *epoch* of its pair. A failure of its group while it carried messages (a send or
receive error, a stream out of sync) is *transient*: the agent forms the pair again at the next
epoch. This side writes the failure under the epoch's key, so the peer, whose own group may look
healthy (it is blocked in a receive), learns of it (``TransferAgent``'s watcher) and dials again
too. A failure to form the group, a close, or ``fail`` from outside (the peer is known dead or
replaced) is final for the incarnation."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from typing import Callable

import torch
import torch.distributed as dist

from kv_transfer.local_kv import LocalRows, PeerKV
from kv_transfer.pair_group import connect_store, form_pair_group
from kv_transfer.peer import PeerInfo, StoreAddress, pair_key
from kv_transfer.wire import Header, empty_header

log = logging.getLogger(__name__)

_TEARDOWN_TAG = 1  # never sent on: a receive on it that times out closes the group's connection

# (header, payload or None, called once the payload has left or None); None is the sender's stop signal.
Outgoing = tuple[Header, torch.Tensor | None, Callable[[], None] | None]
# What a received KV message carries: the packed rows (group mode), or where to copy them from (local).
Received = torch.Tensor | LocalRows


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
    ) -> None:
        """``on_failure(channel, reason, transient)`` runs once, on whichever thread saw the failure.
        ``join_timeout_s`` bounds the wait for the peer (None: unbounded; the agent bounds the wait
        of a pair formed again, ``pair_group.py``)."""
        self.me, self.peer, self.device = me, peer, device
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
        self.payload_shape, self.payload_dtype = payload_shape, payload_dtype
        self._store_addr = store_addr
        self._store: dist.Store | None = None  # connected on the channel's thread
        self._on_message, self._on_failure = on_message, on_failure
        self._before_send = before_send  # fault injection: returns False to skip a message
        self._connect_timeout_s = connect_timeout_s
        self._queue: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        self._group: dist.ProcessGroup | None = None
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
    def failure_key(self) -> str:
        """Where either side writes that this epoch's group failed (the store's root namespace)."""
        return self._pair_prefix + "/failed"

    def send(self, header: Header, payload: torch.Tensor | None = None,
             on_sent: Callable[[], None] | None = None) -> bool:
        """Queue a message (FIFO). False if the channel has already failed. ``on_sent`` runs on the
        send thread once the payload has left (or was dropped by fault injection); not after a failure."""
        if self._failed.is_set():
            return False
        self._queue.put((header, payload, on_sent))
        return True

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        self._queue.put(None)
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
        return f"{list(self.payload_shape)} {self.payload_dtype}"

    # -- threads ---------------------------------------------------------------------------
    def _connect_and_send(self) -> None:
        try:
            group_device = torch.device("cpu") if self.local else self.device
            self._store = connect_store(self._store_addr, self._connect_timeout_s)
            self._group, self._peer_rank = form_pair_group(self._store, self.me, self.peer, group_device,
                                                           self._connect_timeout_s, self.rows, self._stop,
                                                           epoch=self.epoch, join_timeout_s=self._join_timeout_s)
            if self.local:
                self._exchange_kv_handles()
        except Exception as e:
            if self._closed:  # (a channel closed while it waited has not failed: nothing was lost)
                self._drain()
            else:
                self._fail(f"could not form the pair group with {self.peer.key}: {e}")  # (drains too)
            return
        if self._closed or self._failed.is_set():  # (while the group formed)
            self._tear_down()
            self._drain()
            return
        threading.Thread(target=self._receive_loop, name=f"kv-recv-{self.peer.key}", daemon=True).start()
        try:
            while True:
                item = self._queue.get()
                if item is None or self._failed.is_set():
                    if item is not None and item[2] is not None:
                        item[2]()
                    self._drain()
                    return
                header, payload, on_sent = item
                if self._before_send is None or self._before_send(header):
                    self._group.send([header.to_tensor(self._wire_device)], self._peer_rank, 0).wait()
                    if payload is not None:
                        self._group.send([payload], self._peer_rank, 0).wait()
                        self.bytes_sent += (payload.numel() * self._row_bytes if self.local
                                            else payload.numel() * payload.element_size())
                    self.messages += 1
                if on_sent is not None:
                    on_sent()
        except Exception as e:
            if not self._closed:
                self._fail(f"send to {self.peer.key} failed: {e}", transient=True)  # (which drains the queue)
            else:
                self._drain()

    def _drain(self) -> None:
        """Drop what is still queued: its transfers have failed (or the channel closed). Staging
        buffers go back to their pool."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[2] is not None:
                item[2]()

    @property
    def _wire_device(self) -> torch.device:
        return torch.device("cpu") if self.local else self.device

    def _exchange_kv_handles(self) -> None:
        """Local mode: each side publishes its cache's export under the pair's prefix; the
        receiving (decode) side maps the sender's."""
        store = dist.PrefixStore(self._pair_prefix + "/kv", self._store)
        store.set(self.me.role, self._kv_export)
        if self.me.role == "decode":
            self._peer_kv = PeerKV(store.get("prefill"))

    def _receive_loop(self) -> None:
        group, device = self._group, self._wire_device
        header_buf = empty_header(device)
        try:
            while not self._closed:
                group.recv([header_buf], self._peer_rank, 0).wait()
                header = Header.from_tensor(header_buf)
                payload = None
                if header.num_blocks > 0 and self.local:
                    ids = torch.empty(header.num_blocks, dtype=torch.long)
                    group.recv([ids], self._peer_rank, 0).wait()
                    payload = self._peer_kv.rows(ids)  # copied into our blocks by the agent, under its lock
                    self.bytes_received += payload.num_bytes
                elif header.num_blocks > 0:
                    payload = self._receive_buffer(header.num_blocks, device)
                    group.recv([payload], self._peer_rank, 0).wait()
                    self.bytes_received += payload.numel() * payload.element_size()
                self.messages += 1
                self._on_message(self, header, payload)
        except Exception as e:
            if not self._closed:
                self._fail(f"receive from {self.peer.key} failed: {e}", transient=True)
        finally:
            if self._peer_kv is not None:  # this thread is its only user
                self._peer_kv.close()

    def _tear_down(self) -> None:
        """Close this side of the group, so that both sides' blocked receives end and their threads
        exit (the peer's with "connection closed", which fails its channel too). gloo has no abort:
        an operation that times out closes the connection, so wait 1 ms for a message never sent."""
        group = self._group
        if group is None:
            return
        try:
            if self._wire_device.type == "cuda":
                group.abort()
            else:
                group.recv([torch.empty(1)], self._peer_rank, _TEARDOWN_TAG).wait(datetime.timedelta(milliseconds=1))
        except Exception:
            pass  # the expected timeout, or the connection was already closed

    def _receive_buffer(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        """Room for a chunk's rows. On CPU one buffer per channel, grown to the largest chunk and
        reused: a fresh allocation per chunk faults its pages in again, which costs more than the
        copy out of it. Safe because each payload is copied into the cache before the next recv.
        CUDA's caching allocator already reuses memory."""
        shape = (num_blocks, *self.payload_shape)
        if device.type != "cpu":
            return torch.empty(shape, dtype=self.payload_dtype, device=device)
        if self._rx_buffer is None or self._rx_buffer.shape[0] < num_blocks:
            self._rx_buffer = torch.empty(shape, dtype=self.payload_dtype)
        return self._rx_buffer[:num_blocks]

    def fail(self, reason: str) -> None:
        """Fail the channel from outside (its peer is known gone or replaced); once, like any failure."""
        self._fail(reason)

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
        self._rx_buffer = None  # (a receive blocked in the dead group may still hold its slice)
        self._tear_down()
        log.warning("KV channel %s -> %s (epoch %d) failed: %s", self.me.key, self.peer.key, self.epoch, reason)
        self._on_failure(self, reason, transient)
