"""Scheduler + batch-preparation time per step with many running sequences (no model).

Measures what the engine spends per step outside the forward pass: ``Scheduler.schedule()`` plus the
runner's ``InputBatch.apply`` + ``prepare`` (the numpy batch tensors), with ``num_seqs`` requests in
steady decode. ``update_from_output`` (appending sampled tokens, stop checks) is reported separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.fake_runner import FakeModelRunner
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import RunnerOutput


def measure(num_seqs: int = 256, prompt_len: int = 128, steps: int = 400, block_size: int = 16) -> dict:
    if steps < 2:
        raise ValueError(f"--steps must be at least 2 (a median and a p90 need steps), got {steps}")
    max_len = prompt_len + block_size + steps + 64
    blocks = num_seqs * (-(-max_len // block_size)) + 16
    sched = Scheduler(SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=8192),
                      BlockManager(blocks, block_size), max_len)
    runner = FakeModelRunner(max_num_seqs=num_seqs, max_model_len=max_len, block_size=block_size)
    params = SamplingParams(max_tokens=steps + 32, ignore_eos=True, detokenize=False)
    for i in range(num_seqs):
        # Staggered lengths, as in real traffic: each step 1/block_size of the sequences crosses a block.
        n = prompt_len + i % block_size
        sched.add_request(Request(f"r{i}", [(i * 7 + j) % 30000 + 3 for j in range(n)], params))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or sched.num_waiting:
        sched.update_from_output(runner.execute(sched.schedule()))  # prefill everything first

    sched_prep, update = [], []
    batch = runner.batch
    for _ in range(steps):
        t0 = time.perf_counter()
        so = sched.schedule()
        batch.apply(so)
        inputs = batch.prepare(so)
        t1 = time.perf_counter()
        assert len(so.slots) == num_seqs
        rows = inputs.sample_rows
        sampled = (batch.token_ids[rows, batch.num_tokens[rows] - 1] + 1) % 30000 + 3
        batch.append_sampled(rows, sampled)
        out = RunnerOutput(rows.tolist(), sampled.tolist())
        t2 = time.perf_counter()
        sched.update_from_output(out)
        t3 = time.perf_counter()
        sched_prep.append(t1 - t0)
        update.append(t3 - t2)
    q = statistics.quantiles(sched_prep, n=10)
    return {
        "num_seqs": num_seqs,
        "steps": steps,
        "schedule_prepare_median_us": statistics.median(sched_prep) * 1e6,
        "schedule_prepare_p90_us": q[8] * 1e6,
        "update_median_us": statistics.median(update) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = measure(a.num_seqs, steps=a.steps)
    print(json.dumps(r) if a.json else "\n".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
