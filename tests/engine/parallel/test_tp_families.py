"""Tensor parallel for every model family (engine/model/family.py): greedy outputs of a TP-2 engine
equal TP 1 and transformers token for token on each family's tiny seeded model (MoE with shared
experts and uneven routing, q/k norms, Gemma's soft-caps and windows shorter than the prompts,
Phi-3's fused checkpoint tensors, Mistral's window with the blocks behind it given back), batched,
with chunked prefill, prefix caching and preemption in one run; a rank holds half of the projection
and expert weights, the router whole.
"""

import pytest
import torch

from engine.errors import ModelLoadError
from engine.kernels import kernels_for
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.parallel.layout import EvenShare, Pieces, ShardLayout, part_ranges
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import build_family_model
from tests.engine.parallel.test_tp_golden import _engine, _prompts, _run

TP_FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "qwen3", "gemma2", "gemma3", "phi3", "mistral"]


@pytest.fixture(scope="module", params=TP_FAMILIES)
def family(request, tmp_path_factory):
    return build_family_model(tmp_path_factory.mktemp(f"tp-{request.param}"), request.param, seed=1)


def _sharded_numel(engine):
    """Elements of the projections and experts a rank holds (the parts tensor parallelism splits)."""
    total = 0
    for layer in engine.runner.model.layers:
        total += sum(p.weight.numel() for p in layer.projections())
        moe = layer.moe
        if moe is not None:
            parts = (moe.gate_up, moe.down, moe.shared_gate_up, moe.shared_down)
            total += sum(t.numel() for t in parts if t is not None)
    return total


def test_tp2_equals_tp1_and_hf(family):
    prompts, max_new = _prompts(0, n=5)
    want = hf_greedy(load_hf(family), prompts, max_new)
    # Mistral gives back the blocks behind its window as it goes: fewer blocks still preempt.
    blocks = 21 if family.name.startswith("tp-mistral") else 26
    one = _engine(family, 1, num_blocks=blocks)
    assert _run(one, prompts, max_new) == want
    eng = _engine(family, 2, num_blocks=blocks)
    try:
        got = _run(eng, prompts, max_new)
        assert got == want
        assert eng.scheduler.num_preemptions > 0
        assert eng.block_manager.num_prefix_hits > 0
        assert _sharded_numel(eng) * 2 == _sharded_numel(one)
        for layer, whole in zip(eng.runner.model.layers, one.runner.model.layers):
            if layer.moe is not None:  # routed the same on every rank: the router is whole
                assert layer.moe.router.shape == whole.moe.router.shape
    finally:
        eng.close()


def test_an_expert_size_the_group_does_not_divide_is_refused_naming_it():
    hf = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 45,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    cfg = ModelConfig.from_hf_dict(hf)
    shard = ShardLayout(0, 2, 4, 2, cfg.head_dim, 64, 64)
    cpu = torch.device("cpu")
    with pytest.raises(ModelLoadError, match="tensor_parallel_size=2 does not divide the model's shared expert"):
        LlamaModel(cfg, cpu, torch.float32, 64, kernels_for(cpu, torch.float32), shard=shard)


def test_family_tensors_split_by_rank():
    s = ShardLayout(1, 2, num_heads=8, num_kv_heads=2, head_dim=8, intermediate_size=160, vocab_size=512)
    # Phi-3's fused tensors: rank 1's rows of q (64 rows), k and v (16 each); of gate and of up.
    assert s.slice_for("model.layers.0.self_attn.qkv_proj.weight") == Pieces(0, ((32, 64), (72, 80), (88, 96)))
    assert s.shard_shape("model.layers.0.self_attn.qkv_proj.weight", (96, 64)) == (48, 64)
    assert s.slice_for("model.layers.0.mlp.gate_up_proj.weight") == Pieces(0, ((80, 160), (240, 320)))
    # Experts (their own intermediate size, which the layout is not told) split like the dense MLP.
    assert s.shard_shape("model.layers.0.mlp.experts.3.gate_proj.weight", (48, 64)) == (24, 64)
    assert s.slice_for("model.layers.0.mlp.experts.3.down_proj.weight") == EvenShare(1, 1, 2)
    assert part_ranges(EvenShare(1, 1, 2), (64, 48)) == (1, ((24, 48),))
    assert s.shard_shape("model.layers.0.block_sparse_moe.experts.0.w2.weight", (64, 160)) == (64, 80)
    assert s.shard_shape("model.layers.0.block_sparse_moe.experts.0.w3.weight", (160, 64)) == (80, 64)
    assert s.shard_shape("model.layers.0.mlp.shared_expert.up_proj.weight", (80, 64)) == (40, 64)
    whole = (
        "mlp.gate.weight",
        "mlp.shared_expert_gate.weight",
        "block_sparse_moe.gate.weight",
        "self_attn.q_norm.weight",
    )
    assert all(s.slice_for(f"model.layers.0.{name}") is None for name in whole)
    with pytest.raises(ValueError, match="length 47 along dimension 0 cannot be split in 2"):
        part_ranges(EvenShare(0, 0, 2), (47, 64))
