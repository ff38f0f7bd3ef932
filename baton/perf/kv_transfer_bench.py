"""KV transfer throughput and per-request latency between two actors (gloo on CPU, NCCL between GPUs).

For each prompt length, the sending actor ships the prompt's blocks (SmolLM2-135M geometry by
default) through ``TransferAgent`` exactly as a prefill worker does — chunks of
``chunk_tokens`` gathered from a block-major cache, header + payload, scattered into reserved
blocks, acknowledged — and the latency is send start → acknowledgement. Baselines measured in the
same run between the same two actors: one raw ``send``/``recv`` of a contiguous tensor of the same
size over the same kind of pair group (the wire ceiling), and a copy of that size on the device
(memcpy; device-to-device on CUDA). A second pair whose caches the receiver can map measures the
local path (kv_transfer/local_kv.py: block ids on the wire, the receiver copies from the sender's
cache): shared memory on CPU, CUDA IPC for two workers on one GPU.

    python -m baton.perf.kv_transfer_bench [--json]                         # CPU, two Ray actors
    python -m baton.perf.kv_transfer_bench --device cuda --no-ray --json    # a GPU machine without Ray

``--device cuda`` on one GPU measures the IPC path only (NCCL refuses two ranks on one device); with
two GPUs it adds the NCCL path between them. ``--no-ray`` runs the two peers as spawned processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from baton.perf.kv_transfer_sizes import GEOMETRIES, check_args
from kv_transfer.agent import TransferAgent
from kv_transfer.local_kv import locality
from kv_transfer.pair_group import PairGroup, connect_store, form_pair_group
from kv_transfer.peer import PeerInfo, StoreAddress


class BenchPeer:
    def __init__(
        self,
        role: str,
        store: StoreAddress,
        num_blocks: int,
        geometry: dict,
        shared: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        torch.set_num_threads(1)
        g = geometry
        shape = (num_blocks, g["layers"], 2, g["block_size"], g["kv_heads"], g["head_dim"])
        dt = getattr(torch, dtype)
        self.device = torch.device(device)
        self.segment = None
        if shared and self.device.type == "cpu":
            from multiprocessing import shared_memory

            size = math.prod(shape) * dt.itemsize
            self.segment = shared_memory.SharedMemory(create=True, size=size)
            self.kv = torch.frombuffer(self.segment.buf, dtype=dt).view(shape)
            if role == "prefill":
                self.kv.copy_(torch.randn(shape))
        elif role == "prefill":
            self.kv = torch.randn(shape, device=self.device).to(dt)
        else:
            self.kv = torch.zeros(shape, dtype=dt, device=self.device)
        # A CUDA cache is always mappable by a peer on the same GPU (IPC); a CPU one only in /dev/shm.
        where = locality(self.kv, self.segment.name if self.segment else None) if shared else ""
        self.peer = PeerInfo(f"bench-{role}", "shm" if shared else "x", role, locality=where)
        self.role = role
        self.store = store
        self.done = threading.Condition()
        self.acked: dict[str, float] = {}
        self.agent = TransferAgent(
            self.peer,
            store,
            self.kv,
            on_received=self._received,
            on_acked=self._acked,
            kv_segment_name=self.segment.name if self.segment else None,
        )
        self.raw_group: PairGroup | None = None
        self._raw_buffers: dict[int, torch.Tensor] = {}

    def info(self) -> PeerInfo:
        return self.peer

    def connect(self, other: PeerInfo) -> None:
        self.agent.connect(other)

    def connect_raw(self, other: PeerInfo) -> None:
        raw_me = PeerInfo(self.peer.worker_id, "raw", self.role)
        raw_other = PeerInfo(other.worker_id, "raw", other.role)
        store = connect_store(self.store, 30)
        self.raw_group, self.raw_peer = form_pair_group(store, raw_me, raw_other, self.kv.device, 30)

    def expect(self, other: PeerInfo, tid: int, rid: str, blocks: list[int]) -> None:
        self.agent.expect(other, tid, rid, blocks)

    def _received(self, rid: str, tok: int, timing, logprob) -> None:
        pass

    def _acked(self, rid: str, ok: bool) -> None:
        with self.done:
            self.acked[rid] = time.perf_counter()
            self.done.notify_all()

    def ship(self, other: PeerInfo, tid: int, rid: str, num_blocks: int, chunk_blocks: int) -> float:
        """Send ``num_blocks`` in chunks; seconds from the first send to the acknowledgement."""
        t0 = time.perf_counter()
        for i, start in enumerate(range(0, num_blocks, chunk_blocks)):
            ids = list(range(start, min(num_blocks, start + chunk_blocks)))
            last = start + chunk_blocks >= num_blocks
            self.agent.send_blocks(other, tid, rid, start, ids, chunk_index=i, last=last, first_token=7)
        with self.done:
            self.done.wait_for(lambda: rid in self.acked, timeout=120)
        return self.acked[rid] - t0

    def release(self) -> None:
        self.agent.close()
        if self.segment is not None:
            self.segment.unlink()

    def raw(self, num_bytes: int, send: bool) -> float:
        dev = self.device
        # One buffer per size, touched before timing: page faults are not the wire's cost (Baton's
        # receiver reuses its buffer too).
        t = self._raw_buffers.get(num_bytes)
        if t is None:
            t = self._raw_buffers[num_bytes] = torch.zeros(num_bytes // 4, dtype=torch.float32, device=dev)
        group = self.raw_group
        assert group is not None, "connect_raw first"
        t0 = time.perf_counter()
        if send:
            group.send([t], self.raw_peer, 1).wait()
            group.recv([torch.empty(1, device=dev)], self.raw_peer, 2).wait()  # round trip, like the ack
        else:
            group.recv([t], self.raw_peer, 1).wait()
            group.send([torch.ones(1, device=dev)], self.raw_peer, 2).wait()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # NCCL's wait() only orders streams
        return time.perf_counter() - t0


class _Actors:
    """Starts bench peers and calls them: as Ray actors, or as spawned processes where Ray is not
    installed (baton/perf/proc_actor.py). Calls in one ``get`` run at the same time."""

    def __init__(self, use_ray: bool) -> None:
        self.use_ray, self._own_ray = use_ray, False
        self._started: list[Any] = []  # Any: Ray actor handles or ProcActors, both called by their methods' names
        if use_ray:
            import ray

            self._ray = ray
            if not ray.is_initialized():
                ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
                self._own_ray = True
            self._cls = ray.remote(num_cpus=1)(BenchPeer)

    def start(self, *args):
        from baton.perf.proc_actor import ProcActor

        h = self._cls.remote(*args) if self.use_ray else ProcActor(BenchPeer, *args)
        self._started.append(h)
        return h

    def call(self, h, method: str, *args):
        return getattr(h, method).remote(*args) if self.use_ray else h.call(method, *args)

    def get(self, calls: list):
        from baton.perf.proc_actor import gather

        return self._ray.get(calls) if self.use_ray else gather(calls)

    def stop(self) -> None:
        for h in self._started:
            self._ray.kill(h) if self.use_ray else h.stop()
        if self._own_ray:
            self._ray.shutdown()


def _copy_seconds(src: torch.Tensor, dst: torch.Tensor, copies: int = 10) -> float:
    """One copy (memcpy on CPU, device-to-device on CUDA). On CUDA the mean of ``copies`` copies
    between two events: timed from the host, one copy of a few MB is mostly launch and sync."""
    if src.device.type != "cuda":
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(copies):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / copies


def run(
    lengths: list[int],
    repeats: int = 5,
    chunk_tokens: int = 2048,
    geometry: dict | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    use_ray: bool = True,
) -> dict:
    """The wire path (gloo on CPU; NCCL between two GPUs) against a raw send/recv, and the local
    path (shared memory on CPU; CUDA IPC on one GPU) against a copy on the device."""
    g = geometry or GEOMETRIES["smollm2-135m"]  # fp32: 46 KB of KV a token
    dev = torch.device(device)
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    bs = g["block_size"]
    block_bytes = g["layers"] * 2 * bs * g["kv_heads"] * g["head_dim"] * getattr(torch, dtype).itemsize
    max_blocks = max(lengths) // bs + 1
    if dev.type == "cuda":
        # NCCL refuses two ranks on one GPU: the wire path needs a second one.
        wire_devices = ("cuda:0", "cuda:1") if torch.cuda.device_count() >= 2 else None
        local_device = "cuda:0"
    else:
        wire_devices, local_device = ("cpu", "cpu"), "cpu"
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    store = StoreAddress("127.0.0.1", master.port)
    actors = _Actors(use_ray)
    # This process works on one thread, as the peers do: a parallel copy or randn here would leave
    # its pool's threads spinning on a core the peers need for the next transfer (on 2 cores that
    # made the local path's small transfers ~5x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if wire_devices:
            p = actors.start("prefill", store, max_blocks, g, False, wire_devices[0], dtype)
            d = actors.start("decode", store, max_blocks, g, False, wire_devices[1], dtype)
            pi, di = actors.get([actors.call(p, "info"), actors.call(d, "info")])
            actors.get([actors.call(p, "connect", di), actors.call(d, "connect", pi)])
            actors.get([actors.call(p, "connect_raw", di), actors.call(d, "connect_raw", pi)])
        # The local path: a second pair whose caches the receiver maps (/dev/shm, or CUDA IPC).
        lp = actors.start("prefill", store, max_blocks, g, True, local_device, dtype)
        ld = actors.start("decode", store, max_blocks, g, True, local_device, dtype)
        lpi, ldi = actors.get([actors.call(lp, "info"), actors.call(ld, "info")])
        actors.get([actors.call(lp, "connect", ldi), actors.call(ld, "connect", lpi)])
        results = []
        tid = 0
        for length in lengths:
            n = -(-length // bs)
            nbytes = n * block_bytes
            lat, raw, copy, local = [], [], [], []
            src = torch.randn(nbytes // 4, device=local_device)
            dst = torch.empty_like(src)
            for r in range(repeats + 1):  # the first round warms up
                tid += 1
                rid = f"len{length}-{r}"
                if wire_devices:
                    actors.get([actors.call(d, "expect", pi, tid, rid, list(range(n)))])
                    (t,) = actors.get([actors.call(p, "ship", di, tid, rid, n, max(1, chunk_tokens // bs))])
                    rs, _ = actors.get([actors.call(p, "raw", nbytes, True), actors.call(d, "raw", nbytes, False)])
                actors.get([actors.call(ld, "expect", lpi, tid, rid, list(range(n)))])
                (tl,) = actors.get([actors.call(lp, "ship", ldi, tid, rid, n, max(1, chunk_tokens // bs))])
                c = _copy_seconds(src, dst)
                if r:
                    local.append(tl)
                    copy.append(c)
                    if wire_devices:
                        lat.append(t)
                        raw.append(rs)
            ms, lms, cs = (statistics.median(lat) if lat else None), statistics.median(local), statistics.median(copy)
            results.append(
                {
                    "prompt_tokens": length,
                    "blocks": n,
                    "bytes": nbytes,
                    "latency_ms_median": ms * 1e3 if ms else None,
                    "throughput_gb_s": nbytes / ms / 1e9 if ms else None,
                    "raw_send_recv_ms_median": statistics.median(raw) * 1e3 if raw else None,
                    "raw_send_recv_gb_s": nbytes / statistics.median(raw) / 1e9 if raw else None,
                    "memcpy_gb_s": nbytes / cs / 1e9,  # bytes copied a second (a D2D copy on CUDA)
                    "fraction_of_raw": statistics.median(raw) / ms if ms else None,
                    "local_latency_ms_median": lms * 1e3,
                    "local_throughput_gb_s": nbytes / lms / 1e9,
                    "local_fraction_of_copy": cs / lms,
                    "local_speedup": ms / lms if ms else None,
                }
            )
        pairs = [lp, ld] + ([p, d] if wire_devices else [])
        actors.get([actors.call(a, "release") for a in pairs])
    finally:
        actors.stop()
        torch.set_num_threads(threads)
    if dev.type == "cuda":
        backend = (
            "NCCL between two GPUs, CUDA IPC on one" if wire_devices else "CUDA IPC on one GPU (one GPU: no NCCL pair)"
        )
        name = torch.cuda.get_device_name(0)
    else:
        backend, name = "gloo (CPU)", "cpu"
    return {
        "backend": backend,
        "device": name,
        "dtype": dtype,
        "geometry": g,
        "chunk_tokens": chunk_tokens,
        "repeats": repeats,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="256,1024,4096")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (CUDA IPC on one GPU; NCCL too with two)")
    ap.add_argument("--geometry", default="smollm2-135m", choices=sorted(GEOMETRIES))
    ap.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="KV dtype (default: float32 on CPU, bfloat16 on CUDA)",
    )
    ap.add_argument("--no-ray", action="store_true", help="peers in spawned processes instead of Ray actors")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        lengths = check_args(a.lengths, a.repeats, a.chunk_tokens, a.device, a.geometry, a.dtype)
    except ValueError as e:
        ap.error(str(e))
    r = run(lengths, a.repeats, a.chunk_tokens, GEOMETRIES[a.geometry], a.device, a.dtype, use_ray=not a.no_ray)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        for x in r["results"]:
            wire = (
                f"{x['latency_ms_median']:7.1f} ms, {x['throughput_gb_s']:.2f} GB/s; raw send/recv "
                f"{x['raw_send_recv_gb_s']:.2f} GB/s ({x['fraction_of_raw'] * 100:.0f}% of it)"
                if x["latency_ms_median"]
                else "no wire path"
            )
            print(
                f"{x['prompt_tokens']:5d} tokens ({x['bytes'] / 2**20:6.1f} MiB): {wire}; copy "
                f"{x['memcpy_gb_s']:.1f} GB/s; local path {x['local_latency_ms_median']:.1f} ms, "
                f"{x['local_throughput_gb_s']:.2f} GB/s ({x['local_fraction_of_copy'] * 100:.0f}% of the copy)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
