"""What sets a model family apart from the Llama layout, read from its ``config.json`` (pure Python).

``Family`` is the one description the model consults for every difference: per-head q/k norms
(Qwen3, Gemma 3), RMSNorm with (1 + w) and the embedding scaled by sqrt(hidden) (Gemma), the MLP's
activation, Gemma's pre/post-feedforward ("sandwich") norms, attention and final logit soft-capping,
the query pre-attention scalar, sliding-window layers with their own rope base (Gemma 2/3), a
checkpoint with fused q/k/v and gate/up tensors (Phi-3) and mixture-of-experts MLPs (Mixtral,
Qwen2-MoE, Qwen3-MoE). The Llama default (``Family()``) is ``plain``: such a model keeps the fused
kernels' fast path; any other family computes in ``family_forward.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import ModelLoadError

# architectures -> the family parser's key (config.SUPPORTED_ARCHITECTURES names them for the loader)
FAMILY_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}


class Activation(enum.Enum):
    SILU = "silu"
    GELU_TANH = "gelu_pytorch_tanh"


class MoeLayout(enum.Enum):
    """How a checkpoint names a MoE layer's tensors."""

    MIXTRAL = "mixtral"  # block_sparse_moe.gate, block_sparse_moe.experts.N.w1/w2/w3
    QWEN = "qwen"  # mlp.gate, mlp.experts.N.gate_proj/up_proj/down_proj (+ mlp.shared_expert[_gate])


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    norm_topk_prob: bool  # renormalise the chosen experts' softmax weights to sum to one
    layout: MoeLayout
    shared_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none), gated by sigmoid(shared_expert_gate)


@dataclass(frozen=True)
class Family:
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotary embedding
    norm_plus_one: bool = False  # RMSNorm multiplies by (1 + w): the loader adds the 1 to the weights
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    activation: Activation = Activation.SILU
    sandwich_norms: bool = False  # norms after attention and around the MLP (Gemma)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim ** -0.5)
    window: int | None = None  # the sliding layers' window (a key j is seen from query i when i - j < window)
    sliding_layers: tuple[bool, ...] = ()  # per layer: attends within ``window`` (empty: no layer does)
    local_rope_theta: float | None = None  # the sliding layers' rope base, without scaling (Gemma 3)
    fused_checkpoint: bool = False  # qkv_proj and gate_up_proj tensors in the checkpoint (Phi-3)
    moe: MoeSpec | None = None

    @property
    def plain(self) -> bool:
        """A Llama layout: nothing here changes the forward pass."""
        return self == Family() or self == Family(fused_checkpoint=True)

    @property
    def needs_windowed_attention(self) -> bool:
        """Attention that masks outside a window or soft-caps scores (not every kernel does)."""
        return any(self.sliding_layers) or self.attn_softcap is not None

    def within(self, max_positions: int) -> Family:
        """This family for a context of ``max_positions``: a window that long or longer never masks
        anything, so it is dropped (a Mistral served within its window keeps the plain fast path)."""
        if self.window is None or self.window < max_positions:
            return self
        return replace(self, window=None, sliding_layers=())

    @property
    def freeing_window(self) -> int | None:
        """The window when every layer slides (Mistral): a block wholly before the window of a
        sequence's next query is never read again, so the block manager frees it. With some global
        layer (Gemma) every block stays: only the sliding layers skip the old ones."""
        return self.window if self.sliding_layers and all(self.sliding_layers) else None

    def layer_window(self, layer: int) -> int | None:
        return self.window if self.sliding_layers and self.sliding_layers[layer] else None


def family_from_hf(arch: str, cfg: dict[str, Any], num_layers: int, source: str) -> Family:
    """The family of ``arch`` (one of ``FAMILY_ARCHITECTURES``, or a Llama-layout one: ``Family()``)
    from its config; a setting Baton does not run fails naming the field."""
    kind = FAMILY_ARCHITECTURES.get(arch)
    if kind is None:
        return Family()
    if kind == "qwen3":
        return Family(qk_norm=True)
    if kind == "phi3":
        return Family(fused_checkpoint=True)
    if kind in ("gemma2", "gemma3_text"):
        return _gemma(kind, cfg, num_layers, source)
    return Family(qk_norm=kind == "qwen3_moe", moe=_moe(kind, cfg, num_layers, source))


def with_window(
    family: Family, window: int | None, layer_types: list[Any] | None, num_layers: int, source: str
) -> Family:
    """``family`` with Mistral's (or Qwen's ``use_sliding_window``) window: on every layer, or where
    ``layer_types`` says sliding_attention (transformers' Qwen2 slides from ``max_window_layers`` on)."""
    if window is None or family.sliding_layers:
        return family
    if not isinstance(window, int) or window <= 0:
        raise ModelLoadError(f"{source}: sliding_window must be a positive integer or null, got {window!r}")
    sliding = tuple(t == "sliding_attention" for t in layer_types) if layer_types else (True,) * num_layers
    if len(sliding) != num_layers:
        raise ModelLoadError(f"{source}: layer_types names {len(sliding)} layers, the model has {num_layers}")
    return replace(family, window=window, sliding_layers=sliding) if any(sliding) else family


