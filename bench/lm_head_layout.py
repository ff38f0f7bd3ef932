"""Decode steps with the CPU head transposed (``engine.model.llama``) vs ``F.linear`` on the head as
stored, alternating in one process on the same engine (same-run baseline). The transposed arm
uses it at every row count (the engine does below ``FEW_ROWS`` only; this is how that was chosen).

    python -m bench.lm_head_layout [--model default] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    from bench.profile.measure import StepTimer, engine_for_grid, quick_grid

    p = argparse.ArgumentParser(prog="python -m bench.lm_head_layout", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from engine.model import llama

    grid = quick_grid()
    engine = engine_for_grid(args.model, grid, args.threads)
    model = engine.runner.model
    transposed, few_rows = model.lm_head_t, llama.FEW_ROWS
    timer = StepTimer(engine, grid)
    print("| decode rows | context | F.linear ms | transposed ms | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in (1, 2, 3, 4, 8):
        for context in (80, 1040):
            times: dict[str, list[float]] = {"linear": [], "transposed": []}
            for _ in range(args.rounds):
                for name, head, few in (("linear", None, few_rows), ("transposed", transposed, 1 << 30)):
                    model.lm_head_t, llama.FEW_ROWS = head, few
                    times[name] += [s.seconds for s in timer.decode([context] * rows)]
            a, b = statistics.median(times["linear"]), statistics.median(times["transposed"])
            print(f"| {rows} | {context} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f}x |", flush=True)
    model.lm_head_t, llama.FEW_ROWS = transposed, few_rows
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
