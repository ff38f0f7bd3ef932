"""Kept for GPU issues (gpu_check runs it): the transfer protocol's payload work on one GPU, where NCCL
cannot pair two ranks. A prefill and a decode transfer agent with CUDA KV caches (one process, two
ranks of one pair, the wire path) ship blocks through a data plane that carries the payload over
gloo staged through the host, on the pair's real CUDA send/receive streams, and records the stream
each payload operation was issued on: the ones NCCL would bind its communicators to. Every one must
be the pair's own payload stream (sends on the send stream, receives on the receive stream),
never a default stream, and the received blocks must equal the sent ones.

    python -m bench.gpu_check_payload_streams --json      # CUDA only; says so and exits 0 elsewhere
"""

from __future__ import annotations

import argparse
import datetime
import json
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kv_transfer.data_plane import DataPlane
from kv_transfer.pair_group import OP_TIMEOUT, as_pair_group, tear_down_group
from kv_transfer.streams import CudaStreams

SHAPE = (64, 4, 2, 16, 2, 64)  # [blocks, layers, 2, block_size, kv_heads, head_dim]


class _StagedWork:
    def __init__(self, inner, after=None) -> None:
        self._inner, self._after = inner, after

    def wait(self, timeout: object = None) -> bool:
        self._inner.wait()
        if self._after is not None:
            self._after()  # the received bytes go to the device on the caller's current stream
        return True


class _StreamLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: list[tuple[str, str]] = []  # (op, which stream it was issued on)


class _RecordingStagedGroup:
    """Payload ops over gloo, staged through the host, each logged with the stream current at issue."""

    def __init__(self, inner, streams: CudaStreams, log: _StreamLog) -> None:
        self._inner, self._streams, self._log = inner, streams, log

    def _which(self) -> str:
        cur = torch.cuda.current_stream(self._streams.device)
        for name, s in (
            ("send", self._streams.send_stream),
            ("recv", self._streams.recv_stream),
            ("default", torch.cuda.default_stream(self._streams.device)),
        ):
            if cur == s:
                return name
        return "other"

    def send(self, tensors, dst, tag, /):
        with self._log.lock:
            self._log.ops.append(("send", self._which()))
        return self._inner.send([t.cpu() for t in tensors], dst, tag)

    def recv(self, tensors, src, tag, /):
        with self._log.lock:
            self._log.ops.append(("recv", self._which()))
        host = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        work = self._inner.recv(host, src, tag)
        return _StagedWork(work, lambda: [t.copy_(h) for t, h in zip(tensors, host)])

    def abort(self) -> None:
        self._inner.abort()


@dataclass
class RecordingPlane:
    """A ``DataPlaneFactory`` for one process: gloo payloads, real CUDA payload streams, logged."""

    log: _StreamLog = field(default_factory=_StreamLog)

    def __call__(self, store: dist.Store, prefix: str, rank: int, device: torch.device) -> DataPlane:
        group = as_pair_group(dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, OP_TIMEOUT))
        streams = CudaStreams(device)
        return DataPlane(
            _RecordingStagedGroup(group, streams, self.log),
            streams,
            lambda: tear_down_group(group, 1 - rank, torch.device("cpu")),
        )


def run(timeout_s: float = 60.0) -> dict:
    from kv_transfer.agent import TransferAgent
    from kv_transfer.peer import PeerInfo, StoreAddress

    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )
    plane = RecordingPlane()
    store = StoreAddress("127.0.0.1", master.port)
    done = threading.Event()
    src = torch.randn(SHAPE, device="cuda")
    p = TransferAgent(
        PeerInfo("p0", "gpu-check", "prefill"), store, src, data_plane=plane, on_acked=lambda rid, ok: done.set()
    )
    d = TransferAgent(
        PeerInfo("d0", "gpu-check", "decode"),
        store,
        torch.zeros(SHAPE, device="cuda"),
        data_plane=plane,
        on_received=lambda *a: None,
    )
    try:
        d.expect(p.me, 1, "r1", [3, 4, 5, 6])
        p.send_blocks(d.me, 1, "r1", 0, [7, 8], chunk_index=0, last=False)
        p.send_blocks(d.me, 1, "r1", 2, [9, 10], chunk_index=1, last=True, first_token=2)
        if not done.wait(timeout_s):
            raise TimeoutError(f"the transfer was not acknowledged in {timeout_s:.0f} s")
        torch.cuda.synchronize()
        equal = torch.equal(d.kv_cache[[3, 4, 5, 6]], p.kv_cache[[7, 8, 9, 10]])
    finally:
        p.close()
        d.close()
    ops = list(plane.log.ops)
    return {
        "payload_ops": ops,
        "received_equal_sent": equal,
        "all_on_their_payload_stream": bool(ops) and all(op == where for op, where in ops),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_check_payload_streams: CUDA is not available; nothing to check here.")
        return 0
    report = run()
    report["ok"] = report["received_equal_sent"] and report["all_on_their_payload_stream"]
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
