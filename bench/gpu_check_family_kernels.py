"""Kept for GPU issues (gpu_check runs it): the families' Triton kernels on the GPU, against the torch
paths they replace, checked and timed.

- Windowed, soft-capped attention at Gemma-2-2B's shape (8 query heads over 4 KV heads of 256, a
  4096-key window, scores capped at 50, query_pre_attn_scalar 256): decode over contexts longer than
  the window and a prefill chunk after a long prefix, against ``reference.paged_windowed_attention``,
  timed against the same kernel without a window (the blocks the window skips) and the reference.
- The fused MoE experts at one Mixtral-8x7B layer's shape (8 experts of 14336 over 4096, top 2),
  against the torch loop (``moe.moe_mlp``) for decode- and prefill-sized batches, both timed.

    python -m bench.gpu_check_family_kernels --json                       # CUDA, bf16; says so elsewhere
    python -m bench.gpu_check_family_kernels --reduced --json    # tiny fp32 shapes (CPU: the interpreter)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionShape:
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 256
    block_size: int = 16
    window: int = 4096
    softcap: float = 50.0
    query_pre_attn_scalar: float = 256.0
    decode_contexts: tuple[int, ...] = (8192,) * 16 + (300,) * 16
    prefill_chunk: int = 2048
    prefill_context: int = 8192


@dataclass(frozen=True)
class MoeShape:
    hidden: int = 4096
    intermediate: int = 14336
    experts: int = 8
    top_k: int = 2
    token_counts: tuple[int, ...] = (1, 32, 512, 2048)


REDUCED_ATTENTION = AttentionShape(
    heads=4, kv_heads=2, head_dim=16, block_size=4, window=12, softcap=2.0, query_pre_attn_scalar=24.0,
    decode_contexts=(40, 5, 13), prefill_chunk=9, prefill_context=30,
)  # fmt: skip
REDUCED_MOE = MoeShape(hidden=32, intermediate=24, experts=4, top_k=2, token_counts=(1, 20))
# Max error relative to the largest output: bf16's rounding of the outputs and of the products' inputs.
_REL_TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def _time_ms(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Mean milliseconds per call after one warm-up (CUDA events; wall time off CUDA)."""
    fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    d = (got.float() - want.float()).abs().max().item()
    return float("inf") if got.isnan().any() else d / max(want.float().abs().max().item(), 1e-6)


