"""Which heads, rows and vocabulary a tensor-parallel rank holds, and the sizes refused."""

import pytest

from engine.config import EngineConfig
from engine.parallel.layout import ShardLayout, check_tensor_parallel


def _layout(rank, size, heads=8, kv_heads=2, head_dim=4, inter=160, vocab=10):
    return ShardLayout(rank, size, heads, kv_heads, head_dim, inter, vocab)


def test_a_size_that_does_not_divide_the_heads_is_refused_naming_both_numbers():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 does not divide the model's 9 attention heads"):
        check_tensor_parallel(2, 9, 3, 1536)
    with pytest.raises(ValueError, match=r"=3 neither divides the model's 2 KV heads"):
        check_tensor_parallel(3, 6, 2, 6)
    with pytest.raises(ValueError, match=r"=2 does not divide the model's intermediate size 5"):
        check_tensor_parallel(2, 8, 2, 5)
    check_tensor_parallel(3, 9, 3, 1536)  # SmolLM2-135M at TP 3


def test_the_engine_config_refuses_a_size_that_is_not_a_positive_integer():
    for bad in (0, -1, 1.5, True, 65):
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            EngineConfig(tensor_parallel_size=bad)  # type: ignore[arg-type]  # 1.5 and True on purpose
    assert EngineConfig(tensor_parallel_size=4).tensor_parallel_size == 4


def test_kv_heads_split_where_the_size_divides_them():
    got = [_layout(r, 2) for r in range(2)]
    assert [(s.heads, s.kv_heads, s.kv_head_range()) for s in got] == [(4, 1, (0, 1)), (4, 1, (1, 2))]
    assert [s.head_rows() for s in got] == [(0, 16), (16, 32)]
    assert [s.kv_rows() for s in got] == [(0, 4), (4, 8)]


def test_kv_heads_replicated_where_the_size_exceeds_them():
    """8 query heads, 2 KV heads, TP 4: ranks 0-1 hold KV head 0 (query heads 0-3), ranks 2-3 KV head 1."""
    got = [_layout(r, 4) for r in range(4)]
    assert all(s.replicated_kv and s.kv_heads == 1 for s in got)
    assert [s.first_kv_head for s in got] == [0, 0, 1, 1]
    group = 8 // 2
    for s in got:  # a rank's query heads all attend with the KV head it holds
        lo, hi = s.head_rows()
        assert {h // group for h in range(lo // 4, hi // 4)} == {s.first_kv_head}


def test_slices_column_and_row_parallel_and_the_vocabulary_in_ranges():
    s = _layout(1, 2)
    assert s.slice_for("model.layers.0.self_attn.q_proj.weight") == (0, 16, 32)
    assert s.slice_for("model.layers.0.self_attn.v_proj.bias") == (0, 4, 8)
    assert s.slice_for("model.layers.0.self_attn.o_proj.weight") == (1, 16, 32)
    assert s.slice_for("model.layers.3.mlp.up_proj.weight") == (0, 80, 160)
    assert s.slice_for("model.layers.3.mlp.down_proj.weight") == (1, 80, 160)
    assert s.slice_for("lm_head.weight") == (0, 5, 10)
    assert s.slice_for("model.layers.0.input_layernorm.weight") is None
    # A vocabulary the size does not divide: the last range is shorter.
    assert [_layout(r, 4, vocab=10).vocab_range() for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert s.shard_shape("model.embed_tokens.weight", (10, 64)) == (5, 64)
