"""Import a GGUF file (llama.cpp's format) as a Hugging Face-format model directory.

The engine and transformers (the tests' oracle) both load HF directories, so a GGUF is converted
once: weights dequantized to fp32 safetensors, metadata to ``config.json``, and the vocabulary to a
``tokenizer.json``. The blocks of the quantized types the CPU decode kernel multiplies directly
(Q4_1, Q8_0: engine/native/quant_linear.c) are also kept as they were stored, in ``BLOCKS_FILE``.
Everything mirrors transformers' own GGUF loader (integrations/ggml.py,
integrations/gguf/gguf_tokenizer_mapping.py, modeling_gguf_pytorch_utils.py) so that our directory
yields the same tensors and token ids as ``from_pretrained(..., gguf_file=...)``; it is
re-implemented here because transformers is only a test dependency. Each architecture's names,
metadata and transforms are in engine/model/gguf_families.py (with where it reads metadata that
transformers ignores).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.model.gguf_families import ARCHS, EXPERT_LEAVES, ROPE_TENSORS, GGUFArch, family_config, refuse_unloadable
from engine.model.gguf_rope import rope_scaling
from engine.model.gguf_tokenizer import tokenizer_files
from engine.model.weights import BLOCKS_FILE, SINGLE_FILE, atomic_model_dir, write_safetensors
from engine.native.quant_linear import GGML_TYPES

ARCHITECTURES = {arch: spec.hf_architecture for arch, spec in ARCHS.items()}

# The imported directory's format: part of the cache key (engine/model/registry.py), so a change in
# what an import writes is not hidden by an older cached import. 2: Llama 3's rope_freqs as rope_scaling.
IMPORT_FORMAT = 2
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# attn_rot_embd is llama.cpp's own; the rope tensors become config.json's rope_scaling.
_IGNORED = re.compile(r"^blk\.\d+\.attn_rot_embd\.weight$")


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
    tensors = {t.name: t for t in reader.tensors}
    refuse_unloadable(arch, set(tensors), meta.get(f"{arch}.expert_count"), str(gguf_path))
    config = _hf_config(meta, arch, tensors)
    plan = _tensor_plan(reader, gguf_path, ARCHS[arch], config)
    tokenizer, tokenizer_config = tokenizer_files(meta, config)

    with atomic_model_dir(Path(out_dir)) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        ids = ("bos_token_id", "eos_token_id", "pad_token_id")
        generation = {k: config[k] for k in ids if config.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
        say(f"dequantizing {len(plan)} tensors from {gguf_path.name}")
        specs = [(e.hf_name, torch.float32, e.shape) for e in plan]
        write_safetensors(tmp / SINGLE_FILE, specs, _dequantized(plan, gguf_path, say), metadata={"format": "pt"})
        # (an expert's rows are a slice of a stacked tensor's blocks: experts keep only fp32 weights)
        kept = [
            (e, *part)
            for e in plan
            if e.tensor.tensor_type.name in GGML_TYPES and len(e.shape) == 2 and e.expert is None
            for part in _block_parts(e, config)
        ]
        block_specs = [
            (name, torch.uint8, (stop - start, e.tensor.data.nbytes // e.shape[0])) for e, name, start, stop in kept
        ]
        types = json.dumps({name: e.tensor.tensor_type.name for e, name, _, _ in kept})
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
        "model_type": ARCHS[arch].model_type,
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
    elif key("attention.key_length") is not None:  # Qwen3: a head size apart from hidden / heads
        config["head_dim"] = int(key("attention.key_length"))
    if arch.startswith("qwen"):
        config["use_sliding_window"] = False
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
    return family_config(arch, lambda name: key(name), config, tensors, str(meta.path))


class _Entry(NamedTuple):
    """One HF tensor to write, and how it comes from its GGUF tensor."""

    tensor: Any  # the GGUF tensor
    hf_name: str
    shape: tuple[int, ...]  # the HF tensor's
    heads: int | None = None  # Q/K rows to un-permute over this many heads
    expert: int | None = None  # this expert's slice of a stacked (experts, rows, cols) tensor
    offset: float = 0.0  # added to every value (Gemma's norms)


_Plan = list[_Entry]


def _tensor_plan(reader: Any, path: Path, spec: GGUFArch, config: dict[str, Any]) -> _Plan:
    """Every HF tensor to write, in file order (a stacked tensor's experts together)."""
    plan = []
    names = dict(spec.layer_names)
    for t in reader.tensors:
        if _IGNORED.match(t.name) or t.name in ROPE_TENSORS:
            continue
        base, _, suffix = t.name.rpartition(".")
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
        leaf = m.group(2) if m else ""
        if suffix not in ("weight", "bias") or (m is None and base not in _GLOBAL_NAMES) or (m and leaf not in names):
            raise ModelLoadError(f"{path}: unexpected tensor {t.name!r} for architecture {config['model_type']!r}")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost-first
        offset = spec.norm_offset if base.endswith("norm") else 0.0
        if m is None:
            plan.append(_Entry(t, f"{_GLOBAL_NAMES[base]}.{suffix}", shape, offset=offset))
            continue
        hf_base = f"model.layers.{m.group(1)}.{names[leaf]}"
        if leaf in EXPERT_LEAVES:
            plan.extend(_Entry(t, f"{hf_base.format(e=e)}.{suffix}", shape[1:], expert=e) for e in range(shape[0]))
            continue
        if leaf == "ffn_gate_inp_shexp" and len(shape) == 1:
            shape = (1, shape[0])  # llama.cpp stores the shared expert's gate as a vector
        heads = None
        if spec.permute_qk and leaf == "attn_q":
            heads = config["num_attention_heads"]
        elif spec.permute_qk and leaf == "attn_k":
            heads = config["num_key_value_heads"]
        plan.append(_Entry(t, f"{hf_base}.{suffix}", shape, heads, offset=offset))
    present = {e.tensor.name for e in plan}
    required = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{leaf}.weight" for i in range(config["num_hidden_layers"]) for leaf in spec.required
    ]
    missing = [_hf_name(name, names) for name in required if name not in present]
    if missing:
        raise ModelLoadError(f"{path}: incomplete GGUF, missing tensor(s) for {', '.join(missing[:5])}")
    experts = config.get("num_experts")
    stacked = {e.tensor.name: e.tensor.shape for e in plan if e.expert is not None}
    wrong = [name for name, shape in stacked.items() if int(shape[-1]) != experts]
    if wrong:
        raise ModelLoadError(f"{path}: tensor {wrong[0]!r} does not stack expert_count ({experts}) experts")
    return plan