def _paged(s: AttentionShape, contexts: list[int], q_rows: int, device: torch.device, dtype: torch.dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    need = [-(-n // s.block_size) for n in contexts]
    num_blocks = sum(need) + 1
    k = torch.randn(num_blocks, s.block_size, s.kv_heads, s.head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(num_blocks, s.block_size, s.kv_heads, s.head_dim, generator=gen, device=device).to(dtype)
    tables = torch.zeros(len(contexts), max(need), dtype=torch.int32, device=device)
    first = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = torch.arange(first, first + nb, dtype=torch.int32, device=device)
        first += nb
    q = torch.randn(q_rows, s.heads, s.head_dim, generator=gen, device=device).to(dtype)
    return q, k, v, tables, torch.tensor(contexts, dtype=torch.int32, device=device)


def check_attention(s: AttentionShape, device: torch.device, dtype: torch.dtype, iters: int) -> dict:
    from engine.attention import reference
    from engine.attention.triton_decode import paged_decode_attention
    from engine.attention.triton_prefill import paged_prefill_attention

    scale, tol = s.query_pre_attn_scalar**-0.5, _REL_TOL[dtype]
    out: dict = {"shape": asdict(s), "dtype": str(dtype)}
    ctx = list(s.decode_contexts)
    q, k, v, bt, lens = _paged(s, ctx, len(ctx), device, dtype)
    cu = torch.arange(len(ctx) + 1, device=device)
    want = reference.paged_windowed_attention(q, k, v, bt, cu, lens, scale, s.window, s.softcap)
    got = paged_decode_attention(q, k, v, bt, lens, scale, s.window, s.softcap)
    out["decode_rel_err"] = _rel_err(got, want)
    windowed = lambda: paged_decode_attention(q, k, v, bt, lens, scale, s.window, s.softcap)  # noqa: E731
    out["decode_ms"] = {
        "triton_windowed": _time_ms(windowed, iters, device),
        "triton_full_context": _time_ms(lambda: paged_decode_attention(q, k, v, bt, lens, scale), iters, device),
        "torch_reference": _time_ms(
            lambda: reference.paged_windowed_attention(q, k, v, bt, cu, lens, scale, s.window, s.softcap), 2, device
        ),
    }
    q, k, v, bt, lens = _paged(s, [s.prefill_context], s.prefill_chunk, device, dtype)
    cu = torch.tensor([0, s.prefill_chunk], dtype=torch.int32, device=device)
    want = reference.paged_windowed_attention(q, k, v, bt, cu, lens, scale, s.window, s.softcap)
    got = paged_prefill_attention(q, k, v, bt, cu, lens, scale, s.window, s.softcap)
    out["prefill_rel_err"] = _rel_err(got, want)
    windowed = lambda: paged_prefill_attention(q, k, v, bt, cu, lens, scale, s.window, s.softcap)  # noqa: E731
    out["prefill_ms"] = {
        "triton_windowed": _time_ms(windowed, iters, device),
        "triton_full_context": _time_ms(lambda: paged_prefill_attention(q, k, v, bt, cu, lens, scale), iters, device),
    }
    out["ok"] = out["decode_rel_err"] <= tol and out["prefill_rel_err"] <= tol
    return out


def check_moe(s: MoeShape, device: torch.device, dtype: torch.dtype, iters: int) -> dict:
    from engine.model.family import MoeLayout, MoeSpec
    from engine.model.moe import MoeWeights, moe_mlp
    from engine.model.moe_fused import fused_experts

    gen = torch.Generator(device=device).manual_seed(0)
    h, i, e = s.hidden, s.intermediate, s.experts

    def rand(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * fan_in**-0.5).to(dtype)

    w = MoeWeights(rand(e, h, fan_in=h), rand(e, 2 * i, h, fan_in=h), rand(e, h, i, fan_in=i))
    spec = MoeSpec(e, s.top_k, i, True, MoeLayout.MIXTRAL)

    def act(gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up

    out: dict = {"shape": asdict(s), "dtype": str(dtype), "tokens": {}}
    ok = True
    for t in s.token_counts:
        x = torch.randn(t, h, generator=gen, device=device).to(dtype)
        err = _rel_err(moe_mlp(x, w, spec, act, fused_experts), moe_mlp(x, w, spec, act))
        ok = ok and err <= _REL_TOL[dtype]

        def fused(x: torch.Tensor = x) -> torch.Tensor:
            return moe_mlp(x, w, spec, act, fused_experts)

        def loop(x: torch.Tensor = x) -> torch.Tensor:
            return moe_mlp(x, w, spec, act)

        fused_ms, torch_ms = _time_ms(fused, iters, device), _time_ms(loop, iters, device)
        out["tokens"][str(t)] = {
            "rel_err": err,
            "fused_ms": round(fused_ms, 4),
            "torch_ms": round(torch_ms, 4),
            "speedup": round(torch_ms / fused_ms, 2),
        }
    out["ok"] = ok
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--reduced", action="store_true", help="tiny shapes in fp32 on this device (CPU: the interpreter)")
    a = ap.parse_args(argv)
    if not a.reduced and not torch.cuda.is_available():
        print("bench.gpu_check_family_kernels: CUDA is not available; nothing to check here.")
        return 0
    if a.reduced:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules decorate their kernels
        dtype, iters, att, moe = torch.float32, 1, REDUCED_ATTENTION, REDUCED_MOE
    else:
        device, dtype, iters, att, moe = torch.device("cuda"), torch.bfloat16, 20, AttentionShape(), MoeShape()
    attention, experts = check_attention(att, device, dtype, iters), check_moe(moe, device, dtype, iters)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "attention_gemma2_2b": attention,
        "moe_mixtral_layer": experts,
        "ok": attention["ok"] and experts["ok"],
    }
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
