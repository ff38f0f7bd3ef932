"""Kept for Triton kernel changes (gpu_check runs it): the attention kernels' bandwidth against a copy.

Attention kernel micro-benchmarks: Triton paged attention vs the torch reference, as bandwidth.

Decode attention is memory-bound, so the figure of merit is achieved bandwidth: the bytes a kernel
must move (every context token's K and V once, plus q, out and the block tables) over its time,
set against a device-to-device copy measured in the same run (``clone`` of a large tensor: bytes
read + written per second), which is about what the memory system can deliver. Prefill also
reports TFLOP/s, since long chunks are compute-bound.

Times are CUDA-event medians; L2 is flushed before every timed call so the KV really comes from
HBM. Shapes are realistic small models (bf16, block size 16) over a strided block-major cache.

Run ``python -m bench.kernels [--json]`` on a CUDA machine. Without CUDA it says so and exits 0;
``--allow-cpu`` instead runs one tiny shape through the Triton interpreter, to prove the path works.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import Any

import torch


@dataclass(frozen=True)
class Shape:
    """One benchmark point: a model's attention geometry and a batch of sequences."""

    model: str
    heads: int
    kv_heads: int
    head_dim: int
    seqs: int
    ctx: int  # context tokens per sequence (including the new ones)
    q_len: int = 1  # new tokens per sequence: 1 for decode, a chunk for prefill


_QWEN: dict[str, Any] = dict(model="qwen2.5-0.5b", heads=14, kv_heads=2, head_dim=64)  # Any: Shape's str and int fields
_LLAMA: dict[str, Any] = dict(model="llama-3.2-1b", heads=32, kv_heads=8, head_dim=64)
DECODE_SHAPES = [Shape(**m, seqs=b, ctx=c) for m in (_QWEN, _LLAMA) for b in (64, 256) for c in (512, 4096)]
PREFILL_SHAPES = [
    Shape(**m, seqs=s, ctx=c, q_len=q) for m in (_QWEN, _LLAMA) for s, c, q in ((4, 2048, 2048), (8, 4096, 512))
]
CPU_SHAPES = (
    Shape(model="tiny", heads=6, kv_heads=2, head_dim=64, seqs=2, ctx=48),
    Shape(model="tiny", heads=6, kv_heads=2, head_dim=64, seqs=2, ctx=48, q_len=16),
)
_BLOCK = 16
_LAYERS = 2  # the cache is block-major over this many layers, so each layer's view is strided
_FLUSH_BYTES = 256 << 20


@dataclass
class Inputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


