"""Kept for whoever retunes the Triton launch shapes (gpu_check runs it): the defaults against a grid.

Launch-shape sweep for the Triton attention kernels: every ``DecodeTiles`` / ``PrefillTiles`` in a
small grid, on the shapes of bench/kernels.py, each checked against the torch reference and timed
(CUDA-event medians after an L2 flush), with the current default measured in the same run.

    python -m bench.kernel_sweep --out sweep.json      # on a CUDA machine (a few minutes)
    python -m bench.kernel_sweep --allow-cpu           # one tiny shape under the Triton interpreter

The report is written after every shape (a run cut short keeps what it measured): per shape the
default's time, the best tiles and their speed-up, and every point. Tiles whose output is off
the reference by more than the kernel tests' tolerance are reported and never chosen.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.kernels import (
    _FLUSH_BYTES,
    CPU_SHAPES,
    DECODE_SHAPES,
    PREFILL_SHAPES,
    Shape,
    attention_flops,
    copy_bandwidth_gbs,
    kernel_call,
    make_inputs,
    time_cpu,
    time_cuda,
    useful_bytes,
)

_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # as tests/engine/attention/test_triton_kernels.py


def _grid(kind: str, mods: dict[str, Any], small: bool) -> list[Any]:
    if kind == "decode":
        tiles = mods["triton_decode"].DecodeTiles
        if small:
            return [tiles(), tiles(block_n=16, num_warps=2)]
        return [tiles(block_n=n, num_warps=w) for n, w in itertools.product((16, 32, 64, 128), (2, 4, 8))]
    tiles = mods["triton_prefill"].PrefillTiles
    if small:
        return [tiles(), tiles(block_m=16, block_n=64, num_warps=8)]
    return [
        tiles(block_m=m, block_n=n, num_warps=w, num_stages=s)
        for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))
    ]


def sweep_shape(
    kind: str,
    shape: Shape,
    grid: list[Any],
    default: Any,
    mods: dict[str, Any],
    reference: Any,
    dtype: torch.dtype,
    device: str,
    iters: int,
    flush: torch.Tensor | None,
    copy_gbs: float,
) -> dict:
    x = make_inputs(shape, dtype, device)

    def call(t: Any) -> torch.Tensor:
        return kernel_call(kind, mods[f"triton_{kind}"], x, tiles=t)()

    want = kernel_call(kind, reference, x)()
    nbytes, flops = useful_bytes(shape, x), attention_flops(shape)
    points = []
    for t in [default] + [t for t in grid if t != default]:
        row: dict[str, Any] = {"tiles": asdict(t), "default": t == default}
        try:
            err = (call(t).float() - want.float()).abs().max().item()
            run = functools.partial(call, t)
            ms = time_cuda(run, iters, flush) if flush is not None else time_cpu(run, iters)
        except Exception as e:  # noqa: BLE001 - a launch shape the compiler refuses is a result too
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            points.append(row)
            continue
        gbs = nbytes / (ms * 1e-3) / 1e9
        row |= {
            "ms": round(ms, 4),
            "max_abs_err": err,
            "ok": err <= _TOL[dtype],
            "gb_per_s": round(gbs, 1),
            "frac_of_copy": round(gbs / copy_gbs, 3),
            "tflop_per_s": round(flops / (ms * 1e-3) / 1e12, 2),
        }
        points.append(row)
    good = [p for p in points if p.get("ok")]
    base = next((p for p in points if p["default"] and p.get("ok")), None)
    best = min(good, key=lambda p: p["ms"]) if good else None
    return {
        "kind": kind,
        **asdict(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "default_ms": base and base["ms"],
        "best_tiles": best and best["tiles"],
        "best_ms": best and best["ms"],
        "speedup_over_default": round(base["ms"] / best["ms"], 3) if base and best else None,
        "points": points,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernel_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the report here (after every shape)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", choices=("decode", "prefill"))
    ap.add_argument("--allow-cpu", action="store_true", help="without CUDA: one tiny shape a kernel, interpreted")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this long")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not a.allow_cpu:
        print("bench.kernel_sweep: CUDA is not available (pass --allow-cpu for the interpreter smoke run).")
        return 0
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
    mods = {m: importlib.import_module(f"engine.attention.{m}") for m in ("triton_decode", "triton_prefill")}
    reference = importlib.import_module("engine.attention.reference")
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32  # the interpreter's tl.dot mishandles bf16
    torch.manual_seed(0)
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=device) if cuda else None
    iters = a.iters if cuda else 1
    copy_gbs = copy_bandwidth_gbs(device, iters, flush)
    # Prefill first: it is further from the hardware's limit (docs/BENCHMARKS.md).
    plan = (
        [("prefill", s) for s in PREFILL_SHAPES] + [("decode", s) for s in DECODE_SHAPES]
        if cuda
        else [("decode", CPU_SHAPES[0]), ("prefill", CPU_SHAPES[1])]
    )
    # "default": what the kernel picks for the shape when the caller passes no tiles.
    defaults = {
        "decode": mods["triton_decode"].default_decode_tiles,
        "prefill": mods["triton_prefill"].default_prefill_tiles,
    }
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)",
        "copy_gb_per_s": round(copy_gbs, 1),
        "shapes": [],
    }
    t0 = time.monotonic()
    for kind, shape in plan:
        if (a.only and kind != a.only) or time.monotonic() - t0 > a.budget_s:
            continue
        r = sweep_shape(
            kind,
            shape,
            _grid(kind, mods, small=not cuda),
            defaults[kind](shape.head_dim, dtype),
            mods,
            reference,
            dtype,
            device,
            iters,
            flush,
            copy_gbs,
        )
        report["shapes"].append(r)
        print(
            f"{kind} {shape.model} seqs={shape.seqs} ctx={shape.ctx} q={shape.q_len}: default "
            f"{r['default_ms']} ms, best {r['best_ms']} ms {r['best_tiles']}",
            flush=True,
        )
        if a.out:
            a.out.write_text(json.dumps(report, indent=1))
        if cuda:
            torch.cuda.empty_cache()
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "shapes"}
            | {"summary": [{k: v for k, v in s.items() if k != "points"} for s in report["shapes"]]}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
