"""GGUF import of the families transformers itself loads from GGUF (Gemma 2, Gemma 3, Phi-3, Qwen2-MoE,
Qwen3-MoE): a tiny random model, written the way llama.cpp's converter writes it (its tensor names,
Gemma's norms stored as 1 + w, stacked expert tensors, Phi-3's fused tensors and longrope factors),
imports to a directory that transformers loads to exactly the model it loads from the GGUF, and
Baton's greedy output on it equals transformers' on the GGUF, token for token. Gemma's and Phi-3's
sentencepiece vocabularies tokenize as transformers builds them; what transformers cannot load from
GGUF (a Mixtral, other architectures) is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig
from engine.model.gguf_import import import_gguf
from engine.sampling_params import SamplingParams

VOCAB = 512
PROMPTS = [list(range(3, 40)), list(range(100, 117))]  # longer than the Gemma windows
MAX_NEW = 6
# Phi-3's fused tensors quantized: their blocks are kept split as the q/k/v and gate/up weights.
Q8_0 = {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"}
# Which transformers config fields its GGUF loader does not read (it takes its class defaults, right
# for the released models but not for a tiny one) and the oracle is therefore given.
_NOT_READ_BY_TRANSFORMERS = {
    "gemma3": ("rope_parameters",),
    "phi3": ("rope_parameters", "original_max_position_embeddings"),
    "qwen2moe": ("moe_intermediate_size", "shared_expert_intermediate_size"),
    "qwen3moe": ("moe_intermediate_size",),
}


def _hf_config(arch: str) -> Any:
    """A tiny config with the family's features on, as llama.cpp's format can express them (the
    query scale is head_dim ** -0.5, Gemma 2's soft-caps those a GGUF names)."""
    import transformers as t

    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "gemma2":  # transformers' GGUF defaults: query scalar 256, soft-caps 50 and 30
        return t.Gemma2Config(
            **{**common, "num_attention_heads": 2, "num_key_value_heads": 1},
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=8,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
        )
    if arch == "gemma3":
        return t.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1},
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=8,
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
        )
    if arch == "phi3":  # head_dim 16
        return t.Phi3Config(
            **common,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.3 * i for i in range(8)],
                "long_factor": [2.0 + 1.5 * i for i in range(8)],
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "qwen2moe":
        return t.Qwen2MoeConfig(
            **common,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            shared_expert_intermediate_size=80,
            norm_topk_prob=False,
        )
    assert arch == "qwen3moe"
    return t.Qwen3MoeConfig(
        **common, head_dim=32, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48, norm_topk_prob=True
    )


def _write_gguf(path: Path, arch: str, cfg: Any, tensors: dict[str, np.ndarray], tokenizer_json: Path) -> Path:
    """``tensors`` (an HF checkpoint) as llama.cpp's convert_hf_to_gguf.py writes ``arch``."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(VOCAB)
    rope = cfg.rope_parameters
    w.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    if arch in ("gemma2", "gemma3", "qwen3moe"):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma3":  # the global layers' scaling (Gemma 3 4B and up: linear, factor 8)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["full_attention"]["factor"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch == "phi3":
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_sliding_window(0)
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    tok = json.loads(tokenizer_json.read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)  # (transformers' Phi-3 default, 32000, is past a tiny vocabulary)
    for name, value in _gguf_tensors(arch, cfg, tensors).items():
        if name in Q8_0:
            q = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:  # F16 for the stacked experts: dequantized on import like any file's
            w.add_tensor(name, value.astype(np.float16) if name.endswith("_exps.weight") else value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_tensors(arch: str, cfg: Any, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF names to GGUF names through gguf's own name map (llama.cpp's converter's), Gemma's norms
    stored as 1 + w, each layer's experts stacked, Qwen2-MoE's shared-expert gate a vector."""
    import gguf

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    out: dict[str, np.ndarray] = {}
    experts: dict[str, list[np.ndarray]] = {}
    for hf_name, value in tensors.items():
        base, _, suffix = hf_name.rpartition(".")
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        value = np.ascontiguousarray(value, dtype=np.float32)
        parts = base.split(".")
        if "experts" in parts:  # model.layers.N.mlp.experts.E.gate_proj
            out_name = f"blk.{parts[2]}.ffn_{parts[-1].split('_')[0]}_exps.{suffix}"
            experts.setdefault(out_name, []).append(value)
            continue
        name = names.get_name(base)
        assert name is not None, hf_name
        if arch.startswith("gemma") and base.endswith("norm"):
            value = value + np.float32(1.0)
        if name.endswith("ffn_gate_inp_shexp"):
            value = value.reshape(-1)
        out[f"{name}.{suffix}"] = value
    for name, stack in experts.items():  # (experts in file order: 0, 1, ...)
        out[name] = np.stack(stack)
    return out


