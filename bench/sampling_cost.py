"""Kept for users choosing sampling options: what logprobs, penalties and a logit bias cost.

What the optional sampling features cost: the same offline requests through one engine with
none of them, with the sampled token's logprob (``logprobs=0``), with 20 alternatives (the most
OpenAI allows), scoring the prompts too (``prompt_logprobs=1``, what ``echo`` with ``logprobs``
asks), and with penalties and a logit bias on every request. Rounds are interleaved so that a
shared host's drift hits every mode alike. Logprobs must not change a token; penalties do.

    python -m bench.sampling_cost [--model default] [--n 16] [--rounds 3] [--json PATH]

Workload: the first ``n`` requests of ``anyscale-cpu`` (EOS ignored, all submitted at once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

MODES: dict[str, dict[str, Any]] = {
    "off": {},
    "logprobs=0": {"logprobs": 0},
    "logprobs=20": {"logprobs": 20},
    "prompt_logprobs=1": {"prompt_logprobs": 1, "logprobs": 1},
    "penalties": {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.1,
        "logit_bias": {t: -1.0 for t in range(100, 110)},
    },
}
CHANGES_TOKENS = {"penalties"}


def main(argv: list[str] | None = None) -> int:
    from baton.perf.offline import model_and_workload
    from baton.perf.offline_baton import warmup
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    p = argparse.ArgumentParser(prog="python -m bench.sampling_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    model_dir, requests = model_and_workload(args.model, "anyscale-cpu", args.n)
    engine = LLMEngine(EngineConfig(model=str(model_dir)))
    warmup(engine)
    prompts = [list(r.prompt_token_ids) for r in requests]
    tokens = sum(r.max_tokens for r in requests)
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for mode, extra in MODES.items():
            params = [
                SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, detokenize=False, **extra) for r in requests
            ]
            assert engine.block_manager.pool.reset_prefix_cache()  # every run prefills: no hits from the last
            t0 = time.perf_counter()
            outs = engine.generate(prompts, params)
            seconds[mode].append(time.perf_counter() - t0)
            outputs[mode] = [o.token_ids for o in outs]
            assert engine.num_free_blocks == engine.num_total_blocks
    same = all(outputs[m] == outputs["off"] for m in MODES if m not in CHANGES_TOKENS)
    result = {
        "model": args.model,
        "n": args.n,
        "rounds": args.rounds,
        "output_tokens": tokens,
        "identical_tokens": same,
        "seconds": seconds,
        "tok_s": {m: tokens / statistics.median(s) for m, s in seconds.items()},
    }
    result["slowdown"] = {m: statistics.median(seconds[m]) / statistics.median(seconds["off"]) for m in MODES}
    print(
        f"{args.n} requests, {tokens} output tokens, median of {args.rounds} interleaved rounds; "
        f"tokens identical in every logprobs mode: {same}"
    )
    for m in MODES:
        print(f"  {m:12s} {result['tok_s'][m]:8.1f} tok/s   {result['slowdown'][m]:.3f}x the time of 'off'")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
