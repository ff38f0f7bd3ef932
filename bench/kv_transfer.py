"""KV transfer throughput and per-request latency between two Ray actors (gloo on CPU, NCCL on GPU).

For each prompt length, the sending actor ships the prompt's blocks (SmolLM2-135M geometry by
default) through ``TransferAgent`` exactly as a prefill worker does — chunks of
``chunk_tokens`` gathered from a block-major cache, header + payload, scattered into reserved
blocks, acknowledged — and the latency is send start → acknowledgement. Baselines measured in the
same run between the same two actors: one raw ``send``/``recv`` of a contiguous tensor of the same
size over the same kind of pair group (the wire ceiling), and a local memcpy of that size. A
second pair with shared-memory caches measures the local path (kv_transfer/local_kv.py: block ids
on the wire, the receiver copies from the sender's cache).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import threading
import time

import ray
import torch
import torch.distributed as dist

from kv_transfer.agent import TransferAgent
from kv_transfer.local_kv import locality
from kv_transfer.pair_group import connect_store, form_pair_group
from kv_transfer.peer import PeerInfo, StoreAddress

# SmolLM2-135M: 30 layers, 3 KV heads of 64, fp32 -> 46 KB of KV per token.
DEFAULT_GEOMETRY = dict(layers=30, kv_heads=3, head_dim=64, block_size=16)


class BenchPeer:
    def __init__(self, role: str, store: StoreAddress, num_blocks: int, geometry: dict, shared: bool = False) -> None:
        torch.set_num_threads(1)
        g = geometry
        shape = (num_blocks, g["layers"], 2, g["block_size"], g["kv_heads"], g["head_dim"])
        self.segment = None
        if shared:
            from multiprocessing import shared_memory

            self.segment = shared_memory.SharedMemory(create=True, size=int(torch.tensor(shape).prod()) * 4)
            self.kv = torch.frombuffer(self.segment.buf, dtype=torch.float32).view(shape)
            if role == "prefill":
                self.kv.copy_(torch.randn(shape))
        else:
            self.kv = torch.randn(shape) if role == "prefill" else torch.zeros(shape)
        where = locality(self.kv, self.segment.name) if shared else ""
        self.peer = PeerInfo(f"bench-{role}", "shm" if shared else "x", role, locality=where)
        self.role = role
        self.store = store
        self.done = threading.Condition()
        self.acked: dict[str, float] = {}
        self.agent = TransferAgent(self.peer, store, self.kv, on_received=self._received,
                                   on_acked=self._acked, kv_segment_name=self.segment.name if shared else None)
        self.raw_group = None

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

    def _received(self, rid: str, tok: int, timing) -> None:
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
        t = torch.empty(num_bytes // 4, dtype=torch.float32)
        t0 = time.perf_counter()
        if send:
            self.raw_group.send([t], self.raw_peer, 1).wait()
            self.raw_group.recv([torch.empty(1)], self.raw_peer, 2).wait()  # round trip, like the ack
        else:
            self.raw_group.recv([t], self.raw_peer, 1).wait()
            self.raw_group.send([torch.ones(1)], self.raw_peer, 2).wait()
        return time.perf_counter() - t0


def run(lengths: list[int], repeats: int = 5, chunk_tokens: int = 2048, geometry: dict | None = None) -> dict:
    g = geometry or DEFAULT_GEOMETRY
    bs = g["block_size"]
    block_bytes = g["layers"] * 2 * bs * g["kv_heads"] * g["head_dim"] * 4
    max_blocks = max(lengths) // bs + 1
    own = not ray.is_initialized()
    if own:
        ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    store = StoreAddress("127.0.0.1", master.port)
    cls = ray.remote(num_cpus=1)(BenchPeer)
    p, d = cls.remote("prefill", store, max_blocks, g), cls.remote("decode", store, max_blocks, g)
    pi, di = ray.get([p.info.remote(), d.info.remote()])
    ray.get([p.connect.remote(di), d.connect.remote(pi)])
    ray.get([p.connect_raw.remote(di), d.connect_raw.remote(pi)])
    # The local path: a second pair whose caches live in shared memory on this host.
    lp, ld = cls.remote("prefill", store, max_blocks, g, True), cls.remote("decode", store, max_blocks, g, True)
    lpi, ldi = ray.get([lp.info.remote(), ld.info.remote()])
    ray.get([lp.connect.remote(ldi), ld.connect.remote(lpi)])
    results = []
    tid = 0
    for length in lengths:
        n = -(-length // bs)
        nbytes = n * block_bytes
        lat, raw, copy, local = [], [], [], []
        src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
        for r in range(repeats + 1):  # the first round warms up
            tid += 1
            rid = f"len{length}-{r}"
            ray.get(d.expect.remote(pi, tid, rid, list(range(n))))
            t = ray.get(p.ship.remote(di, tid, rid, n, max(1, chunk_tokens // bs)))
            ray.get(ld.expect.remote(lpi, tid, rid, list(range(n))))
            tl = ray.get(lp.ship.remote(ldi, tid, rid, n, max(1, chunk_tokens // bs)))
            rs, _ = ray.get([p.raw.remote(nbytes, True), d.raw.remote(nbytes, False)])
            t0 = time.perf_counter()
            dst.copy_(src)
            c = time.perf_counter() - t0
            if r:
                local.append(tl)
                lat.append(t)
                raw.append(rs)
                copy.append(c)
        ms = statistics.median(lat)
        results.append({
            "prompt_tokens": length,
            "blocks": n,
            "bytes": nbytes,
            "latency_ms_median": ms * 1e3,
            "throughput_gb_s": nbytes / ms / 1e9,
            "raw_send_recv_ms_median": statistics.median(raw) * 1e3,
            "raw_send_recv_gb_s": nbytes / statistics.median(raw) / 1e9,
            "memcpy_gb_s": nbytes / statistics.median(copy) / 1e9,
            "fraction_of_raw": statistics.median(raw) / ms,
            "local_latency_ms_median": statistics.median(local) * 1e3,
            "local_throughput_gb_s": nbytes / statistics.median(local) / 1e9,
            "local_speedup": ms / statistics.median(local),
        })
    ray.get([lp.release.remote(), ld.release.remote()])
    for a in (p, d, lp, ld):
        ray.kill(a)
    if own:
        ray.shutdown()
    return {"backend": "gloo (CPU)", "geometry": g, "chunk_tokens": chunk_tokens, "repeats": repeats,
            "results": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="256,1024,4096")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = run([int(x) for x in a.lengths.split(",")], a.repeats, a.chunk_tokens)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        for x in r["results"]:
            print(f"{x['prompt_tokens']:5d} tokens ({x['bytes'] / 2**20:6.1f} MiB): {x['latency_ms_median']:7.1f} ms, "
                  f"{x['throughput_gb_s']:.2f} GB/s; raw send/recv {x['raw_send_recv_gb_s']:.2f} GB/s "
                  f"({x['fraction_of_raw'] * 100:.0f}% of it); memcpy {x['memcpy_gb_s']:.1f} GB/s; local path "
                  f"{x['local_latency_ms_median']:.1f} ms ({x['local_speedup']:.1f}x faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