@pytest.fixture(scope="module", params=["gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One family: its GGUF, the imported directory, and transformers' model from the GGUF."""
    import transformers

    from tests.engine.model.chat_templates import FORMATS, write_chat_tokenizer

    arch = request.param
    tmp = tmp_path_factory.mktemp(arch)
    cfg = _hf_config(arch)
    torch.manual_seed(0)
    cls = transformers.Gemma3ForCausalLM if arch == "gemma3" else transformers.AutoModelForCausalLM
    src = tmp / "src"
    model = cls(cfg) if arch == "gemma3" else cls.from_config(cfg)
    if arch.startswith("gemma"):
        # Gemma's tied head over embeddings scaled by sqrt(hidden) echoes the last token unless the
        # layers' (normed) outputs outweigh the embedding: make the post-norms large.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".post_" in name:
                    p.add_(3.0)
    model.eval().save_pretrained(src)
    write_chat_tokenizer(src, FORMATS["qwen3"], vocab_size=VOCAB)
    tensors = load_file(str(src / "model.safetensors"))
    path = _write_gguf(tmp / f"tiny-{arch}.gguf", arch, cfg, tensors, src / "tokenizer.json")
    out = import_gguf(path, tmp / "imported")
    given = {f: getattr(cfg, f) for f in _NOT_READ_BY_TRANSFORMERS.get(arch, ())}
    hf_cfg = transformers.AutoConfig.from_pretrained(tmp, gguf_file=path.name)
    for name, value in given.items():
        setattr(hf_cfg, name, value)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp, gguf_file=path.name, config=hf_cfg, dtype=torch.float32
    ).eval()
    return {"arch": arch, "out": out, "hf": hf}


def test_imported_directory_is_transformers_model_from_the_gguf(family: dict[str, Any]) -> None:
    """transformers loads the imported directory to the very tensors it loads from the GGUF (norms
    offset, experts unstacked, fused tensors kept), with the same settings."""
    from tests.engine.hf_oracle import load_hf

    ours = load_hf(family["out"])
    theirs: torch.nn.Module = family["hf"]
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert set(mine) == set(ref)
    for name, tensor in ref.items():
        assert torch.equal(mine[name], tensor), name
    fields = ["head_dim", "num_key_value_heads", "sliding_window", "layer_types", "query_pre_attn_scalar"]
    fields += ["attn_logit_softcapping", "final_logit_softcapping", "num_experts", "num_experts_per_tok"]
    fields += ["norm_topk_prob", "moe_intermediate_size", "shared_expert_intermediate_size", "tie_word_embeddings"]
    for field in fields:
        if hasattr(theirs.config, field):
            assert getattr(ours.config, field) == getattr(theirs.config, field), field


def test_greedy_equals_transformers_from_the_gguf(family: dict[str, Any]) -> None:
    from tests.engine.hf_oracle import hf_greedy
    from tests.engine.test_golden_tiny import _engine

    cfg = ModelConfig.from_file(family["out"] / "config.json")
    assert cfg.architecture == type(family["hf"]).__name__
    params = [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, detokenize=False)] * len(PROMPTS)
    got = [o.token_ids for o in _engine(family["out"]).generate(PROMPTS, params)]
    want = hf_greedy(family["hf"], PROMPTS, [MAX_NEW] * len(PROMPTS))
    assert got == want
    assert len({t for out in want for t in out}) > 2  # not a model that repeats one token


