"""Kept for GPU issues (gpu_check runs it): a bf16 model with head dim 128 (Llama-3.1-8B's attention
layout, 4 query heads a KV head, at a smaller width and depth, random weights) generates the same
greedy tokens on the GPU through Baton's engine (Triton attention, CUDA graphs) as through
Hugging Face transformers.

    python -m bench.gpu_check_hd128_golden --json      # CUDA only; says so and exits 0 elsewhere
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

# Llama-3.1-8B's head layout (128-wide heads, 4 query heads a KV head) in a model small enough to
# build in seconds. The weights' scale keeps greedy choices clear of bf16 near-ties.
HD128_OVERRIDES: dict[str, Any] = dict(
    hidden_size=2048,
    intermediate_size=4096,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=32000,
    max_position_embeddings=4096,
    rope_scaling=None,
    initializer_range=0.1,
)


def prompts(seed: int = 0, n: int = 6, vocab: int = 32000) -> tuple[list[list[int]], list[int]]:
    """Prompts of mixed lengths (some past a KV block, one past a split) and their token counts."""
    rng = random.Random(seed)
    lens = [1, 7, 33, 130, 600, 1500][:n]
    return [[rng.randrange(3, vocab) for _ in range(k)] for k in lens], [16] * len(lens)


def engine_config(model_dir: str):
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig

    return EngineConfig(
        model=model_dir,
        device="cuda",
        dtype="bfloat16",
        max_model_len=4096,
        scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024),
        cache=CacheConfig(block_size=16, num_blocks=1024),
    )


def run(model_dir: Path) -> dict:
    import transformers

    from baton.perf.random_model import build_random_model
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    build_random_model("llama-3.2-1b", model_dir, device="cuda", dtype="bfloat16", **HD128_OVERRIDES)
    ps, max_new = prompts()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16).cuda().eval()
    want = []
    with torch.no_grad():
        for p, n in zip(ps, max_new):
            out = hf.generate(
                torch.tensor([p], device="cuda"),
                max_new_tokens=n,
                do_sample=False,
                attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
            )
            want.append(out[0, len(p) :].tolist())
    del hf
    torch.cuda.empty_cache()
    engine = LLMEngine(engine_config(str(model_dir)))
    params = [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]
    got = [list(o.token_ids) for o in engine.generate(ps, params)]
    first_diff = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]
    return {
        "prompt_tokens": [len(p) for p in ps],
        "equal": [g == w for g, w in zip(got, want)],
        "first_difference_at": first_diff,
        "attention": engine.runner.attn.name,
        "cuda_graphs": engine.runner.graphs is not None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_check_hd128_golden: CUDA is not available; nothing to check here.")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        report = run(Path(tmp) / "hd128-bf16")
    report["ok"] = all(report["equal"])
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
