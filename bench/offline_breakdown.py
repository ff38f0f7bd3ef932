"""Kept for CPU performance changes: where the offline run's time goes, by step kind and projection.

Where Baton's offline run spends its time: (a) of ``baton bench offline`` with every step timed and
bucketed by kind (prefill-carrying steps, decode steps by batch size), and the time spent inside
the projections (every ``Linear`` call: the GEMMs, the head included) against the whole run.

    python -m bench.offline_breakdown [--model default|tiny|PATH] [--workload anyscale-cpu] [--json]
        [--budget 2048] [--order arrival|longest-output-first] [--no-prefill-kernel] [--python-loop]

``--budget`` is the scheduler's token budget per step; ``--order longest-output-first`` submits the
requests by decreasing output length (all arrive at t = 0, so the queue takes them in that order): a
what-if for the schedule, since with EOS ignored a request's max_tokens is its exact output length.
``--no-prefill-kernel`` runs prefill attention on the CPU path's torch code instead of the compiled
kernel (an A/B of engine/native/paged_prefill.c over the whole run).

The projection timer wraps ``Linear.__call__`` for this process only (CPU: the calls are synchronous).
Decode steps run their layers in C (engine/native/decode_layers.c), where no ``Linear`` is called:
the timer then sees the prefill steps' projections and every step's head only. ``--python-loop``
turns the C loop off, so that every projection is timed (and the decode steps are slower).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict

BUCKETS = ("prefill", "decode<=8", "decode9-32", "decode33+")


def bucket_of(counts: list[int]) -> str:
    if any(c > 1 for c in counts):
        return "prefill"
    n = len(counts)
    return "decode<=8" if n <= 8 else "decode9-32" if n <= 32 else "decode33+"


ORDERS = ("arrival", "longest-output-first")


def run(
    model: str = "default",
    workload: str = "anyscale-cpu",
    threads: int | None = None,
    budget: int = 2048,
    order: str = "arrival",
    prefill_kernel: bool = True,
    c_loop: bool = True,
) -> dict:
    from baton.perf.offline import model_and_workload
    from baton.perf.offline_baton import warmup
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.model import linear
    from engine.sampling_params import SamplingParams

    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    model_dir, requests = model_and_workload(model, workload, None)
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            num_threads=threads,
            cache=CacheConfig(),
            scheduler=SchedulerConfig(max_num_batched_tokens=budget),
        )
    )
    if not prefill_kernel:
        engine.runner.attn.prefill.__self__.native_prefill = None  # type: ignore[attr-defined]  # the CPU backend's
    kernels = engine.runner.model.kernels
    c_loop = c_loop and kernels.decode_layers is not None
    if not c_loop:
        engine.runner.model.use_kernels(dataclasses.replace(kernels, decode_layers=None))
    if order == "longest-output-first":
        requests = sorted(requests, key=lambda r: -r.max_tokens)
    warmup(engine)
    in_projections = [0.0]
    real_call = linear.Linear.__call__

    def timed_call(self, x):
        t = time.perf_counter()
        y = real_call(self, x)
        in_projections[0] += time.perf_counter() - t
        return y

    steps: dict[str, list[float]] = defaultdict(list)
    linear.Linear.__call__ = timed_call  # type: ignore[method-assign]  # timed, for this run only
    try:
        t0 = time.perf_counter()
        for r in requests:
            engine.add_request(
                None,
                list(r.prompt_token_ids),
                SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, detokenize=False),
            )
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            scheduled = engine.last_scheduler_output
            assert scheduled is not None  # (set by the step)
            steps[bucket_of(list(scheduled.counts))].append(time.perf_counter() - t)
        total = time.perf_counter() - t0
    finally:
        linear.Linear.__call__ = real_call  # type: ignore[method-assign]
    output_tokens = sum(r.max_tokens for r in requests)
    return {
        "model": model,
        "workload": workload,
        "budget": budget,
        "order": order,
        "prefill_kernel": prefill_kernel,
        "c_decode_loop": c_loop and engine.runner.model.decode_loop_planned,
        "seconds": total,
        "tok_s": output_tokens / total,
        "projection_seconds": in_projections[0],
        "steps": {
            k: {
                "steps": len(steps[k]),
                "seconds": sum(steps[k]),
                "ms_per_step": 1e3 * sum(steps[k]) / len(steps[k]) if steps[k] else 0.0,
            }
            for k in BUCKETS
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offline_breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--workload", default="anyscale-cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--order", choices=ORDERS, default="arrival")
    p.add_argument("--no-prefill-kernel", action="store_true", help="prefill attention on the torch path")
    p.add_argument(
        "--python-loop", action="store_true", help="decode steps' layers from Python, every projection timed"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(
        args.model,
        args.workload,
        args.threads,
        args.budget,
        args.order,
        not args.no_prefill_kernel,
        not args.python_loop,
    )
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{r['workload']} on {r['model']} (budget {r['budget']}, {r['order']} order): "
        f"{r['seconds']:.2f} s, {r['tok_s']:.1f} tok/s; "
        f"{r['projection_seconds']:.2f} s in projections ({r['projection_seconds'] / r['seconds']:.0%}"
        + ("; not the decode steps' layers, which run in C" if r["c_decode_loop"] else "")
        + ")"
    )
    for k, v in r["steps"].items():
        print(f"  {k:11s} {v['steps']:4d} steps  {v['seconds']:6.2f} s  {v['ms_per_step']:7.1f} ms/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
