"""Fixtures for the model-loading tests: the tiny model and small synthetic GGUF files.

The synthetic GGUFs are written the way llama.cpp's converter writes them (Q/K rows permuted for
llama, names renamed, vocabulary as metadata) so the importer can be checked against a known
source without a multi-megabyte download.
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

_HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",  # Qwen3
    "self_attn.k_norm": "attn_k_norm",
}


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a llama-architecture GGUF (F32, a few tensors Q8_0)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    q8 = {"model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"}
    return write_gguf(path, "llama", config, tensors, tiny_model_dir / "tokenizer.json", q8_names=q8)


def gguf_name(hf_name: str) -> str:
    base, _, suffix = hf_name.rpartition(".")
    globals_ = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if base in globals_:
        return f"{globals_[base]}.{suffix}"
    _, _, layer, module = base.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF[module]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's Q/K ``permute`` (the transform the importer undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path,
    arch: str,
    config: dict,
    tensors: dict[str, np.ndarray],
    tokenizer_json: Path,
    *,
    q8_names: AbstractSet[str] = frozenset(),
    pre: str = "gpt-2",
    chat_template: str | None = "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    sentencepiece: bool = False,
    rope_freqs: list[float] | None = None,
    rope_scaling_type: str | None = None,
) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic {arch}")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    if arch == "llama":
        w.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    elif config.get("head_dim"):  # what llama.cpp's converter writes for Qwen3's head size
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    if sentencepiece:
        tokens, types, scores = sentencepiece_vocab(tokenizer_json)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_unk_token_id(0)
    else:
        tok = json.loads(tokenizer_json.read_text())
        vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
        special = {t["content"] for t in tok["added_tokens"] if t["special"]}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list([t for t, _ in vocab])
        w.add_token_types([3 if t in special else 1 for t, _ in vocab])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
        w.add_add_bos_token(True)
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    if chat_template:
        w.add_chat_template(chat_template)
    if rope_scaling_type is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling_type))
        w.add_rope_scaling_factor(4.0)
    if rope_freqs is not None:  # what llama.cpp's converter writes for Llama 3's rope scaling
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value, dtype=np.float32)
        if arch == "llama" and ".q_proj." in name:
            arr = llama_cpp_permute(arr, config["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in name:
            arr = llama_cpp_permute(arr, config["num_key_value_heads"])
        if name in q8_names:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gguf_name(name), q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sentencepiece_vocab(tokenizer_json: Path) -> tuple[list[str], list[int], list[float]]:
    """A Llama-2-style sentencepiece vocabulary (byte-fallback tokens, "\u2581" for spaces, scores
    instead of merges) made from a byte-level BPE vocabulary's decodable pieces."""
    from engine.model.gguf_tokenizer import _bytes_to_unicode

    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, byte
    seen = set(tokens)
    vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        try:
            piece = bytes(byte_of[c] for c in token).decode("utf-8").replace(" ", "\u2581")
        except (KeyError, UnicodeDecodeError):
            continue
        if piece and piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
    tokens += ["<|user|>", "<|assistant|>"]
    types += [4, 3]  # user-defined, control
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, types, scores
