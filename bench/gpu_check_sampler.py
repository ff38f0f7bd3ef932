"""Kept for issue 49 (gpu_check runs it): the device sampler takes no host synchronization inside a
step, and keeps the tokens the row-subset path keeps.

On CUDA the whole-batch sampler (engine/device_sampling.py, ``Sampler(sync_free=True)``) and the
device penalties run under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any
synchronizing call; their tokens must equal the row-subset path's on the same logits. Both paths
are timed per step at a Llama-3 vocabulary, the host's wait included.

    python -m bench.gpu_check_sampler --json                 # CUDA; says so and exits 0 elsewhere
    python -m bench.gpu_check_sampler --device cpu --json    # the same checks at a small size
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from engine.device_sampling import process_logits_on_device
from engine.logits_processing import process_logits
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


def mixed_params(n: int) -> list[SamplingParams]:
    """A batch mixing greedy rows, every filter, seeds and penalties."""
    kinds = [
        SamplingParams(),
        SamplingParams(temperature=0.7, seed=1),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2),
        SamplingParams(temperature=1.2, top_k=40, seed=3),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.05, seed=4),
        SamplingParams(temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, seed=5),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


def _step(sampler: Sampler, logits: torch.Tensor, params, histories, prompts, positions) -> torch.Tensor:
    process = process_logits_on_device if sampler.sync_free else process_logits
    return sampler.sample(process(logits, params, histories, prompts, (2,)), params, positions)


def check(device: torch.device, rows: int, vocab: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    params = mixed_params(rows)
    rng = np.random.default_rng(0)
    histories = [rng.integers(0, vocab, 200) if p.processes_logits else None for p in params]
    prompts = [150] * rows
    positions = list(range(rows))
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(device)
    subset, whole = Sampler(0, device, sync_free=False), Sampler(0, device, sync_free=True)
    want = _step(subset, logits, params, histories, prompts, positions).cpu()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        got = _step(whole, logits, params, histories, prompts, positions)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    out: dict = {"rows": rows, "vocab": vocab, "tokens_equal": got.cpu().tolist() == want.tolist()}
    for name, sampler in (("row_subset", subset), ("whole_batch", whole)):
        t0 = time.perf_counter()
        for _ in range(repeats):
            tokens = _step(sampler, logits, params, histories, prompts, positions)
        if cuda:
            torch.cuda.synchronize()
        tokens.cpu()
        out[f"{name}_ms"] = round(1e3 * (time.perf_counter() - t0) / repeats, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device = torch.device(args.device)
    sizes = [(64, 128256), (256, 128256)] if device.type == "cuda" else [(8, 4096)]
    checks = [check(device, rows, vocab, 20 if device.type == "cuda" else 2) for rows, vocab in sizes]
    report = {"checks": checks, "ok": all(c["tokens_equal"] for c in checks)}
    print(json.dumps(report) if args.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
