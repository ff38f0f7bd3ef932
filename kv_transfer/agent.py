"""A worker's transfer agent: its channels to peers, the sending side (gather blocks after a
prefill chunk, ship them FIFO) and the receiving side (scatter into reserved blocks, acknowledge).

(Over 400 lines as one concept: one table of transfers keyed by transfer id, which both sides'
state changes, cancellations and failures read and write under one lock; the wire, the channel,
the buffers and the streams already live in their own modules.)

Device work is handed over by events, never by a device-wide synchronize (kv_transfer/streams.py):
the sender records one after gathering a chunk on the engine's stream (the channel's send stream
waits on it); the receiver's scatter waits on the event recorded when the blocks were reserved (a
step still writing their previous contents), runs on the channel's receive stream, and records
the event that ``on_received`` hands on (``TransferTiming.kv_ready``): the decode step that first
reads those blocks waits on it.

A pair where either worker is a tensor-parallel group hands off rank to rank
(kv_transfer/group_handoff.py): this agent still carries one header per chunk (flagged
``FLAG_DIRECT``, no payload after it) and the acknowledgements, while the ranks move the heads;
the decode side's chunk counts as landed once every rank received its heads (on the engine
thread, in header order), and a rank's failure fails the channel as a dead peer's would.

Every transfer is keyed by a transfer id the decode side allocates when it reserves blocks.
The receiver only writes into a transfer's blocks while the transfer is *expected*; cancelling it
(deadline passed, request aborted) and writing into it are serialized by one lock, so once
``cancel`` returns True no byte of that transfer will land in the cache (the blocks can be
recomputed locally safely).

A pair whose group fails while both processes live (a network error, a stream out of sync) forms
again: each side fails what was in flight with the other (the decode side prefills those
requests locally) and dials the pair's next epoch at once. The side that saw the failure closes
its end of the group, which fails the peer's too (gloo), and records it in the store, where the
peer's watcher finds it (NCCL cannot be relied on to notice). A peer that does not come back to
the new epoch within ``connect_timeout_s``, or a pair that fails again before carrying anything
``MAX_IDLE_REFORMS`` times in a row, is gone for this incarnation, as is a peer known dead.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.logprobs import TokenLogprob
from kv_transfer.channel import Channel, Received
from kv_transfer.data_plane import DataPlane, DataPlaneFactory, PayloadWork, default_data_plane
from kv_transfer.failure_watch import failures_key, watch_failures
from kv_transfer.fault import FaultInjector
from kv_transfer.group_handoff import GroupHandoff
from kv_transfer.local_kv import export_kv
from kv_transfer.pair_group import connect_store
from kv_transfer.peer import PeerInfo, StoreAddress
from kv_transfer.send_buffers import SendBuffers
from kv_transfer.streams import DONE, HostStreams, PayloadEvent, record_current
from kv_transfer.wire import FLAG_DIRECT, FLAG_LAST, Header, Kind

log = logging.getLogger(__name__)

MAX_IDLE_REFORMS = 3  # a pair failing this many times in a row without carrying a message is gone


@dataclass
class TransferStats:
    completed: int = 0
    failed: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    blocks_sent: int = 0
    blocks_received: int = 0
    seconds: float = 0.0  # receive side: reserve -> last chunk scattered, summed over completed transfers


@dataclass(frozen=True)
class TransferTiming:
    """TTFT stages measured on the prefill side, and when the KV landed here."""

    prefill_queue_s: float
    prefill_compute_s: float
    transfer_s: float  # last chunk sent (prefill's wall clock) -> scattered here (ours)
    landed: float  # time.monotonic() on the receiving side
    # The scatter of the transfer's last chunk (and so of all of them: one receive stream): the
    # decode step that first reads the blocks waits on it (``wait()`` on the engine's thread).
    kv_ready: PayloadEvent = DONE
    # A tensor-parallel receiver's chunks, held whole-head for the engine thread to write into its
    # ranks' caches (``stage_received``); empty otherwise (the chunks are in the cache already).
    staged: tuple[StagedRows, ...] = ()


@dataclass(frozen=True)
class StagedRows:
    """A received chunk not yet in the cache: whole-head ``rows`` for blocks ``block_ids``."""

    block_ids: list[int]
    rows: torch.Tensor


@dataclass
class _Expected:
    request_id: str
    peer_key: str
    block_ids: list[int]
    started: float
    last_progress: float = 0.0  # when the latest chunk landed (the deadline counts from here)
    chunks: int = 0
    reserved: PayloadEvent = DONE  # the engine's stream is done with the blocks' previous contents
    landed: PayloadEvent = DONE  # the latest chunk's scatter
    staged: list[StagedRows] = field(default_factory=list)


@dataclass
class _Outgoing:
    request_id: str
    peer: PeerInfo
    chunks: int = 0
    dropped: bool = False


class TransferAgent:
    def __init__(
        self,
        me: PeerInfo,
        store_addr: StoreAddress,
        kv_cache: torch.Tensor,
        *,
        connect_timeout_s: float = 30.0,
        faults: FaultInjector | None = None,
        on_received: Callable[[str, int, TransferTiming, TokenLogprob | None], None] | None = None,
        on_receive_failed: Callable[[str, str], None] | None = None,
        on_acked: Callable[[str, bool], None] | None = None,
        kv_segment_name: str | None = None,
        data_plane: DataPlaneFactory = default_data_plane,
        row_shape: tuple[int, ...] | None = None,
        stage_received: bool = False,
        direct: GroupHandoff | None = None,
    ) -> None:
        """``data_plane`` forms each pair's payload group (tests: kv_transfer/nccl_double.py).

        A tensor-parallel worker's cache holds its rank's heads only, while a handoff carries every
        head (engine/parallel/group_kv.py): ``row_shape`` is then one whole-head block, the sender
        passes each chunk's gathered ``rows`` to ``send_blocks``, and the receiver
        (``stage_received``) hands the received rows on in ``TransferTiming.staged`` instead of
        writing them into ``kv_cache``. ``direct``: with a peer where either side is such a group,
        the ranks ship their heads themselves instead (kv_transfer/group_handoff.py); this agent
        carries the headers and acknowledgements."""
        self.me = me
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.row_shape = row_shape if row_shape is not None else tuple(kv_cache.shape[1:])
        self._stage = stage_received
        self._direct = direct
        self._row_bytes = math.prod(self.row_shape) * kv_cache.element_size()  # one block, every head
        # What a same-device peer maps to read this cache (only when ``me.locality`` is set).
        self._kv_export = export_kv(kv_cache, kv_segment_name) if me.locality else None
        self.faults = faults or FaultInjector()
        self.connect_timeout_s = connect_timeout_s
        self._store_addr = store_addr
        self._data_plane = data_plane
        # Fails here, naming the store, if it is unreachable; then the failure watcher's own client.
        self._watch_store = connect_store(store_addr, connect_timeout_s)
        self._channels: dict[str, Channel] = {}
        # Incarnations known dead, replaced, or with which no pair could be formed (again): gone for
        # good (a restart is a new incarnation). Sends to them fail at once instead of queueing for
        # a peer that will not come, holding their blocks and staging buffers.
        self._gone: set[str] = set()
        self._epochs: dict[str, int] = {}  # peer key -> the epoch of the pair's next group (after failures)
        self._idle_reforms: dict[str, int] = {}  # peer key -> failures in a row of groups that carried nothing
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._expected: dict[int, _Expected] = {}  # decode side
        self._outgoing: dict[tuple[str, int], _Outgoing] = {}  # prefill side: (peer key, transfer id)
        self._delay_until: dict[tuple[str, int], float] = {}  # injected delays, by (peer key, transfer id)
        # Callbacks run on channel threads: (request id, first token), (request id, reason),
        # (request id, acknowledged) — False when the peer failed or refused.
        self.on_received = on_received or (lambda rid, tok, timing, logprob: None)
        self.on_receive_failed = on_receive_failed or (lambda rid, why: None)
        self.on_acked = on_acked or (lambda rid, ok: None)
        self.stats = TransferStats()
        self.send_buffers = SendBuffers(self.row_shape, kv_cache.dtype)  # CPU pair-group path
        threading.Thread(
            target=watch_failures,
            args=(self._watch_store, me, self._open_channels, self._closing),
            name=f"kv-watch-{me.key}",
            daemon=True,
        ).start()

    # -- channels ---------------------------------------------------------------------------
    def is_gone(self, peer: PeerInfo) -> bool:
        """Whether a channel with this incarnation of ``peer`` has failed (no new one is formed)."""
        with self._lock:
            return peer.key in self._gone

    def channel(self, peer: PeerInfo) -> Channel | None:
        """The open channel to ``peer``, formed now if need be; None if that incarnation is gone
        (checked under the lock that forget_peer takes: no channel to a dead peer after it)."""
        with self._lock:
            if peer.key in self._gone or self._closing.is_set():
                return None
            ch = self._channels.get(peer.worker_id)
            if ch is not None and ch.peer == peer:
                # A failed one is still registered only until its failure callback runs, which picks
                # the next epoch (or gives the peer up): sends on it are refused meanwhile.
                return ch
            old = ch if ch is not None and not ch.failed else None  # another incarnation's, still open
            stale = ch
            epoch = self._epochs.get(peer.key, 0)
            direct = self.ships_direct(peer)
            ch = Channel(
                self._store_addr,
                self.me,
                peer,
                self.device,
                self.row_shape,
                self.kv_cache.dtype,
                self._on_message,
                self._on_channel_failure,
                self.connect_timeout_s,
                functools.partial(self._before_send, peer.key),
                kv_export=self._kv_export,
                epoch=epoch,
                join_timeout_s=self.connect_timeout_s if epoch else None,
                data_plane=functools.partial(self._direct_plane, peer, epoch) if direct else self._data_plane,
                direct=direct,
            )
            self._channels[peer.worker_id] = ch
        if stale is not None:  # (outside the lock: closing tears its group down)
            stale.close()
            self._close_direct(stale)
        if old is not None:  # the worker restarted: what was in flight with its old process failed
            old.fail(f"{old.peer.key} was replaced by {peer.key}")
        return ch

    def ships_direct(self, peer: PeerInfo) -> bool:
        """Whether the pair with ``peer`` hands its KV off rank to rank (group_handoff.py)."""
        return self._direct is not None and self._direct.uses(peer)

    def _direct_plane(
        self, peer: PeerInfo, epoch: int, store: object, prefix: str, rank: int, device: torch.device
    ) -> DataPlane:
        """A rank-to-rank pair's data plane: its handoff group, which every rank of both joins (the
        channel's thread waits here for this worker's). Nothing is sent on it from here."""
        assert self._direct is not None
        self._direct.join(peer, epoch, prefix)
        return DataPlane(_NoPayloads(), HostStreams(), lambda: None)  # (closed by _close_direct)

    def _close_direct(self, ch: Channel) -> None:
        if ch.direct and self._direct is not None:
            self._direct.close(ch.peer, ch.epoch)

    def forget_peer(self, peer: PeerInfo) -> None:
        """``peer`` (this incarnation of it) is dead: stop waiting for it to join a pair, fail what is
        in flight with it and refuse new transfers at once. The router says so when a worker dies;
        the channel alone cannot tell a dead peer from one that has not dialed yet."""
        with self._lock:
            ch = self._channels.get(peer.worker_id)
            ch = ch if ch is not None and ch.peer == peer else None
            self._gone.add(peer.key)
        if ch is not None:
            ch.fail(f"{peer.key} is gone")  # -> _on_channel_failure
        else:
            self._fail_peer(peer.key, f"{peer.key} is gone")

    def connect(self, peer: PeerInfo) -> None:
        """Start forming the pair group now (both sides must do so); returns at once."""
        self.channel(peer)

    # -- decode side --------------------------------------------------------------------------
    def expect(self, peer: PeerInfo, transfer_id: int, request_id: str, block_ids: list[int]) -> None:
        """Called on the engine's thread, right after it reserved ``block_ids``."""
        reserved = record_current(self.device)
        with self._lock:
            now = time.monotonic()
            self._expected[transfer_id] = _Expected(request_id, peer.key, list(block_ids), now, now, reserved=reserved)
        if self.channel(peer) is None:  # that prefill worker died: nothing will come (the caller prefills locally)
            with self._lock:
                gone = self._expected.pop(transfer_id, None)  # (forget_peer may have failed it already)
            if gone is not None:
                self.stats.failed += 1
                self.on_receive_failed(request_id, f"{peer.key} is gone")

    def cancel(self, transfer_id: int) -> bool:
        """Stop accepting a transfer. True if it was still pending: its blocks will not be written."""
        with self._lock:
            return self._expected.pop(transfer_id, None) is not None

    def pending_transfers(self) -> list[tuple[int, str, float]]:
        """(transfer id, request id, time of the last progress) of transfers still expected."""
        with self._lock:
            return [(tid, e.request_id, e.last_progress) for tid, e in self._expected.items()]

    # -- prefill side -------------------------------------------------------------------------
    def send_blocks(
        self,
        peer: PeerInfo,
        transfer_id: int,
        request_id: str,
        block_offset: int,
        block_ids: list[int],
        *,
        chunk_index: int,
        last: bool,
        first_token: int = -1,
        prefill_queue_s: float = 0.0,
        prefill_compute_s: float = 0.0,
        first_logprob: TokenLogprob | None = None,
        rows: torch.Tensor | None = None,
    ) -> bool:
        """Gather ``block_ids`` now (the caller may reuse them right after) and queue them;
        ``rows``: the blocks already gathered (a tensor-parallel group's, with every head)."""
        key = (peer.key, transfer_id)
        with self._lock:
            out = self._outgoing.get(key)
            if out is None:
                out = self._outgoing[key] = _Outgoing(request_id, peer)
        if self.is_gone(peer):  # its decode worker died: release now, never form a group with it again
            self._finish_outgoing(key, acked=False)
            return False
        if out.dropped or self.faults.should_drop(key):
            out.dropped = True
            if last:  # nothing was sent: release as if refused, the decode side will time out
                self._finish_outgoing(key, acked=False)
            return False
        if out.chunks == 0:
            delay = self.faults.delay_for(key)
            if delay:
                with self._lock:
                    self._delay_until[key] = time.monotonic() + delay
        ch = self.channel(peer)
        if ch is None:  # forgotten meanwhile
            self._finish_outgoing(key, acked=False)
            return False
        payload, on_sent, written = None, None, DONE
        flags = FLAG_LAST if last else 0
        if ch.direct:
            assert self._direct is not None
            flags |= FLAG_DIRECT
            if block_ids:  # every rank gathers its heads now and ships them (the header follows)
                self._direct.send(peer, ch.epoch, block_ids)
                with self._lock:
                    self.stats.bytes_sent += len(block_ids) * self._row_bytes
        elif block_ids and rows is not None:
            payload = rows  # (a fresh tensor: nobody writes it while the send thread holds it)
            written = record_current(self.device)
        elif block_ids and ch.local:
            # The peer reads these rows of our cache itself; the blocks stay ours until the ack. The
            # send thread waits for the step that wrote them (this event) before it sends the ids.
            payload = torch.tensor(block_ids, dtype=torch.long)
            written = record_current(self.device)
        elif block_ids and self.device.type == "cpu":
            payload, on_sent = self.send_buffers.gather(self.kv_cache, torch.tensor(block_ids, dtype=torch.long))
        elif block_ids:
            idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
            payload = self.kv_cache.index_select(0, idx)  # on the engine's stream, after the step that wrote them
            written = record_current(self.device)
        header = Header(
            Kind.KV,
            transfer_id,
            chunk_index,
            block_offset,
            len(block_ids),
            flags,
            first_token,
            int(prefill_queue_s * 1e6),
            int(prefill_compute_s * 1e6),
            int(time.time() * 1e6) if last else 0,
            first_logprob if last else None,
        )
        out.chunks += 1
        self.stats.blocks_sent += len(block_ids)
        ok = ch.send(header, payload, on_sent, written)
        if not ok:
            self._finish_outgoing(key, acked=False)
        return ok

    def send_abort(self, peer: PeerInfo, transfer_id: int) -> None:
        ch = self.channel(peer)
        if ch is not None:
            ch.send(Header(Kind.ABORT, transfer_id))
        self._finish_outgoing((peer.key, transfer_id), acked=False)

    # -- channel callbacks (channel threads) --------------------------------------------------
    def _before_send(self, peer_key: str, header: Header) -> bool:
        if header.kind is Kind.KV:
            with self._lock:
                until = self._delay_until.pop((peer_key, header.transfer_id), None)
            if until is not None and until > time.monotonic():
                time.sleep(until - time.monotonic())
            self.faults.before_chunk()
        return True

    def _on_message(self, ch: Channel, header: Header, payload: Received | None) -> None:
        if header.kind is Kind.KV:
            self._receive_kv(ch, header, payload)
        elif header.kind is Kind.ABORT:
            with self._lock:
                exp = self._expected.pop(header.transfer_id, None)
            if exp is not None:
                self.stats.failed += 1
                self.on_receive_failed(exp.request_id, "the prefill worker aborted the transfer")
        elif header.kind in (Kind.ACK, Kind.NACK):
            self._finish_outgoing((ch.peer.key, header.transfer_id), acked=header.kind is Kind.ACK)

    def _receive_kv(self, ch: Channel, header: Header, payload: Received | None) -> None:
        if header.flags & FLAG_DIRECT:
            self._receive_direct(ch, header)
            return
        with self._lock:
            exp = self._expected.get(header.transfer_id)
            if exp is not None and payload is not None:
                off, n = header.block_offset, header.num_blocks
                dst = exp.block_ids[off : off + n] if off >= 0 and n >= 0 else []  # (a negative slice wraps)
                if len(dst) != n:
                    exp = None  # a malformed chunk: refuse the transfer rather than corrupt blocks
                    self._expected.pop(header.transfer_id, None)
                else:
                    with ch.streams.receiving():
                        exp.reserved.wait()
                        if self._stage:
                            exp.staged.append(StagedRows(dst, payload.take()))
                        else:
                            payload.copy_into(self.kv_cache, dst)
                        exp.landed = ch.streams.record()
                    self.stats.bytes_received += payload.num_bytes
                if exp is not None:
                    exp.chunks += 1
                    exp.last_progress = time.monotonic()
                    self.stats.blocks_received += header.num_blocks
            if exp is not None and header.is_last:
                del self._expected[header.transfer_id]
        self._chunk_done(ch, header, exp)

    def _receive_direct(self, ch: Channel, header: Header) -> None:
        """A chunk whose heads the ranks receive: on the engine thread, in header order."""
        assert self._direct is not None

        def block_ids() -> list[int] | None:
            with self._lock:
                exp = self._expected.get(header.transfer_id)
                if exp is None:
                    return None
                off, n = header.block_offset, header.num_blocks
                dst = exp.block_ids[off : off + n] if off >= 0 and n >= 0 else []  # (a negative slice wraps)
                if len(dst) != n:  # a malformed chunk: refuse the transfer rather than corrupt blocks
                    self._expected.pop(header.transfer_id, None)
                    return None
                return dst

        def landed(ok: bool, received: int) -> None:
            if not ok:  # a rank of either group failed: as a dead peer's, everything in flight with it fails
                ch.fail(f"the rank-to-rank handoff with {ch.peer.key} failed", transient=True)
                return
            with self._lock:
                exp = self._expected.get(header.transfer_id)
                if exp is not None:
                    exp.chunks += 1
                    exp.last_progress = time.monotonic()
                    self.stats.blocks_received += header.num_blocks
                    self.stats.bytes_received += received
                    if header.is_last:
                        del self._expected[header.transfer_id]
            self._chunk_done(ch, header, exp)

        self._direct.receive(ch.peer, ch.epoch, header.num_blocks, block_ids, landed)

    def _chunk_done(self, ch: Channel, header: Header, exp: _Expected | None) -> None:
        """After a chunk landed (``exp``: its transfer, None if no longer expected): the last one is
        acknowledged (or refused) and handed on."""
        if not header.is_last:
            return
        if exp is None:
            ch.send(Header(Kind.NACK, header.transfer_id))
            return
        if ch.local:
            exp.landed.synchronize()  # our copies read the sender's blocks: done before it frees them
        ch.send(Header(Kind.ACK, header.transfer_id))
        self.stats.completed += 1
        self.stats.seconds += time.monotonic() - exp.started
        timing = TransferTiming(
            header.prefill_queue_us / 1e6,
            header.prefill_compute_us / 1e6,
            max(0.0, time.time() - header.sent_wall_us / 1e6),
            time.monotonic(),
            exp.landed,
            tuple(exp.staged),
        )
        self.on_received(exp.request_id, header.first_token, timing, header.first_logprob)

    def _finish_outgoing(self, key: tuple[str, int], acked: bool) -> None:
        with self._lock:
            out = self._outgoing.pop(key, None)
            self._delay_until.pop(key, None)
        self.faults.forget(key)
        if out is None:
            return
        if acked:
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        self.on_acked(out.request_id, acked)

    def _on_channel_failure(self, ch: Channel, reason: str, transient: bool) -> None:
        """Fail everything in flight with the peer, on both sides; then dial the pair's next epoch if
        the failure was transient (the peer lives, as far as we know), else the peer is gone."""
        peer = ch.peer
        with self._lock:
            current = self._channels.get(peer.worker_id) is ch
            if current:
                del self._channels[peer.worker_id]
            idle = 0 if ch.messages else self._idle_reforms.get(peer.key, 0) + 1
            again = (
                transient
                and current
                and not self._closing.is_set()
                and peer.key not in self._gone
                and idle < MAX_IDLE_REFORMS
            )
            if again:
                self._epochs[peer.key] = ch.epoch + 1
                self._idle_reforms[peer.key] = idle
            elif current or not transient:
                self._gone.add(peer.key)
        self._fail_peer(peer.key, reason)
        self._close_direct(ch)
        self.stats.bytes_sent += ch.bytes_sent
        if transient:
            try:  # for the peer's watcher: its group may not notice (NCCL)
                ch.record_failure_for_peer(failures_key(peer))
            except Exception as e:  # noqa: BLE001 - a store that cannot be reached is warned of; the failure goes on
                log.warning("could not record the failure of the pair with %s: %s", peer.key, e)
        if again:
            log.info("forming the pair with %s again (epoch %d)", peer.key, ch.epoch + 1)
            self.channel(peer)

    def _open_channels(self) -> list[Channel]:
        with self._lock:
            return [ch for ch in self._channels.values() if not ch.failed]

    def _fail_peer(self, peer_key: str, reason: str) -> None:
        with self._lock:
            lost = [(tid, e) for tid, e in self._expected.items() if e.peer_key == peer_key]
            for tid, _ in lost:
                del self._expected[tid]
            orphans = [k for k in self._outgoing if k[0] == peer_key]
        for _, e in lost:
            self.stats.failed += 1
            self.on_receive_failed(e.request_id, reason)
        for k in orphans:
            self._finish_outgoing(k, acked=False)

    def bytes_sent(self) -> int:
        with self._lock:
            return self.stats.bytes_sent + sum(ch.bytes_sent for ch in self._channels.values())

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            chans = list(self._channels.values())
            self._channels.clear()
        for ch in chans:
            ch.close()
            self._close_direct(ch)


class _NoPayloads:
    """A rank-to-rank pair's data plane group: its payloads travel between the ranks instead."""

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int, /) -> PayloadWork:
        raise ConnectionError("a rank-to-rank pair sends no payload on its channel")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int, /) -> PayloadWork:
        raise ConnectionError("a rank-to-rank pair receives no payload on its channel")
