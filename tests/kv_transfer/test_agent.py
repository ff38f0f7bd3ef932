"""Transfer agents over real gloo pair groups (both ends in this process, on two threads), the
payloads' data plane run through the NCCL-semantics double (kv_transfer/nccl_double.py): every test
here also proves that no data-plane operation waits without its peer committed to the match."""

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from kv_transfer.agent import TransferAgent
from kv_transfer.fault import FaultSpec
from kv_transfer.nccl_double import NcclSemantics, violations
from kv_transfer.peer import PeerInfo, StoreAddress
from kv_transfer.wire import Header, Kind
from tests.waiting import wait_until

SHAPE = (32, 2, 2, 4, 2, 8)  # blocks, layers, k/v, block size, kv heads, head dim


DATA_PLANE = NcclSemantics(bound_s=5.0)


def new_agent(*args, **kw) -> TransferAgent:
    """A transfer agent whose pairs' data plane is the NCCL-semantics double."""
    return TransferAgent(*args, data_plane=DATA_PLANE, **kw)


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20))
    yield StoreAddress("127.0.0.1", s.port)
    assert violations(s) == []  # no payload operation waited without its peer committed


class Events:
    """What a callback reported, in order (the agents' threads append; a list append is atomic)."""

    def __init__(self) -> None:
        self.items: list[tuple] = []

    def add(self, *x) -> None:
        self.items.append(x)

    def wait(self, n: int = 1, timeout: float = 10.0) -> list[tuple]:
        """The events once there are ``n`` of them."""
        wait_until(lambda: len(self.items) >= n, timeout, message=lambda: f"{n} events (got {self.items})")
        return self.items


