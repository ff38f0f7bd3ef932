"""The order in which the transfer code uses its payload streams and events
(kv_transfer/streams.py): the calls the CUDA path makes, logged on the CPU over the NCCL-semantics
double. The payload send runs on the send stream after the gather's event; the receive, its
scatter and the event handed to the decode step run on the receive stream; the event the decode
worker waits on is the one recorded after the last scatter."""

import contextlib
import datetime
import threading

import torch
import torch.distributed as dist

from kv_transfer.agent import TransferAgent
from kv_transfer.data_plane import DataPlane
from kv_transfer.nccl_double import NcclSemantics
from kv_transfer.peer import PeerInfo, StoreAddress
from kv_transfer.streams import DONE, HostStreams, record_current
from tests.waiting import wait_until

SHAPE = (16, 2, 2, 4, 2, 8)


class _LoggedEvent:
    def __init__(self, inner, name, log):
        self.inner, self.name, self.log = inner, name, log

    def wait(self):
        self.log.append(f"wait {self.name}")
        self.inner.wait()

    def synchronize(self):
        self.log.append(f"synchronize {self.name}")
        self.inner.synchronize()


class _LoggedStreams:
    def __init__(self, inner, log):
        self.inner, self.log, self.n = inner, log, 0

    @contextlib.contextmanager
    def _on(self, name, ctx):
        self.log.append(f"on {name}")
        with ctx:
            yield
        self.log.append(f"off {name}")

    def sending(self):
        return self._on("send", self.inner.sending())

    def receiving(self):
        return self._on("recv", self.inner.receiving())

    def record(self):
        ev = _LoggedEvent(self.inner.record(), f"e{self.n}", self.log)
        self.n += 1
        self.log.append(f"record {ev.name}")
        return ev

    def keep_alive(self, tensor):
        self.log.append("keep_alive")
        self.inner.keep_alive(tensor)


def test_payload_work_runs_on_the_pair_streams_and_the_last_scatters_event_reaches_the_decode_step():
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20)
    )
    logs: dict[int, list[str]] = {0: [], 1: []}  # rank 0: prefill, 1: decode
    double = NcclSemantics(bound_s=5.0)

    def logged(store, prefix, rank, device):
        plane = double(store, prefix, rank, device)
        return DataPlane(plane.group, _LoggedStreams(plane.streams, logs[rank]), plane.close)

    store = StoreAddress("127.0.0.1", master.port)
    ready, done = [], threading.Event()
    p = TransferAgent(
        PeerInfo("p0", "ev", "prefill"),
        store,
        torch.randn(SHAPE),
        data_plane=logged,
        on_acked=lambda rid, ok: done.set(),
    )
    d = TransferAgent(
        PeerInfo("d0", "ev", "decode"),
        store,
        torch.zeros(SHAPE),
        data_plane=logged,
        on_received=lambda rid, tok, timing, lp: ready.append(timing.kv_ready),
    )
    try:
        d.expect(p.me, 1, "r1", [3, 4, 5])
        p.send_blocks(d.me, 1, "r1", 0, [7, 8], chunk_index=0, last=False)
        p.send_blocks(d.me, 1, "r1", 2, [9], chunk_index=1, last=True, first_token=2)
        wait_until(done.is_set, message="the transfer acknowledged")
        assert torch.equal(d.kv_cache[[3, 4, 5]], p.kv_cache[[7, 8, 9]])
        # Each chunk on the prefill side: sent on the send stream, kept alive there, and its staging
        # buffer handed back only after the host saw the send's event.
        chunk = ["on send", "keep_alive", "record e{0}", "off send", "synchronize e{0}"]
        assert logs[0] == [s.format(0) for s in chunk] + [s.format(1) for s in chunk]
        # Each chunk on the decode side: the receive is posted and its event recorded on the receive
        # stream; the scatter waits on that event, on the receive stream, and records its own. (The
        # CPU receive buffer is reused only once the previous payload it held has arrived.)
        assert logs[1] == [
            "on recv",
            "record e0",
            "off recv",
            "on recv",
            "wait e0",
            "record e1",
            "off recv",
            "on recv",
            "synchronize e0",
            "record e2",
            "off recv",
            "on recv",
            "wait e2",
            "record e3",
            "off recv",
        ]
        [kv_ready] = ready
        assert isinstance(kv_ready, _LoggedEvent)
        assert kv_ready.name == "e3"  # the last scatter's: what the decode step waits on
    finally:
        p.close()
        d.close()


def test_cpu_events_are_reached_at_once():
    assert record_current(torch.device("cpu")) is DONE
    streams = HostStreams()
    with streams.sending(), streams.receiving():
        ev = streams.record()
    ev.wait()
    ev.synchronize()
