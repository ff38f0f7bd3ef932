"""Kept for GPU issues: every check that needs CUDA, in one prepared run (how a GPU change is verified).

Every check that needs a GPU, as one prepared run for a borrowed CUDA machine (one short lease,
no network, no Ray there): the Triton kernels against the torch reference, the engine's CUDA path
against transformers token for token, a prefill and a decode worker sharing the GPU (CUDA IPC)
against the colocated engine, the kernels' bandwidth as a fraction of a device-to-device
copy, the KV transfer over CUDA IPC (and NCCL with two GPUs), offline throughput on
random-weight Qwen2.5-0.5B and Llama-3.2-1B against the same engine's static batching, and the
prefill kernel's launch-shape sweep.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --out "$OUT" --budget-s 420
    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --out "$OUT" \
        --only shared_gpu_disagg,payload_streams,decode_split_k,golden_hd128_bf16,disagg_ipc_tiny,triton_kernels

A machine with two GPUs runs ``python3 -m bench.gpu_check_2gpu --json`` (prefill and decode on
different GPUs over NCCL); none of the borrowed machines has two, so it has not run.

Each step runs in its own process with the time left (a hang or crash costs that step only) and is
recorded as it ends in OUT/gpu_check.json (return code, seconds, output tail, and the JSON a bench
printed), so a run cut short still returns what it measured. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def _steps(tmp: Path) -> list[tuple[str, list[str], int]]:
    """(name, command, most seconds it may take), most important first."""
    py = sys.executable
    return [
        (
            "env",
            [
                py,
                "-c",
                "import json, torch, triton; p = torch.cuda.get_device_properties(0); "
                "print(json.dumps({'torch': torch.__version__, 'triton': triton.__version__, "
                "'device': p.name, 'capability': list(torch.cuda.get_device_capability(0)), "
                "'gpus': torch.cuda.device_count(), 'memory_gib': round(p.total_memory / 2**30, 1)}))",
            ],
            60,
        ),
        # Issue 43's steps. (1) Two workers sharing the GPU (gpus 0.5 each), KV sized by the profiling
        # pass (engine/kv_memory.py), serve the disaggregated golden check.
        (
            "shared_gpu_disagg",
            [py, "-m", "bench.disagg_check", "--device", "cuda", "--gpu-fraction", "0.5", "--json"],
            150,
        ),
        # (2) The protocol's payload work on the pair's own CUDA streams (where NCCL binds its
        # communicators); the two-process protocol over CUDA IPC is disagg_ipc_tiny below.
        ("payload_streams", [py, "-m", "bench.gpu_check_payload_streams", "--json"], 90),
        # (3) Decode attention at batch 1 and 64 over the whole context's table width, split-K by
        # lengths against the width-based split, against a D2D copy.
        ("decode_split_k", [py, "-m", "bench.gpu_check_decode_split", "--json"], 150),
        # (4) A bf16 head-dim-128 model's greedy tokens against transformers.
        ("golden_hd128_bf16", [py, "-m", "bench.gpu_check_hd128_golden", "--json"], 180),
        (
            "cuda_graphs_tests",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/test_cuda_graphs.py"],
            180,
        ),
        (
            "triton_layer_ops_tests",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/test_triton_layer_ops.py"],
            180,
        ),
        (
            "golden_tiny_cuda_fp32",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/test_golden_tiny.py"],
            240,
        ),
        ("decode_graphs_llama-3.2-1b", [py, "-m", "bench.gpu_decode_graphs", "--model", "llama-3.2-1b", "--json"], 150),
        # The host's share of those steps, on this machine's CPU (what runs around a graph's replay).
        ("host_step", [py, "-m", "bench.host_step", "--json"], 60),
        # Issue 46: decode steps with 1/16/64 rows grammar-constrained against the same rows
        # unconstrained (the masks, computed on the host beside the forward, and applied on the device).
        ("structured", [py, "-m", "bench.grammar_backends", "--engine", "--device", "cuda", "--repeats", "2"], 180),
        (
            "offline_llama-3.2-1b",
            [py, "-m", "bench.gpu_check", "--offline", "llama-3.2-1b", "--model-dir", str(tmp / "llama-3.2-1b")],
            240,
        ),
        (
            "triton_kernels",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/attention/test_triton_kernels.py"],
            240,
        ),
        # Issue 45: Triton windowed / soft-capped attention (Gemma-2-2B's shape) and the fused MoE
        # experts (a Mixtral layer) against the torch paths, checked and timed.
        ("family_kernels", [py, "-m", "bench.gpu_check_family_kernels", "--json"], 150),
        # Issue 45: the families' golden tests on CUDA, through the Triton windowed/soft-capped
        # attention and the fused MoE kernel.
        (
            "golden_families_cuda",
            [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/engine/model/test_golden_families.py"],
            300,
        ),
        # Issue 49: the device sampler runs with no host synchronization and keeps the same tokens.
        ("sampler_sync_free", [py, "-m", "bench.gpu_check_sampler", "--json"], 90),
        # Issue 49: decode steps with the next step scheduled while one runs, against without (batch
        # 1 and 64), and those steps' greedy tokens against transformers.
        ("async_scheduling", [py, "-m", "bench.gpu_check_async", "--json"], 180),
        # Issue 49: transformers' own continuous batching beside Baton's, same models, workload and GPU
        # (it skips what its own budget, inside this limit, cannot fit, and reports the rest).
        ("peer_transformers_cb", [py, "-m", "bench.gpu_check_peer", "--json"], 420),
        ("disagg_ipc_tiny", [py, "-m", "bench.disagg_check", "--device", "cuda", "--json"], 120),
        ("decode_graphs_qwen2.5-0.5b", [py, "-m", "bench.gpu_decode_graphs", "--model", "qwen2.5-0.5b", "--json"], 150),
        (
            "offline_qwen2.5-0.5b",
            [py, "-m", "bench.gpu_check", "--offline", "qwen2.5-0.5b", "--model-dir", str(tmp / "qwen2.5-0.5b")],
            240,
        ),
        ("kernels_bandwidth", [py, "-m", "bench.kernels", "--json"], 180),
        (
            "kv_transfer_ipc",
            [
                py,
                "-m",
                "baton.perf.kv_transfer_bench",
                "--device",
                "cuda",
                "--no-ray",
                "--geometry",
                "llama-3.2-1b",
                "--json",
            ],
            120,
        ),
        # The prefill tiles' one doubtful point (docs/BENCHMARKS.md, "GPU"): the defaults
        # against the grid again, same run.
        ("prefill_tile_sweep", [py, "-m", "bench.kernel_sweep", "--only", "prefill"], 120),
    ]


def _last_json(text: str):
    """The JSON object a bench printed last (its report: a "{" at the start of a line), or None."""
    start = text.rfind("\n{") + 1  # 0 when the output starts with it (or holds none)
    try:
        value = json.loads(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def run_checks(out: Path, budget_s: float, steps=None, only: set[str] | None = None) -> dict:
    """Run ``steps`` (default: ``_steps``, given a scratch folder; those named in ``only``, if given)
    in order inside ``budget_s``."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_s": budget_s, "steps": {}}
    deadline = time.monotonic() + budget_s
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p),
        PYTHONUNBUFFERED="1",
    )
    env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory() as tmp, open(out / "gpu_check.log", "w") as log:
        for name, cmd, most_s in steps if steps is not None else _steps(Path(tmp)):
            if only is not None and name not in only:
                continue
            left = deadline - time.monotonic()
            if left < 20:
                report["steps"][name] = {"skipped": f"{left:.0f} s of the budget left"}
                continue
            t0 = time.monotonic()
            print(f"== {name}: {' '.join(cmd[1:])}", file=log, flush=True)
            rc: int | str  # the exit status, or "timeout"
            try:
                p = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=min(most_s, left))
                rc, stdout, stderr = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc = "timeout"
                stdout, stderr = (
                    x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)
                )
            log.write(stdout + stderr + "\n")
            log.flush()
            report["steps"][name] = {
                "rc": rc,
                "seconds": round(time.monotonic() - t0, 1),
                "tail": (stdout + stderr)[-3000:],
                "result": _last_json(stdout) if rc == 0 else None,
            }
            (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
            print(f"{name}: rc={rc} in {report['steps'][name]['seconds']} s", flush=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    return report


def offline(name: str, model_dir: Path, n: int) -> dict:
    """A random-weight model with a published config, on CUDA in bf16: Baton continuous batching
    against the same engine's static batching (batches of 16) and against itself without CUDA
    graphs, same requests, one run (Baton's device given explicitly: bench offline pins it to the
    CPU, beside its transformers baselines)."""
    from baton.perf.offline import run_offline
    from baton.perf.random_model import build_random_model

    t0 = time.perf_counter()
    build_random_model(name, model_dir, device="cuda", dtype="bfloat16")
    built = time.perf_counter() - t0
    t1 = time.perf_counter()
    # Two interleaved rounds, each system reporting its faster run: the first round carries the
    # process's warm-up (Triton compiles, CUDA initialisation), which fell on whichever system ran first.
    r = run_offline(
        "anyscale-cpu",
        str(model_dir),
        n,
        include_hf=False,
        cuda_graphs_baseline=True,
        repeat=2,
        device="cuda",
        dtype="bfloat16",
        progress=lambda m: print(f"[{time.perf_counter() - t1:6.1f} s] {m}", flush=True),
    )
    r["model"], r["build_seconds"] = name, round(built, 1)
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds for all the steps together")
    ap.add_argument("--only", help="comma-separated step names (default: all, in order)")
    ap.add_argument("--offline", help=argparse.SUPPRESS)  # one step, run in its own process
    ap.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=256, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    unknown = (only or set()) - {name for name, _, _ in _steps(Path("."))}
    if unknown:
        ap.error(f"unknown steps: {', '.join(sorted(unknown))}")
    import torch

    if not torch.cuda.is_available():
        print("bench.gpu_check: CUDA is not available; nothing to check here.")
        return 0
    if a.offline:
        print(json.dumps(offline(a.offline, a.model_dir, a.n), indent=2, default=str))
        return 0
    report = run_checks(a.out, a.budget_s, only=only)
    failed = [k for k, v in report["steps"].items() if v.get("rc") not in (0, None)]
    print(
        f"bench.gpu_check: {len(report['steps'])} steps, failed: {', '.join(failed) or 'none'}; "
        f"report in {a.out / 'gpu_check.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
