"""For a machine with two GPUs (none of this project's borrowed machines has two, so it has not run):
a prefill worker on cuda:0 and a decode worker on cuda:1, in two processes, the KV over NCCL;
greedy output equal to the colocated engine, every payload operation issued on the pair's own
payload streams (never a default stream: where NCCL binds its communicator), and the transfer's
throughput against a cuda:0 -> cuda:1 device copy of the same bytes.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check_2gpu --json

Exits 0 saying so where fewer than two GPUs are visible. The same machine then runs the tensor
parallel check (Llama-3.1-8B's configuration, random weights, TP 2 against TP 1: decode step times
and offline throughput; bench/gpu_check_tp.py):

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check_tp --json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from kv_transfer.data_plane import DataPlane, default_data_plane

_BAD_KEY = "gpu_check_2gpu/default_stream_ops"
_OPS_KEY = "gpu_check_2gpu/payload_ops"


class _StreamCheckedGroup:
    """A payload group that counts, in the rendezvous store, its operations and those issued on a
    default stream (NCCL binds a communicator to the stream its first operation runs on)."""

    def __init__(self, inner, store: dist.Store, device: torch.device) -> None:
        self._inner, self._store, self._device = inner, store, device

    def _check(self) -> None:
        self._store.add(_OPS_KEY, 1)
        if torch.cuda.current_stream(self._device) == torch.cuda.default_stream(self._device):
            self._store.add(_BAD_KEY, 1)

    def send(self, tensors, dst, tag, /):
        self._check()
        return self._inner.send(tensors, dst, tag)

    def recv(self, tensors, src, tag, /):
        self._check()
        return self._inner.recv(tensors, src, tag)

    def abort(self) -> None:
        self._inner.abort()


@dataclass(frozen=True)
class StreamCheckedNccl:
    """A ``DataPlaneFactory``: the real NCCL data plane, its operations' streams counted in the
    store at ``port`` on this host (picklable: it crosses into the worker processes)."""

    port: int

    def __call__(self, store: dist.Store, prefix: str, rank: int, device: torch.device) -> DataPlane:
        plane = default_data_plane(store, prefix, rank, device)
        counts = dist.TCPStore("127.0.0.1", self.port, is_master=False)
        return DataPlane(_StreamCheckedGroup(plane.group, counts, device), plane.streams, plane.close)


def stream_counts(store: dist.Store) -> dict[str, int]:
    return {"payload_ops": store.add(_OPS_KEY, 0), "on_default_stream": store.add(_BAD_KEY, 0)}


def device_copy_gb_s(nbytes: int, iters: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    dst.copy_(src)
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    return nbytes * iters / (time.perf_counter() - t0) / 1e9


def run(model_dir: str) -> dict:
    import datetime

    from bench import disagg_check

    counts = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    report = disagg_check.run(
        model_dir, "cuda:0", devices=("cuda:0", "cuda:1"), worker_kwargs={"data_plane": StreamCheckedNccl(counts.port)}
    )
    report |= stream_counts(counts)
    seconds = (report["transfer_ms_median"] or 0) / 1e3
    per_transfer = report["transfer_bytes"] / max(report["transfers_completed"], 1)
    report["transfer_gb_s"] = round(per_transfer / seconds / 1e9, 3) if seconds else None
    report["device_copy_gb_s"] = round(device_copy_gb_s(max(int(per_transfer), 1 << 20)), 3)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model directory (default: the seeded tiny model, built here)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print(f"bench.gpu_check_2gpu: {torch.cuda.device_count()} GPU(s) visible; this check needs two.")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from engine.model.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny-seed0", seed=0))
        report = run(model)
    report["ok"] = (
        report["greedy_equal_to_colocated"]
        and report["transfers_failed"] == 0
        and report["kv_path"] == "wire"
        and report["payload_ops"] > 0
        and report["on_default_stream"] == 0
    )
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
