"""The compiled CPU prefill kernel (engine/native/paged_prefill.c) against the torch reference: every
prefill chunk of a step in one call, causal over its cached prefix and itself; its fallbacks."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.attention import reference as ref
from engine.attention.cpu import CpuPagedAttention
from engine.native.paged_prefill import NativePagedPrefill
from tests.engine.attention.test_triton_kernels import PREFILL_CASES, prefill_inputs

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")

# The shared fp32 cases the compiled kernels take (head dims a multiple of 16: ``kernel_takes``); the
# Triton-only ones (head dim 8) fall back to the torch path, tested in test_cpu_attention.py.
# (Strided metadata: ``supports`` refuses it and the caller takes the torch path.)
FP32_PREFILL = {
    k: v for k, v in PREFILL_CASES.items() if "dtype" not in v and v["head_dim"] % 16 == 0 and not v.get("strided")
}
# Beyond the shared cases: the specialised (group, head_dim) pairs and the generic path, tiles of 16
# query positions cut in every way (1, 15, 16, 17, 33 queries), chunks after long cached prefixes,
# blocks of 4 (fewer keys than a register block) and of 64, a zero-length chunk among others.
MORE_CASES = {
    "smollm2_step": dict(
        heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[160, 77, 250, 64, 1], ctx=[160, 77, 250, 64, 1]
    ),
    "tile_edges": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[15, 16, 17, 33], ctx=[15, 16, 17, 33]),
    "chunks_after_prefixes": dict(
        heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[40, 1, 100, 0], ctx=[1064, 513, 117, 30], layer=0
    ),
    "tiny_gqa2_d32_bs4": dict(heads=8, kv_heads=4, head_dim=32, block_size=4, q_lens=[33, 17], ctx=[40, 100]),
    "qwen25_gqa7_bs64": dict(heads=14, kv_heads=2, head_dim=64, block_size=64, q_lens=[100, 17], ctx=[300, 17]),
    "llama8b_gqa4_d128": dict(heads=8, kv_heads=2, head_dim=128, block_size=16, q_lens=[70, 9], ctx=[70, 200]),
    "gqa8_d128": dict(heads=8, kv_heads=1, head_dim=128, block_size=32, q_lens=[50], ctx=[90]),
    "generic_gqa5_d48": dict(heads=10, kv_heads=2, head_dim=48, block_size=8, q_lens=[33, 5], ctx=[40, 5]),
    "mha_d64": dict(heads=4, kv_heads=4, head_dim=64, block_size=16, q_lens=[48, 3], ctx=[48, 80]),
}


@pytest.fixture(scope="module")
def kernel() -> NativePagedPrefill:
    k = NativePagedPrefill.load(require_tuned=False)  # (its results, on any build)
    assert k is not None, "a C compiler is here, so the kernel must build"
    return k


@pytest.mark.parametrize("name", sorted(FP32_PREFILL) + sorted(MORE_CASES))
def test_kernel_matches_the_reference(kernel, name):
    args = prefill_inputs({**FP32_PREFILL, **MORE_CASES}[name])
    assert kernel.supports(*args[:6])
    torch.testing.assert_close(kernel(*args), ref.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5)


def test_strided_query_rows_as_the_model_passes_them(kernel):
    """q is a view of the fused qkv rows (row stride past heads * head_dim)."""
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(MORE_CASES["tile_edges"])
    t, heads, d = q.shape
    qkv = torch.randn(t, heads * d + 2 * 3 * d)
    qkv[:, : heads * d] = q.reshape(t, -1)
    strided = qkv[:, : heads * d].view(t, heads, d)
    assert strided.stride(0) != heads * d and kernel.supports(strided, kc, vc, bt, cu, seq_lens)
    torch.testing.assert_close(
        kernel(strided, kc, vc, bt, cu, seq_lens, scale),
        ref.paged_prefill_attention(q, kc, vc, bt, cu, seq_lens, scale),
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_sequence_gets_the_same_floats_in_any_batch_and_with_any_thread_count(kernel):
    """Tasks are per sequence, KV head and tile, and each owns its output rows."""
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(MORE_CASES["chunks_after_prefixes"])
    before = torch.get_num_threads()
    try:
        together = kernel(q, kc, vc, bt, cu, seq_lens, scale)
        for threads in (1, 3):
            torch.set_num_threads(threads)
            for s in range(len(seq_lens)):
                lo, hi = int(cu[s]), int(cu[s + 1])
                alone = kernel(
                    q[lo:hi],
                    kc,
                    vc,
                    bt[s : s + 1],
                    torch.tensor([0, hi - lo], dtype=torch.int32),
                    seq_lens[s : s + 1],
                    scale,
                )
                assert torch.equal(alone, together[lo:hi])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("q_scale", [30.0, 1e-3])
def test_peaked_and_flat_softmax_match_the_reference(kernel, q_scale):
    """Scores far apart (masked keys' scores are large here: they must weigh 0, not inf) and nearly equal."""
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(MORE_CASES["smollm2_step"])
    q = q * q_scale
    out = kernel(q, kc, vc, bt, cu, seq_lens, scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(
        out, ref.paged_prefill_attention(q, kc, vc, bt, cu, seq_lens, scale), rtol=1e-4, atol=1e-4
    )


def test_a_chunk_longer_than_its_context_is_an_error_not_a_crash(kernel):
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(MORE_CASES["mha_d64"])
    with pytest.raises(ValueError, match="longer than their contexts"):
        kernel(q, kc, vc, bt, cu, seq_lens - 10, scale)


@pytest.mark.parametrize("change", ["bf16", "head_dim_40", "group_16", "int64_tables", "blocks_of_128"])
def test_shapes_the_kernel_does_not_take_fall_back_to_the_torch_path(kernel, change):
    case = dict(heads=8, kv_heads=2, head_dim=64, block_size=16, q_lens=[5, 40], ctx=[20, 40])
    if change == "head_dim_40":
        case["head_dim"] = 40
    elif change == "group_16":
        case.update(heads=16, kv_heads=1)
    elif change == "blocks_of_128":
        case.update(block_size=128, q_lens=[5, 200], ctx=[150, 200])
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(case)
    if change == "bf16":
        q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    if change == "int64_tables":
        bt = bt.long()
    assert not kernel.supports(q, kc, vc, bt, cu, seq_lens)
    out = CpuPagedAttention(native_prefill=kernel).prefill(q, kc, vc, bt, cu, seq_lens, scale)
    tol = 2e-2 if change == "bf16" else 1e-5
    torch.testing.assert_close(out, ref.paged_prefill_attention(q, kc, vc, bt, cu, seq_lens, scale), rtol=tol, atol=tol)


def test_the_cpu_backend_uses_the_kernel_where_tuned_and_not_when_switched_off(monkeypatch):
    from engine.attention.backend import select_backend
    from engine.cpu_info import cpuinfo_field

    flags = set(cpuinfo_field("flags").split())
    tuned = "avx512f" in flags or {"avx2", "fma"} <= flags  # (elsewhere the torch path is faster)
    assert (select_backend(torch.device("cpu")).prefill.__self__.native_prefill is not None) == tuned  # type: ignore[attr-defined]  # the backend's bound method
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    backend = select_backend(torch.device("cpu"))
    assert backend.prefill.__self__.native_prefill is None  # type: ignore[attr-defined]  # the backend's bound method
    args = prefill_inputs(MORE_CASES["chunks_after_prefixes"])
    torch.testing.assert_close(backend.prefill(*args), ref.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5)
