"""Kept for users setting ``defer_for_shared_prefix``: what the deferral buys on a shared-prefix burst.

A burst of prompts that share a long prefix (a system prompt), all submitted at once: the
scheduler's deferral for shared prefixes in flight (``SchedulerConfig.defer_for_shared_prefix``)
against plain first-come admission, the same engine and requests, alternating in one run.

    python -m bench.shared_prefix_burst --json                 # SmolLM2 (the default model), CPU
    python -m bench.shared_prefix_burst --model tiny --json

Each run uses a fresh random prefix (no hits left over from the run before). Reports per setting
the median over rounds of: wall time of the burst, mean and max TTFT, and the prompt tokens the
scheduler computed (the prefix once vs once per request).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine.config import EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams


def _burst(engine: LLMEngine, rng: random.Random, requests: int, prefix: int, suffix: int, max_tokens: int) -> dict:
    vocab = engine.model_config.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(prefix)]
    prompts = [shared + [rng.randrange(3, vocab) for _ in range(suffix)] for _ in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    computed = engine.scheduler.prompt_tokens_computed
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    ttft = [
        o.metrics.first_token_time - o.metrics.arrival_time
        for o in outs
        if o.metrics is not None and o.metrics.first_token_time is not None
    ]  # (every finished output has both)
    return {
        "seconds": wall,
        "ttft_mean_s": statistics.mean(ttft),
        "ttft_max_s": max(ttft),
        "prompt_tokens_computed": engine.scheduler.prompt_tokens_computed - computed,
        "tokens": [o.token_ids for o in outs],
    }


def run(
    model: str,
    requests: int = 8,
    prefix: int = 1024,
    suffix: int = 16,
    max_tokens: int = 8,
    rounds: int = 2,
    seed: int = 0,
) -> dict:
    engines = {
        defer: LLMEngine(EngineConfig(model=model, scheduler=SchedulerConfig(defer_for_shared_prefix=defer)))
        for defer in (False, True)
    }
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(rounds + 1):  # round 0 warms both engines up and is not reported
        for defer in (False, True) if r % 2 == 0 else (True, False):
            # The same prompts for both settings within a round; a new prefix every round.
            res = _burst(engines[defer], random.Random(seed * 1000 + r), requests, prefix, suffix, max_tokens)
            if r:
                runs[defer].append(res)
    same = all(a["tokens"] == b["tokens"] for a, b in zip(runs[False], runs[True]))
    med = {
        defer: {
            k: statistics.median(x[k] for x in rs)
            for k in ("seconds", "ttft_mean_s", "ttft_max_s", "prompt_tokens_computed")
        }
        for defer, rs in runs.items()
    }
    return {
        "model": model,
        "requests": requests,
        "prefix_tokens": prefix,
        "suffix_tokens": suffix,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "first_come": med[False],
        "deferred": med[True],
        "speedup_seconds": med[False]["seconds"] / med[True]["seconds"],
        "ttft_mean_ratio": med[False]["ttft_mean_s"] / med[True]["ttft_mean_s"],
        "runs_seconds": {
            "first_come": [x["seconds"] for x in runs[False]],
            "deferred": [x["seconds"] for x in runs[True]],
        },
        "tokens_identical": same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="default (SmolLM2), tiny, or a model directory")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model == "tiny":
            from engine.model.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny-seed0", seed=0))
        report = run(model, a.requests, a.prefix, a.suffix, a.max_tokens, a.rounds)
    print(json.dumps(report, indent=2) if a.json else report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
