"""Kept for issue 49 (gpu_check runs it): the peer, side by side. Hugging Face transformers' own
continuous batching and Baton, on the same random-weight models, workload and device, in one process.

Both run the offline benchmark's ``anyscale-cpu`` workload (baton/perf/offline_workloads.py, EOS
ignored, so every system produces the same useful tokens) on the Llama-3.2-1B and Qwen2.5-0.5B
configurations with random weights (baton/perf/random_model.py), in bf16:

- (a) Baton continuous batching and (b) Baton static batching (batches of 16), each an ``LLMEngine``
  built and warmed off the clock for every run, as ``baton bench offline`` runs them
  (baton/perf/offline_baton.py);
- (c) transformers continuous batching: its manager over its paged cache, with the attention it
  picks itself (it switches to flash-attention where the image has it, else keeps SDPA), its CUDA
  graphs and asynchronous batching as it decides, its default step budget, no ``torch.compile``
  (minutes of warm-up); the cache is sized for the whole workload (nothing preempted) and prefix
  sharing is off (random prompts share nothing). One manager per model, warmed once by its own ``warmup()`` (its graphs
  captured) and a short batch, and kept between rounds, so every timed run finds it warm.

Rounds interleave the systems (a slow spell falls on all of them); each system reports its median
run (the faster of two). The report also counts the requests whose greedy tokens every run of
every system agreed on: all of them in fp32 on the reduced models; random bf16 weights leave
near-ties that another batch shape breaks differently, so there it is a figure, not a check.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check_peer --json    # CUDA; says so and exits 0 elsewhere
    python -m bench.gpu_check_peer --reduced --json               # tiny configs, fp32, few requests, CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton.perf.hf_baselines import _quiet_transformers  # (shared with the CPU baseline)
from baton.perf.offline import model_and_workload
from baton.perf.offline_baton import SystemResult, engine_configs, run_baton
from baton.perf.offline_workloads import OfflineRequest, describe, total_output_tokens
from baton.perf.random_model import PUBLISHED, build_random_model

MODELS = ("llama-3.2-1b", "qwen2.5-0.5b")
SYSTEMS = ("baton-cb", "baton-static", "hf-cb")
# The published configurations shrunk to a few hundred thousand weights (the reduced mode's models).
_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=1024,
    bos_token_id=1,
    eos_token_id=2,
)


@dataclass(frozen=True)
class Setup:
    """Where and on what the systems run."""

    device: str
    dtype: str
    workload: str
    n: int
    reduced: bool
    # transformers' cache page and step budget (None: its own)
    hf_page_size: int | None = None
    hf_max_batch_tokens: int | None = None

    def model_overrides(self, name: str) -> dict:
        if not self.reduced:
            return {}
        return {**_TINY, "head_dim": 16} if "head_dim" in PUBLISHED[name] else dict(_TINY)


# transformers' own step budget when it sizes its cache itself (5.17 and 5.24); given a cache size,
# 5.17 would instead grow the step to what memory allows, and its SDPA path attends densely over a step
FULL = Setup("cuda", "bfloat16", "anyscale-cpu", 256, reduced=False, hf_max_batch_tokens=8192)
# Small pages and steps: transformers' SDPA path attends densely over the whole step and cache.
REDUCED = Setup("cpu", "float32", "anyscale-cpu-small", 6, reduced=True, hf_page_size=16, hf_max_batch_tokens=256)


def _collect(manager, ids: set[str], timeout_s: float) -> dict[str, Any]:
    """The finished results of ``ids``; fails on a dead loop, a failed request or the time out (checked
    between results too: a slow peer's results keep arriving)."""
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids) - len(results)} of {len(ids)} requests unfinished")
        out = manager.get_result(timeout=0.1)  # (returns as soon as a result is there)
        if out is None:
            if not manager.is_running():
                raise RuntimeError(f"its loop stopped with {len(ids) - len(results)} requests unfinished")
        elif out.error is not None:
            raise RuntimeError(f"request {out.request_id} failed: {out.error}")
        elif out.request_id in ids and out.is_finished():
            results[out.request_id] = out
    return results


