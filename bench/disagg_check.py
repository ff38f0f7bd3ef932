"""Kept for GPU issues (gpu_check runs it): disaggregated prefill/decode on one device, token for token.

Disaggregated serving without Ray: a prefill worker and a decode worker in two spawned processes
on one device, the KV over the local path (CUDA IPC on one GPU; shared memory on CPU), checked
token for token against the colocated engine in this process.

The GPU machines this project borrows have torch and Triton but no Ray (baton/perf/proc_actor.py), so
this drives the workers' own API the way the router does — ``reserve`` on the decode worker,
``prefill`` on the prefill worker, ``poll`` for the outputs — and checks what the Ray tests check
on CPU: greedy equality with chunked prefill (several chunks a prompt), a shared prefix that ships
fewer blocks the second time, and both workers back to all-free blocks.

    python -m bench.disagg_check --json            # CUDA when available, else CPU + shared memory
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from baton.perf.proc_actor import ProcActor, gather
from decode_worker.worker import DecodeWorker
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from kv_transfer.peer import StoreAddress
from prefill_worker.messages import PrefillTask
from prefill_worker.worker import PrefillWorker


def _prompts(seed: int, n: int, vocab: int, prefix_len: int) -> list[list[int]]:
    """``n`` prompts of mixed lengths; the first two share a ``prefix_len``-token prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 200))]
        out.append(prefix + tail if i < 2 else tail)
    return out


def _engine_config(
    model: str, device: str, block_size: int, chunk: int, shared: bool, gpu_fraction: float | None = None
) -> EngineConfig:
    """``gpu_fraction``: the worker shares the GPU and sizes its KV from that share by a profiling
    pass (engine/kv_memory.py) instead of a fixed 256 blocks."""
    # fp32 everywhere: colocated and disaggregated must pick the same greedy tokens.
    cache = (
        CacheConfig(block_size=block_size, num_blocks=256, shared_memory=shared)
        if gpu_fraction is None
        else CacheConfig(block_size=block_size, gpu_fraction=gpu_fraction, shared_memory=shared)
    )
    return EngineConfig(
        model=model,
        device=device,
        dtype="float32",
        scheduler=SchedulerConfig(max_num_batched_tokens=chunk),
        cache=cache,
    )


def _serve(
    prefill: ProcActor, decode: ProcActor, prefill_peer, decode_peer, specs: list[RequestSpec], timeout_s: float
) -> dict[str, dict]:
    """Reserve + prefill every spec, then poll the decode worker until each has finished."""
    skips = {}
    for spec in specs:
        res = decode.call("reserve", spec, prefill_peer).result()
        if not res.accepted:
            raise RuntimeError(f"reserve refused {spec.request_id}: {res.reason}")
        skips[spec.request_id] = res.num_cached_blocks
        prefill.call("prefill", PrefillTask(spec, decode_peer, res.transfer_id, res.num_cached_blocks)).result()
    done: dict[str, dict] = {}
    transfer_s: dict[str, float] = {}  # on the output carrying the first token
    deadline = time.monotonic() + timeout_s
    while len(done) < len(specs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"finished {len(done)} of {len(specs)} requests in {timeout_s:.0f} s")
        for out in decode.call("poll", 0.5).result().outputs:
            if out.ttft_breakdown and "transfer" in out.ttft_breakdown:
                transfer_s[out.request_id] = out.ttft_breakdown["transfer"]
            if out.finished:
                done[out.request_id] = {
                    "token_ids": list(out.token_ids),
                    "finish_reason": out.finish_reason,
                    "skip_blocks": skips[out.request_id],
                }
    for rid, t in transfer_s.items():
        done[rid]["transfer_s"] = t
    return done


