"""Import a GGUF file (llama.cpp's format) as a Hugging Face-format model directory.

The engine and transformers (the tests' oracle) both load HF directories, so a GGUF is converted
once: weights dequantized to fp32 safetensors, metadata to ``config.json``, and the vocabulary to a
``tokenizer.json``. The blocks of the quantized types the CPU decode kernel multiplies directly
(Q4_1, Q8_0: engine/native/quant_linear.c) are also kept as they were stored, in ``BLOCKS_FILE``.
Everything mirrors transformers' own GGUF loader (integrations/ggml.py,
integrations/gguf/gguf_tokenizer_mapping.py, modeling_gguf_pytorch_utils.py) so that our directory
yields the same tensors and token ids as ``from_pretrained(..., gguf_file=...)``; it is
re-implemented here because transformers is only a test dependency.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.model.gguf_rope import rope_scaling
from engine.model.gguf_tokenizer import tokenizer_files
from engine.model.weights import BLOCKS_FILE, SINGLE_FILE, atomic_model_dir, write_safetensors
from engine.native.quant_linear import GGML_TYPES

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor-name leaf -> HF module path (inside model.layers.N for blk.N.*).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Tensors only some architectures have (Qwen3's per-head q/k norms).
_ARCH_LAYER_NAMES = {"qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}}
# The imported directory's format: part of the cache key (engine/model/registry.py), so a change in
# what an import writes is not hidden by an older cached import. 2: Llama 3's rope_freqs as rope_scaling.
IMPORT_FORMAT = 2
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors with no HF weight: rope_freqs becomes config.json's rope_scaling (engine/model/gguf_rope.py),
# attn_rot_embd is llama.cpp's own.
_IGNORED = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_rot_embd\.weight)$")


def import_gguf(gguf_path: Path, out_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Convert ``gguf_path`` into an HF directory at ``out_dir`` (replaced atomically if present)."""
    gguf_path = Path(gguf_path)
    say = progress or (lambda _msg: None)
    reader = _open(gguf_path)
    meta = _Metadata(reader, gguf_path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{gguf_path}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    config = _hf_config(meta, arch, {t.name: t for t in reader.tensors})
    plan = _tensor_plan(reader, gguf_path, arch, config)
    tokenizer, tokenizer_config = tokenizer_files(meta, config)

    with atomic_model_dir(Path(out_dir)) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        ids = ("bos_token_id", "eos_token_id", "pad_token_id")
        generation = {k: config[k] for k in ids if config.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
        say(f"dequantizing {len(plan)} tensors from {gguf_path.name}")
        specs = [(hf_name, torch.float32, shape) for _, hf_name, shape, _ in plan]
        write_safetensors(tmp / SINGLE_FILE, specs, _dequantized(plan, gguf_path, say), metadata={"format": "pt"})
        kept: _Plan = [
            (t, hf_name, shape, heads)
            for t, hf_name, shape, heads in plan
            if t.tensor_type.name in GGML_TYPES and len(shape) == 2
        ]
        block_specs = [(hf_name, torch.uint8, (shape[0], t.data.nbytes // shape[0])) for t, hf_name, shape, _ in kept]
        types = json.dumps({hf_name: t.tensor_type.name for t, hf_name, _, _ in kept})
        write_safetensors(tmp / BLOCKS_FILE, block_specs, _blocks(kept), metadata={"format": "pt", "ggml_types": types})
    say(f"imported {gguf_path.name} into {out_dir}")
    return Path(out_dir)


class _Metadata:
    """Typed access to a GGUF's key/value metadata."""

    def __init__(self, reader: Any, path: Path) -> None:
        self._fields = reader.fields
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:  # noqa: BLE001 - a malformed field (wrong type / bad UTF-8)
            raise ModelLoadError(f"{self.path}: cannot read metadata {key!r} ({e})") from None

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.path}: missing required GGUF metadata {key!r}")
        return value


def _open(path: Path) -> Any:
    """A GGUFReader over ``path``, with every tensor's bytes checked to lie inside the file."""
    import gguf  # deferred: only importing a GGUF needs it

    if not path.is_file():
        raise ModelLoadError(f"{path}: GGUF file not found")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - bad magic, truncated header, unknown value type...
        raise ModelLoadError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ModelLoadError(f"{path}: truncated GGUF file (tensor {t.name!r} extends past the end)")
    return reader


def _hf_config(meta: _Metadata, arch: str, tensors: dict[str, Any]) -> dict[str, Any]:
    """config.json from the GGUF metadata (keys as transformers' GGUF_CONFIG_MAPPING reads them)."""

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError(f"{meta.path}: missing tensor 'token_embd.weight'")
    hidden = int(meta.require(f"{arch}.embedding_length"))
    heads = int(meta.require(f"{arch}.attention.head_count"))
    kv_heads = key("attention.head_count_kv", heads)
    tokens = meta.get("tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(meta.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads if isinstance(kv_heads, int) else max(kv_heads)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "vocab_size": int(key("vocab_size") or len(tokens) or int(embed.shape[-1])),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        # llama/mistral only: rope.dimension_count is the head size (transformers relies on it too).
        config["head_dim"] = int(key("rope.dimension_count") or key("attention.key_length") or hidden // heads)
    else:
        config["use_sliding_window"] = False
        if key("attention.key_length") is not None:  # Qwen3: a head size apart from hidden / heads
            config["head_dim"] = int(key("attention.key_length"))
    freqs = tensors.get("rope_freqs.weight")
    scaling = rope_scaling(
        key("rope.scaling.type"),
        key("rope.scaling.factor"),
        None if freqs is None else freqs.data.reshape(-1).tolist(),
        config["rope_theta"],
        config.get("head_dim") or hidden // heads,
        str(meta.path),
    )
    if scaling is not None:
        config["rope_scaling"] = scaling
    for name, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        value = meta.get(f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[name] = int(value)
    return config


_Plan = list[tuple[Any, str, tuple[int, ...], int | None]]


def _tensor_plan(reader: Any, path: Path, arch: str, config: dict[str, Any]) -> _Plan:
    """(GGUF tensor, HF name, HF shape, heads to un-permute or None) for every tensor to write."""
    plan = []
    for t in reader.tensors:
        if _IGNORED.match(t.name):
            continue
        hf_name = _hf_name(t.name, arch)
        if hf_name is None:
            raise ModelLoadError(f"{path}: unexpected tensor {t.name!r} for architecture {arch!r}")
        heads = None
        if arch == "llama" and re.search(r"\.attn_q\.", t.name):
            heads = config["num_attention_heads"]
        elif arch == "llama" and re.search(r"\.attn_k\.", t.name):
            heads = config["num_key_value_heads"]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost-first
        plan.append((t, hf_name, shape, heads))
    present = {hf for _, hf, _, _ in plan}
    required = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{module}.weight"
        for i in range(config["num_hidden_layers"])
        for module in _LAYER_NAMES.values()
    ]
    missing = [name for name in required if name not in present]
    if missing:
        raise ModelLoadError(f"{path}: incomplete GGUF, missing tensor(s) for {', '.join(missing[:5])}")
    return plan


def _hf_name(gguf_name: str, arch: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    layer_names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.{suffix}"
    return None


def _dequantized(plan: _Plan, path: Path, say: Callable[[str], None]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield fp32 tensors one at a time (dequantized, Q/K rows un-permuted)."""
    from gguf.quants import dequantize

    for n, (t, hf_name, shape, heads) in enumerate(plan):
        try:
            weights = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise ModelLoadError(f"{path}: tensor {t.name!r} uses unsupported GGML type {t.tensor_type.name}") from None
        weights = weights.reshape(shape)
        if not weights.flags.writeable:  # F32 tensors come back as views of the read-only memmap
            weights = weights.copy()
        if heads is not None:
            weights = reverse_permute(weights, heads)
        if n % 32 == 0:
            say(f"tensor {n + 1}/{len(plan)}: {t.name} ({t.tensor_type.name})")
        yield hf_name, torch.from_numpy(np.ascontiguousarray(weights))


def _blocks(kept: _Plan) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield each kept tensor's blocks as stored, one row of blocks per output feature (Q/K rows
    un-permuted like the fp32 weights: whole rows move, so the blocks stay intact)."""
    for t, hf_name, shape, heads in kept:
        rows = np.asarray(t.data).reshape(shape[0], -1)
        if heads is not None:
            rows = reverse_permute(rows, heads)
        yield hf_name, torch.from_numpy(np.array(rows, order="C"))  # a copy: the memmap is read-only


def reverse_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its convert_hf_to_gguf ``permute``).

    llama.cpp interleaves the two rotary halves of each head ((x0, x_half, x1, ...) row order) for
    its GPT-J-style rope; HF's rotate_half rope wants each head's halves contiguous again.
    """
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)
