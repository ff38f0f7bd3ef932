"""Rope scaling in GGUF files (engine/model/gguf_rope.py): Llama 3's scaling lives only in the
``rope_freqs.weight`` tensor (per-frequency divisors, as llama.cpp's converter writes them); the
import rebuilds transformers' ``llama3`` parameters from it, and other scaling types are refused,
never silently dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.numpy import load_file

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ModelLoadError
from engine.model.gguf_rope import llama3_from_divisors
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import hf_greedy
from tests.engine.model.conftest import write_gguf


def converter_divisors(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> list[float]:
    """llama.cpp's convert_hf_to_gguf.py for Llama 3 (generate_extra_tensors), written out again here."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


@pytest.mark.parametrize("head_dim,factor", [(64, 8.0), (128, 8.0), (64, 32.0), (128, 32.0)])
def test_the_published_llama3_parameters_come_back(head_dim: int, factor: float) -> None:
    """Llama 3.1 (factor 8) and 3.2 (factor 32): original context 8192, low/high factors 1 and 4."""
    divisors = converter_divisors(500000.0, head_dim, factor, 1.0, 4.0, 8192)
    got = llama3_from_divisors(divisors, 500000.0, head_dim, "x.gguf")
    assert got is not None
    assert got["rope_type"] == "llama3" and got["factor"] == factor
    assert got["original_max_position_embeddings"] == 8192
    assert got["low_freq_factor"] == pytest.approx(1.0, rel=1e-6)
    assert got["high_freq_factor"] == pytest.approx(4.0, rel=1e-6)


def test_no_scaling_and_divisors_that_are_not_llama3() -> None:
    assert llama3_from_divisors([1.0] * 32, 500000.0, 64, "x.gguf") is None
    with pytest.raises(ModelLoadError, match=r"rope_freqs.weight .* not Llama 3's"):
        llama3_from_divisors([1.0, 3.0, 1.0, 3.0] * 8, 500000.0, 64, "x.gguf")
    with pytest.raises(ModelLoadError, match="has 3 values, expected 32"):
        llama3_from_divisors([1.0, 2.0, 3.0], 500000.0, 64, "x.gguf")


def _tiny_llama3(out: Path, tokenizer_vocab: int) -> dict:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=tokenizer_vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        initializer_range=0.3,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out, safe_serialization=True)
    return {**json.loads((out / "config.json").read_text()), "rope_theta": 500000.0}


def test_a_llama3_gguf_runs_with_its_rope_scaling_as_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before, rope_freqs was dropped: plain RoPE, other tokens from the first one."""
    from engine.model.gguf_import import import_gguf
    from tests.engine.hf_oracle import load_hf

    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    config = _tiny_llama3(tmp_path / "hf", vocab)
    tensors = {k: v for k, v in load_file(str(tmp_path / "hf" / "model.safetensors")).items() if k != "lm_head.weight"}
    path = write_gguf(
        tmp_path / "llama3.gguf",
        "llama",
        config,
        tensors,
        tiny_model_dir / "tokenizer.json",
        rope_freqs=converter_divisors(500000.0, 32, 8.0, 1.0, 4.0, 64),
    )
    imported = import_gguf(path, tmp_path / "imported")
    assert json.loads((imported / "config.json").read_text())["rope_scaling"]["rope_type"] == "llama3"
    engine = LLMEngine(EngineConfig(model=str(imported), dtype="float32"))
    prompts = [[(7 * i + 3 * n) % (vocab - 10) + 5 for i in range(n)] for n in (8, 40, 120)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, detokenize=False)
    ours = [o.token_ids for o in engine.generate(prompts, params)]
    assert ours == hf_greedy(load_hf(tmp_path / "hf"), prompts, [12] * 3)


def test_a_gguf_naming_another_rope_scaling_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    """yarn (or any type but linear) was dropped: the model ran with plain RoPE."""
    from engine.model.gguf_import import import_gguf

    config = {**json.loads((tiny_model_dir / "config.json").read_text()), "rope_theta": 1e6}
    tensors = {k: v for k, v in load_file(str(tiny_model_dir / "model.safetensors")).items()}
    path = write_gguf(
        tmp_path / "yarn.gguf", "llama", config, tensors, tiny_model_dir / "tokenizer.json", rope_scaling_type="yarn"
    )
    with pytest.raises(ModelLoadError, match=r"rope.scaling.type 'yarn' is not supported"):
        import_gguf(path, tmp_path / "out")
