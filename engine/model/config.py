"""The model architecture, parsed from a Hugging Face ``config.json`` (pure Python, no torch).

Supported: Llama 2/3 (including ``llama3`` rope scaling), Qwen2/2.5 (qkv bias), Mistral and
SmolLM2 (a Llama), and the families ``family.py`` describes (Qwen3, Phi-3, Gemma 2/3, Mixtral,
Qwen2-MoE, Qwen3-MoE). Transformers 4.x (``rope_theta`` + ``rope_scaling``) and 5.x
(``rope_parameters``) spellings are both accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.model.family import FAMILY_ARCHITECTURES, Family, activation_of, family_from_hf, with_window

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    **FAMILY_ARCHITECTURES,
}
_SUPPORTED_ROPE = ("default", "llama3", "linear", "longrope", "su")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3's "su"): per-frequency divisors below and from original_max_position_embeddings on
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # cos/sin multiplied by it (longrope)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    family: Family = field(default_factory=Family)  # what else sets the architecture apart (family.py)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"model config: {name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"model config: head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token at 1 byte per element (multiply by the dtype size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    @property
    def long_rope_from(self) -> int | None:
        """longrope's original length: a sequence longer than it is rotated with the long factors at
        every position (engine/model/rope.py); None for the other rope types."""
        rs = self.rope_scaling
        return rs.original_max_position_embeddings if rs.rope_type == "longrope" else None

    @property
    def max_context_len(self) -> int:
        """Usable context (a sliding window is attention's: ``Family.window``, which every attention
        backend applies)."""
        return self.max_position_embeddings

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
        archs = cfg.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ModelLoadError(f"{source}: architectures must be a list of strings, got {archs!r}")
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            model_type = cfg.get("model_type")
            by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
            arch = by_type.get(model_type) if isinstance(model_type, str) else None
            if arch is None:
                raise ModelLoadError(
                    f"{source}: unsupported architecture {archs or model_type!r}; "
                    f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
                )
        activation = activation_of(arch, cfg, source)
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            rope_theta, scaling = _parse_rope(_global_rope(cfg), source)
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
            use_sw = cfg.get("use_sliding_window", arch in ("MistralForCausalLM", "MixtralForCausalLM"))
            # transformers' Mixtral has no window unless config.json names one
            default_window = None if arch == "MixtralForCausalLM" else 4096
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=scaling,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(
                    cfg.get("attention_bias", cfg.get("qkv_bias", arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")))
                ),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                # transformers' default window is 4096 (Mistral, Qwen2) when the key is absent; null: none
                sliding_window=(cfg.get("sliding_window", default_window) or None) if use_sw else None,
                family=with_window(
                    replace(family_from_hf(arch, cfg, int(cfg["num_hidden_layers"]), source), activation=activation),
                    (cfg.get("sliding_window", default_window) or None) if use_sw else None,
                    cfg.get("layer_types"),
                    int(cfg["num_hidden_layers"]),
                    source,
                ),
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelLoadError(f"{path}: not found (a model directory needs config.json)") from None
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"{path}: not UTF-8 text ({e})") from None
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{path}: expected a JSON object")
        return cls.from_hf_dict(cfg, str(path))


def _global_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 (transformers 5.x) keeps a rope setting per layer type: the global layers' is the model's
    (the sliding layers' base is in its Family)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        return {**cfg, "rope_parameters": params["full_attention"]}
    return cfg


def _parse_rope(cfg: dict[str, Any], source: str) -> tuple[float, RopeScaling]:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
    if rope_type not in _SUPPORTED_ROPE:
        raise ModelLoadError(
            f"{source}: unsupported rope scaling {rope_type!r}; supported: {', '.join(_SUPPORTED_ROPE)}"
        )
    if float(merged.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor {merged.get('partial_rotary_factor')!r} is not "
            "supported (only 1.0: the rotary embedding over the whole head)"
        )
    if rope_type in ("longrope", "su"):
        return theta, _longrope(cfg, merged, source)
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def _longrope(cfg: dict[str, Any], merged: dict[str, Any], source: str) -> RopeScaling:
    """Phi-3's longrope as transformers computes it: the attention factor from max / original length."""
    import math

    original = int(
        merged.get("original_max_position_embeddings")
        or cfg.get("original_max_position_embeddings")
        or cfg.get("max_position_embeddings", 4096)
    )
    factor = merged.get("factor")
    factor = float(factor) if factor is not None else int(cfg.get("max_position_embeddings", 2048)) / original
    attention = merged.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    factors = {}
    for name in ("short_factor", "long_factor"):
        f = merged.get(name)
        if not isinstance(f, list) or len(f) != head_dim // 2:
            raise ModelLoadError(
                f"{source}: rope scaling {name} must be a list of head_dim/2 ({head_dim // 2}) numbers, got {f!r}"
            )
        factors[name] = tuple(float(x) for x in f)
    return RopeScaling(
        rope_type="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        short_factor=factors["short_factor"],
        long_factor=factors["long_factor"],
        attention_factor=float(attention),
    )
