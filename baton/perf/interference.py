"""Prefill/decode interference on the same cores: colocated vs disaggregated, one run.

Steady interactive traffic (``interactive`` concurrent streams with short prompts and long
outputs, each replaced by a new one as soon as it finishes) while long prompts (``long_len``
tokens) arrive every ``long_every_s`` seconds. Output lengths vary per request
(``interactive_max_tokens``, uniform), so the streams do not finish, and send their next prompts,
in lockstep: with one fixed length they all restart in the same step for the whole run, a burst
of short prefills that is an artifact of the workload, not steady traffic. Both setups use the
same cores and the same engine settings; they differ only in where prefill runs:

* colocated: one decode worker with ``2 * threads`` torch threads prefills and decodes everything;
* disaggregated: one prefill worker and one decode worker with ``threads`` threads each; short
  prompts prefill on the decode worker, at most ``decode_prefill_token_budget`` tokens a step,
  except those the prefill worker has room for when they arrive (``short_prompts_to_idle_prefill``).

Reported per setup: inter-token latency of the interactive streams (p50/p90/p99/p99.9/max, measured where
the client receives tokens), the share of their gaps, and of their waiting time, in stalls of at
least ``STALL_S``, their time to first token, the long prompts' time to first token,
and throughput (output tokens/s and total prompt+output tokens/s) over the measured window.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from baton.cluster import ClusterConfig, LocalCluster
from baton.perf.interference_workload import InterferenceWorkload, add_arguments, workload_from_args
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams
from router.stream import RequestFailed

STALL_S = 0.5  # an inter-token gap a reader notices: the stalls behind a long prefill are 1-3 s


def _quantiles(xs: list[float]) -> dict:
    """p50/p90/p99, and p99.9 and the max: a stall behind a long prefill hits every stream at once but
    only once per long prompt, so where decode steps are short it is under 1% of the gaps."""
    if len(xs) < 2:
        return {"p50": None, "p90": None, "p99": None, "p999": None, "max": max(xs, default=None), "n": len(xs)}
    q = statistics.quantiles(xs, n=1000, method="inclusive")  # q[k - 1]: the k-per-mille point
    return {
        "p50": statistics.median(xs),
        "p90": q[899],
        "p99": q[989],
        "p999": q[998],
        "max": max(xs),
        "mean": statistics.fmean(xs),
        "n": len(xs),
    }


def _stalls(gaps: list[float], threshold_s: float) -> dict:
    """How much of the streaming the gaps of at least ``threshold_s`` make up: their share of the
    gaps (what a percentile sees) and of the time the streams spent waiting between tokens (what a
    reader sees: one 1.5 s stall among a hundred 15 ms gaps is 1% of the gaps but half the time)."""
    stalled = [g for g in gaps if g >= threshold_s]
    total = sum(gaps)
    return {
        "threshold_s": threshold_s,
        "n": len(stalled),
        "gap_share": len(stalled) / len(gaps) if gaps else None,
        "time_share": sum(stalled) / total if total else None,
    }


def drive(cluster: LocalCluster, w: InterferenceWorkload, vocab: int) -> dict:
    need = w.long_len + w.long_max_tokens
    if need > cluster.max_model_len:  # else the long prompts fail in their thread and nothing interferes
        raise ValueError(
            f"--long-len {w.long_len} + {w.long_max_tokens} output tokens exceed the model's context "
            f"length ({cluster.max_model_len})"
        )
    rng = random.Random(w.seed)
    lock = threading.Lock()
    finished: list = []  # (kind, stream, submit time)
    stop = threading.Event()
    t_start = time.monotonic()

    def run_interactive(slot: int) -> None:
        r = random.Random(w.seed * 1000 + slot)
        while not stop.is_set():
            prompt = [r.randrange(3, vocab) for _ in range(r.randint(*w.interactive_prompt))]
            t0 = time.monotonic()
            s = cluster.submit(
                prompt,
                SamplingParams(max_tokens=r.randint(*w.interactive_max_tokens), ignore_eos=True, detokenize=False),
            )
            try:
                s.result(600)
            except RequestFailed:  # the cluster shut down under it: the run is over
                return
            with lock:
                finished.append(("interactive", s, t0))

    def run_long() -> None:
        n = 0
        while not stop.wait(w.long_every_s if n else w.warmup_s / 2):
            prompt = [rng.randrange(3, vocab) for _ in range(w.long_len)]
            t0 = time.monotonic()
            s = cluster.submit(prompt, SamplingParams(max_tokens=w.long_max_tokens, ignore_eos=True, detokenize=False))
            n += 1
            threading.Thread(target=_await_long, args=(s, t0), daemon=True).start()

    def _await_long(s, t0: float) -> None:
        try:
            s.result(600)
        except RequestFailed:
            return
        with lock:
            finished.append(("long", s, t0))

    threads = [threading.Thread(target=run_interactive, args=(i,), daemon=True) for i in range(w.interactive)]
    threads.append(threading.Thread(target=run_long, daemon=True))
    for t in threads:
        t.start()
    time.sleep(w.warmup_s + w.duration_s)
    stop.set()
    window = (t_start + w.warmup_s, t_start + w.warmup_s + w.duration_s)
    for t in threads[:-1]:
        t.join(timeout=120)
    time.sleep(1.0)

    itl: list[float] = []
    ttft_i: list[float] = []
    ttft_long: list[float] = []
    out_tokens = prompt_tokens = 0
    with lock:
        done = list(finished)
    for kind, s, t0 in done:
        times = s.token_times
        in_window = [t for t in times if window[0] <= t <= window[1]]
        out_tokens += len(in_window)
        if s.first_token_time and window[0] <= s.first_token_time <= window[1]:
            prompt_tokens += s.num_prompt_tokens
            (ttft_i if kind == "interactive" else ttft_long).append(s.first_token_time - t0)
        if kind == "interactive":
            itl += [b - a for a, b in itertools.pairwise(times) if window[0] <= a and b <= window[1]]
    return {
        "itl_s": _quantiles(itl),
        "itl_stalls": _stalls(itl, STALL_S),
        "interactive_ttft_s": _quantiles(ttft_i),
        "long_ttft_s": _quantiles(ttft_long),
        "output_tok_s": out_tokens / w.duration_s,
        "total_tok_s": (out_tokens + prompt_tokens) / w.duration_s,
        "requests_finished": len(done),
    }


def run(
    model: str = "default",
    threads: int = 1,
    workload: InterferenceWorkload = InterferenceWorkload(),  # noqa: B008 - frozen
    max_num_batched_tokens: int = 2048,
    local_prefill_threshold: int = 256,
    small_chunk_baseline: int = 0,
    kv_shared_memory: bool = False,
    decode_prefill_token_budget: int | None = 256,
    short_prompts_to_idle_prefill: bool = True,
    progress=lambda m: None,
) -> dict:
    engine = EngineConfig(
        model=model,
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens),
        cache=CacheConfig(kv_cache_memory_gb=1.0, shared_memory=kv_shared_memory),
    )
    setups = {
        "colocated": ClusterConfig(
            prefill_workers=0,
            decode_workers=1,
            engine=engine,
            torch_threads_per_worker=2 * threads,
            cpus_per_worker=2 * threads,
        ),
        # Short (interactive) prompts prefill on the decode worker: conditional disaggregation.
        "disaggregated": ClusterConfig(
            prefill_workers=1,
            decode_workers=1,
            engine=engine,
            torch_threads_per_worker=threads,
            cpus_per_worker=threads,
            local_prefill_threshold=local_prefill_threshold,
            short_prompts_to_idle_prefill=short_prompts_to_idle_prefill,
            decode_prefill_token_budget=decode_prefill_token_budget,
        ),
    }
    if small_chunk_baseline:  # the other colocated remedy: smaller prefill chunks
        small = replace(engine, scheduler=SchedulerConfig(max_num_batched_tokens=small_chunk_baseline))
        setups[f"colocated_chunk{small_chunk_baseline}"] = replace(setups["colocated"], engine=small)
    out: dict[str, Any] = {
        "workload": workload.__dict__,
        "max_num_batched_tokens": max_num_batched_tokens,
        "model": model,
        "local_prefill_threshold": local_prefill_threshold,
        "kv_shared_memory": kv_shared_memory,
        "decode_prefill_token_budget": decode_prefill_token_budget,
        "short_prompts_to_idle_prefill": short_prompts_to_idle_prefill,
        "setups": list(setups),
    }
    for name, cfg in setups.items():
        progress(f"{name}: starting")
        cluster = LocalCluster(cfg)
        try:
            progress(f"{name}: driving {workload.warmup_s + workload.duration_s:.0f}s of traffic")
            out[name] = drive(cluster, workload, cluster.vocab_size)
        finally:
            cluster.shutdown()
        progress(f"{name}: p99 ITL {out[name]['itl_s']['p99']}")
    c, d = out["colocated"], out["disaggregated"]
    if c["itl_s"]["p99"] and d["itl_s"]["p99"]:
        out["p99_itl_ratio_colocated_over_disaggregated"] = c["itl_s"]["p99"] / d["itl_s"]["p99"]
        out["p999_itl_ratio_colocated_over_disaggregated"] = c["itl_s"]["p999"] / d["itl_s"]["p999"]
    out["throughput_ratio_disaggregated_over_colocated"] = (
        d["total_tok_s"] / c["total_tok_s"] if c["total_tok_s"] else None
    )
    return out


def run_from_args(a: argparse.Namespace) -> dict:
    return run(
        a.model,
        threads=1,
        workload=workload_from_args(a),
        max_num_batched_tokens=a.max_num_batched_tokens,
        local_prefill_threshold=a.local_prefill_threshold,
        small_chunk_baseline=a.small_chunk_baseline,
        kv_shared_memory=a.kv_shared_memory,
        decode_prefill_token_budget=a.decode_prefill_budget or None,
        short_prompts_to_idle_prefill=a.short_prompts_to_idle_prefill == "on",
        progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    add_arguments(ap)
    print(json.dumps(run_from_args(ap.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
