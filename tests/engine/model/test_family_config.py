"""Families load from sharded checkpoints, and a setting Baton does not run fails naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig
from engine.model.family import Activation
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import build_family_model
from tests.engine.test_golden_tiny import _engine, _prompts, _run

BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": 256,
}


def test_a_sharded_checkpoint_with_an_index_equals_hf(tmp_path: Path) -> None:
    d = build_family_model(tmp_path / "one", "qwen2_moe", seed=3)
    hf = load_hf(d)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    prompts, max_new = _prompts(5, n=3)
    assert _run(_engine(sharded), prompts, max_new) == hf_greedy(hf, prompts, max_new)


def test_gemma_reads_its_layout() -> None:
    cfg = ModelConfig.from_hf_dict(
        {
            **BASE,
            "architectures": ["Gemma2ForCausalLM"],
            "sliding_window": 8,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": None,
        }
    )
    f = cfg.family
    assert f.sliding_layers == (True, False) and f.window == 8 and f.attn_softcap == 50.0 and f.final_softcap is None
    assert f.activation is Activation.GELU_TANH and f.norm_plus_one and f.embed_scale and not f.plain
    assert cfg.max_context_len == 256  # the window is attention's, it does not cap the context


@pytest.mark.parametrize(
    ("arch", "extra", "field"),
    [
        ("NopeForCausalLM", {}, "unsupported architecture"),
        ("Qwen3ForCausalLM", {"hidden_act": "relu"}, "hidden_act 'relu'"),
        ("Gemma2ForCausalLM", {"hidden_activation": "silu"}, "hidden_activation 'silu'"),
        ("Phi3ForCausalLM", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
        (
            "Phi3ForCausalLM",
            {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
            "short_factor",
        ),
        (
            "Qwen2MoeForCausalLM",
            {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "mlp_only_layers": [1]},
            "mlp_only_layers",
        ),
        ("MixtralForCausalLM", {"num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok"),
        ("Gemma3ForCausalLM", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("Gemma2ForCausalLM", {"layer_types": ["full_attention"]}, "layer_types"),
    ],
)
def test_an_unsupported_setting_fails_naming_the_field(arch: str, extra: dict, field: str) -> None:
    with pytest.raises(ModelLoadError, match=field.replace("(", r"\(")):
        ModelConfig.from_hf_dict({**BASE, "architectures": [arch], **extra})


def test_a_fused_tensor_of_the_wrong_size_fails_naming_it(tmp_path: Path) -> None:
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    d = build_family_model(tmp_path / "phi3", "phi3")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 4}))
    with pytest.raises(ModelLoadError, match=r"safetensors: unexpected tensor 'model.layers.0.self_attn.qkv_proj"):
        LLMEngine(EngineConfig(model=str(d), dtype="float32"))
