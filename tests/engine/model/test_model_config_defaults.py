"""Where config.json leaves something out, Baton reads it as transformers does: the stop ids come
from config.json's ``eos_token_id`` when generation_config.json names none, and a Mistral (or a
Qwen2 with ``use_sliding_window``) without ``sliding_window`` has transformers' default window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.model.config import ModelConfig


def _copy(tiny_model_dir: Path, out: Path, **config) -> Path:
    shutil.copytree(tiny_model_dir, out)
    cfg = {**json.loads((out / "config.json").read_text()), **config}
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return out


def test_config_eos_ids_stop_generation_without_a_generation_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Llama 3 lists several eos ids in config.json; without generation_config.json only the
    tokenizer's eos stopped generation, so a model emitting the second one ran to max_tokens."""
    d = _copy(tiny_model_dir, tmp_path / "m", eos_token_id=[2, 1051])
    (d / "generation_config.json").unlink(missing_ok=True)
    engine = LLMEngine(EngineConfig(model=str(d), dtype="float32"))
    assert 1051 in engine.eos_token_ids and 2 in engine.eos_token_ids
    with_gen = _copy(tiny_model_dir, tmp_path / "g", eos_token_id=[2, 1051])
    (with_gen / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert 1051 not in LLMEngine(EngineConfig(model=str(with_gen), dtype="float32")).eos_token_ids  # HF: its own list


def test_a_missing_sliding_window_is_transformers_default() -> None:
    base = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 8192,
    }
    assert ModelConfig.from_hf_dict({**base, "architectures": ["MistralForCausalLM"]}).sliding_window == 4096
    assert (
        ModelConfig.from_hf_dict(
            {**base, "architectures": ["MistralForCausalLM"], "sliding_window": None}
        ).sliding_window
        is None
    )  # explicit null: none
    assert ModelConfig.from_hf_dict({**base, "architectures": ["Qwen2ForCausalLM"]}).sliding_window is None
    assert (
        ModelConfig.from_hf_dict(
            {**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True}
        ).sliding_window
        == 4096
    )