def _watch_waits_for(peer: PeerInfo, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once an agent waits in a pair's rendezvous for ``peer`` to join."""
    from kv_transfer import pair_group

    waiting, real_wait = threading.Event(), pair_group._wait_for

    def watched(store_, key, cancelled, who, *rest):
        if who.key == peer.key:
            waiting.set()
        return real_wait(store_, key, cancelled, who, *rest)

    monkeypatch.setattr(pair_group, "_wait_for", watched)
    return waiting


def _send_thread_ended(peer: PeerInfo) -> bool:
    return not any(t.name == f"kv-send-{peer.key}" for t in threading.enumerate())


def make_pair(store, inc="a"):
    p_peer, d_peer = PeerInfo("p0", inc, "prefill"), PeerInfo("d0", inc, "decode")
    received, failed, acked = Events(), Events(), Events()
    p = new_agent(p_peer, store, torch.randn(SHAPE), on_acked=lambda rid, ok: acked.add(rid, ok))
    d = new_agent(
        d_peer,
        store,
        torch.zeros(SHAPE),
        on_received=lambda rid, tok, timing, logprob: received.add(rid, tok),
        on_receive_failed=lambda rid, why: failed.add(rid, why),
    )
    return p, d, p_peer, d_peer, received, failed, acked


def test_chunks_land_in_reserved_blocks_and_are_acknowledged(store):
    p, d, pp, dp, received, failed, acked = make_pair(store)
    d.expect(pp, 7, "r1", [10, 11, 12, 13, 14])
    src = [3, 4, 5, 6, 9]
    p.send_blocks(dp, 7, "r1", 0, src[:2], chunk_index=0, last=False)
    p.send_blocks(dp, 7, "r1", 2, src[2:], chunk_index=1, last=True, first_token=42)
    assert received.wait() == [("r1", 42)]
    assert acked.wait() == [("r1", True)]
    assert torch.equal(d.kv_cache[[10, 11, 12, 13, 14]], p.kv_cache[src])
    assert torch.count_nonzero(d.kv_cache[:10]) == 0  # nothing else written
    assert d.stats.blocks_received == 5 and p.stats.blocks_sent == 5 and not failed.items


def test_staging_buffers_are_reused_and_their_reuse_never_corrupts_a_chunk(store):
    """On CPU the sender gathers into kept buffers and the receiver into one per channel; many
    back-to-back transfers of different blocks and sizes must each land exactly."""
    p, d, pp, dp, _received, failed, acked = make_pair(store, inc="reuse")
    for tid in range(1, 13):
        n = 1 + tid % 4
        src, dst = [(tid * 5 + i) % 32 for i in range(n)], [(tid * 3 + 7 * i) % 32 for i in range(n)]
        d.expect(pp, tid, f"r{tid}", dst)
        p.send_blocks(dp, tid, f"r{tid}", 0, src[:1], chunk_index=0, last=n == 1)
        if n > 1:
            p.send_blocks(dp, tid, f"r{tid}", 1, src[1:], chunk_index=1, last=True)
        assert acked.wait(tid)[-1] == (f"r{tid}", True)
        assert torch.equal(d.kv_cache[dst], p.kv_cache[src]), tid
        # The ack can overtake the send thread handing the buffer back: wait for it, so that the
        # pool's reuse (what is asserted below) does not depend on thread timing.
        bufs = p.send_buffers
        wait_until(lambda: bufs.idle() >= min(bufs.keep, bufs.allocated), 5, message="the send buffer handed back")
    assert p.send_buffers.allocated <= 4 and p.send_buffers.idle() <= p.send_buffers.keep
    assert not failed.items


def test_a_cancelled_transfer_is_drained_not_written_and_nacked(store):
    p, d, pp, dp, received, _failed, acked = make_pair(store)
    d.expect(pp, 1, "late", [1, 2])
    assert d.cancel(1) and not d.cancel(1)
    p.send_blocks(dp, 1, "late", 0, [5, 6], chunk_index=0, last=True, first_token=3)
    assert acked.wait() == [("late", False)]
    assert torch.count_nonzero(d.kv_cache) == 0 and not received.items
    # The FIFO is still in sync: a following transfer works.
    d.expect(pp, 2, "next", [8])
    p.send_blocks(dp, 2, "next", 0, [0], chunk_index=0, last=True, first_token=9)
    assert received.wait() == [("next", 9)]


def test_dropped_transfer_sends_nothing_and_releases_the_sender(store):
    p, d, pp, dp, received, _failed, acked = make_pair(store)
    p.faults.set(FaultSpec(drop_next=1))
    d.expect(pp, 5, "dropped", [1])
    p.send_blocks(dp, 5, "dropped", 0, [2], chunk_index=0, last=True, first_token=1)
    assert acked.wait() == [("dropped", False)]
    assert p.faults.num_dropped == 1 and p.stats.blocks_sent == 0  # nothing went out: nothing can arrive
    assert not received.items and d.pending_transfers()[0][:2] == (5, "dropped")


def test_abort_message_fails_the_receiver(store):
    p, d, pp, dp, received, failed, _acked = make_pair(store)
    d.expect(pp, 3, "ab", [1, 2])
    p.send_blocks(dp, 3, "ab", 0, [4], chunk_index=0, last=False)
    p.send_abort(dp, 3)
    assert failed.wait()[0][0] == "ab" and not received.items


def test_header_round_trip_and_bad_magic():
    h = Header(Kind.KV, 12, 3, 4, 5, 1, 77)
    assert Header.from_tensor(h.to_tensor(torch.device("cpu"))) == h and h.is_last
    with pytest.raises(ValueError, match="out of sync"):
        Header.from_tensor(torch.zeros(11, dtype=torch.int64))


# -- the local path: the receiver reads the sender's shared-memory cache directly ---------------


def make_local_pair(store, inc="l"):
    """Two agents whose caches live in POSIX shared memory on this host (as with
    ``CacheConfig.shared_memory``): they pick the local path, ids on the wire instead of KV."""
    from multiprocessing import shared_memory

    from kv_transfer.local_kv import locality

    segments, caches = [], []
    for fill in (torch.randn, torch.zeros):
        seg = shared_memory.SharedMemory(create=True, size=int(torch.tensor(SHAPE).prod()) * 4)
        t = torch.frombuffer(seg.buf, dtype=torch.float32).view(SHAPE)
        t.copy_(fill(SHAPE))
        segments.append(seg)
        caches.append(t)
    where = locality(caches[0], segments[0].name)
    p_peer = PeerInfo("p0", inc, "prefill", locality=where)
    d_peer = PeerInfo("d0", inc, "decode", locality=where)
    received, failed, acked = Events(), Events(), Events()
    p = new_agent(
        p_peer, store, caches[0], on_acked=lambda rid, ok: acked.add(rid, ok), kv_segment_name=segments[0].name
    )
    d = new_agent(
        d_peer,
        store,
        caches[1],
        on_received=lambda rid, tok, timing, logprob: received.add(rid, tok),
        on_receive_failed=lambda rid, why: failed.add(rid, why),
        kv_segment_name=segments[1].name,
    )
    return p, d, p_peer, d_peer, received, failed, acked, segments


def test_local_path_copies_from_the_peer_cache_and_sends_only_ids(store):
    p, d, pp, dp, received, _failed, acked, segments = make_local_pair(store)
    try:
        assert pp.locality.startswith("shm:") and p.channel(dp).local and d.channel(pp).local
        d.expect(pp, 3, "r", [20, 21, 22])
        src = [1, 7, 30]
        p.send_blocks(dp, 3, "r", 0, src[:1], chunk_index=0, last=False)
        p.send_blocks(dp, 3, "r", 1, src[1:], chunk_index=1, last=True, first_token=5)
        assert received.wait() == [("r", 5)] and acked.wait() == [("r", True)]
        assert torch.equal(d.kv_cache[[20, 21, 22]], p.kv_cache[src])
        assert torch.count_nonzero(d.kv_cache[:20]) == 0
        # KV-equivalent bytes are accounted, though only 3 int64 ids crossed the socket.
        row = p.kv_cache[0].numel() * 4
        assert d.stats.bytes_received == 3 * row
        # Cancellation semantics are the same: a cancelled transfer writes nothing.
        d.expect(pp, 4, "gone", [5])
        assert d.cancel(4)
        p.send_blocks(dp, 4, "gone", 0, [2], chunk_index=0, last=True, first_token=1)
        assert acked.wait(2)[-1] == ("gone", False) and torch.count_nonzero(d.kv_cache[5]) == 0
    finally:
        p.close()
        d.close()
        for s in segments:
            s.unlink()


def test_only_peers_sharing_a_locality_use_the_local_path():
    from kv_transfer.channel import Channel

    here = PeerInfo("p1", "x", "prefill", locality="shm:boot-a:host-a")
    assert Channel.is_local(here, PeerInfo("d1", "x", "decode", locality="shm:boot-a:host-a"))
    assert not Channel.is_local(here, PeerInfo("d1", "x", "decode", locality="shm:boot-b:host-b"))
    assert not Channel.is_local(here, PeerInfo("d1", "x", "decode"))  # its cache cannot be shared
    assert not Channel.is_local(PeerInfo("p1", "x", "prefill"), PeerInfo("d1", "x", "decode"))


def test_local_path_copies_runs_of_blocks_into_exactly_their_places(store):
    """On CPU the rows go straight from the peer's mapping into our blocks, a slice per run of
    consecutive ids on both sides: runs that break on either side must land block by block."""
    p, d, pp, dp, received, _failed, acked, segments = make_local_pair(store, inc="runs")
    try:
        src, dst = [8, 9, 10, 3, 4, 30], [12, 13, 20, 21, 22, 2]
        d.expect(pp, 1, "r", dst)
        p.send_blocks(dp, 1, "r", 0, src[:4], chunk_index=0, last=False)
        p.send_blocks(dp, 1, "r", 4, src[4:], chunk_index=1, last=True, first_token=9)
        assert received.wait() == [("r", 9)] and acked.wait() == [("r", True)]
        assert torch.equal(d.kv_cache[dst], p.kv_cache[src])
        untouched = [b for b in range(d.kv_cache.shape[0]) if b not in dst]
        assert torch.count_nonzero(d.kv_cache[untouched]) == 0
    finally:
        p.close()
        d.close()
        for s in segments:
            s.unlink()


def test_consecutive_runs_follow_both_sides():
    from kv_transfer.local_kv import consecutive_runs

    assert consecutive_runs([8, 9, 10, 3, 4], [40, 41, 50, 51, 52]) == [(8, 40, 2), (10, 50, 1), (3, 51, 2)]
    assert consecutive_runs([], []) == []
    with pytest.raises(ValueError):
        consecutive_runs([1], [])


def test_a_failed_incarnation_is_never_dialled_again_and_its_transfers_fail_at_once(store):
    """A decode worker that died leaves its address in the store: a new pair group with it could
    wait on gloo's connect for its whole op timeout (24 h), holding the transfers queued behind it
    and their blocks (a leak seen after a decode worker was killed mid-load)."""
    acked, failed = Events(), Events()
    p = new_agent(
        PeerInfo("p0", "a", "prefill"), store, torch.randn(SHAPE), on_acked=lambda rid, ok: acked.add(rid, ok)
    )
    d = new_agent(
        PeerInfo("d0", "a", "decode"),
        store,
        torch.zeros(SHAPE),
        on_receive_failed=lambda rid, why: failed.add(rid, why),
    )
    dead_decode, dead_prefill = PeerInfo("d0", "dead", "decode"), PeerInfo("p0", "dead", "prefill")
    try:
        p.channel(dead_decode).fail("receive from d0@dead failed: connection reset")  # it died
        d.channel(dead_prefill).fail("receive from p0@dead failed: connection reset")
        assert p.is_gone(dead_decode) and d.is_gone(dead_prefill)
        t0 = time.monotonic()
        assert not p.send_blocks(dead_decode, 5, "r5", 0, [1, 2], chunk_index=0, last=False)
        assert acked.wait(1, timeout=3.0) == [("r5", False)]  # released now: its blocks are free
        assert time.monotonic() - t0 < 3.0 and "d0" not in p._channels  # no new group is formed (30 s timeout)
        p.send_abort(dead_decode, 6)  # nothing to dial either
        d.expect(dead_prefill, 9, "r9", [3, 4])  # a reservation naming the dead prefill worker
        assert failed.wait(1, timeout=3.0)[0][0] == "r9" and d.pending_transfers() == []
    finally:
        p.close()
        d.close()


def test_a_restarted_peer_fails_what_was_in_flight_with_its_old_process(store):
    acked = Events()
    p = new_agent(
        PeerInfo("p0", "a", "prefill"), store, torch.randn(SHAPE), on_acked=lambda rid, ok: acked.add(rid, ok)
    )
    old, new = PeerInfo("d0", "old", "decode"), PeerInfo("d0", "new", "decode")
    try:
        assert p.send_blocks(old, 1, "r1", 0, [1], chunk_index=0, last=True)  # queued: d0@old never answers
        p.channel(new)  # d0 is back as a new process
        assert acked.wait(1, timeout=2.0) == [("r1", False)]  # was never released (blocks held)
        assert p.is_gone(old) and not p.is_gone(new)
    finally:
        p.close()


def test_a_peer_that_dials_long_after_the_connect_timeout_still_forms_the_pair(store):
    """A decode worker dials when it reserves; the router may then prefill that request on it, and the
    prefill worker dials only with its first task for it, much later. A side that gave up waiting
    could never form that pair again (it forms once per pair of incarnations): the wait for the
    other side is not bounded by the connect timeout (pair_group.py)."""
    p, d, pp, dp, received, _failed, acked = make_pair(store, inc="late")
    d.connect_timeout_s = p.connect_timeout_s = 0.5
    d.connect(pp)  # the decode side alone, as at a reservation
    time.sleep(1.5)  # the behaviour under test: the other side dials long after the connect timeout
    d.expect(pp, 1, "r1", [1])
    p.send_blocks(dp, 1, "r1", 0, [2], chunk_index=0, last=True, first_token=4)
    assert received.wait() == [("r1", 4)] and acked.wait() == [("r1", True)]
    assert not d.is_gone(pp) and not p.is_gone(dp)


@pytest.mark.parametrize(
    "decode_shape, dtype",
    [
        ((32, 2, 2, 8, 2, 8), torch.float32),  # another block size: the rows are bigger than the sender's
        ((32, 2, 2, 4, 8, 2), torch.float32),  # heads and head size swapped: the same bytes, another layout
        (SHAPE, torch.bfloat16),  # another dtype
    ],
)
def test_workers_whose_kv_rows_differ_refuse_the_pair_naming_both(store, decode_shape, dtype):
    """Before, a bigger row aborted the decode process inside gloo (a payload longer than the
    buffer), and a smaller or same-size one was written and acknowledged as wrong KV."""
    acked, failed = Events(), Events()
    p = new_agent(
        PeerInfo("p0", "g", "prefill"),
        store,
        torch.randn(SHAPE),
        connect_timeout_s=5.0,
        on_acked=lambda rid, ok: acked.add(rid, ok),
    )
    d = new_agent(
        PeerInfo("d0", "g", "decode"),
        store,
        torch.zeros(decode_shape, dtype=dtype),
        connect_timeout_s=5.0,
        on_receive_failed=lambda rid, why: failed.add(rid, why),
    )
    pp, dp = p.me, d.me
    try:
        d.expect(pp, 1, "r1", [1, 2])
        p.send_blocks(dp, 1, "r1", 0, [3, 4], chunk_index=0, last=True, first_token=5)
        assert acked.wait(1, timeout=8.0) == [("r1", False)]
        [(rid, why)] = failed.wait(1, timeout=8.0)
        assert rid == "r1" and "KV rows differ" in why and str(list(decode_shape[1:])) in why
        assert torch.count_nonzero(d.kv_cache) == 0
    finally:
        p.close()
        d.close()


def test_a_dropped_transfer_id_is_dropped_to_one_peer_only(store):
    """Each decode worker numbers its transfers from 1: fault injection keyed by the id alone dropped
    id 1 to every other decode worker too, for good."""
    p, d, pp, dp, _received, _failed, acked = make_pair(store, inc="drop")
    d1_received = Events()
    d1 = new_agent(
        PeerInfo("d1", "drop", "decode"),
        store,
        torch.zeros(SHAPE),
        on_received=lambda rid, tok, timing, logprob: d1_received.add(rid, tok),
    )
    try:
        p.faults.set(FaultSpec(drop_next=1))
        d.expect(pp, 1, "to-d0", [1])
        p.send_blocks(dp, 1, "to-d0", 0, [2], chunk_index=0, last=True, first_token=1)
        assert acked.wait(1) == [("to-d0", False)]
        d1.expect(pp, 1, "to-d1", [1])  # d1's own transfer 1
        p.send_blocks(d1.me, 1, "to-d1", 0, [2], chunk_index=0, last=True, first_token=9)
        assert d1_received.wait(1) == [("to-d1", 9)] and p.faults.num_dropped == 1
    finally:
        d1.close()


def test_a_chunk_with_a_negative_block_offset_is_refused_not_written(store):
    """A negative offset sliced the reserved blocks from their end: the chunk landed in another of
    the transfer's blocks and was acknowledged."""
    p, d, pp, dp, received, _failed, acked = make_pair(store, inc="neg")
    d.expect(pp, 4, "r4", [10, 11, 12, 13])
    p.send_blocks(dp, 4, "r4", -2, [3], chunk_index=0, last=True, first_token=1)
    assert acked.wait(1) == [("r4", False)]
    assert torch.count_nonzero(d.kv_cache) == 0 and not received.items


def test_a_peer_that_never_dials_does_not_hold_up_the_pairs_with_others(store, monkeypatch):
    """A decode worker dials the prefill worker it reserves with; the router may then prefill that
    request on it after all, and that prefill worker may not dial back for a long time. The wait
    for it held the agent's one store client (a TCPStore client serves one call at a time), so the
    decode worker could form no pair with any other prefill worker: their transfers missed their
    deadlines and fell back to local prefill."""
    received = Events()
    d = new_agent(
        PeerInfo("d0", "w", "decode"),
        store,
        torch.zeros(SHAPE),
        on_received=lambda rid, tok, timing, logprob: received.add(rid, tok),
    )
    p1 = new_agent(PeerInfo("p1", "w", "prefill"), store, torch.randn(SHAPE))
    silent = PeerInfo("p0", "w", "prefill")  # never dials
    waiting = _watch_waits_for(silent, monkeypatch)
    try:
        d.connect(silent)
        assert waiting.wait(10)  # d0 is waiting for p0 now
        d.expect(p1.me, 1, "r1", [1, 2])
        p1.send_blocks(d.me, 1, "r1", 0, [5, 6], chunk_index=0, last=True, first_token=3)
        assert received.wait(1, timeout=15.0) == [("r1", 3)]  # (held for good by the bug; slow on a loaded host)
        assert torch.equal(d.kv_cache[[1, 2]], p1.kv_cache[[5, 6]])
    finally:
        p1.close()
        d.close()


def test_a_peer_known_dead_before_it_paired_releases_the_transfers_and_buffers_queued_for_it(store, monkeypatch):
    """A prefill worker ships chunks to a decode worker that died before the pair formed: they
    queued behind the wait for it, each in a staging buffer of its own (90 MiB for a 2,048-token
    chunk of SmolLM2), and the wait lasted its 24 h op timeout. The router's word that the peer
    is dead ends the wait, fails the transfers, returns the buffers and ends the channel's thread."""
    acked = Events()
    p = new_agent(
        PeerInfo("p0", "x", "prefill"), store, torch.randn(SHAPE), on_acked=lambda rid, ok: acked.add(rid, ok)
    )
    dead = PeerInfo("d0", "x", "decode")
    waiting = _watch_waits_for(dead, monkeypatch)
    try:
        assert p.send_blocks(dead, 1, "r1", 0, [1, 2], chunk_index=0, last=False)
        assert p.send_blocks(dead, 2, "r2", 0, [3], chunk_index=0, last=False)
        assert p.send_buffers.allocated == 2 and p.send_buffers.idle() == 0  # both held by the queue
        assert waiting.wait(10)  # the channel waits for the dead peer to join
        p.forget_peer(dead)
        assert sorted(acked.wait(2, timeout=2.0)) == [("r1", False), ("r2", False)]
        wait_until(lambda: _send_thread_ended(dead), 2.0, message="the send thread for the dead peer ended")
        assert p.send_buffers.idle() == 2 and p.is_gone(dead)
        assert not p.send_blocks(dead, 3, "r3", 0, [4], chunk_index=0, last=True)  # refused at once
        assert acked.wait(3, timeout=3.0)[-1] == ("r3", False)
    finally:
        p.close()


def test_forgetting_a_peer_with_no_channel_fails_its_reservations_and_refuses_it(store):
    failed = Events()
    d = new_agent(
        PeerInfo("d0", "y", "decode"),
        store,
        torch.zeros(SHAPE),
        on_receive_failed=lambda rid, why: failed.add(rid, why),
    )
    dead = PeerInfo("p0", "y", "prefill")
    try:
        d.forget_peer(dead)
        d.expect(dead, 1, "r1", [1])
        assert failed.wait(1, timeout=3.0)[0][0] == "r1" and d.pending_transfers() == []
        assert "p0" not in d._channels
    finally:
        d.close()


def test_no_channel_to_a_forgotten_peer_is_formed_afterwards(store):
    """forget_peer and a send or reservation naming the peer race: the check that the peer is gone
    and the channel's creation are one step under the agent's lock, so no channel to the dead peer
    (a thread polling for it for good, with the chunk's buffer) is formed after the forget."""
    p = new_agent(PeerInfo("p0", "z", "prefill"), store, torch.randn(SHAPE))
    dead = PeerInfo("d0", "z", "decode")
    try:
        p.forget_peer(dead)
        p.connect(dead)
        assert p.channel(dead) is None and "d0" not in p._channels
        p.send_abort(dead, 1)  # nothing to dial
        assert "d0" not in p._channels
    finally:
        p.close()


def test_a_peer_forgotten_while_a_send_to_it_is_stuck_releases_the_chunks_queued_behind_it(store):
    """A peer that stops reading (a hung host: no connection reset comes) leaves the send thread
    stuck in a send; the chunks queued behind it kept their staging buffers until that send
    returned (its op timeout is 24 h)."""
    shape = (64, 2, 2, 16, 8, 64)  # 32 blocks are 4 MiB: more than the socket buffers hold
    acked = Events()
    p = new_agent(
        PeerInfo("p0", "h", "prefill"), store, torch.randn(shape), on_acked=lambda rid, ok: acked.add(rid, ok)
    )
    d = new_agent(PeerInfo("d0", "h", "decode"), store, torch.zeros(shape))
    try:
        d.expect(p.me, 0, "warm", [0])
        p.send_blocks(d.me, 0, "warm", 0, [1], chunk_index=0, last=True)
        assert acked.wait(1) == [("warm", True)]
        ch = p._channels["d0"]
        with d._lock:  # the decode side's receive thread stalls on its next chunk: it stops reading
            for tid in range(1, 6):
                p.send_blocks(d.me, tid, f"r{tid}", 0, list(range(32)), chunk_index=0, last=False)
            time.sleep(1.0)  # the behaviour under test: a peer that hangs a while (its send stays stuck)
            assert ch._queue.qsize() >= 2  # queued behind the stuck send, each with its buffer
            p.forget_peer(d.me)
            assert len(acked.wait(6)) == 6 and ch._queue.qsize() <= 1  # (at most the stop signal left)
        assert not any(ok for rid, ok in acked.items[1:])
    finally:
        p.close()
        d.close()


def test_a_pair_group_idle_longer_than_the_connect_timeout_still_carries_transfers(store):
    """The gloo group is built with the connect timeout (its rendezvous must not wait 24 h for a
    peer that died after writing its rows) and then waits for messages without one."""
    p, d, pp, dp, received, failed, _acked = make_pair(store, inc="idle")
    p.connect_timeout_s = d.connect_timeout_s = 0.5
    d.expect(pp, 1, "r1", [1])
    p.send_blocks(dp, 1, "r1", 0, [2], chunk_index=0, last=True, first_token=4)
    assert received.wait(1) == [("r1", 4)]
    time.sleep(1.5)  # the behaviour under test: idle past the connect timeout (both threads in a recv)
    d.expect(pp, 2, "r2", [3])
    p.send_blocks(dp, 2, "r2", 0, [5], chunk_index=0, last=True, first_token=6)
    assert received.wait(2) == [("r1", 4), ("r2", 6)] and not failed.items


def test_a_peer_that_died_after_writing_its_rows_is_let_go_when_it_is_known_dead(store):
    """It wrote its half of the rendezvous at a reservation, then died before gloo's: the other side's
    channel thread waited in gloo's rendezvous for the op timeout (24 h), which nothing can cancel.
    It now waits for the peer to say it is there *now*, where the router's word ends the wait."""
    from kv_transfer.pair_group import connect_store
    from kv_transfer.peer import pair_key

    acked = Events()
    p = new_agent(
        PeerInfo("p0", "w2", "prefill"),
        store,
        torch.randn(SHAPE),
        connect_timeout_s=1.0,
        on_acked=lambda rid, ok: acked.add(rid, ok),
    )
    dead = PeerInfo("d0", "w2", "decode")
    rows = f"{list(SHAPE[1:])} {torch.float32}"
    dist.PrefixStore(pair_key(p.me, dead), connect_store(store, 5)).set("rows/1", rows)
    try:
        assert p.send_blocks(dead, 1, "r1", 0, [1], chunk_index=0, last=True)
        time.sleep(1.5)  # the behaviour under test: past the connect timeout (a stalled peer is not given up on)
        assert not acked.items and not p.is_gone(dead)
        p.forget_peer(dead)
        assert acked.wait(1, timeout=3.0) == [("r1", False)]
        wait_until(lambda: _send_thread_ended(dead), 3.0, message="the send thread ended (not stuck in gloo)")
    finally:
        p.close()


def test_a_side_that_stalled_after_dialing_still_forms_the_pair(store):
    """The first side dialed, then stalled; the other arrived and waited longer than the connect
    timeout. Giving up then took a live peer for gone, for good."""
    p, d, pp, dp, received, _failed, acked = make_pair(store, inc="stall")
    p.connect_timeout_s = d.connect_timeout_s = 0.5
    from kv_transfer import pair_group

    real_wait, stalled = pair_group._wait_for, threading.Event()

    def slow_decode_wait(store_, key, cancelled, peer, *rest):  # the decode side stalls before it says "here"
        if key.startswith("rows/") and peer.role == "prefill":
            real_wait(store_, key, cancelled, peer, *rest)
            stalled.wait(2.0)
            return
        real_wait(store_, key, cancelled, peer, *rest)

    pair_group._wait_for = slow_decode_wait
    try:
        d.expect(pp, 1, "r1", [1])
        p.send_blocks(dp, 1, "r1", 0, [2], chunk_index=0, last=True, first_token=4)
        assert received.wait(1, timeout=8.0) == [("r1", 4)] and acked.wait(1, timeout=8.0) == [("r1", True)]
        assert not d.is_gone(pp) and not p.is_gone(dp)
    finally:
        pair_group._wait_for = real_wait


def _recv_threads(peer):
    return sum(t.name == f"kv-recv-{peer.key}" for t in threading.enumerate())


def _transfer(p, d, pp, dp, tid, received, acked):
    n_received, n_acked = len(received.items), len(acked.items)
    d.expect(pp, tid, f"r{tid}", [20, 21])
    assert p.send_blocks(dp, tid, f"r{tid}", 0, [tid, tid + 1], chunk_index=0, last=True, first_token=tid)
    assert received.wait(n_received + 1)[-1] == (f"r{tid}", tid)
    assert acked.wait(n_acked + 1)[-1] == (f"r{tid}", True)
    assert torch.equal(d.kv_cache[[20, 21]], p.kv_cache[[tid, tid + 1]])


def test_a_pair_whose_group_failed_while_both_live_forms_again(store):
    """A send error (here injected: both processes live) used to mark the peer gone for good: every
    later request between the two prefilled locally until one of them restarted."""
    p, d, pp, dp, received, failed, acked = make_pair(store, inc="sever")
    try:
        _transfer(p, d, pp, dp, 1, received, acked)
        p.faults.set(FaultSpec(sever_after_chunks=0))
        d.expect(pp, 2, "r2", [5, 6])
        p.send_blocks(dp, 2, "r2", 0, [1, 2], chunk_index=0, last=True, first_token=9)
        assert acked.wait(2)[-1] == ("r2", False)  # the sender let go of its blocks
        assert failed.wait(1)[0][0] == "r2" and d.pending_transfers() == []  # the receiver prefills locally
        assert not p.is_gone(dp) and not d.is_gone(pp)
        _transfer(p, d, pp, dp, 3, received, acked)  # over the pair's next group
        assert p.channel(dp).epoch == d.channel(pp).epoch == 1
        wait_until(
            lambda: _recv_threads(dp) == 1 and _recv_threads(pp) == 1, 5, message="the old group's threads ended"
        )
        assert torch.count_nonzero(d.kv_cache[[5, 6]]) == 0  # nothing of the failed transfer landed
    finally:
        p.close()
        d.close()


def test_a_failure_the_peers_group_did_not_see_reaches_it_through_the_store(store, monkeypatch):
    """NCCL does not fail the peer's receive when this side gives up its end: the peer learns from the
    failure this side records, through its watcher."""
    from kv_transfer.channel import Channel

    monkeypatch.setattr(Channel, "_tear_down", lambda self: None)  # neither side's group notices
    p, d, pp, dp, received, failed, acked = make_pair(store, inc="watch")
    try:
        _transfer(p, d, pp, dp, 1, received, acked)
        d.expect(pp, 2, "r2", [5, 6])
        p.channel(dp)._fail("injected: a stream out of sync", transient=True)
        assert failed.wait(1)[0] == ("r2", "p0@watch recorded the pair's failure: injected: a stream out of sync")
        _transfer(p, d, pp, dp, 3, received, acked)
        assert p.channel(dp).epoch == d.channel(pp).epoch == 1
    finally:
        monkeypatch.undo()  # so that closing ends the groups' receive threads
        p.close()
        d.close()


def test_a_peer_that_does_not_come_back_after_a_failure_is_gone(store):
    p, d, pp, dp, received, _failed, acked = make_pair(store, inc="noreturn")
    try:
        _transfer(p, d, pp, dp, 1, received, acked)
        p.connect_timeout_s = 1.0  # how long the next epoch waits for the peer
        d.close()  # its end of the group closes: to the prefill side, a failure like any other
        wait_until(
            lambda: p.channel(dp) is not None and p.channel(dp).epoch == 1, 5, message="the next epoch's channel"
        )
        assert p.send_blocks(dp, 2, "r2", 0, [1], chunk_index=0, last=True)  # queued for the new group
        assert acked.wait(2, timeout=5.0)[-1] == ("r2", False)
        assert p.is_gone(dp) and p.channel(dp) is None
    finally:
        p.close()


def test_a_pair_that_keeps_failing_before_carrying_anything_is_given_up(store):
    from kv_transfer.agent import MAX_IDLE_REFORMS

    p, d, pp, dp, received, _failed, acked = make_pair(store, inc="flap")
    try:
        _transfer(p, d, pp, dp, 1, received, acked)
        for i in range(1 + MAX_IDLE_REFORMS):  # the first failure follows a transfer; then none gets through
            assert not p.is_gone(dp)
            p.faults.set(FaultSpec(sever_after_chunks=0))
            assert p.send_blocks(dp, 10 + i, f"x{i}", 0, [1], chunk_index=0, last=True)
            assert acked.wait(2 + i)[-1] == (f"x{i}", False)
        wait_until(lambda: p.is_gone(dp) and d.is_gone(pp), 5, message="both sides giving up")
    finally:
        p.close()
        d.close()


def test_both_sides_of_a_re_formed_pair_agree_to_give_up(store):
    """A side whose bounded wait ran out used to give up alone: a peer arriving just after found its
    rows and went on to wait in gloo's rendezvous for the op timeout (24 h)."""
    from kv_transfer.pair_group import PairingTimedOut, connect_store, form_pair_group

    pp, dp = PeerInfo("p0", "late", "prefill"), PeerInfo("d0", "late", "decode")
    with pytest.raises(PairingTimedOut):
        form_pair_group(connect_store(store, 5), pp, dp, torch.device("cpu"), 5.0, "rows", epoch=1, join_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(PairingTimedOut):  # it sees the prefill side's rows, and the decision to give up
        form_pair_group(connect_store(store, 5), dp, pp, torch.device("cpu"), 5.0, "rows", epoch=1, join_timeout_s=5.0)
    assert time.monotonic() - t0 < 2.0
    results: dict[str, int | Exception] = {}

    def join(me: PeerInfo, peer: PeerInfo) -> None:
        try:
            results[me.role] = form_pair_group(
                connect_store(store, 5), me, peer, torch.device("cpu"), 5.0, "rows", epoch=2, join_timeout_s=5.0
            )[1]
        except Exception as e:  # noqa: BLE001 - what each side got is the test's subject
            results[me.role] = e

    threads = [threading.Thread(target=join, args=(pp, dp)), threading.Thread(target=join, args=(dp, pp))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {"prefill": 1, "decode": 0}  # both in time: the pair forms (peer ranks)
