"""GGUF import: tensors and config equal what transformers builds from the same GGUF; synthetic
GGUFs round-trip exactly; broken or unsupported files fail with the file named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig
from engine.model.gguf_import import import_gguf, reverse_permute
from engine.model.registry import default_gguf_path
from engine.model.tokenizer import Tokenizer
from engine.model.weights import iter_safetensors, read_ggml_blocks
from tests.engine.model.conftest import llama_cpp_permute, write_gguf

CONFIG_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "vocab_size",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)


def _hf_rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 0.0)))


@pytest.mark.slow
def test_default_model_equals_transformers(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    gguf = default_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    state = hf.state_dict()
    seen = set()
    for name, tensor, _ in iter_safetensors(default_model_dir):
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == state[name].shape, name
        assert torch.equal(tensor, state[name]), name
        seen.add(name)
    # tied embeddings: the only tensor transformers has that the file does not carry
    assert set(state) - seen == {"lm_head.weight"}
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])

    ours = json.loads((default_model_dir / "config.json").read_text())
    for field in CONFIG_FIELDS:
        assert ours[field] == getattr(hf.config, field), field
    assert ours["rope_theta"] == _hf_rope_theta(hf.config) == 100000.0
    assert ours["head_dim"] == hf.config.head_dim == 64
    cfg = ModelConfig.from_file(default_model_dir / "config.json")
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (
        "LlamaForCausalLM",
        30,
        3,
        True,
    )
    assert cfg.eos_token_ids == (2,) and cfg.max_context_len == 8192


@pytest.mark.slow
def test_default_model_files(default_model_dir: Path) -> None:
    names = sorted(p.name for p in default_model_dir.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "ggml-blocks.safetensors",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    tok_cfg = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["add_bos_token"] is False and tok_cfg["eos_token"] == "<|im_end|>"
    assert "<|im_start|>assistant" in tok_cfg["chat_template"]
    assert json.loads((default_model_dir / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.mark.slow
def test_default_model_blocks_dequantize_to_its_weights(default_model_dir: Path) -> None:
    """Every kept block tensor (Q4_1 projections, the Q8_0 embedding) is its fp32 weight, exactly,
    Q/K rows un-permuted alike; the norms (F32 in the file) have no blocks."""
    from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight

    kernel = NativeQuantLinear.load()
    if kernel is None:
        pytest.skip("the quantized kernel needs AVX-512 and F16C")
    blocks = read_ggml_blocks(default_model_dir)
    weights = {name: t for name, t, _ in iter_safetensors(default_model_dir)}
    assert len(blocks) == 30 * 7 + 1 and blocks["model.embed_tokens.weight"][1] == "Q8_0"
    assert {qtype for name, (_, qtype) in blocks.items() if "layers" in name} == {"Q4_1"}
    for name, (b, qtype) in blocks.items():
        if name.startswith(("model.layers.0.", "model.layers.29.", "model.embed")):
            assert torch.equal(kernel.dequantize(QuantizedWeight(b, qtype)), weights[name]), name


def test_reverse_permute_inverts_llama_cpp() -> None:
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3, 6):
        assert np.array_equal(reverse_permute(llama_cpp_permute(w, heads), heads), w)


def test_tiny_gguf_roundtrip(tiny_gguf: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """HF -> (llama.cpp-style) GGUF -> import gives back the original weights and tokenizer."""
    messages: list[str] = []
    out = import_gguf(tiny_gguf, tmp_path / "imported", progress=messages.append)
    assert messages and "imported" in messages[-1]
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    imported = {name: t.numpy() for name, t, _ in iter_safetensors(out)}
    assert set(imported) == set(original)
    for name, value in original.items():
        if name in ("model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"):
            np.testing.assert_allclose(imported[name], value, atol=2e-3)  # stored as Q8_0
        else:
            assert np.array_equal(imported[name], value), name
    cfg = json.loads((out / "config.json").read_text())
    ref = json.loads((tiny_model_dir / "config.json").read_text())
    for field in (*CONFIG_FIELDS, "head_dim", "rope_theta"):
        assert cfg[field] == pytest.approx(ref[field]), field
    ours, orig = Tokenizer.from_dir(out), Tokenizer.from_dir(tiny_model_dir)
    for text in ("Hello world 123", "日本語 😀", " <s>x</s> ", "def f(x):\n    return x"):
        assert ours.encode(text) == orig.encode(text), text
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi"


@pytest.mark.slow
def test_qwen2_gguf_equals_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A Qwen2 GGUF (q/k/v biases, no Q/K permutation, qwen2 pre-tokenizer) matches transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = {**json.loads((tiny_model_dir / "config.json").read_text()), "rope_theta": 1e6}
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    rng = np.random.default_rng(0)
    tensors = {k: v for k, v in base.items() if k != "lm_head.weight"}  # tied embeddings
    for i in range(config["num_hidden_layers"]):
        for proj, size in (("q", 256), ("k", 128), ("v", 128)):
            tensors[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = rng.normal(0, 0.02, size).astype(np.float32)
    path = write_gguf(
        tmp_path / "tiny-qwen2.gguf",
        "qwen2",
        config,
        tensors,
        tiny_model_dir / "tokenizer.json",
        pre="qwen2",
        q8_names={"model.layers.2.mlp.gate_proj.weight"},
    )
    out = import_gguf(path, tmp_path / "imported")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    state = hf.state_dict()
    ours = dict((name, t) for name, t, _ in iter_safetensors(out))
    assert set(state) - set(ours) == {"lm_head.weight"}
    for name, tensor in ours.items():
        assert torch.equal(tensor, state[name]), name
    cfg = ModelConfig.from_file(out / "config.json")
    assert cfg.architecture == "Qwen2ForCausalLM" and cfg.attention_bias and cfg.tie_word_embeddings
    assert cfg.rope_theta == _hf_rope_theta(hf.config) == 1e6
    hf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    tok = Tokenizer.from_dir(out)
    for text in ("Hello world 12345", "don't  stop\n\n  日本語😀", "x1y22z333"):
        assert tok.encode(text) == hf_tok(text)["input_ids"], text


@pytest.mark.slow
def test_sentencepiece_gguf_tokenizer_equals_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A Llama-2-style GGUF vocabulary (sentencepiece BPE, merges rebuilt from scores, byte fallback)."""
    from transformers import AutoTokenizer

    config = json.loads((tiny_model_dir / "config.json").read_text())
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    path = write_gguf(
        tmp_path / "spm.gguf", "llama", config, tensors, tiny_model_dir / "tokenizer.json", sentencepiece=True
    )
    out = import_gguf(path, tmp_path / "imported")
    hf = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    hf_dir = AutoTokenizer.from_pretrained(out)
    ours = Tokenizer.from_dir(out)
    texts = ["Hello world", " leading", "a  b\n\n c", "日本語 😀 ok", "<|user|>hi<|assistant|>yo</s>", "", " "]
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"] == hf_dir(text)["input_ids"], text
        assert ids[0] == 1  # add_bos_token defaults on for sentencepiece files
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    byte_ids = ours.encode("\u2603", add_special_tokens=False)  # not in the vocabulary: byte fallback
    assert [ours.id_to_token(i) for i in byte_ids][-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    assert ours.decode(byte_ids) == "\u2603"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope.gguf: GGUF file not found"):
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def test_corrupt_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOT A GGUF FILE" * 100)
    with pytest.raises(ModelLoadError, match=r"bad.gguf: not a valid GGUF file"):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_file(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"cut.gguf: (truncated|not a valid)"):
        import_gguf(cut, tmp_path / "out")
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(tiny_gguf.read_bytes()[:64])
    with pytest.raises(ModelLoadError, match=r"header.gguf"):
        import_gguf(header_only, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"phi.gguf: unsupported GGUF architecture 'phi2'"):
        import_gguf(path, tmp_path / "out")


def test_missing_tensor(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    del tensors["model.layers.3.mlp.down_proj.weight"]
    path = write_gguf(tmp_path / "holey.gguf", "llama", config, tensors, tiny_model_dir / "tokenizer.json")
    with pytest.raises(ModelLoadError, match=r"holey.gguf: incomplete GGUF.*model\.layers\.3\.mlp\.down_proj"):
        import_gguf(path, tmp_path / "out")


def test_qwen3_gguf_equals_transformers(tmp_path: Path) -> None:
    """A Qwen3 GGUF (per-head q/k norms, a head size apart from hidden / heads, tied embeddings)
    imports to transformers' own tensors from it and generates what transformers generates."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.sampling_params import SamplingParams
    from tests.engine.hf_oracle import hf_greedy, load_hf
    from tests.engine.model.family_oracle import build_family_model
    from tests.engine.test_golden_tiny import _engine

    src = build_family_model(tmp_path / "qwen3", "qwen3", seed=1, chat=True)
    config = json.loads((src / "config.json").read_text())
    config["rope_theta"] = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k != "lm_head.weight"}
    path = write_gguf(
        tmp_path / "tiny-qwen3.gguf", "qwen3", config, tensors, src / "tokenizer.json", pre="qwen2", chat_template=None
    )
    out = import_gguf(path, tmp_path / "imported")
    # (transformers' GGUF config mapping has no head size for qwen3: it assumes the real models' 128)
    hf_config = AutoConfig.from_pretrained(src)
    state = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, config=hf_config, dtype=torch.float32
    ).state_dict()
    ours = dict((name, t) for name, t, _ in iter_safetensors(out))
    assert set(state) - set(ours) == {"lm_head.weight"}
    for name, tensor in ours.items():
        assert torch.equal(tensor, state[name]), name
    cfg = ModelConfig.from_file(out / "config.json")
    assert cfg.architecture == "Qwen3ForCausalLM" and cfg.family.qk_norm and cfg.head_dim == 16
    prompts = [list(range(3, 40)), list(range(100, 117))]
    got = [o.token_ids for o in _engine(out).generate(prompts, [SamplingParams(max_tokens=10, ignore_eos=True)] * 2)]
    assert got == hf_greedy(load_hf(src), prompts, [10, 10])
