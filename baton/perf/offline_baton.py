"""One system under test of the offline benchmark (baton/perf/offline.py): Baton's own engine run
over a workload, timed off a warmup, with its KV waste, projection work and draft counts."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baton.perf.offline_workloads import OfflineRequest, total_output_tokens
from baton.perf.work import RowCost, WorkCounter
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams

# The transformers baselines run on CPU in fp32; "auto" would put Baton on a GPU in bf16 on a CUDA host.
BATON_DEVICE, BATON_DTYPE = "cpu", "float32"


@dataclass
class SystemResult:
    name: str
    seconds: float
    tok_s: float
    outputs: list[list[int]]
    details: dict = field(default_factory=dict)


def run_baton(
    engine_config: EngineConfig, requests: list[OfflineRequest], name: str, greedy_head: bool = True, amx: bool = True
) -> SystemResult:
    """``greedy_head=False``: greedy rows compute every logit (engine/native/greedy_head.py off: A/B runs);
    ``amx=False``: the layers' larger products keep the mode's own path (engine/native/amx_linear.py off)."""
    from engine.engine import LLMEngine

    engine = LLMEngine(engine_config)
    # An A/B arm: the same model with a kernel left out of its set (engine/kernels.py).
    left_out: dict[str, Any] = {name: None for name, keep in (("greedy_head", greedy_head), ("amx", amx)) if not keep}
    if left_out:
        engine.runner.model.use_kernels(dataclasses.replace(engine.runner.model.kernels, **left_out))
    warmup(engine)
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, detokenize=False) for r in requests]
    waste: list[float] = []
    model = engine.runner.model
    work, head, greedy = WorkCounter(RowCost.of(model.cfg)), model.compute_logits, model.greedy_tokens
    sampled = [0]

    def counted_logits(hidden):  # the head's rows: every row that samples
        sampled[0] += hidden.shape[0]
        return head(hidden)

    def counted_greedy(hidden):  # (the greedy head's rows count as head rows: the same product, screened)
        tokens = greedy(hidden)
        sampled[0] += 0 if tokens is None else hidden.shape[0]
        return tokens

    model.compute_logits, model.greedy_tokens = counted_logits, counted_greedy  # type: ignore[method-assign]  # counted
    candidates_before = model.greedy_head_candidates
    drafts_before = (engine.scheduler.num_draft_tokens, engine.scheduler.num_accepted_tokens)  # (the warmup's)
    t0 = time.perf_counter()
    ids = [engine.add_request(None, list(r.prompt_token_ids), p) for r, p in zip(requests, params)]
    done = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        steps += 1
        scheduled = engine.last_scheduler_output
        assert scheduled is not None  # (set by the step)
        work.add_step(scheduled.total_num_scheduled_tokens, sampled[0])
        sampled[0] = 0
        used, allocated = engine.kv_slot_usage()
        if allocated:
            waste.append(1 - used / allocated)
    seconds = time.perf_counter() - t0
    useful = total_output_tokens(requests)
    outputs = [done[i] for i in ids]
    assert all(len(o) == r.max_tokens for o, r in zip(outputs, requests)), "a request produced the wrong length"
    details = {
        "steps": steps,
        "kv_waste": sum(waste) / len(waste) if waste else 0.0,
        "preemptions": engine.scheduler.num_preemptions,
        "work": work.report(seconds),
        "drafts": engine.scheduler.num_draft_tokens - drafts_before[0],
        "drafts_kept": engine.scheduler.num_accepted_tokens - drafts_before[1],
        # exact logits the greedy head computed (engine/native/greedy_head.c; 0 where it is not used)
        "greedy_head_candidates": model.greedy_head_candidates - candidates_before,
    }
    engine.close()  # (its tensor-parallel ranks, if any)
    del engine
    gc.collect()
    _release_device_memory()
    return SystemResult(name, seconds, useful / seconds, outputs, details)


def _release_device_memory() -> None:
    """Hand a finished engine's GPU memory back to the driver: the next engine sizes its KV cache by
    the driver's free memory, which does not count torch's cached blocks."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def warmup(engine) -> None:
    """Off the clock: short prompts, then one step of a full token budget's prefill and a few decode
    steps of those rows. The systems share one process, and the first one timed would otherwise pay
    the process's first touch of a large step's activation memory and kernel set-up that the
    others then find done ((a)'s first run of three was ~14% slower than its others, 2026-11-27)."""
    engine.generate([[5, 6, 7, 8] * 4, [9, 10, 11]], SamplingParams(max_tokens=3, ignore_eos=True, detokenize=False))
    budget = engine.scheduler.config.max_num_batched_tokens
    length = max(1, min(256, engine.max_model_len - 8, budget))
    prompts = [[5 + (i * 7 + j) % 251 for j in range(length)] for i in range(max(1, budget // length))]
    engine.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))


def engine_configs(
    model_dir,
    threads: int | None,
    max_num_batched_tokens: int,
    device: str = BATON_DEVICE,
    dtype: str = BATON_DTYPE,
    tensor_parallel_size: int = 1,
) -> tuple[EngineConfig, EngineConfig]:
    """Baton's continuous-batching and static-batching configs (by default on the baselines' device and dtype;
    ``threads`` per rank at ``tensor_parallel_size`` > 1)."""
    # Any: EngineConfig's fields, of their several types
    base: dict[str, Any] = dict(
        model=str(model_dir),
        num_threads=threads,
        cache=CacheConfig(),
        device=device,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
    )
    cb = EngineConfig(**base, scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens))
    static = EngineConfig(
        **base,
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, policy="static", static_batch_size=16),
    )
    return cb, static


def without_native_kernels(run: Callable[[], SystemResult]) -> SystemResult:
    """Run with BATON_NATIVE_KERNELS=0 (read when an engine is built), then restore the setting."""
    from engine.native.build import DISABLE_ENV

    before = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = "0"
    try:
        return run()
    finally:
        if before is None:
            del os.environ[DISABLE_ENV]
        else:
            os.environ[DISABLE_ENV] = before
