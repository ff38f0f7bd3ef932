"""For a machine with several GPUs (a single-GPU machine cannot run it: it says so and exits 0):
Llama-3.1-8B's configuration with random bf16 weights, served by the colocated engine at tensor
parallel size 2 against size 1. For each size, decode step times by batch size (the engine's full
step, every request decoding) and offline throughput over a fixed workload (EOS ignored, so every
size makes the same tokens), on one engine per size; rank r of a group runs on ``cuda:r``.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check_tp --json

``--reduced`` runs a tiny configuration of the same architecture on the CPU in fp32 (the ranks are
local processes meeting over gloo): the test of the command, not a measurement. Figures from a
real run go in docs/BENCHMARKS.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Llama-3.1-8B's published configuration, as overrides of the Llama-3.2-1B one the random-model
# builder knows (baton/perf/random_model.py): the same architecture, larger and untied.
LLAMA_31_8B: dict[str, Any] = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
# The command's own test on a CPU: the same architecture, tiny (4 heads and 2 KV heads split at TP 2).
REDUCED_MODEL: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    rope_scaling=None,
    bos_token_id=1,
    eos_token_id=2,
)


@dataclass(frozen=True)
class Settings:
    """What one run measures; the full run's defaults, or ``REDUCED``'s."""

    device: str = "cuda"
    dtype: str = "bfloat16"
    sizes: tuple[int, ...] = (1, 8, 32, 64, 128)  # decode batch sizes
    context: int = 256  # prompt tokens of every decoding request
    steps: int = 20  # timed decode steps per batch size
    requests: int = 256  # offline workload's requests
    prompt_len: tuple[int, int] = (64, 256)
    mean_output: float = 64.0
    output_clip: tuple[int, int] = (4, 256)
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    kv_cache_gb: float = 16.0  # per rank
    threads: int | None = None  # torch threads per rank (CPU)


REDUCED = Settings(
    device="cpu",
    dtype="float32",
    sizes=(1, 4),
    context=16,
    steps=3,
    requests=4,
    prompt_len=(8, 24),
    mean_output=6.0,
    output_clip=(2, 10),
    max_model_len=256,
    max_num_batched_tokens=256,
    kv_cache_gb=0.05,
    threads=1,
)


def build_model(out_dir: Path, reduced: bool) -> Path:
    from baton.perf.random_model import build_random_model

    overrides = REDUCED_MODEL if reduced else LLAMA_31_8B
    device, dtype = ("cpu", "float32") if reduced else ("cuda", "bfloat16")
    path = build_random_model("llama-3.2-1b", out_dir, device=device, dtype=dtype, **overrides)
    _release_device_memory()  # the builder's copy: the engines size their KV by the free memory
    return path


def _release_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _workload(s: Settings, vocab: int, avoid: frozenset[int]):
    from baton.perf.offline_workloads import anyscale_cpu

    return anyscale_cpu(
        vocab,
        n=s.requests,
        seed=0,
        avoid_ids=avoid,
        prompt_len=s.prompt_len,
        mean_output=s.mean_output,
        output_clip=s.output_clip,
    )


def measure(model_dir: Path, tp: int, s: Settings) -> dict:
    """Decode step times by batch size, then offline throughput, on one engine of ``tp`` ranks."""
    from baton.perf.offline_baton import warmup
    from baton.perf.offline_workloads import total_output_tokens
    from bench.host_step import start_decoding, time_steps
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device=s.device,
            dtype=s.dtype,
            max_model_len=s.max_model_len,
            num_threads=s.threads,
            tensor_parallel_size=tp,
            scheduler=SchedulerConfig(
                max_num_seqs=max(max(s.sizes), 256), max_num_batched_tokens=s.max_num_batched_tokens
            ),
            cache=CacheConfig(kv_cache_memory_gb=s.kv_cache_gb),
        )
    )
    try:
        load_s = time.perf_counter() - t0
        warmup(engine)
        cfg = engine.model_config
        avoid = frozenset({*(cfg.eos_token_ids or ()), *([cfg.bos_token_id] if cfg.bos_token_id is not None else [])})
        rng = random.Random(0)
        allowed = [i for i in range(cfg.vocab_size) if i not in avoid]
        decode = []
        for bs in s.sizes:
            # room for the tokens its first rows make while the last ones prefill, and the timed steps
            params = SamplingParams(max_tokens=s.steps + 64, ignore_eos=True, detokenize=False)
            prompts = [[rng.choice(allowed) for _ in range(s.context)] for _ in range(bs)]
            ids = start_decoding(engine, prompts, params)
            time_steps(engine, 2)  # not timed: the batch's first steps after its prefills
            step = statistics.median(time_steps(engine, s.steps))
            for i in ids:
                engine.abort(i)
            decode.append({"batch": bs, "step_ms": round(step * 1e3, 3), "tok_s": round(bs / step, 1)})
            print(f"TP {tp}: batch {bs:4d}: {step * 1e3:8.2f} ms a decode step", flush=True)
        requests = _workload(s, cfg.vocab_size, avoid)
        params_list = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, detokenize=False) for r in requests]
        t0 = time.perf_counter()
        outs = engine.generate([list(r.prompt_token_ids) for r in requests], params_list)
        seconds = time.perf_counter() - t0
        outputs = [list(o.token_ids) for o in outs]
        assert [len(o) for o in outputs] == [r.max_tokens for r in requests], "a request made the wrong length"
        tokens = total_output_tokens(requests)
        print(f"TP {tp}: offline {tokens / seconds:9.1f} tok/s ({len(requests)} requests)", flush=True)
        assert engine.num_free_blocks == engine.num_total_blocks, "blocks held after the runs"
        return {
            "tensor_parallel_size": tp,
            "load_s": round(load_s, 2),
            "cuda_graphs": engine.runner.graphs is not None,
            "decode": decode,
            "offline": {
                "requests": len(requests),
                "output_tokens": tokens,
                "seconds": round(seconds, 3),
                "tok_s": round(tokens / seconds, 1),
            },
            "outputs": outputs,
        }
    finally:
        engine.close()
        del engine
        _release_device_memory()


def compare(runs: dict[int, dict]) -> dict:
    """Each size against TP 1: decode step time ratios by batch, the offline throughput ratio, and
    how many requests got the same tokens (bf16 sums in another order may break a near-tie)."""
    base = runs[1]
    out = {}
    for tp, r in runs.items():
        if tp == 1:
            continue
        steps = {d["batch"]: d["step_ms"] for d in base["decode"]}
        out[f"tp{tp}_vs_tp1"] = {
            "decode_speedup": {d["batch"]: round(steps[d["batch"]] / d["step_ms"], 3) for d in r["decode"]},
            "offline_speedup": round(r["offline"]["tok_s"] / base["offline"]["tok_s"], 3),
            "requests_identical": sum(a == b for a, b in zip(r["outputs"], base["outputs"])),
        }
    return out


def run(tp_sizes: list[int], reduced: bool) -> dict:
    import torch

    s = REDUCED if reduced else Settings()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", reduced)
        runs = {tp: measure(model_dir, tp, s) for tp in tp_sizes}
    report: dict[str, Any] = {
        "model": "llama-3.1-8b-config (random weights)" if not reduced else "tiny llama (reduced)",
        "device": torch.cuda.get_device_name(0) if s.device == "cuda" else "cpu",
        "dtype": s.dtype,
        "gpus_visible": torch.cuda.device_count(),
        "context": s.context,
        "steps": s.steps,
        "runs": {str(tp): {k: v for k, v in r.items() if k != "outputs"} for tp, r in runs.items()},
    }
    if 1 in runs:
        report["compare"] = compare(runs)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp-sizes", default="1,2", help="tensor-parallel sizes to run, comma-separated")
    ap.add_argument("--reduced", action="store_true", help="a tiny model on the CPU (the command's test)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    tp_sizes = sorted({int(t) for t in a.tp_sizes.split(",")})
    if not a.reduced:
        import torch

        have = torch.cuda.device_count()
        if have < max(tp_sizes):
            note = (
                f"bench.gpu_check_tp: {have} GPU(s) visible; tensor parallel size {max(tp_sizes)} needs "
                f"{max(tp_sizes)}: run it on a machine with several GPUs (--reduced: the tiny CPU run)"
            )
            print(json.dumps({"skipped": note}) if a.json else note)
            return 0
    report = run(tp_sizes, a.reduced)
    print(json.dumps(report, indent=2) if a.json else report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
