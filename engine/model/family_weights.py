"""The checkpoint tensors a family adds to (or replaces in) the Llama layout, and the ones it fuses.

``family_shapes`` lists, per layer, what a family's checkpoint holds beyond the Llama tensors (q/k
norms, Gemma's feedforward norms, a MoE layer's router and experts) and which Llama tensors it has
not (a MoE layer has no dense MLP); ``split_fused`` turns Phi-3's fused ``qkv_proj`` and
``gate_up_proj`` into the Llama names as they stream in; ``layer_extras`` takes a layer's extra
tensors (with Gemma's (1 + w) norms folded in) once they are loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from engine.model.config import ModelConfig
from engine.model.family import MoeLayout

DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
# Norm weights (the parts of a name after the layer prefix) that Gemma's (1 + w) applies to.
_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)


def family_shapes(cfg: ModelConfig) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """(tensors each layer has beyond the Llama ones, Llama tensors each layer lacks): names after
    ``model.layers.N.``."""
    f, h = cfg.family, cfg.hidden_size
    extra: dict[str, tuple[int, ...]] = {}
    if f.qk_norm:
        extra["self_attn.q_norm.weight"] = extra["self_attn.k_norm.weight"] = (cfg.head_dim,)
    if f.sandwich_norms:
        extra["pre_feedforward_layernorm.weight"] = extra["post_feedforward_layernorm.weight"] = (h,)
    moe = f.moe
    if moe is None:
        return extra, ()
    i = moe.intermediate_size
    if moe.layout is MoeLayout.MIXTRAL:
        extra["block_sparse_moe.gate.weight"] = (moe.num_experts, h)
        for e in range(moe.num_experts):
            p = f"block_sparse_moe.experts.{e}."
            extra[p + "w1.weight"] = extra[p + "w3.weight"] = (i, h)
            extra[p + "w2.weight"] = (h, i)
    else:
        extra["mlp.gate.weight"] = (moe.num_experts, h)
        for e in range(moe.num_experts):
            p = f"mlp.experts.{e}."
            extra[p + "gate_proj.weight"] = extra[p + "up_proj.weight"] = (i, h)
            extra[p + "down_proj.weight"] = (h, i)
        if moe.shared_intermediate_size:
            s = moe.shared_intermediate_size
            extra["mlp.shared_expert.gate_proj.weight"] = extra["mlp.shared_expert.up_proj.weight"] = (s, h)
            extra["mlp.shared_expert.down_proj.weight"] = (h, s)
            extra["mlp.shared_expert_gate.weight"] = (1, h)
    return extra, DENSE_MLP


def split_fused(
    weights: Iterable[tuple[str, torch.Tensor, str]], q: int, kv: int, intermediate: int
) -> Iterator[tuple[str, torch.Tensor, str]]:
    """Phi-3's ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` as the q/k/v and gate/up tensors they fuse,
    given the model's (or a tensor-parallel rank's) q and kv rows and intermediate size (a tensor of
    the wrong size passes through whole: the shape check names it)."""
    for name, tensor, source in weights:
        if name.endswith("self_attn.qkv_proj.weight") and tensor.shape[0] == q + 2 * kv:
            stem = name[: -len("qkv_proj.weight")]
            for part, t in zip(("q_proj", "k_proj", "v_proj"), torch.split(tensor, [q, kv, kv])):
                yield stem + part + ".weight", t, source
        elif name.endswith("mlp.gate_up_proj.weight") and tensor.shape[0] == 2 * intermediate:
            stem = name[: -len("gate_up_proj.weight")]
            gate, up = tensor.chunk(2)
            yield stem + "gate_proj.weight", gate, source
            yield stem + "up_proj.weight", up, source
        else:
            yield name, tensor, source


def plus_one(cfg: ModelConfig, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A norm weight as the model multiplies by it: (1 + w) for Gemma (added in float32, as transformers
    does), else as it is."""
    if cfg.family.norm_plus_one and (name == "model.norm.weight" or name.endswith(_NORMS)):
        return (1.0 + tensor.float()).to(tensor.dtype)
    return tensor


def layer_extras(cfg: ModelConfig, w: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Pop layer ``prefix``'s extra tensors from ``w`` (named without the prefix)."""
    extra, _ = family_shapes(cfg)
    return {name: w.pop(prefix + name) for name in extra}
