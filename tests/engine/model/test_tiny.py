"""The tiny model: byte-for-byte deterministic per seed, and a valid HF directory for transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.model.config import ModelConfig
from engine.model.tiny import build_tiny_model
from engine.model.tokenizer import Tokenizer


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = _files(build_tiny_model(tmp_path / "again", seed=0))
    assert again == _files(tiny_model_dir)
    other = _files(build_tiny_model(tmp_path / "seed1", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert other["tokenizer.json"] == again["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_shapes_and_config(tiny_model_dir: Path) -> None:
    cfg = ModelConfig.from_file(tiny_model_dir / "config.json")
    assert (
        cfg.architecture,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
        cfg.max_position_embeddings,
    ) == ("LlamaForCausalLM", 4, 256, 8, 4, 4096, 4096)
    assert not cfg.tie_word_embeddings and cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (128, 256)
    assert torch.equal(weights["model.norm.weight"], torch.ones(256))
    std = weights["model.layers.0.mlp.up_proj.weight"].std().item()
    assert abs(std - 0.02) < 0.001
    assert all(t.dtype == torch.float32 for t in weights.values())
    tok = Tokenizer.from_dir(tiny_model_dir)
    assert tok.vocab_size == 4096 and tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert tok.decode(tok.encode("Hello, world! 日本 😀")) == "Hello, world! 日本 😀"


def test_loads_in_transformers(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = hf_tok.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], add_generation_prompt=True, return_dict=False
    )
    assert list(ids) == Tokenizer.from_dir(tiny_model_dir).encode_chat([{"role": "user", "content": "Hi there"}])
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 4096) and torch.isfinite(logits).all()
    loaded = load_file(str(tiny_model_dir / "model.safetensors"))
    state = model.state_dict()
    assert set(state) == set(loaded) and all(torch.equal(state[k], loaded[k]) for k in loaded)
