"""The fused layer kernels (engine/native/layer_ops.c) against the torch arithmetic they replace."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.kernels import layer_ops_for
from engine.model.config import ModelConfig
from engine.model.reference_ops import TorchLayerOps
from engine.model.rope import RotaryEmbedding
from engine.native.layer_ops import NativeLayerOps

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def native() -> NativeLayerOps:
    ops = NativeLayerOps.load()
    assert ops is not None, "a C compiler is here, so the kernels must build"
    return ops


def _rope(head_dim: int, theta: float = 10000.0) -> RotaryEmbedding:
    heads = 4
    cfg = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=64,
        hidden_size=heads * head_dim,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=theta,
    )
    return RotaryEmbedding(cfg, 4096, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 256), (300, 960), (2, 17)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_torch_and_updates_the_residual_in_place(native, rows, dim, with_delta):
    gen = torch.Generator().manual_seed(rows * dim)
    h = torch.randn(rows, dim, generator=gen) * 3
    delta = torch.randn(rows, dim, generator=gen) if with_delta else None
    weight = torch.randn(dim, generator=gen)
    h_torch, h_native = h.clone(), h.clone()
    expected = TorchLayerOps.add_rms_norm(h_torch, delta, weight, 1e-5)
    got = native.add_rms_norm(h_native, delta, weight, 1e-5)
    assert torch.equal(h_native, h_torch)  # the residual add is exact
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 4, 32), (14, 2, 64), (8, 2, 128)])
def test_rotate_qkv_is_bit_identical_to_torch(native, heads, kv_heads, head_dim):
    """Compiled without fused multiply-add, the rotation rounds exactly as transformers' does."""
    gen = torch.Generator().manual_seed(head_dim)
    rope = _rope(head_dim)
    qkv = torch.randn(50, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.randint(0, 4096, (50,), generator=gen)
    expected = TorchLayerOps.rotate_qkv(qkv.clone(), positions, rope, heads, kv_heads, head_dim)
    got = native.rotate_qkv(qkv.clone(), positions, rope, heads, kv_heads, head_dim)
    for name, e, g in zip("qkv", expected, got):
        assert g.shape == e.shape, name
        assert torch.equal(g, e), f"{name} differs by {(g - e).abs().max().item()}"


def test_silu_mul_matches_torch_across_the_range(native):
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(33, 2 * 1536, generator=gen) * 8
    gate_up[0, :10] = torch.tensor([-1e4, -100.0, -88.0, -87.0, -20.0, 0.0, 1e-30, 20.0, 88.0, 1e4])
    expected = TorchLayerOps.silu_mul(gate_up)
    got = native.silu_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6)


SPECIAL_GATES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    -1e4,
    -100.0,
    -88.5,
    -88.0,
    -87.5,
    -87.0,
    -86.9,
    -20.0,
    -1e-38,
    -0.0,
    0.0,
    1e-45,
    1e-30,
    0.5,
    20.0,
    86.9,
    87.0,
    87.5,
    88.0,
    88.5,
    100.0,
    1e4,
    3.4e38,
]


def test_silu_mul_eight_lanes_equal_the_scalar_tail_bit_for_bit(native):
    """Rows of 9: each row's first 8 outputs come from the 8-lane exp (exp_poly8), its last from the
    scalar one (exp_poly). Every row holds one gate value in all 9 places, so the two must agree to
    the bit, NaN, infinities and both clamped ends included."""
    gen = torch.Generator().manual_seed(6)
    gates = torch.cat([torch.tensor(SPECIAL_GATES), torch.randn(200, generator=gen) * 30])
    gate_up = torch.cat([gates[:, None].expand(-1, 9), torch.full((len(gates), 9), 1.5)], dim=1).contiguous()
    got = native.silu_mul(gate_up)
    lanes, tail = got[:, :8], got[:, 8:].expand(-1, 8)
    assert torch.equal(lanes.view(torch.int32), tail.contiguous().view(torch.int32))
    assert torch.isnan(got[0]).all() and torch.isfinite(got[gates.abs() <= 1e4]).all()


def test_inputs_the_kernels_do_not_take_use_the_torch_arithmetic(native):
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(6, 64, generator=gen)
    strided = torch.randn(6, 128, generator=gen)[:, ::2]  # not contiguous
    weight = torch.randn(64, generator=gen)
    for inp in (h.bfloat16(), strided):
        a, b = inp.clone(), inp.clone()
        torch.testing.assert_close(
            native.add_rms_norm(a, None, weight.to(inp.dtype), 1e-6),
            TorchLayerOps.add_rms_norm(b, None, weight.to(inp.dtype), 1e-6),
        )
    gate_up = torch.randn(4, 64, generator=gen).bfloat16()
    torch.testing.assert_close(native.silu_mul(gate_up), TorchLayerOps.silu_mul(gate_up))
    rope = _rope(32)
    qkv = torch.randn(5, 6 * 32, generator=gen)
    positions = torch.arange(5, dtype=torch.int32)  # int32 positions: the torch path
    for e, g in zip(
        TorchLayerOps.rotate_qkv(qkv.clone(), positions, rope, 4, 1, 32),
        native.rotate_qkv(qkv.clone(), positions, rope, 4, 1, 32),
    ):
        assert torch.equal(e, g)


def test_the_native_kernels_serve_cpu_fp32_only(monkeypatch):
    assert isinstance(layer_ops_for(torch.device("cpu"), torch.float32), NativeLayerOps)
    assert isinstance(layer_ops_for(torch.device("cpu"), torch.bfloat16), TorchLayerOps)
    assert isinstance(layer_ops_for(torch.device("cuda"), torch.float32), TorchLayerOps)
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    assert isinstance(layer_ops_for(torch.device("cpu"), torch.float32), TorchLayerOps)
