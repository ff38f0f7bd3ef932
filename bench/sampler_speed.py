"""The sampler alone (engine/sampler.py): milliseconds per call for N rows of SmolLM2's 49,152-token
vocabulary, by sampling mode, in a process with an engine's malloc settings (engine/host_memory.py), on random logits of two shapes (``peaked``: N(0, 1) x 6, a few tokens
hold most of the mass; ``flat``: N(0, 1) x 2). Medians of ``--repeat`` calls after a warmup.

    python -m bench.sampler_speed [--rows 1,8,64] [--repeat 30] [--json]

For an A/B, run it in a worktree of the other commit, alternating (the sampler is one file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

VOCAB = 49152
MODES = {
    "greedy": {},
    "temperature 0.7": {"temperature": 0.7},
    "temperature 0.7, seeded": {"temperature": 0.7, "seed": 1},
    "top_p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "top_p 0.95, seeded": {"temperature": 1.0, "top_p": 0.95, "seed": 1},
    "top_k 50": {"temperature": 0.7, "top_k": 50},
    "min_p 0.05": {"temperature": 0.7, "min_p": 0.05},
}


def run(rows=(1, 8, 64), repeat: int = 30) -> dict:
    import torch

    from engine.host_memory import keep_freed_memory
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams

    keep_freed_memory()  # as an engine does: large buffers reused, not faulted in afresh each call
    torch.manual_seed(0)
    sampler = Sampler(0, torch.device("cpu"))
    out = []
    for shape, scale in (("peaked", 6.0), ("flat", 2.0)):
        for n in rows:
            logits = torch.randn(n, VOCAB) * scale
            for mode, kw in MODES.items():
                params = [SamplingParams(**kw)] * n
                positions = list(range(n))
                for _ in range(3):
                    sampler.sample(logits, params, positions)
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    sampler.sample(logits, params, positions)
                    times.append(time.perf_counter() - t0)
                out.append({"logits": shape, "rows": n, "mode": mode,
                            "ms": round(statistics.median(times) * 1e3, 3)})
    return {"vocab": VOCAB, "threads": torch.get_num_threads(), "results": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = run(tuple(int(x) for x in a.rows.split(",")), a.repeat)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print("| logits | rows | mode | ms |\n|---|---:|---|---:|")
    for x in r["results"]:
        print(f"| {x['logits']} | {x['rows']} | {x['mode']} | {x['ms']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
