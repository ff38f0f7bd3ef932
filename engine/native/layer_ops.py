"""ctypes binding of ``layer_ops.c``: the elementwise steps of a Llama-family layer (residual add +
RMSNorm, the rotary embedding of q and k, SiLU * up) fused for CPU fp32, with the arithmetic of
``engine.model.reference_ops.TorchLayerOps``, to which inputs the kernels do not take go.
"""

from __future__ import annotations

import ctypes

import torch

from engine.model.reference_ops import TorchLayerOps
from engine.model.rope import RotaryEmbedding
from engine.native.build import bind, build_and_load


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

    def add_rms_norm(
        self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        if not (
            _f32_rows(h)
            and (delta is None or (_f32_rows(delta) and delta.shape == h.shape))
            and weight.dtype == torch.float32
            and weight.is_contiguous()
            and weight.shape == h.shape[1:]
        ):
            return TorchLayerOps.add_rms_norm(h, delta, weight, eps)
        out = torch.empty_like(h)
        self._norm(
            h.data_ptr(),
            None if delta is None else delta.data_ptr(),
            weight.data_ptr(),
            out.data_ptr(),
            h.shape[0],
            h.shape[1],
            eps,
            torch.get_num_threads(),
        )
        return out

    def rotate_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        heads: int,
        kv_heads: int,
        head_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = rope.cos, rope.sin
        if not (
            _f32_rows(qkv)
            and positions.dtype == torch.int64
            and positions.is_contiguous()
            and cos.dtype == torch.float32
            and cos.is_contiguous()
            and sin.is_contiguous()
            and head_dim % 2 == 0
        ):
            return TorchLayerOps.rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)
        t = qkv.shape[0]
        self._rope(
            qkv.data_ptr(),
            qkv.stride(0),
            positions.data_ptr(),
            t,
            cos.data_ptr(),
            sin.data_ptr(),
            heads + kv_heads,
            head_dim,
            torch.get_num_threads(),
        )
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        return (
            qkv[:, :q_size].view(t, heads, head_dim),
            qkv[:, q_size : q_size + kv_size].view(t, kv_heads, head_dim),
            qkv[:, q_size + kv_size :].view(t, kv_heads, head_dim),
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not (_f32_rows(gate_up) and gate_up.shape[1] % 2 == 0):
            return TorchLayerOps.silu_mul(gate_up)
        rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, dim), dtype=gate_up.dtype)
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, dim, torch.get_num_threads())
        return out


def _f32_rows(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.is_contiguous()
