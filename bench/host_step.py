"""Kept for GPU and scheduler changes (gpu_check runs it): the host's share of an engine step.

The host's share of an engine step: ``engine.step()`` with the model's arithmetic taken out.

The model's forward returns zeros of the right shape at once, its head returns zero logits and the
sampler's arithmetic returns zero ids (on a GPU the argmax is device work; torch's CPU argmax is
~10x slower than a max and took ~1.2 ms of a 256-row step here), so what is timed is everything
else a step does on the host: scheduling, the runner's inputs, the sampled ids' bookkeeping, the
outputs and the state updates. On a GPU with CUDA graphs that is what runs before and after each
replay, so it bounds how much asynchronous scheduling could hide.

    python -m bench.host_step [--sizes 1,64,256] [--context 200] [--steps 50] [--json]

Each batch size is timed twice: ``host_ms``, the median of whole ``engine.step()`` calls, then the
median of each phase over as many more steps (``schedule_ms``, ``runner_ms``, ``update_ms``,
``outputs_ms``: timed over other steps than ``host_ms``, so their sum is only close to it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path


def start_decoding(engine, prompts: list[list[int]], params) -> list[str]:
    """Add one request per prompt and step until all of them decode (every prompt prefilled); their ids."""
    ids = [engine.add_request(None, prompt, params) for prompt in prompts]
    while True:
        engine.step()
        so = engine.last_scheduler_output
        if len(so.slots) == len(ids) and all(c == 1 for c in so.counts):
            return ids


def time_steps(engine, n: int) -> list[float]:
    """``n`` engine steps' wall times (on CUDA a step ends with the sampled ids on the host)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        engine.step()
        out.append(time.perf_counter() - t0)
    return out


PHASES = (
    ("schedule", "scheduler", "schedule"),
    ("runner", "runner", "execute"),
    ("update", "scheduler", "update_from_output"),
    ("outputs", "output_processor", "process"),
)


def time_phases(engine, n: int) -> dict[str, float]:
    """Median ms of each phase of ``n`` engine steps: the scheduler, the runner (inputs, the stubbed
    forward and sampler, the sampled ids' bookkeeping), the scheduler's update, the outputs. Each
    phase's method is wrapped on its instance for these steps only."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}

    def timed(name, fn):
        def wrapper(*args):
            t0 = time.perf_counter()
            out = fn(*args)
            times[name].append(time.perf_counter() - t0)
            return out

        return wrapper

    for name, owner, method in PHASES:
        obj = getattr(engine, owner)
        setattr(obj, method, timed(name, getattr(obj, method)))
    sizes = []
    try:
        for _ in range(n):
            engine.step()
            sizes.append(len(engine.last_scheduler_output.slots))
    finally:
        for _, owner, method in PHASES:
            delattr(getattr(engine, owner), method)  # the class's method again
    out = {f"{name}_ms": round(statistics.median(v) * 1e3, 3) for name, v in times.items()}
    out["batch_in_phases"] = min(sizes)  # (a batch that shrank would not be the size reported)
    return out


def measure(sizes: list[int], context: int, steps: int) -> dict:
    import torch

    from engine.config import EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.model.tiny import build_tiny_model
    from engine.sampling_params import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0)
        engine = LLMEngine(
            EngineConfig(
                model=str(model_dir), device="cpu", num_threads=1, scheduler=SchedulerConfig(max_num_seqs=max(sizes))
            )
        )
    model = engine.runner.model
    hidden, vocab = model.cfg.hidden_size, model.cfg.vocab_size
    zero_logits = torch.zeros(max(sizes), vocab)

    def no_forward(input_ids, positions, kv_cache, meta, attn, keep=None):
        return torch.zeros(input_ids.shape[0] if keep is None else len(keep), hidden)

    # The host's share of a step alone: the model and the sampler replaced by constant answers.
    model.forward = no_forward  # type: ignore[method-assign]
    model.compute_logits = lambda h: zero_logits[: h.shape[0]]  # type: ignore[method-assign,assignment]
    zero_ids = torch.zeros(max(sizes), dtype=torch.long)
    engine.runner.sampler.sample = lambda logits, params, positions: zero_ids[: logits.shape[0]]  # type: ignore[method-assign,assignment]
    rng = random.Random(0)
    rows = []
    for bs in sizes:
        params = SamplingParams(max_tokens=2 * steps + 32, ignore_eos=True, detokenize=False)
        ids = start_decoding(engine, [[rng.randrange(3, vocab) for _ in range(context)] for _ in range(bs)], params)
        times = time_steps(engine, steps)
        phases = time_phases(engine, steps)
        for i in ids:
            engine.abort(i)
        rows.append({"batch": bs, "host_ms": round(statistics.median(times) * 1e3, 3), **phases})
    return {"context": context, "steps": steps, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,64,256")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = measure(sorted({int(s) for s in a.sizes.split(",")}), a.context, a.steps)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        for row in r["rows"]:
            split = ", ".join(f"{name} {row[name + '_ms']:.3f}" for name, _, _ in PHASES)
            print(f"batch {row['batch']:4d}: {row['host_ms']:.3f} ms of host work a decode step ({split} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
