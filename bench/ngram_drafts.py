"""A what-if for speculative decoding on the offline workload: how many target-model steps greedy
decoding would take if a prompt-lookup proposer (the last n tokens matched earlier in the prompt
or output, the k tokens that followed proposed as a draft) fed each step. Written before Baton
speculated (engine/spec_decode.py makes the same proposal from an index). The engine generates each
request's greedy output once, then the proposer is replayed over prompt + output: a step verifies
its draft and yields the accepted tokens plus one.

    python -m bench.ngram_drafts [--model default|tiny|PATH] [--workload anyscale-cpu] [--n 3] [--k 4] [--json]

Reports output tokens per target step overall, the steps the longest request would need (the run's
step count is at least that), and the draft rows a step would verify for nothing: in steps bound
by the weight stream they cost little, in steps bound by arithmetic they cost as much as useful rows.
"""

from __future__ import annotations

import argparse
import json


def proposer_steps(prompt: list[int], output: list[int], n: int, k: int) -> tuple[int, int, int]:
    """(target steps, accepted draft tokens, rejected draft tokens) to produce ``output`` after ``prompt``."""
    history, i, steps, accepted, rejected = list(prompt), 0, 0, 0, 0
    while i < len(output):
        draft = propose(history, n, k)
        a = 0
        while a < len(draft) and i + a < len(output) and draft[a] == output[i + a]:
            a += 1
        take = min(a + 1, len(output) - i)
        history += output[i : i + take]
        i += take
        steps += 1
        accepted += min(a, take)
        rejected += len(draft) - min(a, take)
    return steps, accepted, rejected


def propose(history: list[int], n: int, k: int) -> list[int]:
    """The k tokens that followed the latest earlier match of the last m tokens, longest m <= n first."""
    for m in range(min(n, len(history) - 1), 0, -1):
        tail = history[-m:]
        for j in range(len(history) - m - 1, -1, -1):
            if history[j : j + m] == tail:
                return history[j + m : j + m + k]
    return []


def run(model: str = "default", workload: str = "anyscale-cpu", n: int = 3, k: int = 4) -> dict:
    from bench.offline import model_and_workload
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    if n < 1 or k < 1:
        raise ValueError(f"n and k must be at least 1, got n={n}, k={k}")
    model_dir, requests = model_and_workload(model, workload, None)
    engine = LLMEngine(EngineConfig(model=str(model_dir)))
    outputs = engine.generate([list(r.prompt_token_ids) for r in requests],
                              [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, detokenize=False)
                               for r in requests])
    per_request = [proposer_steps(list(r.prompt_token_ids), list(o.token_ids), n, k) for r, o in zip(requests, outputs)]
    tokens = sum(len(o.token_ids) for o in outputs)
    steps = sum(s for s, _, _ in per_request)
    longest = max(range(len(outputs)), key=lambda i: len(outputs[i].token_ids))
    return {"model": model, "workload": workload, "n": n, "k": k, "output_tokens": tokens, "target_steps": steps,
            "tokens_per_step": tokens / steps, "accepted": sum(a for _, a, _ in per_request),
            "rejected": sum(r for _, _, r in per_request),
            "longest_request": {"tokens": len(outputs[longest].token_ids), "steps": per_request[longest][0]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ngram_drafts", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--workload", default="anyscale-cpu")
    p.add_argument("--n", type=int, default=3, help="longest suffix matched")
    p.add_argument("--k", type=int, default=4, help="draft length")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(args.model, args.workload, args.n, args.k)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    lr = r["longest_request"]
    print(f"{r['workload']} on {r['model']}, prompt lookup n={r['n']}, k={r['k']}: {r['output_tokens']} tokens in "
          f"{r['target_steps']} target steps ({r['tokens_per_step']:.2f} a step); {r['accepted']} draft tokens accepted, "
          f"{r['rejected']} verified for nothing; the longest request ({lr['tokens']} tokens) in {lr['steps']} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
