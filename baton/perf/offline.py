"""Offline throughput: Baton continuous batching against three baselines, in one run.

(a) Baton continuous batching, (b) Baton's same engine in static-batching mode (batches of 16, each
running until its longest request ends), (c) Hugging Face transformers continuous batching, and
(d) transformers static ``generate`` in batches of 16. Every system runs the same requests with EOS
ignored, so each produces exactly the same number of useful tokens; model loading and a short
warmup are off the clock. Also reports Baton's KV waste (allocated-but-unused token slots over
allocated slots, averaged over steps) and how many requests got identical tokens from every system.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Callable

from baton.perf.offline_baton import (
    BATON_DEVICE,
    BATON_DTYPE,
    SystemResult,
    engine_configs,
    run_baton,
    without_native_kernels,
)
from baton.perf.offline_workloads import anyscale_cpu, total_output_tokens
from engine.config import SpeculativeConfig

WORKLOADS = ("anyscale-cpu", "anyscale-cpu-small")


def build_workload(name: str, vocab_size: int, avoid_ids: frozenset[int], n: int | None, seed: int = 0):
    if name == "anyscale-cpu":
        return anyscale_cpu(vocab_size, n=64 if n is None else n, seed=seed, avoid_ids=avoid_ids)
    if name == "anyscale-cpu-small":  # the suite's quick version
        return anyscale_cpu(
            vocab_size,
            n=8 if n is None else n,
            seed=seed,
            avoid_ids=avoid_ids,
            prompt_len=(8, 32),
            mean_output=8,
            output_clip=(2, 16),
        )
    raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")


def model_and_workload(model: str, workload: str, n: int | None):
    """The model's directory and the workload's requests for its vocabulary (special ids avoided)."""
    from engine.model.config import ModelConfig
    from engine.model.registry import resolve_model

    model_dir = resolve_model(model)
    cfg = ModelConfig.from_file(model_dir / "config.json")
    specials = {0, 1, 2, *(cfg.eos_token_ids or ()), *([cfg.bos_token_id] if cfg.bos_token_id is not None else [])}
    return model_dir, build_workload(workload, cfg.vocab_size, frozenset(specials), n)


def run_offline(
    workload: str = "anyscale-cpu",
    model: str = "default",
    n: int | None = None,
    include_hf: bool = True,
    threads: int | None = None,
    max_num_batched_tokens: int = 2048,
    progress: Callable[[str], None] = lambda m: None,
    repeat: int = 1,
    torch_path_baseline: bool = False,
    cuda_graphs_baseline: bool = False,
    device: str = BATON_DEVICE,
    dtype: str = BATON_DTYPE,
    speculative_tokens: int = 0,
    greedy_head_baseline: bool = False,
    amx_baseline: bool = False,
    tensor_parallel_size: int = 1,
) -> dict:
    """Each system ``repeat`` times (rounds interleaved); each reports its median run.

    ``torch_path_baseline`` adds (a) run without the compiled CPU kernels (engine/native);
    ``cuda_graphs_baseline`` adds (a) with every decode step eager (no CUDA graphs; on CUDA).
    ``speculative_tokens`` > 0 adds (a) and (b) with n-gram drafts of that many tokens
    (engine/spec_decode.py), reported beside the plain systems, which the targets are about;
    ``greedy_head_baseline`` adds (a) and (b) with every logit computed (the greedy head off);
    ``amx_baseline`` adds (a) and (b) with the layers' larger products off AMX (where it loads).
    ``device``/``dtype``: Baton's (pinned to the transformers baselines' cpu/float32 by default;
    bench/gpu_check.py runs Baton alone on CUDA in bf16)."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    model_dir, requests = model_and_workload(model, workload, n)
    useful = total_output_tokens(requests)
    cb_config, static_config = engine_configs(
        model_dir, threads, max_num_batched_tokens, device, dtype, tensor_parallel_size
    )
    runners: list[tuple[str, str, Callable[[], SystemResult]]] = [
        ("baton-cb", "(a) Baton continuous batching", lambda: run_baton(cb_config, requests, "baton-cb")),
        (
            "baton-static",
            "(b) Baton static batching (batches of 16)",
            lambda: run_baton(static_config, requests, "baton-static"),
        ),
    ]
    if torch_path_baseline:
        runners.append(
            (
                "baton-cb-torch-path",
                "(a0) Baton continuous batching, torch CPU path (no native kernels)",
                lambda: without_native_kernels(lambda: run_baton(cb_config, requests, "baton-cb-torch-path")),
            )
        )
    if speculative_tokens:
        spec = SpeculativeConfig(num_tokens=speculative_tokens)
        spec_cb, spec_static = (
            dataclasses.replace(c, scheduler=dataclasses.replace(c.scheduler, speculative=spec))
            for c in (cb_config, static_config)
        )
        runners += [
            (
                "baton-cb-spec",
                f"(a+s) Baton continuous batching, n-gram drafts of {speculative_tokens}",
                lambda: run_baton(spec_cb, requests, "baton-cb-spec"),
            ),
            (
                "baton-static-spec",
                f"(b+s) Baton static batching, n-gram drafts of {speculative_tokens}",
                lambda: run_baton(spec_static, requests, "baton-static-spec"),
            ),
        ]

    def part_off(tag: str, arm: str, what: str, **switch: bool) -> list:
        """(a) and (b) again with one of Baton's parts switched off (``run_baton``'s flags)."""
        return [
            (
                f"baton-{kind}-{arm}",
                f"({letter}-{tag}) Baton {label}, {what}",
                lambda config=config, name=f"baton-{kind}-{arm}": run_baton(config, requests, name, **switch),
            )
            for kind, letter, label, config in (
                ("cb", "a", "continuous batching", cb_config),
                ("static", "b", "static batching", static_config),
            )
        ]

    if greedy_head_baseline:
        runners += part_off("g", "every-logit", "every logit (greedy head off)", greedy_head=False)
    if amx_baseline:
        runners += part_off("x", "no-amx", "larger products off AMX", amx=False)
    if cuda_graphs_baseline:
        eager_config = dataclasses.replace(cb_config, cuda_graphs=False)
        runners.append(
            (
                "baton-cb-eager",
                "(a') Baton continuous batching, CUDA graphs off",
                lambda: run_baton(eager_config, requests, "baton-cb-eager"),
            )
        )
    hf_model = None
    if include_hf:
        from baton.perf.hf_baselines import load_hf_model, run_hf_continuous, run_hf_static

        hf_model = load_hf_model(model_dir)

        def hf(name: str, run) -> Callable[[], SystemResult]:
            def go() -> SystemResult:
                r = run()
                return SystemResult(name, r.seconds, r.tok_s, r.outputs or [], r.details)

            return go

        runners += [
            (
                "hf-cb",
                "(c) transformers continuous batching",
                hf("hf-cb", lambda: run_hf_continuous(hf_model, requests, num_threads=threads)),
            ),
            (
                "hf-static",
                "(d) transformers static generate (batches of 16)",
                hf("hf-static", lambda: run_hf_static(hf_model, requests, batch_size=16, num_threads=threads)),
            ),
        ]
    # Rounds interleave the systems, so a slow spell of a shared machine falls on all of them.
    runs: dict[str, list[SystemResult]] = {name: [] for name, _, _ in runners}
    for round_no in range(repeat):
        for name, label, run in runners:
            progress(
                f"{label}: {len(requests)} requests, {useful} output tokens"
                + (f" (round {round_no + 1} of {repeat})" if repeat > 1 else "")
            )
            runs[name].append(run())
            progress(f"    {runs[name][-1].tok_s:.1f} tok/s")
    systems = [_median_run(runs[name]) for name, _, _ in runners]
    by = {s.name: s for s in systems}
    cb, static = by["baton-cb"], by["baton-static"]
    every_run = [r for rs in runs.values() for r in rs if r.outputs]
    agree = sum(1 for i in range(len(requests)) if len({tuple(r.outputs[i]) for r in every_run}) == 1)
    result = {
        "workload": workload,
        "model": model,
        "num_requests": len(requests),
        "useful_output_tokens": useful,
        "baton_cb_tok_s": cb.tok_s,
        "baton_static_tok_s": static.tok_s,
        "hf_cb_tok_s": by["hf-cb"].tok_s if "hf-cb" in by else None,
        "hf_static_tok_s": by["hf-static"].tok_s if "hf-static" in by else None,
        "kv_waste": cb.details["kv_waste"],
        "seconds": {s.name: s.seconds for s in systems},
        "baton_cb_over_static": cb.tok_s / static.tok_s,
        # that ratio = static's work over CB's (the workload's) x CB's rate over static's (the engine's)
        "static_over_cb_work": static.details["work"]["projection_tflop"] / cb.details["work"]["projection_tflop"],
        "cb_over_static_gflop_s": cb.details["work"]["projection_gflop_s"]
        / static.details["work"]["projection_gflop_s"],
        "requests_identical_across_systems": agree,
        "details": {s.name: s.details for s in systems},
        "repeat": repeat,
        "runs_tok_s": {name: [r.tok_s for r in rs] for name, rs in runs.items()},
        "machine": {
            **machine_info(threads),
            "baton_device": cb_config.device,
            "baton_dtype": cb_config.dtype,
            **hf_device_dtype(hf_model),
        },
    }
    if torch_path_baseline:
        result["baton_cb_torch_path_tok_s"] = by["baton-cb-torch-path"].tok_s
        result["baton_cb_over_torch_path"] = cb.tok_s / by["baton-cb-torch-path"].tok_s
    if speculative_tokens:
        cb_spec, static_spec = by["baton-cb-spec"], by["baton-static-spec"]
        result.update(
            speculative_tokens=speculative_tokens,
            baton_cb_spec_tok_s=cb_spec.tok_s,
            baton_static_spec_tok_s=static_spec.tok_s,
            baton_cb_spec_over_cb=cb_spec.tok_s / cb.tok_s,
            baton_cb_spec_over_static_spec=cb_spec.tok_s / static_spec.tok_s,
            spec_kept_fraction={
                n: by[n].details["drafts_kept"] / max(1, by[n].details["drafts"])
                for n in ("baton-cb-spec", "baton-static-spec")
            },
        )
    if greedy_head_baseline:
        cb_all, static_all = by["baton-cb-every-logit"], by["baton-static-every-logit"]
        result.update(
            baton_cb_every_logit_tok_s=cb_all.tok_s,
            baton_static_every_logit_tok_s=static_all.tok_s,
            baton_cb_over_every_logit=cb.tok_s / cb_all.tok_s,
            baton_static_over_every_logit=static.tok_s / static_all.tok_s,
            baton_cb_over_static_every_logit=cb_all.tok_s / static_all.tok_s,
        )
    if amx_baseline:
        cb_x, static_x = by["baton-cb-no-amx"], by["baton-static-no-amx"]
        result.update(
            baton_cb_no_amx_tok_s=cb_x.tok_s,
            baton_static_no_amx_tok_s=static_x.tok_s,
            baton_cb_over_no_amx=cb.tok_s / cb_x.tok_s,
            baton_static_over_no_amx=static.tok_s / static_x.tok_s,
            baton_cb_over_static_no_amx=cb_x.tok_s / static_x.tok_s,
        )
    if cuda_graphs_baseline:
        result["baton_cb_eager_tok_s"] = by["baton-cb-eager"].tok_s
        result["baton_cb_over_eager"] = cb.tok_s / by["baton-cb-eager"].tok_s
    if include_hf:
        result["baton_cb_over_hf_cb"] = cb.tok_s / by["hf-cb"].tok_s
        result["baton_cb_over_hf_static"] = cb.tok_s / by["hf-static"].tok_s
    return result


