"""The elementwise steps of a Llama-family layer in torch: the reference arithmetic every fused
kernel (engine/native/layer_ops.c, engine/model/triton_layer_ops.py) is checked against and falls
back to for inputs it does not take, and the layer ops wherever no fused kernel serves.

``add_rms_norm(h, delta, weight, eps)`` adds the residual ``delta`` into ``h`` in place (when given)
and returns RMSNorm(h); ``rotate_qkv(qkv, positions, rope, heads, kv_heads, head_dim)`` splits the
fused qkv rows into q, k, v heads with the rotary embedding applied to q and k (the fused versions
rotate them in place and return views); ``silu_mul(gate_up)`` is SiLU(gate) * up over the fused
gate/up rows. ``LayerOps`` is that interface.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from engine.model.rope import RotaryEmbedding


class LayerOps(Protocol):
    def add_rms_norm(
        self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor: ...

    def rotate_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        heads: int,
        kv_heads: int,
        head_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


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
    def rotate_qkv(
        qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, heads: int, kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = qkv.shape[0]
        q, k, v = torch.split(qkv, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = rope.apply(q.view(t, heads, head_dim), positions)
        k = rope.apply(k.view(t, kv_heads, head_dim), positions)
        return q, k, v.view(t, kv_heads, head_dim)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
