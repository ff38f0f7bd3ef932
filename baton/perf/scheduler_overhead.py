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
from engine.config import MAX_NUM_SEQS, SchedulerConfig
from engine.fake_runner import FakeModelRunner
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import RunnerOutput

# The measured steps: each one adds a token to every sequence, so the runner's token buffer (and the
# KV pool) grow with num_seqs x steps; far more than a median and a p90 need.
MAX_STEPS = 10_000
# Memory grows with num_seqs x max_len token slots (~60 bytes each: the runner's int64 buffer, the KV
# pool's block objects, the requests' token lists): 2**25 of them is about 2 GB.
MAX_TOKEN_SLOTS = 2**25
_BYTES_PER_SLOT = 60


def check_args(num_seqs: int, steps: int, prompt_len: int = 128, block_size: int = 16) -> None:
    """ValueError naming the flag, before anything is allocated."""
    if isinstance(num_seqs, bool) or not 1 <= num_seqs <= MAX_NUM_SEQS:
        raise ValueError(f"--num-seqs must be between 1 and {MAX_NUM_SEQS}, got {num_seqs}")
    if isinstance(steps, bool) or not 2 <= steps <= MAX_STEPS:
        raise ValueError(f"--steps must be between 2 and {MAX_STEPS} (a median and a p90 need at least 2), got {steps}")
    max_len = _max_len(num_seqs, steps, prompt_len, block_size)
    if num_seqs * (max_len + 1) > MAX_TOKEN_SLOTS:
        most = MAX_TOKEN_SLOTS // num_seqs - 1 - (max_len - steps)
        raise ValueError(
            f"--steps must be at most {most} with --num-seqs {num_seqs} (memory grows with "
            f"num_seqs x steps; the bench stays under ~{MAX_TOKEN_SLOTS * _BYTES_PER_SLOT / 1e9:.0f} GB), "
            f"got {steps}"
        )


def _budget(num_seqs: int) -> int:
    """Tokens a step: every sequence's decode in one step, and room beside them for prompt chunks."""
    return max(8192, 2 * num_seqs)


def _warmup_steps(num_seqs: int, prompt_len: int, block_size: int) -> int:
    """An upper bound on the steps that prefill every prompt: the first requests admitted decode (one
    token a step each) while the last ones prefill, so they must not reach max_tokens before the
    measured steps start."""
    per_step = _budget(num_seqs) - num_seqs  # what the decodes leave for prompt chunks
    return -(-num_seqs * (prompt_len + block_size) // per_step) + 2


def _max_len(num_seqs: int, steps: int, prompt_len: int, block_size: int) -> int:
    return prompt_len + block_size + _warmup_steps(num_seqs, prompt_len, block_size) + steps + 64


def measure(num_seqs: int = 256, prompt_len: int = 128, steps: int = 400, block_size: int = 16) -> dict:
    check_args(num_seqs, steps, prompt_len, block_size)
    warmup = _warmup_steps(num_seqs, prompt_len, block_size)
    max_len = _max_len(num_seqs, steps, prompt_len, block_size)
    blocks = num_seqs * (-(-max_len // block_size)) + 16
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=_budget(num_seqs)),
        BlockManager(blocks, block_size),
        max_len,
    )
    runner = FakeModelRunner(max_num_seqs=num_seqs, max_model_len=max_len, block_size=block_size)
    params = SamplingParams(max_tokens=warmup + steps + 32, ignore_eos=True, detokenize=False)
    for i in range(num_seqs):
        # Staggered lengths, as in real traffic: each step 1/block_size of the sequences crosses a block.
        n = prompt_len + i % block_size
        sched.add_request(Request(f"r{i}", [(i * 7 + j) % 30000 + 3 for j in range(n)], params))

    def prefilling() -> bool:
        return bool(sched.num_waiting) or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running)

    for _ in range(warmup):  # prefill everything first
        if not prefilling():
            break
        sched.update_from_output(runner.execute(sched.schedule()))
    if prefilling() or len(sched.running) != num_seqs:  # a bug here, not bad input
        raise AssertionError(
            f"after {warmup} prefill steps {len(sched.running)} of {num_seqs} sequences run "
            f"and {sched.num_waiting} wait"
        )

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
    print(
        json.dumps(r)
        if a.json
        else "\n".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in r.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