def make_inputs(shape: Shape, dtype: torch.dtype, device: str) -> Inputs:
    """A block-major cache with every sequence's blocks scattered by a random permutation."""
    per_seq = -(-shape.ctx // _BLOCK)
    num_blocks = shape.seqs * per_seq
    kv = torch.randn(num_blocks, _LAYERS, 2, _BLOCK, shape.kv_heads, shape.head_dim, device=device, dtype=dtype)
    tables = torch.randperm(num_blocks, device=device).view(shape.seqs, per_seq).to(torch.int32)
    q = torch.randn(shape.seqs * shape.q_len, shape.heads, shape.head_dim, device=device, dtype=dtype)
    cu = torch.arange(0, shape.seqs + 1, device=device, dtype=torch.int32) * shape.q_len
    lens = torch.full((shape.seqs,), shape.ctx, device=device, dtype=torch.int32)
    return Inputs(q, kv[:, 1, 0], kv[:, 1, 1], tables, cu, lens, shape.head_dim**-0.5)


def kernel_call(kind: str, impl: Any, x: Inputs, **kwargs: Any) -> Callable[[], torch.Tensor]:
    """A no-argument call of ``impl``'s (a kernel module's) decode or prefill attention on ``x``."""
    if kind == "decode":
        return lambda: impl.paged_decode_attention(
            x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, x.scale, **kwargs
        )
    return lambda: impl.paged_prefill_attention(
        x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.seq_lens, x.scale, **kwargs
    )


def useful_bytes(shape: Shape, x: Inputs) -> int:
    """Bytes an ideal kernel moves: context K+V once, q in, out back, and the block tables."""
    kv = shape.seqs * shape.ctx * shape.kv_heads * shape.head_dim * 2 * x.q.element_size()
    return kv + 2 * x.q.numel() * x.q.element_size() + x.block_tables.numel() * 4


def attention_flops(shape: Shape) -> float:
    """QK^T and PV multiply-adds over the causally visible keys."""
    first = shape.ctx - shape.q_len
    visible = shape.q_len * first + shape.q_len * (shape.q_len + 1) / 2
    return 4.0 * shape.seqs * shape.heads * shape.head_dim * visible


def time_cuda(fn: Callable[[], Any], iters: int, flush: torch.Tensor) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs, each after an L2 flush."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_cpu(fn: Callable[[], Any], iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = perf_counter()
        fn()
        times.append((perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbs(device: str, iters: int, flush: torch.Tensor | None) -> float:
    """Device-to-device copy bandwidth: ``clone`` of a 1 GiB tensor (read + write)."""
    nbytes = (1 << 30) if device == "cuda" else (64 << 20)
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ms = time_cuda(x.clone, iters, flush) if flush is not None else time_cpu(x.clone, iters)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def bench_shape(
    kind: str,
    shape: Shape,
    dtype: torch.dtype,
    device: str,
    iters: int,
    impls: dict[str, Any],
    flush: torch.Tensor | None,
    copy_gbs: float,
) -> list[dict[str, Any]]:
    """Time each implementation on one shape; Triton is checked against the reference first."""
    x = make_inputs(shape, dtype, device)
    calls = {n: kernel_call(kind, m, x) for n, m in impls.items()}
    err = (calls["triton"]().float() - calls["reference"]().float()).abs().max().item()
    nbytes = useful_bytes(shape, x)
    rows = []
    for name, fn in calls.items():
        ms = time_cuda(fn, iters, flush) if flush is not None else time_cpu(fn, iters)
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.append(
            dict(
                kernel=kind,
                impl=name,
                **asdict(shape),
                dtype=str(dtype).removeprefix("torch."),
                ms=round(ms, 4),
                gb_per_s=round(gbs, 1),
                frac_of_copy=round(gbs / copy_gbs, 3),
                tflop_per_s=round(attention_flops(shape) / (ms * 1e-3) / 1e12, 2),
                max_abs_err_vs_reference=err,
            )
        )
    return rows


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--iters", type=int, default=20, help="timed runs per point (median reported)")
    p.add_argument("--only", choices=("decode", "prefill"), help="run one kernel kind")
    p.add_argument(
        "--allow-cpu", action="store_true", help="without CUDA, smoke-test a tiny shape under the Triton interpreter"
    )
    return p.parse_args(argv)


def _print_table(report: dict[str, Any]) -> None:
    print(f"device: {report['device']}   copy bandwidth: {report['copy_gb_per_s']:.1f} GB/s")
    print(
        f"{'kernel':8} {'impl':10} {'model':14} {'seqs':>5} {'ctx':>5} {'q_len':>5} {'ms':>9} {'GB/s':>8} "
        f"{'copy%':>6} {'TFLOP/s':>8} {'err':>8}"
    )
    for r in report["results"]:
        print(
            f"{r['kernel']:8} {r['impl']:10} {r['model']:14} {r['seqs']:>5} {r['ctx']:>5} {r['q_len']:>5} "
            f"{r['ms']:>9.3f} {r['gb_per_s']:>8.1f} {100 * r['frac_of_copy']:>5.1f}% {r['tflop_per_s']:>8.2f} "
            f"{r['max_abs_err_vs_reference']:>8.1e}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(
            "bench.kernels: CUDA is not available, nothing to benchmark "
            "(pass --allow-cpu to smoke-test the kernels under the Triton interpreter)."
        )
        return 0
    if importlib.util.find_spec("triton") is None:
        print("bench.kernels: triton is not installed, nothing to benchmark.")
        return 0
    if not cuda:
        # Must be set before the kernel modules decorate their kernels.
        os.environ["TRITON_INTERPRET"] = "1"
    mods = {m: importlib.import_module(f"engine.attention.{m}") for m in ("triton_decode", "triton_prefill")}
    reference = importlib.import_module("engine.attention.reference")

    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32  # the interpreter's tl.dot mishandles bf16
    iters = args.iters if cuda else 2
    torch.manual_seed(0)
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=device) if cuda else None
    copy_gbs = copy_bandwidth_gbs(device, iters, flush)
    plan = [("decode", s) for s in DECODE_SHAPES] + [("prefill", s) for s in PREFILL_SHAPES]
    if not cuda:
        plan = [("decode", CPU_SHAPES[0]), ("prefill", CPU_SHAPES[1])]
    results = []
    for kind, shape in plan:
        if args.only and kind != args.only:
            continue
        impls = {"triton": mods[f"triton_{kind}"], "reference": reference}
        results += bench_shape(kind, shape, dtype, device, iters, impls, flush, copy_gbs)
        if cuda:
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter: timings are meaningless)"
    report = {"device": name, "copy_gb_per_s": round(copy_gbs, 1), "block_size": _BLOCK, "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
