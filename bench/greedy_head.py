"""The greedy head (engine/native/greedy_head.c) against what it replaces, the Q8_0 head's every logit
(engine/native/quant_linear.c) and the sampler's argmax, at a range of row counts, interleaved in one
process; with each arm's tokens compared and the exact logits the screen left to compute.

    python -m bench.greedy_head [--rows 1,4,8,16,32,64] [--rounds 15] [--json]

Shapes are SmolLM2-135M's head (49,152 x 576, Q8_0): random quants, scales spread as a real model's,
and rows of random features with one outlier feature 40x the others (final hidden states have
such features, and they set their block's int8 step: the screen's bound is widest there). Each
figure is the median of ``--rounds`` calls; a round runs both arms once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

VOCAB, HIDDEN = 49152, 576


def run(rows: list[int], rounds: int = 15) -> dict:
    import torch

    from engine.native.argmax import NativeArgmax
    from engine.native.greedy_head import GreedyHeadWeights, NativeGreedyHead
    from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight

    head, linear, argmax = NativeGreedyHead.load(), NativeQuantLinear.load(), NativeArgmax.load()
    if head is None or linear is None or argmax is None:
        raise SystemExit("the greedy head needs AVX-512 VNNI and the compiled kernels (BATON_NATIVE_KERNELS, CC)")
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (VOCAB, HIDDEN // 32, 34), dtype=torch.uint8, generator=g)
    scales = (torch.rand(VOCAB, HIDDEN // 32, generator=g) * 0.004 + 0.0005).half()
    blocks[..., 0:2] = scales.view(torch.uint8).view(VOCAB, HIDDEN // 32, 2)
    weight = QuantizedWeight(blocks.view(VOCAB, -1).contiguous(), "Q8_0")
    prepared = GreedyHeadWeights.of(weight)
    arms = {"every logit": lambda x: (argmax(linear(x, weight, None)), 0), "greedy head": lambda x: head(x, prepared)}
    results = {}
    for m in rows:
        x = torch.randn(m, HIDDEN, generator=g)
        x[:, 7] *= 40
        times = {name: [] for name in arms}
        tokens, candidates = {}, 0
        for name, arm in arms.items():  # warm
            tokens[name], _ = arm(x)
        for _ in range(rounds):
            for name, arm in arms.items():
                t = time.perf_counter()
                _, c = arm(x)
                times[name].append(time.perf_counter() - t)
                candidates = c or candidates
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        results[str(m)] = {**{f"{n}_ms": v for n, v in ms.items()}, "speed_up": ms["every logit"] / ms["greedy head"],
                           "candidates_per_row": candidates / m,
                           "same_tokens": bool(torch.equal(tokens["every logit"], tokens["greedy head"]))}
    return {"threads": torch.get_num_threads(), "rounds": rounds, "rows": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.greedy_head", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,4,8,16,32,64")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run([int(x) for x in args.rows.split(",")], args.rounds)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"SmolLM2's head (Q8_0 {VOCAB} x {HIDDEN}), {r['threads']} thread(s), median of {r['rounds']}")
    print("| rows | every logit + argmax ms | greedy head ms | speed-up | exact logits a row | same tokens |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for rows, v in r["rows"].items():
        print(f"| {rows} | {v['every logit_ms']:.2f} | {v['greedy head_ms']:.2f} | {v['speed_up']:.2f}x "
              f"| {v['candidates_per_row']:.1f} | {v['same_tokens']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