def _hf_name(gguf_name: str, names: dict[str, str]) -> str:
    """The HF name a (missing) GGUF tensor stands for, for messages."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    _, layer, leaf = base.split(".", 2)
    return f"model.layers.{layer}.{names[leaf].format(e='*')}.{suffix}"


def _dequantized(plan: _Plan, path: Path, say: Callable[[str], None]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield fp32 tensors one at a time (dequantized, Q/K rows un-permuted)."""
    from gguf.quants import dequantize

    stacked: tuple[str, np.ndarray] | None = None  # the stacked expert tensor being sliced
    for n, e in enumerate(plan):
        t = e.tensor
        if stacked is not None and stacked[0] == t.name:
            weights = stacked[1]
        else:
            try:
                weights = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            except NotImplementedError:
                raise ModelLoadError(
                    f"{path}: tensor {t.name!r} uses unsupported GGML type {t.tensor_type.name}"
                ) from None
            stacked = (t.name, weights) if e.expert is not None else None
        if e.expert is not None:
            weights = weights[e.expert]
        weights = weights.reshape(e.shape)
        if e.offset:
            weights = weights + np.float32(e.offset)  # a new array, as transformers computes it
        elif not weights.flags.writeable:  # F32 tensors come back as views of the read-only memmap
            weights = weights.copy()
        if e.heads is not None:
            weights = reverse_permute(weights, e.heads)
        if n % 32 == 0:
            say(f"tensor {n + 1}/{len(plan)}: {t.name} ({t.tensor_type.name})")
        yield e.hf_name, torch.from_numpy(np.ascontiguousarray(weights))


def _block_parts(e: _Entry, config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, first row, end row) of each weight the engine multiplies from ``e``'s blocks: Phi-3's
    fused tensors as the q/k/v and gate/up weights they hold (row ranges, as the loader splits the
    fp32 ones), anything else whole."""
    rows = e.shape[0]
    if e.hf_name.endswith("self_attn.qkv_proj.weight"):
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
        if rows == q + 2 * kv:
            stem = e.hf_name.removesuffix("qkv_proj.weight")
            return [
                (stem + "q_proj.weight", 0, q),
                (stem + "k_proj.weight", q, q + kv),
                (stem + "v_proj.weight", q + kv, rows),
            ]
    if e.hf_name.endswith("mlp.gate_up_proj.weight") and rows % 2 == 0:
        stem = e.hf_name.removesuffix("gate_up_proj.weight")
        return [(stem + "gate_proj.weight", 0, rows // 2), (stem + "up_proj.weight", rows // 2, rows)]
    return [(e.hf_name, 0, rows)]


def _blocks(kept: list[tuple[_Entry, str, int, int]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield each kept weight's blocks as stored, one row of blocks per output feature (Q/K rows
    un-permuted like the fp32 weights: whole rows move, so the blocks stay intact)."""
    for e, name, start, stop in kept:
        rows = np.asarray(e.tensor.data).reshape(e.shape[0], -1)
        if e.heads is not None:
            rows = reverse_permute(rows, e.heads)
        yield name, torch.from_numpy(np.array(rows[start:stop], order="C"))  # a copy: the memmap is read-only


def reverse_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its convert_hf_to_gguf ``permute``).

    llama.cpp interleaves the two rotary halves of each head ((x0, x_half, x1, ...) row order) for
    its GPT-J-style rope; HF's rotate_half rope wants each head's halves contiguous again.
    """
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)
