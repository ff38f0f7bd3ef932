"""The projections of a whole forward pass, alone, for each way the CPU can multiply them (engine/model/linear.py):
oneDNN's packed weights, MKL's ``F.linear`` on the dense weight, the compiled skinny kernel
(engine/native/skinny_linear.c) and GGUF blocks (Q4_1 layers, Q8_0 head, as the default model's file
has them: engine/native/quant_linear.c) in the file's layout (``quantized-gguf``) and in the 8-row
layout the model uses (``quantized``: Q4_1 regrouped), at a range of row counts, interleaved in one process.

    python -m bench.projections [--rows 1,2,4,8,16,32,64,96] [--layers 30] [--rounds 9] [--no-head] [--json]

Shapes are SmolLM2-135M's (hidden 576, intermediate 1536, 9 + 2 x 3 heads of 64, vocabulary 49152;
random weights and blocks: values do not change speed); the head multiplies min(rows, 64) rows, as a step
samples at most one row per sequence. The model's weights (537 MB) do not fit in cache, so every
pass reads them from memory, as an engine step does. Each figure is the median of ``--rounds``
passes; a round runs every mode once, in turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

HIDDEN, INTERMEDIATE, QKV, VOCAB = 576, 1536, 960, 49152
SHAPES = ((QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))


def run(rows: list[int], layers: int = 30, rounds: int = 9, threads: int | None = None, head: bool = True) -> dict:
    import torch

    from engine.model.linear import Linear, can_pack
    from engine.native.quant_linear import NativeQuantLinear
    from engine.native.skinny_linear import NativeSkinnyLinear

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) * 0.02 for _ in range(layers) for o, i in SHAPES]
    if head:
        weights.append(torch.randn(VOCAB, HIDDEN, generator=g) * 0.02)
    modes = ["mkl"] + (["packed"] if can_pack(torch.device("cpu"), torch.float32) else [])
    skinny = NativeSkinnyLinear.load()
    quant = NativeQuantLinear.load() if skinny is not None else None
    modes += (["skinny"] if skinny is not None else []) + (["quantized-gguf", "quantized"] if quant is not None else [])
    projections = {}
    for mode in modes:
        projections[mode] = []
        for n, w in enumerate(weights):
            p = Linear(w.clone())
            if mode.startswith("quantized"):
                blocks = random_blocks(*w.shape, "Q8_0" if head and n == len(weights) - 1 else "Q4_1", g)
                p.quantized = blocks if mode == "quantized-gguf" else blocks.regroup()  # the model's layout
            p.use({"mkl": "dense", "quantized-gguf": "quantized"}.get(mode, mode), skinny, quant)
            projections[mode].append(p)

    results: dict[str, dict[str, float]] = {}
    for m in rows:
        x = {HIDDEN: torch.randn(m, HIDDEN, generator=g), INTERMEDIATE: torch.randn(m, INTERMEDIATE, generator=g)}
        head_x = torch.randn(min(m, 64), HIDDEN, generator=g)

        def one_pass(mode: str) -> float:
            t = time.perf_counter()
            for n, p in enumerate(projections[mode][: 4 * layers]):
                p(x[SHAPES[n % 4][1]])
            if head:
                projections[mode][-1](head_x)
            return time.perf_counter() - t

        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for mode in modes:
            one_pass(mode)  # warm the code paths; the weights stay out of cache (537 MB)
        for _ in range(rounds):
            for mode in modes:
                times[mode].append(one_pass(mode))
        results[str(m)] = {f"{mode}_ms": 1e3 * statistics.median(t) for mode, t in times.items()}
    flops = {str(m): 2 * (m * layers * sum(o * i for o, i in SHAPES) + head * min(m, 64) * VOCAB * HIDDEN) for m in rows}
    return {"layers": layers, "head": head, "rounds": rounds, "threads": torch.get_num_threads(), "modes": modes,
            "weight_mb": sum(w.numel() for w in weights) * 4 / 1e6, "ms": results, "flop": flops}


def random_blocks(rows: int, cols: int, qtype: str, g):
    """Random blocks of ``qtype`` (fixed, finite scales; random quants) for a [rows, cols] weight."""
    import torch

    from engine.native.quant_linear import GGML_TYPES, QK, QuantizedWeight

    size = GGML_TYPES[qtype][1]
    blocks = torch.randint(0, 256, (rows, cols // QK, size), dtype=torch.uint8, generator=g)
    blocks[:, :, 0:2] = torch.tensor([0.002], dtype=torch.float16).view(torch.uint8)
    if qtype == "Q4_1":
        blocks[:, :, 2:4] = torch.tensor([-0.015], dtype=torch.float16).view(torch.uint8)
    return QuantizedWeight(blocks.view(rows, -1), qtype)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.projections", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8,16,32,64,96")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-head", action="store_true", help="the layers' projections only")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run([int(x) for x in args.rows.split(",")], args.layers, args.rounds, args.threads, head=not args.no_head)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    modes = r["modes"]
    print(f"{r['layers']} layers{' + head' if r['head'] else ''}, {r['weight_mb']:.0f} MB of fp32 weights, {r['threads']} thread(s), "
          f"median of {r['rounds']}")
    print("| rows | " + " | ".join(f"{m} ms" for m in modes) + " | best vs packed |")
    print("| ---: | " + " | ".join("---:" for _ in modes) + " | ---: |")
    for rows, ms in r["ms"].items():
        best = min(ms.values())
        ratio = f"{ms['packed_ms'] / best:.2f}x" if "packed_ms" in ms else "-"
        print(f"| {rows} | " + " | ".join(f"{ms[f'{m}_ms']:.1f}" for m in modes) + f" | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