def activation_of(arch: str, cfg: dict[str, Any], source: str) -> Activation:
    kind = FAMILY_ARCHITECTURES.get(arch)
    if kind in ("gemma2", "gemma3_text"):
        name = cfg.get("hidden_activation") or cfg.get("hidden_act") or Activation.GELU_TANH.value
        field = "hidden_activation"
    else:
        name, field = cfg.get("hidden_act", "silu"), "hidden_act"
    if name == "gelu_tanh":
        name = Activation.GELU_TANH.value
    allowed = Activation.GELU_TANH if kind in ("gemma2", "gemma3_text") else Activation.SILU
    if name != allowed.value:
        raise ModelLoadError(f"{source}: unsupported {field} {name!r} for {arch} (only {allowed.value})")
    return allowed


def _gemma(kind: str, cfg: dict[str, Any], num_layers: int, source: str) -> Family:
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{source}: use_bidirectional_attention=true is not supported (a causal decoder only)")
    types = cfg.get("layer_types")
    if types is None:  # transformers 4.x: Gemma 2 alternates from a sliding layer; Gemma 3 every 6th is global
        pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
        types = [
            ("full_attention" if (n + 1) % (2 if kind == "gemma2" else pattern) == 0 else "sliding_attention")
            for n in range(num_layers)
        ]
    if len(types) != num_layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise ModelLoadError(
            f"{source}: layer_types must name sliding_attention or full_attention for each of the "
            f"{num_layers} layers, got {types!r}"
        )
    window = cfg.get("sliding_window", 4096)  # transformers' default
    sliding = tuple(t == "sliding_attention" for t in types)
    if any(sliding) and not (isinstance(window, int) and window > 0):
        raise ModelLoadError(f"{source}: sliding_window must be a positive integer, got {window!r}")
    local_theta = None
    if kind == "gemma3_text":
        params = cfg.get("rope_parameters") or {}
        local = params.get("sliding_attention") if isinstance(params.get("sliding_attention"), dict) else None
        if local is not None and local.get("rope_type", "default") != "default":
            raise ModelLoadError(
                f"{source}: rope_parameters.sliding_attention.rope_type {local.get('rope_type')!r} "
                "is not supported (default only)"
            )
        local_theta = float(local["rope_theta"] if local else cfg.get("rope_local_base_freq", 10000.0))
    return Family(
        qk_norm=kind == "gemma3_text",
        norm_plus_one=True,
        embed_scale=True,
        activation=Activation.GELU_TANH,
        sandwich_norms=True,
        attn_softcap=_positive_or_none(cfg, "attn_logit_softcapping", source),
        final_softcap=_positive_or_none(cfg, "final_logit_softcapping", source),
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
        window=window if any(sliding) else None,
        sliding_layers=sliding if any(sliding) else (),
        local_rope_theta=local_theta,
    )


def _moe(kind: str, cfg: dict[str, Any], num_layers: int, source: str) -> MoeSpec:
    if kind != "mixtral" and (int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers")):
        field = "decoder_sparse_step" if int(cfg.get("decoder_sparse_step", 1)) != 1 else "mlp_only_layers"
        raise ModelLoadError(f"{source}: {field}={cfg.get(field)!r} is not supported (every layer a MoE layer)")
    if float(cfg.get("router_jitter_noise", 0.0) or 0.0):
        raise ModelLoadError(f"{source}: router_jitter_noise is not supported for inference (set it to 0)")
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    if experts <= 0 or not 0 < top_k <= experts:
        raise ModelLoadError(f"{source}: num_experts_per_tok ({top_k}) must be in 1..num_experts ({experts})")
    if kind == "mixtral":
        return MoeSpec(experts, top_k, int(cfg["intermediate_size"]), True, MoeLayout.MIXTRAL)
    shared = int(cfg.get("shared_expert_intermediate_size", 0) or 0) if kind == "qwen2_moe" else 0
    return MoeSpec(
        experts,
        top_k,
        int(cfg["moe_intermediate_size"]),
        bool(cfg.get("norm_topk_prob", False)),
        MoeLayout.QWEN,
        shared,
    )


def _positive_or_none(cfg: dict[str, Any], field: str, source: str) -> float | None:
    v = cfg.get(field)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or v <= 0:
        raise ModelLoadError(f"{source}: {field} must be a positive number or null, got {v!r}")
    return float(v)
