"""The NCCL-semantics double (kv_transfer/nccl_double.py): what it enforces, that the old
single-group channel design fails under it while plain gloo hides the fault, and that an idle
pair of the two-plane design holds no data-plane operation."""

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from kv_transfer.agent import TransferAgent
from kv_transfer.data_plane import DataPlane, default_data_plane
from kv_transfer.nccl_double import NcclSemantics, NcclSemanticsGroup, NcclSemanticsViolation, violations
from kv_transfer.peer import PeerInfo, StoreAddress
from kv_transfer.wire import Header, Kind, empty_header
from tests.waiting import wait_until

CPU = torch.device("cpu")


@pytest.fixture
def master():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20))


def _client(master):
    return dist.TCPStore(
        "127.0.0.1", master.port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=20)
    )


def _pair(master, factory, prefix="pair") -> tuple[DataPlane, DataPlane]:
    """Both ranks of one data plane (gloo's rendezvous needs both at once: two threads)."""
    planes: dict[int, DataPlane] = {}
    threads = [
        threading.Thread(target=lambda r=r: planes.__setitem__(r, factory(_client(master), prefix, r, CPU)))
        for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return planes[0], planes[1]


def test_wait_never_blocks_the_host_and_reads_before_the_event_see_poison(master):
    a, b = _pair(master, NcclSemantics(bound_s=5.0))
    try:
        got = torch.zeros(4)
        group = b.group
        assert isinstance(group, NcclSemanticsGroup)
        work = group.recv([got], 0, 0)
        t0 = time.monotonic()
        work.wait()  # nothing was sent yet: on NCCL this only orders b's stream
        assert time.monotonic() - t0 < 0.5 and not work.is_completed()
        arrived = b.streams.record()
        assert torch.isnan(got).all()  # a host read before the event: poison, not data
        a.group.send([torch.arange(4.0)], 1, 0).wait()
        arrived.synchronize()
        assert torch.equal(got, torch.arange(4.0))
        header = empty_header(CPU)
        b.group.recv([header], 0, 0).wait()
        with pytest.raises(ValueError, match="out of sync"):  # a header read before its event
            Header.from_tensor(header)
        a.group.send([Header(Kind.ACK, 1).to_tensor(CPU)], 1, 0).wait()
        b.streams.record().synchronize()
        assert Header.from_tensor(header) == Header(Kind.ACK, 1)
    finally:
        a.close()
        b.close()
    assert violations(master) == []


def test_a_send_queued_behind_a_pending_receive_to_the_same_peer_waits_for_it(master):
    """a posts a receive, then a send; b posts the receive matching that send. gloo runs the two
    directions apart and b's receive completes; on NCCL a's send is queued behind a's receive on
    the one stream to b, whose match b could only issue behind its own pending receive: a hang,
    which the double reports within its bound."""
    plain = _pair(master, default_data_plane, prefix="gloo")
    try:
        kept = [plain[0].group.recv([torch.zeros(2)], 1, 0), plain[0].group.send([torch.ones(3)], 1, 0)]  # noqa: F841 (a dropped work cancels its operation)
        into_b = torch.zeros(3)
        plain[1].group.recv([into_b], 0, 0).wait()  # gloo: returns with the data
        assert torch.equal(into_b, torch.ones(3))
    finally:
        for plane in plain:
            plane.close()
    a, b = _pair(master, NcclSemantics(bound_s=0.5), prefix="double")
    try:
        a.group.recv([torch.zeros(2)], 1, 0).wait()  # issued first: a's stream waits on it
        a.group.send([torch.ones(3)], 1, 0).wait()  # queued behind it
        into_b = torch.zeros(3)
        b.group.recv([into_b], 0, 0).wait()
        with pytest.raises(NcclSemanticsViolation):
            b.streams.record().synchronize()
        assert torch.isnan(into_b).all()  # nothing arrived
        # a's watcher records its own stalled receive on its thread, maybe after b's raised
        wait_until(
            lambda: any("rank 0's recv #0" in v for v in violations(master)),
            timeout_s=5,
            message="rank 0's stalled receive to be recorded",
        )
    finally:
        a.close()
        b.close()


def test_an_operation_whose_peer_never_commits_fails_within_the_bound(master):
    a, b = _pair(master, NcclSemantics(bound_s=0.5))
    try:
        t0 = time.monotonic()
        a.group.recv([torch.zeros(1)], 1, 0).wait()
        with pytest.raises(NcclSemanticsViolation, match="without the peer committed to the matching send"):
            a.streams.record().synchronize()
        assert time.monotonic() - t0 < 3.0
        [why] = violations(master)
        assert "rank 0's recv #0" in why
    finally:
        a.close()
        b.close()


# -- the old design: one full-duplex group, a receive always posted, header and payload FIFO ----


def _old_design_transfer(prefill: DataPlane, decode: DataPlane) -> dict:
    """One KV chunk and its ACK over ONE group per pair, as the channel did before the control and
    data planes were split: each side's receive thread keeps a header receive posted, the
    sender ships the header then the payload behind it, the receiver answers ACK."""
    out: dict = {}
    rows = torch.arange(12.0).view(3, 4)

    def receive_loop(plane: DataPlane, peer: int, role: str, posted: threading.Event) -> None:
        buf = empty_header(CPU)
        try:
            while True:
                work = plane.group.recv([buf], peer, 0)
                posted.set()
                work.wait()
                plane.streams.record().synchronize()  # read only after its event: done right
                header = Header.from_tensor(buf)
                if header.kind is Kind.KV:
                    got = torch.empty(header.num_blocks, 4)
                    plane.group.recv([got], peer, 0).wait()
                    plane.streams.record().synchronize()
                    out["rows"] = got.clone()
                    plane.group.send([Header(Kind.ACK, header.transfer_id).to_tensor(CPU)], peer, 0).wait()
                elif header.kind is Kind.ACK:
                    out["acked"] = True
                    return
        except Exception as e:  # noqa: BLE001 - what ended the loop is the test's finding
            out[f"{role} error"] = e

    posted = [threading.Event(), threading.Event()]
    for plane, peer, role, ev in ((prefill, 1, "prefill", posted[0]), (decode, 0, "decode", posted[1])):
        threading.Thread(target=receive_loop, args=(plane, peer, role, ev), daemon=True).start()
    for ev in posted:
        ev.wait(5)
    prefill.group.send([Header(Kind.KV, 1, num_blocks=3).to_tensor(CPU)], 1, 0).wait()
    prefill.group.send([rows], 1, 0).wait()
    wait_until(
        lambda: "acked" in out or any(k.endswith("error") for k in out),
        timeout_s=15,
        message="the old design's transfer to end",
    )
    return out


def test_the_old_single_group_design_works_on_gloo_but_deadlocks_under_nccl_semantics(master):
    gloo = _pair(master, default_data_plane, prefix="gloo")
    try:
        out = _old_design_transfer(*gloo)
        assert out.get("acked") and torch.equal(out["rows"], torch.arange(12.0).view(3, 4))
    finally:
        for plane in gloo:
            plane.close()
    nccl_like = _pair(master, NcclSemantics(bound_s=1.0), prefix="double")
    try:
        t0 = time.monotonic()
        out = _old_design_transfer(*nccl_like)
        # The prefill side's header send sits behind its own always-posted receive, which no
        # send of the decode side will ever match: the stream deadlocks, and the double says so.
        # Both sides' receives then wait on sends that never run; whichever side's bound runs out
        # first reports it (the order is the host's scheduling, and either proves the deadlock).
        errors = {role: e for role, e in out.items() if role.endswith("error")}
        assert "acked" not in out and errors
        assert all(isinstance(e, NcclSemanticsViolation) for e in errors.values())
        assert time.monotonic() - t0 < 5.0
        flagged = {"prefill error": "rank 0's recv #0", "decode error": "rank 1's recv #0"}
        assert all(any(flagged[role] in v for v in violations(master)) for role in errors)
    finally:
        for plane in nccl_like:
            plane.close()


# -- the two-plane design under the double -------------------------------------------------------


def test_an_idle_pair_holds_no_data_plane_operation(master):
    """Past the double's bound with nothing to send: no payload operation is pending on either
    side (NCCL's watchdog would have nothing to time out) and none was flagged."""
    store = StoreAddress("127.0.0.1", master.port)
    plane = NcclSemantics(bound_s=0.5)
    received, acked = [], []
    p = TransferAgent(
        PeerInfo("p0", "i", "prefill"),
        store,
        torch.randn(16, 2, 2, 4, 2, 8),
        data_plane=plane,
        on_acked=lambda rid, ok: acked.append((rid, ok)),
    )
    d = TransferAgent(
        PeerInfo("d0", "i", "decode"),
        store,
        torch.zeros(16, 2, 2, 4, 2, 8),
        data_plane=plane,
        on_received=lambda rid, tok, timing, lp: received.append(rid),
    )
    try:
        for tid in (1, 2):
            d.expect(p.me, tid, f"r{tid}", [tid, tid + 4])
            p.send_blocks(d.me, tid, f"r{tid}", 0, [tid + 8], chunk_index=0, last=False)
            p.send_blocks(d.me, tid, f"r{tid}", 1, [tid + 10], chunk_index=1, last=True, first_token=3)
            wait_until(lambda: len(acked) == tid, message=f"transfer {tid} acknowledged")
            assert torch.equal(d.kv_cache[[tid, tid + 4]], p.kv_cache[[tid + 8, tid + 10]])
        groups = [p.channel(d.me).data_plane.group, d.channel(p.me).data_plane.group]
        wait_until(lambda: all(g.pending() == 0 for g in groups), message="the payload operations done")
        time.sleep(1.0)  # the behaviour under test: idle for twice the bound
        assert [g.pending() for g in groups] == [0, 0] and violations(master) == []
        assert acked == [("r1", True), ("r2", True)] and received == ["r1", "r2"]
    finally:
        p.close()
        d.close()