def _all_free(actor: ProcActor, timeout_s: float = 10.0):
    """The worker's load once every block is free again (the prefill side frees after the ack)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = actor.call("load").result()
        if load.num_free_blocks == load.num_total_blocks or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def run(
    model_dir: str,
    device: str,
    num_prompts: int = 8,
    max_tokens: int = 24,
    block_size: int = 16,
    chunk: int = 64,
    prefix_len: int = 96,
    seed: int = 0,
    timeout_s: float = 120.0,
    gpu_fraction: float | None = None,
    devices: tuple[str, str] | None = None,
    worker_kwargs: dict | None = None,
) -> dict:
    """``devices``: the prefill and the decode worker's (default: both on ``device``);
    ``worker_kwargs``: more arguments for both workers (a ``data_plane``, say)."""
    shared = device == "cpu"  # the CPU local path needs caches in shared memory; CUDA uses IPC
    reference = LLMEngine(_engine_config(model_dir, device, block_size, chunk, shared=False))
    prompts = _prompts(seed, num_prompts, reference.model_config.vocab_size, prefix_len)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    expected = [o.token_ids for o in reference.generate(prompts, [params] * len(prompts))]
    device_name = str(reference.runner.device)
    del reference

    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    store = StoreAddress("127.0.0.1", master.port)
    p_dev, d_dev = devices or (device, device)
    extra = worker_kwargs or {}
    prefill = ProcActor(
        PrefillWorker,
        "prefill-0",
        _engine_config(model_dir, p_dev, block_size, chunk, shared, gpu_fraction),
        store,
        **extra,
    )
    decode = ProcActor(
        DecodeWorker,
        "decode-0",
        _engine_config(model_dir, d_dev, block_size, chunk, shared, gpu_fraction),
        store,
        **extra,
    )
    try:
        pi, di = gather([prefill.call("info"), decode.call("info")])
        gather([prefill.call("connect", di.peer), decode.call("connect", pi.peer)])
        specs = [RequestSpec(f"r{i}", tuple(p), params) for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        # The first request alone, so the second finds its prefix cached on the decode worker.
        got = _serve(prefill, decode, pi.peer, di.peer, specs[:1], timeout_s)
        got |= _serve(prefill, decode, pi.peer, di.peer, specs[1:], timeout_s)
        seconds = time.perf_counter() - t0
        pload, dload = _all_free(prefill), _all_free(decode)
    finally:
        for actor in (prefill, decode):
            try:
                actor.call("shutdown").result(30)
            finally:
                actor.stop()
    mismatches = [s.request_id for s, exp in zip(specs, expected) if got[s.request_id]["token_ids"] != exp]
    transfer_ms = [1e3 * r["transfer_s"] for r in got.values() if "transfer_s" in r]
    return {
        "device": device_name,
        "kv_path": pi.peer.locality.split(":")[0] if pi.peer.locality else "wire",
        "requests": len(specs),
        "prompt_tokens": [len(p) for p in prompts],
        "chunks_per_longest_prompt": -(-max(len(p) for p in prompts) // chunk),
        "greedy_equal_to_colocated": not mismatches,
        "mismatches": mismatches,
        "shared_prefix_skip_blocks": got["r1"]["skip_blocks"],
        "shared_prefix_full_blocks": prefix_len // block_size,
        "transfers_completed": dload.transfers_completed,
        "transfers_failed": dload.transfers_failed,
        "transfer_bytes": dload.transfer_bytes,
        "transfer_ms_median": statistics.median(transfer_ms) if transfer_ms else None,
        "prefill_blocks_free": [pload.num_free_blocks, pload.num_total_blocks],
        "decode_blocks_free": [dload.num_free_blocks, dload.num_total_blocks],
        "seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model directory (default: the seeded tiny model, built here)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cuda or cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--gpu-fraction", type=float, help="the workers share the GPU, KV sized from this share each")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch

    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from engine.model.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny-seed0", seed=0))
        report = run(model, device, num_prompts=a.prompts, max_tokens=a.max_tokens, gpu_fraction=a.gpu_fraction)
    ok = (
        report["greedy_equal_to_colocated"]
        and report["shared_prefix_skip_blocks"] > 0
        and report["transfers_failed"] == 0
        and report["prefill_blocks_free"][0] == report["prefill_blocks_free"][1]
        and report["decode_blocks_free"][0] == report["decode_blocks_free"][1]
    )
    report["ok"] = ok
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
