"""Engine steps with the projections packed for oneDNN (``engine/model/linear.py``) vs dense
``F.linear``, alternating in one process on the same engine (same-run baseline): decode steps of
B sequences and prefill steps of T prompt tokens.

    python -m bench.packed_weights [--model default] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    from bench.profile.measure import Grid, StepTimer, engine_for_grid

    p = argparse.ArgumentParser(prog="python -m bench.packed_weights", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,2,3,4,8,16,32")
    p.add_argument("--contexts", default="80,1040")
    p.add_argument("--prompts", default="64,256,1024")
    args = p.parse_args(argv)

    rows = [int(r) for r in args.rows.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    prompts = [int(t) for t in args.prompts.split(",")]
    grid = Grid(decode=tuple((b, n) for b in rows for n in contexts), ragged=(),
                prefill=tuple((t, 0) for t in prompts), mixed=(), repeats=2, max_point_s=30.0)
    engine = engine_for_grid(args.model, grid, args.threads)
    model = engine.runner.model
    timer = StepTimer(engine, grid)
    print(f"model {args.model}, {args.threads} thread(s), median of {args.rounds} rounds x {grid.repeats} steps")
    print("| step | F.linear ms | packed ms | speed-up |")
    print("| --- | ---: | ---: | ---: |")

    def ab(label: str, timed) -> None:
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for packed in (False, True):
                model.set_packed(packed)
                times[packed] += [s.seconds for s in timed()]
        a, b = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {label} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f}x |", flush=True)

    for b, n in grid.decode:
        ab(f"decode {b} x {n}", lambda: timer.decode([n] * b))
    for tokens in prompts:
        ab(f"prefill {tokens}", lambda: timer.prefill(tokens, 0))
    model.set_packed(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
