"""The elementwise steps of a Llama-family layer: fused C kernels on CPU fp32 (``layer_ops.c``),
the same arithmetic in torch elsewhere (CUDA, bf16/fp16, no compiler).

``add_rms_norm(h, delta, weight, eps)`` adds the residual ``delta`` into ``h`` in place (when given)
and returns RMSNorm(h); ``rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)`` splits the
fused qkv rows into q, k, v heads with the rotary embedding applied to q and k (the native version
rotates them in place and returns views); ``silu_mul(gate_up)`` is SiLU(gate) * up over the fused
gate/up rows.
"""

from __future__ import annotations

import ctypes
import os

import torch
import torch.nn.functional as F

from engine.model.rope import RotaryEmbedding
from engine.native.build import bind, build_and_load


class TorchLayerOps:
    """Reference arithmetic: transformers' LlamaRMSNorm (variance in float32) and rotate-half RoPE."""

    @staticmethod
    def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if delta is not None:
            h.add_(delta)
        xf = h.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(h.dtype)

    @staticmethod
    def rotate_qkv(qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, heads: int, kv_heads: int,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = qkv.shape[0]
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = rope.apply(q.view(t, heads, head_dim), positions)
        k = rope.apply(k.view(t, kv_heads, head_dim), positions)
        return q, k, v.view(t, kv_heads, head_dim)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class NativeLayerOps:
    """The compiled kernels; inputs they do not take go to ``TorchLayerOps``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._norm = bind(lib, "baton_add_rms_norm_f32", "ppppllfi")
        self._rope = bind(lib, "baton_rope_qk_f32", "plplppiii")
        self._silu_mul = bind(lib, "baton_silu_mul_f32", "pplli")

    @classmethod
    def load(cls) -> NativeLayerOps | None:
        library = build_and_load("layer_ops.c", extra_flags=("-ffp-contract=off",))
        return cls(library.lib) if library.lib is not None else None

    def add_rms_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not (_f32_rows(h) and (delta is None or (_f32_rows(delta) and delta.shape == h.shape))
                and weight.dtype == torch.float32 and weight.is_contiguous() and weight.shape == h.shape[1:]):
            return TorchLayerOps.add_rms_norm(h, delta, weight, eps)
        out = torch.empty_like(h)
        self._norm(h.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(), out.data_ptr(),
                   h.shape[0], h.shape[1], eps, torch.get_num_threads())
        return out

    def rotate_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, heads: int, kv_heads: int,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = rope.cos, rope.sin
        if not (_f32_rows(qkv) and positions.dtype == torch.int64 and positions.is_contiguous()
                and cos.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous() and head_dim % 2 == 0):
            return TorchLayerOps.rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)
        t = qkv.shape[0]
        self._rope(qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), t, cos.data_ptr(), sin.data_ptr(),
                   heads + kv_heads, head_dim, torch.get_num_threads())
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        return (qkv[:, :q_size].view(t, heads, head_dim), qkv[:, q_size : q_size + kv_size].view(t, kv_heads, head_dim),
                qkv[:, q_size + kv_size :].view(t, kv_heads, head_dim))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not (_f32_rows(gate_up) and gate_up.shape[1] % 2 == 0):
            return TorchLayerOps.silu_mul(gate_up)
        rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, dim), dtype=gate_up.dtype)
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, dim, torch.get_num_threads())
        return out


def _f32_rows(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.is_contiguous()


def layer_ops_for(device: torch.device, dtype: torch.dtype):
    """The compiled kernels for CPU fp32 where they build; on CUDA the Triton kernels where they
    compile and pass their self-check (engine/model/triton_layer_ops.py; ``BATON_TRITON_LAYER_OPS=0``
    turns them off); the torch arithmetic everywhere else."""
    if device.type == "cpu" and dtype == torch.float32:
        native = NativeLayerOps.load()
        if native is not None:
            return native
    if device.type == "cuda" and os.environ.get("BATON_TRITON_LAYER_OPS", "1") != "0":
        try:
            from engine.model.triton_layer_ops import checked_triton_layer_ops
        except ImportError:  # no triton: the torch ops, as before
            return TorchLayerOps()
        fused = checked_triton_layer_ops(device, dtype)
        if fused is not None:
            return fused
    return TorchLayerOps()
