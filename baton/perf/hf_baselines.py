"""Hugging Face transformers baselines for the offline benchmark.

Two baselines, both greedy, fp32 by default, on CPU, with EOS ignored so every request produces exactly its
``max_tokens`` tokens (the same useful work Baton does):

* ``run_hf_static``: classic static batching with ``model.generate``. Requests are taken in order in batches of
  ``batch_size``, left-padded to the batch's longest prompt, and each batch runs until its *longest* request is done.
  Tokens generated past a request's own ``max_tokens`` are wasted work: that waste is what the baseline measures.
* ``run_hf_continuous``: transformers' own continuous batching (``ContinuousBatchingManager``), with a per-request
  ``max_new_tokens``, every request submitted at t=0 and a paged KV cache big enough for the whole workload.

Throughput is *useful* output tokens (the sum of every request's ``max_tokens``) per second of generation time; model
loading and warmup are never timed.

Run ``python -m baton.perf.hf_baselines --model-dir DIR [--gguf-file F] --n 64 --json`` to measure both on the full
``anyscale-cpu`` workload.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from baton.perf.offline_workloads import OfflineRequest, anyscale_cpu, describe, total_output_tokens
from baton.perf.other_load import OtherLoad, wait_until_idle

# transformers is a test/bench dependency only: it is imported inside the functions that need it.

# On CPU, SDPA is the fastest attention transformers has (no flash kernels), and one of the two implementations
# continuous batching accepts (the other, "paged|eager", materializes the score matrices with plain matmuls).
CPU_ATTN_IMPLEMENTATION = "sdpa"

# The logger transformers' continuous batching writes to (it does not propagate to the "transformers" logger).
_CB_LOGGER_NAME = "ContinuousBatchingLogger"


@dataclass
class BaselineResult:
    """Outcome of one baseline run. ``outputs`` holds the generated ids per request, in request order."""

    name: str
    useful_output_tokens: int
    seconds: float
    tok_s: float
    outputs: list[list[int]] | None
    # Run facts worth reporting next to the throughput (computed tokens, CB settings, ...).
    details: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info/warning chatter, restoring the previous settings afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    cb_logger = logging.getLogger(_CB_LOGGER_NAME)
    cb_level = cb_logger.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cb_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        cb_logger.setLevel(cb_level)


@contextmanager
def _torch_threads(num_threads: int | None) -> Iterator[None]:
    """Optionally pin torch's intra-op thread count for the duration of a run, restoring it afterwards."""
    previous = torch.get_num_threads()
    if num_threads is None or num_threads == previous:
        yield
        return
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def load_hf_model(model_dir: Path | str, dtype: torch.dtype = torch.float32, gguf_file: str | None = None):
    """Load a causal LM on CPU in eval mode with SDPA attention. ``gguf_file`` (inside ``model_dir``) is dequantized
    to ``dtype`` by transformers, which is how the default GGUF model is compared like for like."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": CPU_ATTN_IMPLEMENTATION}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    # The GGUF converter draws a raw tqdm bar that ignores transformers' switch: hold its stderr, replay it on error.
    held = io.StringIO()
    try:
        with _quiet_transformers(), redirect_stderr(held) if gguf_file is not None else nullcontext():
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    return model.to("cpu").eval()


def _pad_id(model) -> int:
    """Any id works as padding (it is masked out); prefer the model's own pad id, else 0."""
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts to the longest one: (input_ids, attention_mask), both [batch, longest]."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return input_ids, mask


