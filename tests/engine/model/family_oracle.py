"""Tiny seeded models of the families ``engine/model/family.py`` describes, each with its distinctive
features switched on (q/k norms, a head_dim apart from hidden/heads, windows shorter than the test
prompts, soft-capping, longrope, shared experts, several experts; Mistral with a window shorter
than its prompts), saved with transformers' own
``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ["qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "qwen3_moe", "mistral"]
# Phi-3's longrope original length: a longer sequence is rotated with its long factors (test_phi3_longrope.py).
PHI3_ORIGINAL_MAX = 128
VOCAB_SIZE = 512


def build_family_model(out_dir: Path, family: str, seed: int = 0, chat: bool = False) -> Path:
    """The seeded model of ``family`` in ``out_dir``; with ``chat``, a tokenizer with the family's real
    chat template beside it (chat_templates.py)."""
    import transformers as t

    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "qwen3":
        cfg = t.Qwen3Config(**common, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=True)
    elif family == "phi3":
        half = 4  # head_dim 8
        cfg = t.Phi3Config(
            **common,
            pad_token_id=0,
            original_max_position_embeddings=PHI3_ORIGINAL_MAX,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.3 * i for i in range(half)],
                "long_factor": [2.0 + 1.5 * i for i in range(half)],
                "original_max_position_embeddings": PHI3_ORIGINAL_MAX,
            },
        )
    elif family == "gemma2":
        # untied: a tied head scaled by sqrt(hidden) only echoes the last token, whatever attention does
        cfg = t.Gemma2Config(
            **common,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=12,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=4.0,
            pad_token_id=0,
            tie_word_embeddings=False,
        )
    elif family == "gemma3":
        cfg = t.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 6},
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=12,
            pad_token_id=0,
            tie_word_embeddings=False,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
        )
    elif family == "mistral":  # a window far shorter than the prompts: no longer a cap on the context
        cfg = t.MistralConfig(**common, rope_theta=1000000.0, sliding_window=16)
    elif family == "mixtral":
        cfg = t.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0)
    elif family == "qwen2_moe":
        cfg = t.Qwen2MoeConfig(
            **common,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            shared_expert_intermediate_size=80,
            norm_topk_prob=False,
        )
    elif family == "qwen3_moe":
        cfg = t.Qwen3MoeConfig(
            **common, head_dim=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48, norm_topk_prob=True
        )
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    cls = t.Gemma3ForCausalLM if family == "gemma3" else t.AutoModelForCausalLM.from_config(cfg).__class__
    model = cls(cfg).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    if chat:
        from tests.engine.model.chat_templates import FAMILY_FORMAT, FORMATS, write_chat_tokenizer

        write_chat_tokenizer(out_dir, FORMATS[FAMILY_FORMAT[family]], vocab_size=VOCAB_SIZE)
    return out_dir
