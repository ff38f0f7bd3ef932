"""Packed projections compute the same products as F.linear, and unpack to the weight they packed."""

import pytest
import torch
import torch.nn.functional as F

from engine.model.linear import Linear, can_pack

needs_packing = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="torch without oneDNN")


@needs_packing
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_matches_f_linear_at_every_row_count(rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(160, 96, generator=g)
    b = torch.randn(160, generator=g) if with_bias else None
    proj = Linear(w.clone(), b, pack=True)
    assert proj.packed and proj.out_features == 160
    got = proj(x)
    assert got.shape == (rows, 160)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@needs_packing
def test_a_non_contiguous_input_is_multiplied_correctly():
    x = torch.randn(48, 5).t()  # [5, 48], strided
    w = torch.randn(24, 48)
    torch.testing.assert_close(Linear(w.clone(), pack=True)(x), x @ w.t(), rtol=1e-5, atol=1e-5)


@needs_packing
def test_unpack_restores_the_weight_bit_for_bit():
    w = torch.randn(40, 16)
    proj = Linear(w.clone(), pack=True)
    assert torch.equal(proj.dense_weight(), w)
    proj.unpack()
    assert not proj.packed and torch.equal(proj.weight, w)
    x = torch.randn(3, 16)
    assert torch.equal(proj(x), F.linear(x, w))


def test_dense_is_f_linear_bit_for_bit():
    x, w, b = torch.randn(2, 48), torch.randn(24, 48), torch.randn(24)
    assert torch.equal(Linear(w, b)(x), F.linear(x, w, b))


def test_only_cpu_fp32_packs():
    assert not can_pack(torch.device("cpu"), torch.bfloat16)
    assert not can_pack(torch.device("cuda"), torch.float32)


@needs_packing
def test_the_cpu_model_packs_and_unpacks_every_projection():
    from engine.model.config import ModelConfig
    from engine.model.llama import LlamaModel
    from engine.model.tiny import CONFIG

    model = LlamaModel(ModelConfig.from_hf_dict(CONFIG), torch.device("cpu"), torch.float32, 64)
    assert model.pack
    g = torch.Generator().manual_seed(0)
    model.load_weights((n, torch.randn(*s, generator=g) * 0.02, "test") for n, s in model.expected_shapes().items())
    projections = [model.lm_head, *(p for layer in model.layers for p in layer.projections())]
    assert all(p.packed for p in projections)
    model.set_packed(False)
    assert not any(p.packed for p in projections) and not model.pack
    with pytest.raises(ValueError, match="packed weights need fp32"):
        LlamaModel(ModelConfig.from_hf_dict(CONFIG), torch.device("cpu"), torch.bfloat16, 64).set_packed(True)