def _generate_greedy(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy ``generate`` that never stops at EOS; returns only the generated ids, [batch, new_tokens].

    ``eos_token_id=None`` must be a *kwarg*: a GenerationConfig object with eos None would be back-filled from the
    model's generation config. No ``min_new_tokens`` either: it would add a logits processor, i.e. change compute.
    """
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        num_beams=1,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=_pad_id(model),
        use_cache=True,
    )
    generated = out[:, input_ids.shape[1] :]
    if generated.shape[1] != new_tokens:
        raise RuntimeError(f"generate stopped after {generated.shape[1]} of {new_tokens} tokens: EOS was not ignored")
    return generated


def run_hf_static(
    model, requests: Sequence[OfflineRequest], batch_size: int = 16, num_threads: int | None = None
) -> BaselineResult:
    """Static batching with ``model.generate``: batches of ``batch_size`` in request order, each running until its
    longest request ends. Only the generate calls are timed (a short untimed warmup comes first)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pad_id = _pad_id(model)
    outputs: list[list[int]] = []
    seconds = 0.0
    computed = 0  # generated rows x steps, wasted tokens included
    with _quiet_transformers(), _torch_threads(num_threads), torch.inference_mode():
        if requests:  # warmup: one-time allocator / oneDNN setup costs stay off the clock
            ids, mask = _left_pad([requests[0].prompt_token_ids[:8]] * 2, pad_id)
            _generate_greedy(model, ids, mask, 2)
        load = OtherLoad()
        for start in range(0, len(requests), batch_size):
            batch = requests[start : start + batch_size]
            ids, mask = _left_pad([r.prompt_token_ids for r in batch], pad_id)
            new_tokens = max(r.max_tokens for r in batch)
            t0 = perf_counter()
            generated = _generate_greedy(model, ids, mask, new_tokens)
            seconds += perf_counter() - t0
            computed += len(batch) * new_tokens
            outputs.extend(generated[row, : r.max_tokens].tolist() for row, r in enumerate(batch))
        other_load, threads = load.cpus(), torch.get_num_threads()
    useful = total_output_tokens(requests)
    details = {
        "batch_size": batch_size,
        "computed_output_tokens": computed,
        "threads": threads,
        "other_load_cpus": other_load,
    }
    return BaselineResult("hf-static", useful, seconds, useful / seconds if seconds > 0 else 0.0, outputs, details)


@dataclass(frozen=True)
class CBSettings:
    """The continuous batching knobs this baseline sets, chosen to be favourable to transformers on a small CPU.

    * With SDPA (the best CPU option: no flash or block-table kernels there), transformers' CB packs the batch into
      ONE sequence and attends through a dense block-diagonal mask [batch query tokens, batch KV tokens]: attention
      is quadratic in the batch (a decode step of B requests with ~L cached tokens costs B * (B * L), not B * L), and
      a prefill chunk attends densely to every decoding request's KV too. Hence a capped ``max_requests_per_batch``
      and a small ``max_batch_tokens`` (prefill chunk); the 8192-token default would attend 8192 x 8192 per layer.
    * Sweep on the full anyscale-cpu workload (SmolLM2-135M fp32, 2 vCPUs, machine otherwise idle), useful tok/s for
      B x M = max_requests_per_batch x max_batch_tokens: 8x128 45, 16x64 46, 16x128 40-52 (4 runs), 16x256 47-48,
      32x128 45, 32x256 48, 32x512 45, 64x256 44; the prefill-first scheduler 36-52. Repeats of one setting vary by
      ~20%, so the plateau is flat; 16 x 128 with HF's default FIFO scheduler sits in its middle. (Static generate
      keeps both cores busy; this CB loop averages ~1.35 of 2, and with 1 thread it loses only ~10%.)
    * ``page_size`` 64, not 256: no CPU kernel cares, and smaller pages waste less cache. ``num_blocks`` is sized
      from the workload (every request's full length at once, with headroom over the scheduler's 15% safety margin)
      so nothing is ever preempted or offloaded.
    * No prefix sharing (random prompts share no prefix: the hashing is pure overhead); no async batching, CUDA
      graphs or torch.compile (no streams or graphs on CPU, and compiling on 2 cores costs minutes of warmup plus
      recompiles on the varying shapes).
    """

    max_requests_per_batch: int = 16
    max_batch_tokens: int = 128
    page_size: int = 64
    scheduler_type: str = "fifo"
    cache_headroom: float = 1.3  # cache capacity / workload footprint; > 1 / (1 - 0.15 safety margin)

    def num_blocks(self, requests: Sequence[OfflineRequest]) -> int:
        """Blocks holding every request's prompt + output at once, with headroom."""
        need = sum(math.ceil((len(r.prompt_token_ids) + r.max_tokens) / self.page_size) for r in requests)
        return max(4, math.ceil(need * self.cache_headroom) + 2)

    def to_config(self, requests: Sequence[OfflineRequest]):
        from transformers import ContinuousBatchingConfig

        return ContinuousBatchingConfig(
            page_size=self.page_size,
            num_blocks=self.num_blocks(requests),
            max_batch_tokens=self.max_batch_tokens,
            max_requests_per_batch=self.max_requests_per_batch,
            max_blocks_per_request=0,  # the block-table decode path needs flash kernels: not on CPU
            allow_block_sharing=False,
            use_async_batching=False,
            use_cuda_graph=False,
            default_compile_level=0,
            scheduler_type=self.scheduler_type,
            auto_switch_to_flash=False,
            seed=0,
        )


def _collect(manager, ids: set[str], timeout_s: float) -> dict[str, Any]:
    """Wait for the finished results of ``ids``; fail loudly on a dead loop, an error, or a stranger's result."""
    results: dict[str, Any] = {}
    deadline = perf_counter() + timeout_s
    while len(results) < len(ids):
        out = manager.get_result(timeout=0.5)
        if out is None:
            if not manager.is_running():
                raise RuntimeError(f"continuous batching loop stopped with {len(ids) - len(results)} requests left")
            if perf_counter() > deadline:
                raise TimeoutError(f"continuous batching: {len(ids) - len(results)} requests unfinished")
            continue
        if out.error is not None:
            raise RuntimeError(f"continuous batching request {out.request_id} failed: {out.error}")
        if out.request_id not in ids:
            raise RuntimeError(f"unexpected continuous batching result for {out.request_id!r}")
        if out.is_finished():
            results[out.request_id] = out
    return results


def run_hf_continuous(
    model,
    requests: Sequence[OfflineRequest],
    settings: CBSettings | None = None,
    num_threads: int | None = None,
    timeout_s: float = 3600.0,
) -> BaselineResult:
    """transformers continuous batching with a per-request ``max_new_tokens``, all requests submitted at t=0.

    The manager is used directly (``generate_batch`` takes a single ``max_new_tokens``). The clock runs from the
    first submission to the last result; an untimed warmup request goes through the same manager first. Each result
    is matched to its request by id and checked against its prompt and its exact length.
    """
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    settings = settings or CBSettings()
    if not requests:
        return BaselineResult("hf-continuous", 0, 0.0, 0.0, [], {"settings": asdict(settings)})
    # eos -1 disables EOS in CB (ids < 0 are dropped from the stop set); no processors, so argmax of raw logits.
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=max(r.max_tokens for r in requests))
    cb_config = settings.to_config(requests)
    hints = WorkloadHints(
        max_prompt_length=max(len(r.prompt_token_ids) for r in requests),
        max_generated_length=gen_config.max_new_tokens,
        num_requests=len(requests),
    )
    ids = [f"bench-{i}" for i in range(len(requests))]
    with _quiet_transformers(), _torch_threads(num_threads), torch.inference_mode():
        manager = model.init_continuous_batching(
            generation_config=gen_config, continuous_batching_config=cb_config, workload_hints=hints
        )
        try:
            manager.start()
            # Warmup (untimed): builds the batch processor and cache, and runs one prefill + a few decode steps.
            manager.add_request(list(requests[0].prompt_token_ids[:16]), "warmup", max_new_tokens=4, eos_token_id=-1)
            _collect(manager, {"warmup"}, timeout_s)

            load, t0 = OtherLoad(), perf_counter()
            for rid, r in zip(ids, requests):
                manager.add_request(list(r.prompt_token_ids), rid, max_new_tokens=r.max_tokens, eos_token_id=-1)
            results = _collect(manager, set(ids), timeout_s)
            seconds = perf_counter() - t0
            other_load, threads = load.cpus(), torch.get_num_threads()
            resolved = manager.continuous_batching_config
        finally:
            manager.stop(block=True)
            manager.destroy()

    outputs: list[list[int]] = []
    for rid, r in zip(ids, requests):
        out = results[rid]
        if list(out.prompt_ids) != list(r.prompt_token_ids):
            raise RuntimeError(f"result {rid} carries another request's prompt")
        if len(out.generated_tokens) != r.max_tokens:
            raise RuntimeError(f"result {rid}: {len(out.generated_tokens)} tokens, expected {r.max_tokens}")
        outputs.append(list(out.generated_tokens))
    useful = total_output_tokens(requests)
    details = {
        "settings": asdict(settings),
        "num_blocks": resolved.num_blocks,
        "max_batch_tokens": resolved.max_batch_tokens,
        "max_requests_per_batch": resolved.max_requests_per_batch,
        "attn_implementation": model.config._attn_implementation,
        "threads": threads,
        "other_load_cpus": other_load,
    }
    return BaselineResult("hf-continuous", useful, seconds, useful / seconds if seconds > 0 else 0.0, outputs, details)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m baton.perf.hf_baselines", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--gguf-file", default=None, help="GGUF file inside --model-dir (dequantized to fp32)")
    p.add_argument("--n", type=int, default=64, help="number of requests of the anyscale-cpu workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--avoid-ids", default="0,1,2", help="comma-separated special token ids kept out of prompts")
    p.add_argument("--batch-size", type=int, default=16, help="static baseline batch size")
    p.add_argument("--cb-max-requests", type=int, default=CBSettings.max_requests_per_batch)
    p.add_argument("--cb-max-batch-tokens", type=int, default=CBSettings.max_batch_tokens)
    p.add_argument("--only", choices=["static", "continuous"], default=None, help="run a single baseline")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: leave as is)")
    p.add_argument("--wait-idle", type=float, default=0.0, help="wait up to this many seconds for a quiet machine")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both baselines on the anyscale-cpu workload and print the results."""
    args = _parse_args(argv)
    model = load_hf_model(args.model_dir, gguf_file=args.gguf_file)
    avoid = frozenset(int(x) for x in args.avoid_ids.split(",") if x.strip())
    requests = anyscale_cpu(model.config.vocab_size, n=args.n, seed=args.seed, avoid_ids=avoid)
    settings = CBSettings(max_requests_per_batch=args.cb_max_requests, max_batch_tokens=args.cb_max_batch_tokens)

    results: list[BaselineResult] = []
    if args.only in (None, "static"):
        idle = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else None
        results.append(run_hf_static(model, requests, batch_size=args.batch_size, num_threads=args.threads))
        results[-1].details["other_load_cpus_before"] = idle
    if args.only in (None, "continuous"):
        idle = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else None
        results.append(run_hf_continuous(model, requests, settings, num_threads=args.threads))
        results[-1].details["other_load_cpus_before"] = idle
    if len(results) == 2:  # both are greedy fp32 on the same inputs: report how far their outputs agree
        same = sum(a == b for a, b in zip(results[0].outputs or [], results[1].outputs or []))
        results[1].details["requests_identical_to_static"] = same

    report = {
        "workload": {"name": "anyscale-cpu", "seed": args.seed, **describe(requests)},
        "results": [{k: v for k, v in asdict(r).items() if k != "outputs"} for r in results],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"workload: {report['workload']}")
        for r in results:
            print(f"{r.name:>14}: {r.tok_s:8.1f} useful tok/s  {r.seconds:8.1f} s  {r.details}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
