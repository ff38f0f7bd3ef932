"""Two small operations of every CPU step against torch's, on SmolLM2's shapes: the fused
SiLU(gate) * up (``engine/native/layer_ops.c``; intermediate 1,536) and the sampler's row argmax
(``engine/native/argmax.c``; vocabulary 49,152), at decode- and prefill-sized row counts. Each
arm's median of ``--repeats`` timings, the arms taking turns (``bench.avx2_kernels.alternate``); the compiled ones are checked against
torch (argmax: equal indices; SiLU: within 2e-6 relative).

    python -m bench.cpu_small_ops [--rows 1,8,64,2048] [--repeats 31] [--json]

Run from another checkout's directory (``PYTHONPATH=that/tree python -m bench.cpu_small_ops``) it
measures that tree's kernels: how a change to one of them was compared with the commit before it.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

INTERMEDIATE, VOCAB = 1536, 49152


def run(rows: list[int], repeats: int = 31) -> dict:
    import torch

    from bench.avx2_kernels import alternate
    from engine.native.layer_ops import NativeLayerOps, TorchLayerOps

    try:  # a tree from before the compiled argmax: that arm is left out
        from engine.native.argmax import NativeArgmax
    except ImportError:
        NativeArgmax = None
    ops = NativeLayerOps.load()
    argmax = NativeArgmax.load() if NativeArgmax is not None else None
    g = torch.Generator().manual_seed(0)
    results: dict[str, dict[str, float]] = {}
    for m in rows:
        gate_up = torch.randn(m, 2 * INTERMEDIATE, generator=g) * 4
        logits = torch.randn(min(m, 64), VOCAB, generator=g) * 3  # a step samples at most one row a sequence
        arms: dict[str, Callable[[], object]] = {"silu_torch": lambda: TorchLayerOps.silu_mul(gate_up),
                                                 "argmax_torch": lambda: logits.argmax(dim=-1)}
        if ops is not None:
            torch.testing.assert_close(ops.silu_mul(gate_up), TorchLayerOps.silu_mul(gate_up), rtol=2e-6, atol=1e-6)
            arms["silu_native"] = lambda: ops.silu_mul(gate_up)
        if argmax is not None:
            assert torch.equal(argmax(logits), logits.argmax(dim=-1))
            arms["argmax_native"] = lambda: argmax(logits)
        results[str(m)] = {f"{k}_ms": 1e3 * s for k, s in alternate(arms, repeats).items()}
    return {"threads": torch.get_num_threads(), "repeats": repeats, "ms": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_small_ops", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,8,64,2048")
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run([int(v) for v in args.rows.split(",")], args.repeats)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['threads']} thread(s), medians of {r['repeats']} (ms); argmax over min(rows, 64) rows")
    for m, arms in r["ms"].items():
        line = "  ".join(f"{k[:-3]} {v:8.3f}" for k, v in arms.items())
        print(f"{int(m):5d} rows  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
