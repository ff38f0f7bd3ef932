"""What each GGUF architecture Baton imports looks like: its tensor names, the metadata that becomes
``config.json``, and the transforms llama.cpp's converter applied that the import undoes.

The architectures are the ones transformers itself loads from GGUF (integrations/ggml.py's
``GGUF_CONFIG_MAPPING``, modeling_gguf_pytorch_utils.py's tensor processors), so the oracle can load
the same file, and the tensors are the ones it loads. Where transformers ignores metadata llama.cpp
writes (Gemma 2's soft-caps, Gemma 3's rope scaling, Phi-3's longrope factors, the MoE expert sizes)
or has no key for a setting (Gemma's query scale) the import follows llama.cpp instead: transformers'
class defaults fit some released models (Gemma 2 2B/9B, Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B) but not
others (Gemma 3 4B and up, Phi-3 with longrope, the Gemma 27Bs). A Mixtral (llama architecture with
expert tensors) is refused: transformers loads it as a dense Llama with the experts dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ModelLoadError

# GGUF tensor-name leaf -> HF module path inside model.layers.N, shared by the Llama-layout families.
_ATTN = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LLAMA = {**_ATTN, **_MLP, "ffn_norm": "post_attention_layernorm"}
# Gemma's sandwich: llama.cpp's ffn_norm is the norm before the MLP, not the one after attention.
_GEMMA = {
    **_ATTN,
    **_MLP,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_PHI3 = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",  # gate and up fused, gate first: HF's Phi-3 checkpoint layout
    "ffn_down": "mlp.down_proj",
}
_MOE = {
    **_ATTN,
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.gate",
    # stacked (experts, rows, cols) tensors: one HF tensor per expert, {e} its index
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
_SHARED_EXPERT = {
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
EXPERT_LEAVES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")

Key = Callable[[str], Any]  # the architecture's own metadata key ("{arch}.{name}"), None when absent


@dataclass(frozen=True)
class GGUFArch:
    """One GGUF architecture as Baton imports it."""

    hf_architecture: str
    model_type: str
    layer_names: Mapping[str, str]  # every tensor leaf the importer accepts in a layer
    optional: frozenset[str] = frozenset()  # leaves a layer may lack (biases are always optional)
    permute_qk: bool = False  # llama.cpp permuted Q/K rows for its rope (llama only)
    norm_offset: float = 0.0  # added to every norm weight on import (Gemma: the file holds 1 + w)
    extra_globals: Mapping[str, str] = field(default_factory=dict)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(leaf for leaf in self.layer_names if leaf not in self.optional)


ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", "llama", _LLAMA, permute_qk=True),
    "qwen2": GGUFArch("Qwen2ForCausalLM", "qwen2", _LLAMA),
    "qwen3": GGUFArch("Qwen3ForCausalLM", "qwen3", {**_LLAMA, **_QK_NORM}),
    "gemma2": GGUFArch("Gemma2ForCausalLM", "gemma2", _GEMMA, norm_offset=-1.0),
    "gemma3": GGUFArch("Gemma3ForCausalLM", "gemma3_text", {**_GEMMA, **_QK_NORM}, norm_offset=-1.0),
    "phi3": GGUFArch("Phi3ForCausalLM", "phi3", _PHI3),
    "qwen2moe": GGUFArch("Qwen2MoeForCausalLM", "qwen2_moe", {**_MOE, **_SHARED_EXPERT}),
    "qwen3moe": GGUFArch("Qwen3MoeForCausalLM", "qwen3_moe", {**_MOE, **_QK_NORM}),
}
# Global tensors with no HF weight: llama's rope_freqs (read by gguf_rope.py), Phi-3's longrope
# factors (read into rope_scaling below).
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def refuse_unloadable(arch: str, tensor_names: set[str], expert_count: Any, source: str) -> None:
    """Fail on a file of a supported architecture that transformers cannot load as that family."""
    if arch == "llama" and (expert_count or any(n.endswith("_exps.weight") for n in tensor_names)):
        raise ModelLoadError(
            f"{source}: GGUF architecture 'llama' with mixture-of-experts tensors (a Mixtral) is not "
            "supported: transformers cannot load it from GGUF either; use its Hugging Face directory"
        )


def family_config(
    arch: str, key: Key, config: dict[str, Any], tensors: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """``config`` (the Llama-layout fields, ``rope_scaling`` included) completed for ``arch``."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if arch in ("gemma2", "gemma3"):
        return _gemma(arch, key, config)
    if arch == "phi3":
        head_dim = hidden // heads
        rotary = key("rope.dimension_count")
        if rotary is not None and int(rotary) != head_dim:  # Phi-4-mini: Baton's config refuses it by name
            config["partial_rotary_factor"] = int(rotary) / head_dim
        longrope = _longrope(key, config, tensors, head_dim, source)
        if longrope is not None:
            config["rope_scaling"] = longrope
            config["original_max_position_embeddings"] = longrope["original_max_position_embeddings"]
        return config
    if arch in ("qwen2moe", "qwen3moe"):
        return _moe(arch, key, config, tensors, source)
    return config


