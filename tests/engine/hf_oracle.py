"""Hugging Face transformers as the correctness oracle: tiny seeded models and greedy references."""

from __future__ import annotations

from pathlib import Path

import torch


def build_tiny_hf_model(
    out_dir: Path,
    arch: str = "llama",
    seed: int = 0,
    max_position_embeddings: int = 512,
    initializer_range: float = 0.3,
    num_hidden_layers: int = 3,
) -> Path:
    """A seeded random Llama, Llama 3 (rope scaling), Qwen2 or Mistral saved as a HF directory
    (safetensors). ``max_position_embeddings`` sets the context length Baton serves it at (the
    outputs do not depend on it, except through Llama 3's rope scaling and Mistral's window).
    ``initializer_range``: the weights' scale; the default gives outputs that wander, a smaller one
    outputs that repeat themselves (what n-gram drafts need). ``num_hidden_layers``: fewer make
    a slow path (Triton's interpreter) cheaper; the layers are alike."""
    import transformers

    common = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False)
        cls = transformers.LlamaForCausalLM
    elif arch == "llama3":
        cfg = transformers.LlamaConfig(
            **common,
            rope_theta=500000.0,
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "mistral":  # its window (longer than these prompts) caps the context, as Baton reads it
        cfg = transformers.MistralConfig(**common, rope_theta=1000000.0, sliding_window=256, tie_word_embeddings=False)
        cls = transformers.MistralForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: list[int]) -> list[list[int]]:
    """Greedy generation one prompt at a time (no padding), EOS ignored."""
    outs = []
    with torch.inference_mode():
        for p, n in zip(prompts, max_new_tokens):
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


def load_hf(model_dir: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
