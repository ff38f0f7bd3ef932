"""How much a worker's step slows down while another worker on the same host is busy (torch).

On a CPU host every worker is a process on its own core, but the cores share the memory bus and
the last-level cache, and a small model's decode step is memory-bound (it streams every weight
once per step). So two busy workers each run slower than one alone. This is measured directly:
a few representative steps are timed alone, then again while a second process (same model, same
threads) runs decode steps back to back; the slowdown per busy neighbour is the mean ratio - 1.
The simulator multiplies a step by ``1 + slowdown x (other busy workers on the host)``.

On GPUs, workers have their own devices: the slowdown is not measured there (0).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
from collections.abc import Callable

PROBES = (("decode", 4, 256), ("decode", 16, 64), ("prefill", 256, 0))


def _neighbour(model_dir: str, threads: int | None, ready, stop, batch: int = 8, context: int = 256) -> None:
    """A busy worker next door: steady decode steps until told to stop (runs in a child process)."""
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    eng = LLMEngine(
        EngineConfig(
            model=model_dir,
            num_threads=threads,
            scheduler=SchedulerConfig(max_num_seqs=batch + 2),
            cache=CacheConfig(num_blocks=batch * (-(-(context + 1100) // 16)) + 16),
        )
    )
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    n = 0
    ready.set()
    while not stop.is_set():
        if not eng.has_unfinished_requests():
            for _ in range(batch):
                n += 1
                eng.reserve(f"bg-{n}", [5 + (i % 1000) for i in range(context - 1)], params)
                eng.kv_arrived(f"bg-{n}", 7)
        eng.step()


def _probe(timer, repeats: int) -> list[float]:
    out = []
    for kind, a, b in PROBES:
        times = []
        for _ in range(repeats):
            samples = timer.decode([b] * a) if kind == "decode" else timer.prefill(a, b)
            times += [s.seconds for s in samples]
        out.append(statistics.median(times))
    return out


def neighbour_slowdown(
    timer, model_dir: str, threads: int | None, repeats: int = 2, progress: Callable[[str], None] = lambda m: None
) -> float:
    """Relative slowdown of this engine's steps per busy neighbour (>= 0)."""
    alone = _probe(timer, repeats)
    ctx = mp.get_context("spawn")  # a clean interpreter: no forked torch thread pools
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_neighbour, args=(model_dir, threads, ready, stop), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the neighbour process did not start")
        busy = _probe(timer, repeats)
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    ratios = [b / a for a, b in zip(alone, busy)]
    progress(
        "steps next to a busy worker: " + ", ".join(f"{k} {x}x{y} {r:.2f}x" for (k, x, y), r in zip(PROBES, ratios))
    )
    return max(0.0, statistics.fmean(ratios) - 1.0)