@pytest.mark.parametrize("family", ["phi3"], indirect=True)
def test_fused_blocks_are_kept_split(family: dict[str, Any]) -> None:
    """A quantized Phi-3 fused tensor's blocks are kept as the weights the engine multiplies, each
    dequantizing to its imported fp32 weight exactly."""
    import gguf

    from engine.model.weights import iter_safetensors, read_ggml_blocks

    blocks = read_ggml_blocks(family["out"])
    weights = {name: t for name, t, _ in iter_safetensors(family["out"])}
    q, kv, inter = 64, 32, 96  # 4 heads and 2 key/value heads of 16; the intermediate size
    rows = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, q + kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, q + 2 * kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, 2 * inter),
    }
    assert sorted(blocks) == sorted(f"model.layers.0.{p}.weight" for p in rows)
    for part, (whole, start, stop) in rows.items():
        b, qtype = blocks[f"model.layers.0.{part}.weight"]
        assert qtype == "Q8_0"
        dense = torch.from_numpy(gguf.quants.dequantize(b.numpy(), gguf.GGMLQuantizationType.Q8_0))
        assert torch.equal(dense, weights[f"model.layers.0.{whole}.weight"][start:stop]), part


def _stub_gguf(path: Path, arch: str, names: list[str], **meta: int) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_embedding_length(4)
    w.add_head_count(1)
    w.add_block_count(1)
    w.add_feed_forward_length(4)
    w.add_token_list(["a", "b", "c", "d"])
    for key, value in meta.items():
        w.add_uint32(f"{arch}.{key}", value)
    for name in names:
        w.add_tensor(name, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_mixtral_gguf_is_refused(tmp_path: Path) -> None:
    """llama.cpp writes a Mixtral as a llama GGUF with stacked experts; transformers loads it as a dense
    Llama with the experts dropped, so Baton names it instead of importing it."""
    path = _stub_gguf(tmp_path / "mixtral.gguf", "llama", ["token_embd.weight", "blk.0.ffn_gate_exps.weight"])
    with pytest.raises(ModelLoadError, match=r"mixtral.gguf: GGUF architecture 'llama' with mixture-of-experts"):
        import_gguf(path, tmp_path / "out")
    path = _stub_gguf(tmp_path / "mixtral2.gguf", "llama", ["token_embd.weight"], expert_count=8)
    with pytest.raises(ModelLoadError, match=r"\(a Mixtral\) is not supported"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_architecture_transformers_cannot_load_is_refused(tmp_path: Path) -> None:
    path = _stub_gguf(tmp_path / "deepseek.gguf", "deepseek2", ["token_embd.weight"])
    with pytest.raises(
        ModelLoadError, match=r"unsupported GGUF architecture 'deepseek2'; supported: .*gemma3.*qwen3moe"
    ):
        import_gguf(path, tmp_path / "out")


@pytest.mark.parametrize("arch", ["gemma2", "phi3"])
def test_sentencepiece_vocabulary_equals_transformers(arch: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Gemma's and Phi-3's sentencepiece vocabularies tokenize as transformers builds them for the
    architecture (Gemma: no prefix space, space-only tokens, merges in file order; Phi-3: the prefix
    space from a normalizer)."""
    import gguf
    from transformers import AutoTokenizer

    from engine.model.gguf_import import _Metadata
    from engine.model.gguf_tokenizer import tokenizer_files
    from engine.model.tokenizer import Tokenizer
    from tests.engine.model.conftest import sentencepiece_vocab

    tokens, types, scores = sentencepiece_vocab(tiny_model_dir / "tokenizer.json")
    if arch == "gemma2":  # llama.cpp keeps Gemma's space-only tokens as spaces
        tokens, types, scores = tokens + ["  ", "    "], types + [1, 1], scores + [-1e4, -1e4]
    path = tmp_path / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok, tok_cfg = tokenizer_files(_Metadata(gguf.GGUFReader(path), path), {"max_position_embeddings": 64})
    out = tmp_path / "out"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    ours, hf = Tokenizer.from_dir(out), AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["Hello world", " leading", "  two", "a    b\n\n c", "日本語 😀 ok", "<|user|>hi</s>", ""]
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"], text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