def _gemma(arch: str, key: Key, config: dict[str, Any]) -> dict[str, Any]:
    layers, hidden, heads = config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
    head_dim = int(key("attention.key_length") or 256)
    # Not in the file: llama.cpp scales queries by head_dim ** -0.5, except for the 27B models
    # (by their layer count), which use hidden / heads, as their HF configs do.
    big = layers == (46 if arch == "gemma2" else 62)
    every = 2 if arch == "gemma2" else 6  # llama.cpp's sliding-window pattern: every n-th layer global
    config.pop("hidden_act", None)
    config.update(
        hidden_activation="gelu_pytorch_tanh",
        head_dim=head_dim,
        query_pre_attn_scalar=hidden // heads if big else head_dim,
        sliding_window=int(key("attention.sliding_window") or 4096),
        layer_types=["full_attention" if (n + 1) % every == 0 else "sliding_attention" for n in range(layers)],
    )
    if arch == "gemma2":
        config["attn_logit_softcapping"] = float(key("attn_logit_softcapping") or 50.0)
        config["final_logit_softcapping"] = float(key("final_logit_softcapping") or 30.0)
        return config
    config["attn_logit_softcapping"] = config["final_logit_softcapping"] = None
    # Gemma 3: the global layers use the file's base and scaling; the local ones llama.cpp's fixed base.
    theta = config.pop("rope_theta")
    scaling = config.pop("rope_scaling", None) or {"rope_type": "default"}
    config["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {**scaling, "rope_theta": theta},
    }
    return config


def _longrope(
    key: Key, config: dict[str, Any], tensors: Mapping[str, Any], head_dim: int, source: str
) -> dict[str, Any] | None:
    """Phi-3's longrope from its ``rope_factors_long``/``rope_factors_short`` tensors."""
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if long is None and short is None:
        return None
    if long is None or short is None:
        raise ModelLoadError(f"{source}: rope_factors_long and rope_factors_short must both be present or absent")
    original = key("rope.scaling.original_context_length")
    if original is None:
        raise ModelLoadError(f"{source}: longrope factors without phi3.rope.scaling.original_context_length")
    factors = {name: [float(x) for x in t.data.reshape(-1).tolist()] for name, t in (("long", long), ("short", short))}
    if any(len(f) != head_dim // 2 for f in factors.values()):
        raise ModelLoadError(f"{source}: rope_factors_long/short must hold head_dim/2 ({head_dim // 2}) values")
    return {
        "rope_type": "longrope",
        "long_factor": factors["long"],
        "short_factor": factors["short"],
        "original_max_position_embeddings": int(original),
    }


def _moe(arch: str, key: Key, config: dict[str, Any], tensors: Mapping[str, Any], source: str) -> dict[str, Any]:
    def rows(name: str) -> int | None:  # a stacked / shared expert tensor's output rows
        t = tensors.get(name)
        return None if t is None else int(t.shape[1] if len(t.shape) > 1 else t.shape[0])

    experts, used = key("expert_count"), key("expert_used_count")
    if not experts or not used:
        raise ModelLoadError(f"{source}: missing GGUF metadata '{arch}.expert_count' or '{arch}.expert_used_count'")
    expert_size = key("expert_feed_forward_length") or rows("blk.0.ffn_gate_exps.weight")
    if not expert_size:
        raise ModelLoadError(f"{source}: missing GGUF metadata '{arch}.expert_feed_forward_length'")
    config.update(
        num_experts=int(experts),
        num_experts_per_tok=int(used),
        moe_intermediate_size=int(expert_size),
        # llama.cpp renormalises the chosen experts' weights for Qwen3-MoE, not for Qwen2-MoE
        norm_topk_prob=arch == "qwen3moe",
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    if arch == "qwen2moe":
        shared = key("expert_shared_feed_forward_length") or rows("blk.0.ffn_gate_shexp.weight")
        if not shared:
            raise ModelLoadError(f"{source}: missing GGUF metadata 'qwen2moe.expert_shared_feed_forward_length'")
        config["shared_expert_intermediate_size"] = int(shared)
        config["qkv_bias"] = config["attention_bias"]
    return config