@dataclass
class TransformersCB:
    """transformers' continuous batching on one loaded model: one manager, warmed once, kept running
    between rounds (idle, it waits on an event: no work beside the other systems' runs). The manager
    itself, as ``generate_batch`` drives it: ``generate_batch`` gives every request one length."""

    model: Any
    requests: Sequence[OfflineRequest]
    manager: Any = None
    settings: dict = field(default_factory=dict)

    @classmethod
    def start(
        cls, model_dir: Path, requests: Sequence[OfflineRequest], setup: Setup, timeout_s: float
    ) -> TransformersCB:
        from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                str(model_dir), dtype=getattr(torch, setup.dtype), attn_implementation="sdpa"
            )
        model = model.to(setup.device).eval()
        # the cache page's field: "page_size" in transformers 5.24, "block_size" in the GPU image's 5.17
        fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        page_key = "page_size" if "page_size" in fields else "block_size"
        page = setup.hf_page_size or getattr(ContinuousBatchingConfig, page_key)
        need = sum(math.ceil((len(r.prompt_token_ids) + r.max_tokens) / page) for r in requests)
        cb_config = ContinuousBatchingConfig(
            **{page_key: page},
            num_blocks=math.ceil(need * 1.3) + 2,  # headroom over its scheduler's safety margin
            max_batch_tokens=setup.hf_max_batch_tokens,
            allow_block_sharing=False,
            default_compile_level=0,
            seed=0,
        )
        longest = max(r.max_tokens for r in requests)
        # eos -1: no stop token (EOS ignored, as Baton's runs); no processors: argmax of the raw logits
        gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=longest)
        hints = WorkloadHints(
            max_prompt_length=max(len(r.prompt_token_ids) for r in requests),
            max_generated_length=longest,
            num_requests=len(requests),
        )
        peer = cls(model, requests)
        # no_grad, as generate_batch: 5.17's loop thread runs outside inference mode, and would then refuse
        # to update the inference tensors an inference-mode warm-up made
        with _quiet_transformers(), torch.no_grad():
            peer.manager = model.init_continuous_batching(
                generation_config=gen_config, continuous_batching_config=cb_config, workload_hints=hints
            )
            peer.manager.warmup()  # its CUDA graphs captured at the largest shapes (a no-op without graphs)
            peer.manager.start()
            warm = {f"warm-{i}": r for i, r in enumerate(requests[:32])}  # a full prefill step, then decodes
            for rid, r in warm.items():
                peer.manager.add_request(list(r.prompt_token_ids), rid, max_new_tokens=4, eos_token_id=-1)
            _collect(peer.manager, set(warm), timeout_s)
        resolved = peer.manager.continuous_batching_config
        peer.settings = {
            "attn_implementation": model.config._attn_implementation,
            "use_cuda_graph": list(resolved.use_cuda_graph),
            "use_async_batching": resolved.use_async_batching,
            "decode_fast_path": resolved.max_blocks_per_request > 0,
            "page_size": getattr(resolved, page_key),
            **{k: getattr(resolved, k) for k in ("num_blocks", "max_batch_tokens", "max_requests_per_batch")},
        }
        return peer

    def run(self, round_no: int, timeout_s: float) -> SystemResult:
        """Every request submitted at once; the clock runs from the first submission to the last result."""
        ids = [f"r{round_no}-{i}" for i in range(len(self.requests))]
        with _quiet_transformers(), torch.no_grad():
            t0 = time.perf_counter()
            for rid, r in zip(ids, self.requests):
                self.manager.add_request(list(r.prompt_token_ids), rid, max_new_tokens=r.max_tokens, eos_token_id=-1)
            try:
                results = _collect(self.manager, set(ids), timeout_s)
            except TimeoutError as e:  # (the figure is then a bound)
                bound = total_output_tokens(self.requests) / timeout_s
                raise TimeoutError(f"{e} after {timeout_s:.0f} s: under {bound:,.0f} tok/s") from e
            seconds = time.perf_counter() - t0
        outputs = []
        for rid, r in zip(ids, self.requests):
            out = results[rid]
            if list(out.prompt_ids) != list(r.prompt_token_ids) or len(out.generated_tokens) != r.max_tokens:
                raise RuntimeError(f"{rid}: another request's prompt or {len(out.generated_tokens)} tokens")
            outputs.append(list(out.generated_tokens))
        useful = total_output_tokens(self.requests)
        return SystemResult("hf-cb", seconds, useful / seconds, outputs, dict(self.settings))

    def close(self) -> None:
        """Stop its loop (a run cut short would otherwise keep computing beside the next system's) and
        hand its cache back."""
        if self.manager is not None:
            self.manager.stop(block=True, timeout=30, hard_stop=True)
            self.manager.destroy()
            self.manager = None
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def compare_model(
    name: str, setup: Setup, rounds: int, folder: Path, deadline: float, hf_timeout_s: float, say: Callable
) -> dict:
    """One model: built, then ``rounds`` interleaved rounds of the three systems, inside ``deadline``
    (a run not started 20 s before it is skipped); transformers' runs stop at ``hf_timeout_s`` each."""
    model_dir = build_random_model(
        name, folder / name, device=setup.device, dtype=setup.dtype, **setup.model_overrides(name)
    )
    model_dir, requests = model_and_workload(str(model_dir), setup.workload, setup.n)
    cb_config, static_config = engine_configs(model_dir, None, 2048, setup.device, setup.dtype)
    errors: dict[str, str] = {}
    t0 = time.perf_counter()
    peer: TransformersCB | None = None
    if (left := deadline - time.monotonic()) < 20:
        errors["hf-cb"] = f"skipped at its start: {left:.0f} s left"
    else:
        try:
            peer = TransformersCB.start(model_dir, requests, setup, left)
        except Exception as e:  # noqa: BLE001 - a peer that cannot start on this image is a finding, not the end
            errors["hf-cb"] = f"start: {type(e).__name__}: {e}"
    warm_s = time.perf_counter() - t0
    baton_runs: dict[str, Callable[[int, float], SystemResult]] = {
        "baton-cb": lambda _r, _t: run_baton(cb_config, requests, "baton-cb"),
        "baton-static": lambda _r, _t: run_baton(static_config, requests, "baton-static"),
    }
    runs: dict[str, list[SystemResult]] = {s: [] for s in SYSTEMS}
    try:
        for round_no in range(rounds):
            for system in SYSTEMS:
                left = deadline - time.monotonic()
                if system in errors or left < 20:
                    errors.setdefault(system, f"skipped in round {round_no + 1}: {left:.0f} s left")
                    continue
                go = baton_runs.get(system) or (peer.run if peer is not None else None)
                assert go is not None  # (no peer: errors holds hf-cb)
                try:
                    runs[system].append(go(round_no, min(hf_timeout_s, left - 10)))
                except Exception as e:  # noqa: BLE001 - a timeout included: the others' figures still count
                    errors[system] = f"round {round_no + 1}: {type(e).__name__}: {e}"
                    if peer is not None and system == "hf-cb":
                        peer.close()
                    continue
                say(f"{name} round {round_no + 1}: {system} {runs[system][-1].tok_s:,.0f} tok/s")
    finally:
        if peer is not None:
            peer.close()
    best = {s: sorted(rs, key=lambda r: r.seconds)[(len(rs) - 1) // 2] for s, rs in runs.items() if rs}
    every_run = [r for rs in runs.values() for r in rs]
    agree = sum(1 for i in range(len(requests)) if len({tuple(r.outputs[i]) for r in every_run}) == 1)
    tok_s = {s: best[s].tok_s if s in best else None for s in SYSTEMS}
    cb, static, hf = (tok_s[s] for s in SYSTEMS)
    return {
        "workload": {"name": setup.workload, **describe(requests)},
        "baton_cb_tok_s": cb,
        "baton_static_tok_s": static,
        "hf_cb_tok_s": hf,
        "baton_cb_over_hf_cb": cb / hf if cb and hf else None,
        "baton_cb_over_static": cb / static if cb and static else None,
        "seconds": {s: r.seconds for s, r in best.items()},
        "runs_tok_s": {s: [r.tok_s for r in rs] for s, rs in runs.items()},
        "requests_identical_across_systems": agree,
        "hf_settings": peer.settings if peer is not None else None,
        "hf_start_seconds": round(warm_s, 1),
        "baton_steps": {s: best[s].details["steps"] for s in ("baton-cb", "baton-static") if s in best},
        "errors": errors,
    }


def environment(setup: Setup) -> dict:
    import transformers
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    return {
        "device": torch.cuda.get_device_name(0) if setup.device == "cuda" else "cpu",
        "dtype": setup.dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "flash_attn_2": is_flash_attn_2_available(),
        "flash_attn_3": is_flash_attn_3_available(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reduced", action="store_true", help="tiny configs, fp32, few requests, on the CPU")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--n", type=int, help="requests (default: 256; reduced: 6)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=380.0, help="runs not started by then are skipped")
    ap.add_argument("--hf-timeout-s", type=float, default=60.0, help="transformers' longest run (a bound if cut)")
    ap.add_argument("--hf-max-batch-tokens", type=int, help="transformers' step budget (default: its own)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    models = a.models.split(",")
    if unknown := set(models) - set(MODELS):
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    if a.rounds < 1 or (a.n is not None and a.n < 1):
        ap.error("--rounds and --n must be at least 1")
    setup = REDUCED if a.reduced else FULL
    if a.n is not None:
        setup = dataclasses.replace(setup, n=a.n)
    if a.hf_max_batch_tokens is not None:
        setup = dataclasses.replace(setup, hf_max_batch_tokens=a.hf_max_batch_tokens)
    if setup.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu_check_peer: CUDA is not available; nothing to compare here (--reduced runs on the CPU).")
        return 0
    deadline = time.monotonic() + a.budget_s
    t0 = time.perf_counter()

    def say(m: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f} s] {m}", file=sys.stderr, flush=True)

    report: dict = {"environment": environment(setup), "reduced": setup.reduced, "rounds": a.rounds, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(models):  # each model gets its share of the time left
            share = time.monotonic() + (deadline - time.monotonic()) / (len(models) - i)
            report["models"][name] = compare_model(name, setup, a.rounds, Path(tmp), share, a.hf_timeout_s, say)
    report["ok"] = all(not m["errors"] for m in report["models"].values())
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        for name, m in report["models"].items():
            keys = ("baton_cb_tok_s", "baton_static_tok_s", "hf_cb_tok_s")
            figures = ", ".join(f"{s} {m[k]:,.0f}" for s, k in zip(SYSTEMS, keys) if m[k])
            print(f"{name}: {figures} tok/s; identical {m['requests_identical_across_systems']}; errors {m['errors']}")
    return 0 if report["ok"] else 1  # (gpu_check.log keeps the whole report either way)


if __name__ == "__main__":
    raise SystemExit(main())
