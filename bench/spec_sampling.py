"""Kept for users enabling speculative decoding: its speed and token equality on sampled requests.

Speculative decoding (n-gram drafts) for sampled requests: output tokens/s with drafts against
without, at a few temperatures and batch sizes, in alternating rounds of one process; the share of
drafts kept; and whether each seeded request's tokens are the same with drafts as without (they
should be: a drafted position samples with its own output index's noise, engine/runner.py).

    python -m bench.spec_sampling [--model default|tiny|PATH] [--temperatures 0,0.3,0.7,1.0]
                                  [--batch 1,8] [--max-tokens 128] [--k 4] [--min-keep-chance 0.5]
                                  [--rounds 3] [--json]

``--min-keep-chance 0`` drafts ``k`` tokens whenever the n-grams match (no adaptation to the keep rate).

Two prompt sets: ``rewrite`` (chat prompts that ask for a given text back with a small change, the
case prompt lookup is for: the answer copies the prompt) and ``random`` (the offline workload's
random-token prompts, on which SmolLM2's outputs fall into loops). Requests are seeded, EOS is
ignored, every request of a batch asks for ``--max-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

REWRITE = [
    "Repeat this list exactly, one item a line, in the same order: apples, pears, plums, cherries, "
    "grapes, lemons, limes, oranges, melons, peaches, apricots, figs, dates, kiwis, mangoes, papayas.",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog near the river bank.",
    "Rewrite this Python function with the name changed to add_numbers:\n\ndef f(a, b):\n    result = a + b\n"
    "    print('the sum of', a, 'and', b, 'is', result)\n    return result\n",
    'Return this JSON with the value of age changed to 31: {"name": "Ada", "age": 30, "city": "London", '
    '"languages": ["English", "French"], "email": "ada@example.com"}',
]


def _prompts(engine, kind: str, n: int, seed: int) -> list:
    tok = engine.tokenizer
    if kind == "rewrite":
        return [tok.apply_chat_template([{"role": "user", "content": REWRITE[i % len(REWRITE)]}]) for i in range(n)]
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(64, 256))] for _ in range(n)]


def _run(engine, prompts, temperature: float, max_tokens: int) -> tuple[float, list[list[int]], int, int]:
    from engine.sampling_params import SamplingParams

    params = [
        SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=1000 + i, ignore_eos=True, detokenize=False)
        for i in range(len(prompts))
    ]
    s = engine.scheduler
    d0, a0 = s.num_draft_tokens, s.num_accepted_tokens
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    dt = time.perf_counter() - t0
    return (
        sum(len(o.token_ids) for o in outs) / dt,
        [o.token_ids for o in outs],
        s.num_draft_tokens - d0,
        s.num_accepted_tokens - a0,
    )


def run(
    model: str = "default",
    temperatures=(0.0, 0.3, 0.7, 1.0),
    batches=(1, 8),
    max_tokens: int = 128,
    k: int = 4,
    rounds: int = 3,
    min_keep_chance: float = 0.5,
) -> dict:
    from dataclasses import replace

    from engine.config import EngineConfig, SpeculativeConfig
    from engine.engine import LLMEngine
    from engine.model.registry import resolve_model

    model_dir = resolve_model(model)
    plain = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32"))
    cfg = plain.config
    drafting = LLMEngine(
        replace(
            cfg,
            scheduler=replace(
                cfg.scheduler, speculative=SpeculativeConfig(num_tokens=k, min_keep_chance=min_keep_chance)
            ),
        )
    )
    for e in (plain, drafting):  # warm both (first large step, first decode steps)
        _run(e, _prompts(e, "random", 4, 99), 0.7, 8)
    rows = []
    for kind in ("rewrite", "random"):
        for batch in batches:
            prompts = _prompts(plain, kind, batch, seed=batch)
            for temp in temperatures:
                rates: dict[str, list[float]] = {"plain": [], "drafts": []}
                same, drafted, kept = True, 0, 0
                for _ in range(rounds):
                    r0, ids0, _, _ = _run(plain, prompts, temp, max_tokens)
                    r1, ids1, d, a = _run(drafting, prompts, temp, max_tokens)
                    rates["plain"].append(r0)
                    rates["drafts"].append(r1)
                    same &= ids0 == ids1
                    drafted, kept = drafted + d, kept + a
                p, s = statistics.median(rates["plain"]), statistics.median(rates["drafts"])
                rows.append(
                    {
                        "prompts": kind,
                        "batch": batch,
                        "temperature": temp,
                        "plain_tok_s": round(p, 1),
                        "drafts_tok_s": round(s, 1),
                        "speedup": round(s / p, 3),
                        "kept": round(kept / drafted, 3) if drafted else None,
                        "same_tokens": same,
                    }
                )
    return {
        "model": str(model_dir),
        "k": k,
        "min_keep_chance": min_keep_chance,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--temperatures", default="0,0.3,0.7,1.0")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--min-keep-chance", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    result = run(
        a.model,
        tuple(float(t) for t in a.temperatures.split(",")),
        tuple(int(b) for b in a.batch.split(",")),
        a.max_tokens,
        a.k,
        a.rounds,
        a.min_keep_chance,
    )
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"{result['model']}: drafts of up to {result['k']} (min keep chance {result['min_keep_chance']}), "
        f"{result['max_tokens']} tokens a request, "
        f"medians of {result['rounds']} alternating rounds"
    )
    print("| prompts | batch | temperature | plain tok/s | drafts tok/s | speedup | kept | same tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in result["rows"]:
        print(
            f"| {r['prompts']} | {r['batch']} | {r['temperature']} | {r['plain_tok_s']} | {r['drafts_tok_s']} | "
            f"{r['speedup']}x | {r['kept']} | {r['same_tokens']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
