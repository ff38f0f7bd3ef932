"""The elementwise steps of a Llama-family layer as Triton kernels, for CUDA: one kernel each
instead of the ~8 (residual add + RMSNorm), ~20 (rotary embedding of q and k) and 3 (SiLU * up)
kernels the torch arithmetic launches.

Why: with CUDA graphs a small model's decode step is no longer bound by the host's launches but by
the number of kernels the GPU runs one after another, each a few microseconds however small its
work (~45 a layer eagerly, 16 of them the projections and attention). These three fusions leave
~12 a layer.

Same interface and arithmetic as ``engine.model.reference_ops.TorchLayerOps`` (transformers' order:
the residual added in the model dtype, the variance in float32, the normalised row rounded to the
model dtype before the weight; SiLU rounded before the product), up to the order of the variance's
sum and float32 intermediates where torch rounds each op to bf16. ``rotate_qkv`` rotates q and k
in place in the fused qkv rows and returns views, as the CPU kernels do. Checked against the torch
ops under the Triton interpreter (tests/engine/test_triton_layer_ops.py), and at model load on
the GPU itself (``checked_triton_layer_ops``, called by ``engine.kernels.layer_ops_for``):
a kernel that fails to compile or disagrees leaves the model on the torch ops, with a warning. The
decode CUDA graphs are captured after that choice, over whichever ops it made.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from engine.model.reference_ops import TorchLayerOps
from engine.model.rope import RotaryEmbedding

log = logging.getLogger(__name__)


@triton.jit
def _add_rms_norm_kernel(h_ptr, delta_ptr, w_ptr, out_ptr, n_cols, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    h = tl.load(h_ptr + row * n_cols + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * n_cols + cols, mask=ok, other=0.0)
        h = (h.to(tl.float32) + d.to(tl.float32)).to(h_ptr.dtype.element_ty)  # the residual, in the model dtype
        tl.store(h_ptr + row * n_cols + cols, h, mask=ok)
    x = h.to(tl.float32)
    var = tl.sum(x * x, 0) / n_cols
    y = (x * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rope_kernel(
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    row_stride,
    cos_stride,
    ROT_HEADS: tl.constexpr,
    H_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    heads = tl.arange(0, H_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    ok = (heads < ROT_HEADS) & (dims < HALF)
    cos = tl.load(cos_ptr + pos * cos_stride + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * cos_stride + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    first = qkv_ptr + tok * row_stride + heads * (2 * HALF) + dims  # q heads, then k heads: contiguous
    x1 = tl.load(first, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=ok, other=0.0).to(tl.float32)
    ty = qkv_ptr.dtype.element_ty
    tl.store(first, (x1 * cos - x2 * sin).to(ty), mask=ok)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(ty), mask=ok)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=ok, other=0.0)
    ty = out_ptr.dtype.element_ty
    act = (g / (1.0 + tl.exp(-g))).to(ty)  # SiLU, rounded to the model dtype as torch's F.silu is
    tl.store(out_ptr + row * n_cols + cols, (act.to(tl.float32) * u.to(tl.float32)).to(ty), mask=ok)


_SILU_BLOCK = 1024


class TritonLayerOps:
    """Inputs the kernels do not take (not contiguous rows, another layout) go to ``TorchLayerOps``."""

    @staticmethod
    def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not (
            _rows(h)
            and (
                delta is None
                or (_rows(delta) and delta.shape == h.shape and delta.dtype == h.dtype and delta.device == h.device)
            )
            and weight.is_contiguous()
            and weight.shape == h.shape[1:]
            and weight.device == h.device
        ):
            return TorchLayerOps.add_rms_norm(h, delta, weight, eps)
        out = torch.empty_like(h)
        if h.shape[0]:
            block = triton.next_power_of_2(h.shape[1])
            _add_rms_norm_kernel[(h.shape[0],)](
                h,
                h if delta is None else delta,
                weight,
                out,
                h.shape[1],
                eps,
                HAS_DELTA=delta is not None,
                BLOCK=block,
                num_warps=min(16, max(4, block // 512)),
            )  # <= 16 values a thread
        return out

    @staticmethod
    def rotate_qkv(
        qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, heads: int, kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = rope.cos, rope.sin
        width = (heads + 2 * kv_heads) * head_dim
        if not (
            qkv.dim() == 2
            and qkv.stride(1) == 1
            and qkv.shape[1] == width
            and head_dim % 2 == 0
            and positions.shape == (qkv.shape[0],)
            and positions.is_contiguous()
            and cos.is_contiguous()
            and sin.is_contiguous()
            and cos.shape[1] == head_dim // 2
            and cos.dtype == sin.dtype == qkv.dtype
            and qkv.device == positions.device == cos.device == sin.device
        ):
            return TorchLayerOps.rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)
        t = qkv.shape[0]
        if t:
            half = head_dim // 2
            _rope_kernel[(t,)](
                qkv,
                positions,
                cos,
                sin,
                qkv.stride(0),
                cos.stride(0),
                ROT_HEADS=heads + kv_heads,
                H_PAD=triton.next_power_of_2(heads + kv_heads),
                HALF=half,
                HALF_PAD=triton.next_power_of_2(half),
            )
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        return (
            qkv[:, :q_size].view(t, heads, head_dim),
            qkv[:, q_size : q_size + kv_size].view(t, kv_heads, head_dim),
            qkv[:, q_size + kv_size :].view(t, kv_heads, head_dim),
        )

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        if not (_rows(gate_up) and gate_up.shape[1] % 2 == 0):
            return TorchLayerOps.silu_mul(gate_up)
        rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, dim), dtype=gate_up.dtype, device=gate_up.device)
        if rows:
            _silu_mul_kernel[(rows, triton.cdiv(dim, _SILU_BLOCK))](gate_up, out, dim, BLOCK=_SILU_BLOCK)
        return out


def _rows(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.is_contiguous()


def checked_triton_layer_ops(device: torch.device, dtype: torch.dtype) -> TritonLayerOps | None:
    """``TritonLayerOps`` where its kernels compile on ``device`` and agree with the torch ops on a
    small random layer (a few rows of a Llama-like shape in ``dtype``); None, with a warning,
    elsewhere."""
    try:
        problem = _self_check(TritonLayerOps(), device, dtype)
    except Exception as e:  # noqa: BLE001 - a compile or launch failure: any Triton or driver error type
        problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if problem:
        log.warning("the Triton layer kernels are not used on %s (%s): the torch ops run instead", device, problem)
        return None
    return TritonLayerOps()


def _self_check(ops: TritonLayerOps, device: torch.device, dtype: torch.dtype) -> str | None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows, heads, kv_heads, head_dim, hidden = 5, 4, 2, 64, 256

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    h, delta, weight = rand(rows, hidden), rand(rows, hidden), rand(hidden)
    h_ref = h.clone()
    want = TorchLayerOps.add_rms_norm(h_ref, delta, weight, 1e-5)
    got = ops.add_rms_norm(h, delta, weight, 1e-5)
    if not (torch.allclose(h, h_ref, atol=tol, rtol=tol) and torch.allclose(got, want, atol=tol, rtol=tol)):
        return "add_rms_norm disagrees with the torch ops"
    gate_up = rand(rows, 2 * hidden)
    if not torch.allclose(ops.silu_mul(gate_up), TorchLayerOps.silu_mul(gate_up), atol=tol, rtol=tol):
        return "silu_mul disagrees with the torch ops"
    rope = _SmallRope(head_dim, 64, device, dtype)
    qkv = rand(rows, (heads + 2 * kv_heads) * head_dim)
    positions = torch.tensor([0, 1, 7, 30, 63], device=device)
    want_qkv = TorchLayerOps.rotate_qkv(qkv.clone(), positions, rope, heads, kv_heads, head_dim)
    got_qkv = ops.rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)
    if not all(torch.allclose(g, w, atol=tol, rtol=tol) for g, w in zip(got_qkv, want_qkv)):
        return "rotate_qkv disagrees with the torch ops"
    return None


class _SmallRope(RotaryEmbedding):
    """A rotary table for the self-check, without a model config."""

    def __init__(self, head_dim: int, positions: int, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos = freqs.cos().to(device=device, dtype=dtype)
        self.sin = freqs.sin().to(device=device, dtype=dtype)
