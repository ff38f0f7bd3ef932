"""The all-reduce's share of a tensor-parallel decode step (the colocated engine, gloo on CPU).

A batch of sequences is prefilled, then ``--steps`` decode steps of the whole batch are timed on
rank 0 with a ``CollectiveTimer`` on its group (engine/parallel/group.py): the wall time inside its
all-reduces (two a layer and the embedding's) and the logits' gather, against the steps' own. Rank
0's wait inside a collective includes the other ranks' lateness at that point: what the step
spends there, whichever rank is slower.

    python -m bench.tp_allreduce_share [--model tiny|default|DIR] [--tp 2] [--batch 4]
        [--context 64] [--steps 30] [--threads 1] [--json]

``--model tiny`` builds the seeded tiny Llama (engine/model/tiny.py) in a temporary directory;
``default`` is SmolLM2-135M-Instruct. ``--threads``: torch threads of each rank.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from bench.host_step import start_decoding, time_steps


def measure(model: str, tp: int, batch: int, context: int, steps: int, threads: int = 1) -> dict:
    from engine.config import EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.model.tiny import build_tiny_model
    from engine.parallel.group import CollectiveTimer
    from engine.sampling_params import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", seed=0)) if model == "tiny" else model
        engine = LLMEngine(
            EngineConfig(
                model=model_dir,
                device="cpu",
                dtype="float32",
                tensor_parallel_size=tp,
                num_threads=threads,
                scheduler=SchedulerConfig(max_num_seqs=batch),
            )
        )
    try:
        vocab = engine.model_config.vocab_size
        rng = random.Random(0)
        params = SamplingParams(max_tokens=steps + 64, ignore_eos=True, detokenize=False)
        prompts = [[rng.randrange(3, vocab) for _ in range(context)] for _ in range(batch)]
        start_decoding(engine, prompts, params)
        time_steps(engine, 3)  # warm
        timer = CollectiveTimer()
        group = engine.ranks.group if engine.ranks is not None else None
        if group is not None:
            group.timer = timer
        try:
            times = time_steps(engine, steps)
        finally:
            if group is not None:
                group.timer = None
        so = engine.last_scheduler_output
        if so is None or len(so.slots) != batch or any(c != 1 for c in so.counts):
            raise RuntimeError("a timed step was not a decode step of the whole batch")
    finally:
        engine.close()
    total = sum(times)
    return {
        "model": model if model in ("tiny", "default") else engine.model_config.architecture,
        "tp": tp,
        "threads_per_rank": threads,
        "batch": batch,
        "context": context,
        "steps": steps,
        "step_ms": round(statistics.median(times) * 1e3, 3),
        "all_reduce_ms_per_step": round(timer.all_reduce_s / steps * 1e3, 3),
        "all_reduces_per_step": timer.all_reduce_calls / steps,
        "gather_ms_per_step": round(timer.gather_s / steps * 1e3, 3),
        "all_reduce_share": round(timer.all_reduce_s / total, 4),
        "gather_share": round(timer.gather_s / total, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = measure(a.model, a.tp, a.batch, a.context, a.steps, a.threads)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print(
            f"{r['model']} TP {r['tp']} ({r['threads_per_rank']} thread(s) a rank), batch {r['batch']}: "
            f"decode step {r['step_ms']:.3f} ms; all-reduce {r['all_reduce_ms_per_step']:.3f} ms a step "
            f"({r['all_reduces_per_step']:g} calls, {100 * r['all_reduce_share']:.1f}% of the step), "
            f"logits gather {r['gather_ms_per_step']:.3f} ms ({100 * r['gather_share']:.1f}%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
