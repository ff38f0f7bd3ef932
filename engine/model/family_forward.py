"""The forward pass of a family that is not the plain Llama layout (``Family.plain`` is false): the
same ragged batch over the paged KV cache as ``LlamaModel.forward``, with each of ``Family``'s
differences where it applies. The projections are the model's own ``Linear``s (every projection mode
serves them); the rest is torch arithmetic, so no fused layer kernel has to know a family.

Attention goes through the model's attention backend unless a layer needs a sliding window or
soft-capped scores: those take the ``KernelSet``'s windowed attention under the Triton backend (the
Triton kernels on CUDA, engine/kernels.py) and the torch reference's
(``reference.paged_windowed_attention``) under the torch backend. MoE layers take the set's fused
experts where it has them (Triton, on CUDA), else the torch loop (engine/model/moe.py).

Sharded (tensor parallel), a rank computes its heads and its rows of every MLP and expert; the
model's ``reduce`` sums each block's partial output (o_proj's, the MLP's: for a MoE layer one sum
of its routed and shared experts, the router and the shared expert's gate computed whole on
every rank) before any norm reads it. The rest is elementwise or per head, the same on a shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.kernels import TORCH_WINDOWED, KernelSet
from engine.model.config import ModelConfig
from engine.model.family import Activation, Family
from engine.model.moe import MoeWeights, moe_mlp
from engine.model.rope import RotaryEmbedding

Projection = Callable[[torch.Tensor], torch.Tensor]


class DecoderLayer(Protocol):
    """What this reads of a layer (engine/model/llama.py's DecoderLayer); read-only, so the layer's
    own (narrower) types fit."""

    @property
    def qkv(self) -> Projection: ...
    @property
    def o(self) -> Projection: ...
    @property
    def gate_up(self) -> Projection | None: ...
    @property
    def down(self) -> Projection | None: ...
    @property
    def ln1(self) -> torch.Tensor: ...
    @property
    def ln2(self) -> torch.Tensor: ...
    @property
    def extra(self) -> dict[str, torch.Tensor]: ...
    @property
    def moe(self) -> MoeWeights | None: ...


class LlamaModel(Protocol):
    """What this reads of the model (engine/model/llama.py's LlamaModel, which imports this module)."""

    cfg: ModelConfig
    kernels: KernelSet
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_size: int
    kv_size: int
    scale: float
    rope: RotaryEmbedding
    local_rope: RotaryEmbedding | None

    @property
    def norm(self) -> torch.Tensor: ...  # (the model's assert the weights are loaded)
    @property
    def layers(self) -> Sequence[DecoderLayer]: ...
    def embed_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...
    def reduce(self, partial: torch.Tensor) -> torch.Tensor: ...  # a sharded product's sum over the ranks


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (Gemma's (1 + w) is folded into ``weight`` at load)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def act_mul(family: Family, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if family.activation is Activation.GELU_TANH:
        return F.gelu(gate, approximate="tanh") * up
    return F.silu(gate) * up


def family_forward(
    model: LlamaModel,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    attn: AttentionBackend,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    family, eps = model.cfg.family, model.cfg.rms_norm_eps
    h = model.embed_ids(input_ids)
    if family.embed_scale:
        h = h * torch.tensor(model.cfg.hidden_size**0.5, dtype=h.dtype)
    for n, layer in enumerate(model.layers):
        x = rms_norm(h, layer.ln1, eps)
        a = _attention(model, n, layer, x, positions, kv_cache, meta, attn)
        if family.sandwich_norms:
            h = h + rms_norm(a, layer.ln2, eps)
            x = rms_norm(h, layer.extra["pre_feedforward_layernorm.weight"], eps)
        else:
            h = h + a
            x = rms_norm(h, layer.ln2, eps)
        if layer.moe is not None and family.moe is not None:
            m = moe_mlp(x, layer.moe, family.moe, lambda gu: act_mul(family, gu), model.kernels.fused_moe)
        else:
            assert layer.down is not None and layer.gate_up is not None  # a dense layer
            m = layer.down(act_mul(family, layer.gate_up(x)))
        m = model.reduce(m)
        if family.sandwich_norms:
            m = rms_norm(m, layer.extra["post_feedforward_layernorm.weight"], eps)
        h = h + m
    if keep is not None and len(keep) != h.shape[0]:
        h = h.index_select(0, keep)
    return rms_norm(h, model.norm, eps)


def _attention(
    model: LlamaModel,
    n: int,
    layer: DecoderLayer,
    x: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    attn: AttentionBackend,
) -> torch.Tensor:
    family, eps = model.cfg.family, model.cfg.rms_norm_eps
    t, hd = x.shape[0], model.head_dim
    q, k, v = torch.split(layer.qkv(x), [model.q_size, model.kv_size, model.kv_size], dim=-1)
    q, k, v = q.view(t, model.num_heads, hd), k.view(t, model.num_kv_heads, hd), v.view(t, model.num_kv_heads, hd)
    if family.qk_norm:
        q = rms_norm(q, layer.extra["self_attn.q_norm.weight"], eps)
        k = rms_norm(k, layer.extra["self_attn.k_norm.weight"], eps)
    window = family.layer_window(n)
    rope = model.local_rope if window is not None and model.local_rope is not None else model.rope
    q, k = rope.apply(q, positions), rope.apply(k, positions)
    k_cache, v_cache = kv_cache[:, n, 0], kv_cache[:, n, 1]
    attn.write_kv(k_cache, v_cache, k, v.contiguous(), meta.slot_block, meta.slot_offset)
    nd, scale, cap = meta.num_decode_tokens, model.scale, family.attn_softcap
    out = torch.empty_like(q)
    if window is None and cap is None:
        if nd:
            out[:nd] = attn.decode(q[:nd], k_cache, v_cache, *meta.decode_tables(), scale)
        if meta.num_prefill_tokens:
            out[nd:] = attn.prefill(q[nd:], k_cache, v_cache, *meta.prefill_tables(), scale)
    else:
        windowed = model.kernels.windowed_attention if attn.name == "triton" else TORCH_WINDOWED
        if nd:
            out[:nd] = windowed.decode(q[:nd], k_cache, v_cache, *meta.decode_tables(), scale, window, cap)
        if meta.num_prefill_tokens:
            out[nd:] = windowed.prefill(q[nd:], k_cache, v_cache, *meta.prefill_tables(), scale, window, cap)
    return model.reduce(layer.o(out.view(t, model.q_size)))
