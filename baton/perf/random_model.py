"""Random-weight models with published configurations, for GPU measurements (weights do not change
speed): Qwen2.5-0.5B and Llama-3.2-1B, written as Hugging Face directories (config.json and
safetensors, no tokenizer: prompts are token ids). Built with transformers on the device that will
run them, so a 1B model takes seconds, not minutes.

    python -m baton.perf.random_model qwen2.5-0.5b OUT_DIR [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

PUBLISHED = {
    "qwen2.5-0.5b": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=151643,
        eos_token_id=151643,
    ),
    "llama-3.2-1b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=128000,
        eos_token_id=128001,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}


def build_random_model(
    name: str, out_dir: Path, *, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0, **overrides
) -> Path:
    """Write ``name``'s configuration with seeded random weights to ``out_dir``; ``overrides``
    replace configuration fields (the tests shrink the model with them)."""
    import transformers

    if name not in PUBLISHED:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(PUBLISHED)}")
    fields = {**PUBLISHED[name], **overrides}
    kwargs = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    qwen = fields["model_type"] == "qwen2"
    cfg = transformers.Qwen2Config(**kwargs) if qwen else transformers.LlamaConfig(**kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        untrained = (
            transformers.Qwen2ForCausalLM(cfg)
            if isinstance(cfg, transformers.Qwen2Config)
            else transformers.LlamaForCausalLM(cfg)
        )
        model = untrained.to(getattr(torch, dtype)).eval()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(PUBLISHED))
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args(argv)
    print(build_random_model(a.name, a.out_dir, device=a.device, dtype=a.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
