"""Kept for issue 49 (gpu_check runs it): decode steps with asynchronous scheduling against without,
and asynchronous steps' greedy tokens against transformers.

Two engines on the same random-weight Llama-3.2-1B config in bf16, one with
``EngineConfig.async_scheduling`` (the host schedules step n+1 and applies step n's tokens while
the device runs; engine/async_step.py) and one without; for each batch size, that many requests
with prompts of ``--context`` random tokens are prefilled in both, then whole ``engine.step()``
calls are timed in interleaved rounds and each reports its median (a step of the asynchronous
engine ends with the next step launched, so its median is the period between steps). Then a tiny
seeded Llama in fp32 on the same device, with asynchronous steps, must give transformers' greedy
tokens, a batch with different ``max_tokens``.

    python -m bench.gpu_check_async --json             # CUDA; says so and exits 0 elsewhere
    python -m bench.gpu_check_async --reduced --json   # CPU: a shrunken config, the same checks
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

import torch

from bench.host_step import start_decoding, time_steps
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams

# The reduced run's model: the published config's shape, shrunk (the tests' sizes).
_REDUCED = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)


def _engine(model_dir: Path, device: str, dtype: str, on: bool, max_seqs: int, kv_gb: float) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device=device,
            dtype=dtype,
            async_scheduling=on,
            scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=8192),
            cache=CacheConfig(kv_cache_memory_gb=kv_gb),
        )
    )


def timing(model_dir: Path, device: str, dtype: str, sizes: list[int], context: int, steps: int, rounds: int) -> dict:
    """Median decode step (ms) of the synchronous and the asynchronous engine at each batch size."""
    kv_gb = 4.0 if device == "cuda" else 0.25
    engines = {
        mode: _engine(model_dir, device, dtype, mode == "async", max(sizes), kv_gb) for mode in ("sync", "async")
    }
    vocab = engines["sync"].model_config.vocab_size
    rng = random.Random(0)
    rows = []
    for bs in sizes:
        prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(bs)]
        params = SamplingParams(max_tokens=2 * (steps + 2) * rounds + 8, ignore_eos=True, detokenize=False)
        ids = {mode: start_decoding(e, prompts, params) for mode, e in engines.items()}
        times: dict[str, list[float]] = {mode: [] for mode in engines}
        for _ in range(rounds):
            for mode, e in engines.items():
                time_steps(e, 2)  # (the switch's first steps are not timed)
                times[mode] += time_steps(e, steps)
        for mode, e in engines.items():
            for i in ids[mode]:
                e.abort(i)
        ms = {mode: statistics.median(t) * 1e3 for mode, t in times.items()}
        rows.append(
            {
                "batch": bs,
                "sync_ms": round(ms["sync"], 3),
                "async_ms": round(ms["async"], 3),
                "speedup": round(ms["sync"] / ms["async"], 3),
            }
        )
        print(f"batch {bs:4d}: sync {ms['sync']:7.3f} ms, async {ms['async']:7.3f} ms", flush=True)
    steps_async = engines["async"].async_steps
    assert steps_async is not None
    for e in engines.values():  # (the asynchronous one's step in flight, collected)
        while e.has_unfinished_requests():
            e.step()
        assert e.num_free_blocks == e.num_total_blocks
        e.close()
    return {
        "context": context,
        "steps": steps,
        "rounds": rounds,
        "rows": rows,
        "overlapped_steps": steps_async.num_overlapped,
        "synchronous_steps": steps_async.num_sync,
    }


def golden(device: str, tmp: Path) -> dict:
    """A tiny seeded Llama in fp32 with asynchronous steps: transformers' greedy tokens, a batch
    whose requests end at different lengths."""
    from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf

    d = build_tiny_hf_model(tmp / "tiny-llama", "llama", seed=1)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(1, 70))] for _ in range(8)]
    max_new = [rng.randint(1, 24) for _ in prompts]
    engine = LLMEngine(EngineConfig(model=str(d), device=device, dtype="float32", async_scheduling=True))
    outs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new])
    got = [o.token_ids for o in outs]
    steps = engine.async_steps
    assert steps is not None
    equal = got == hf_greedy(load_hf(d), prompts, max_new)
    leaked = engine.num_total_blocks - engine.num_free_blocks
    engine.close()
    return {"tokens_equal_transformers": equal, "blocks_leaked": leaked, "overlapped_steps": steps.num_overlapped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reduced", action="store_true", help="a shrunken config on the CPU, fp32")
    ap.add_argument("--sizes", default="1,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per engine and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not a.reduced and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    from baton.perf.random_model import build_random_model

    device, dtype = ("cpu", "float32") if a.reduced else ("cuda", "bfloat16")
    sizes = [1, 4] if a.reduced else sorted({int(s) for s in a.sizes.split(",")})
    context, steps, rounds = (16, 3, 1) if a.reduced else (a.context, a.steps, a.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = _REDUCED if a.reduced else {}
        model_dir = build_random_model(
            "llama-3.2-1b", Path(tmp) / "llama-3.2-1b", device=device, dtype=dtype, **overrides
        )
        report: dict = {
            "model": "llama-3.2-1b" + (" (reduced)" if a.reduced else ""),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "timing": timing(model_dir, device, dtype, sizes, context, steps, rounds),
            "golden": golden(device, Path(tmp)),
        }
    g = report["golden"]
    report["ok"] = bool(g["tokens_equal_transformers"] and not g["blocks_leaked"] and g["overlapped_steps"] > 0)
    print(json.dumps(report) if a.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