def hf_device_dtype(hf_model) -> dict:
    """Where the transformers baselines ran (None when skipped), read off the loaded model."""
    if hf_model is None:
        return {"hf_device": None, "hf_dtype": None}
    return {"hf_device": str(hf_model.device), "hf_dtype": str(hf_model.dtype).removeprefix("torch.")}


def _median_run(runs: list[SystemResult]) -> SystemResult:
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[(len(ordered) - 1) // 2]  # an actual run (the faster middle one for an even count)


def machine_info(threads: int | None) -> dict:
    import torch

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    from engine.cpu_info import cpuinfo_field

    return cpuinfo_field("model name") or platform.processor() or "unknown"


def format_table(r: dict) -> str:
    rows = [
        ("Baton continuous batching", r["baton_cb_tok_s"]),
        ("Baton static batching (16)", r["baton_static_tok_s"]),
        ("Baton CB, torch CPU path", r.get("baton_cb_torch_path_tok_s")),
        ("Baton CB, n-gram drafts", r.get("baton_cb_spec_tok_s")),
        ("Baton static, n-gram drafts", r.get("baton_static_spec_tok_s")),
        ("Baton CB, larger products off AMX", r.get("baton_cb_no_amx_tok_s")),
        ("Baton static, larger products off AMX", r.get("baton_static_no_amx_tok_s")),
        ("transformers continuous batching", r["hf_cb_tok_s"]),
        ("transformers static generate (16)", r["hf_static_tok_s"]),
    ]
    lines = [
        f"{r['workload']} on {r['model']}: {r['num_requests']} requests, {r['useful_output_tokens']} output tokens"
    ]
    for name, v in rows:
        if v is not None:
            lines.append(f"  {name:36s} {v:8.1f} tok/s   (Baton CB is {r['baton_cb_tok_s'] / v:.2f}x)")
    lines.append(f"  KV waste (Baton CB): {r['kv_waste'] * 100:.2f}%")
    lines.append(
        f"  CB over static = {r['static_over_cb_work']:.2f}x the projection work (static's over CB's)"
        f" x {r['cb_over_static_gflop_s']:.2f}x the rate (CB's GFLOP/s over static's)"
    )
    lines.append(f"  requests with identical tokens in every system: {r['requests_identical_across_systems']}")
    return "\n".join(lines)


def to_json(r: dict) -> str:
    return json.dumps(r, indent=2, sort_keys=True)
