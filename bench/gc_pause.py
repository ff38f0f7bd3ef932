"""How long a full garbage collection stops a process with a loaded engine, before and after
``freeze_startup_objects`` (engine/gc_freeze.py), which the worker actors call when they start.

    python -m bench.gc_pause [--model default|tiny|PATH] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def full_collection_ms(repeats: int) -> tuple[float, int]:
    """Median wall time of ``gc.collect()`` and the number of objects it walks."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, len(gc.get_objects())


def main(argv: list[str] | None = None) -> int:
    from bench.offline import model_and_workload
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.gc_freeze import freeze_startup_objects

    p = argparse.ArgumentParser(prog="python -m bench.gc_pause", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    model_dir, _ = model_and_workload(args.model, "anyscale-cpu-small", None)
    engine = LLMEngine(EngineConfig(model=str(model_dir)))
    before, walked = full_collection_ms(args.repeats)
    frozen = freeze_startup_objects()
    after, left = full_collection_ms(args.repeats)
    print(f"engine on {args.model}: a full collection took {before:.1f} ms over {walked} objects; "
          f"after freezing {frozen}, {after:.2f} ms over {left}")
    del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
