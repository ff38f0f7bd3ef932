"""The compiled CPU decode kernel (engine/attention/native) against the torch reference, its build
cache, and its fallbacks (no compiler, switched off, shapes it does not take)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from engine.attention import reference as ref
from engine.attention.cpu import CpuPagedAttention
from engine.native.build import build_and_load
from engine.native.paged_decode import NativePagedDecode
from tests.engine.attention.test_triton_kernels import DECODE_CASES, decode_inputs

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")

# The shared fp32 cases the compiled kernels take (head dims a multiple of 16: ``kernel_takes``); the
# Triton-only ones (head dim 8) fall back to the torch path, tested in test_cpu_attention.py.
# (Strided metadata: ``supports`` refuses it and the caller takes the torch path.)
FP32_DECODE = {
    k: v for k, v in DECODE_CASES.items() if "dtype" not in v and v["head_dim"] % 16 == 0 and not v.get("strided")
}
# Shapes beyond the shared cases: the specialised (group, head_dim) pairs of real models and the
# generic path (group 5, head_dim 48), 64-token blocks, rows of one token, long ragged rows.
MORE_CASES = {
    "tiny_gqa2_d32": dict(heads=8, kv_heads=4, head_dim=32, block_size=16, lens=[1, 17, 90]),
    "qwen25_gqa7_d64": dict(heads=14, kv_heads=2, head_dim=64, block_size=16, lens=[200, 3, 64]),
    "llama8b_gqa4_d128": dict(heads=8, kv_heads=2, head_dim=128, block_size=16, lens=[33, 130]),
    "generic_gqa5_d48": dict(heads=10, kv_heads=2, head_dim=48, block_size=8, lens=[7, 41, 1]),
    "mha_bs64": dict(heads=4, kv_heads=4, head_dim=64, block_size=64, lens=[64, 65, 300]),
    "one_token_rows": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[1, 1, 1, 1, 1]),
    "long_ragged": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[1500, 20, 777], layer=0),
    # past 1,024 tokens a context is attended in pieces that are merged after
    "split_one_long": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[4100]),
    "split_mixed_bs32": dict(heads=8, kv_heads=2, head_dim=128, block_size=32, lens=[3000, 1024, 1025, 9]),
    "split_generic": dict(heads=10, kv_heads=2, head_dim=48, block_size=8, lens=[2600, 40]),
}


@pytest.fixture(scope="module")
def kernel() -> NativePagedDecode:
    k = NativePagedDecode.load()
    assert k is not None, "a C compiler is here, so the kernel must build"
    return k


@pytest.mark.parametrize("name", sorted(FP32_DECODE) + sorted(MORE_CASES))
def test_kernel_matches_the_reference(kernel, name):
    args = decode_inputs({**FP32_DECODE, **MORE_CASES}[name])
    assert kernel.supports(*args[:5])
    torch.testing.assert_close(kernel(*args), ref.paged_decode_attention(*args), rtol=1e-5, atol=1e-5)


def test_kernel_respects_the_thread_count(kernel):
    args = decode_inputs(MORE_CASES["long_ragged"])
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(kernel(*args))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)  # tasks are independent


def test_a_long_context_gets_the_same_floats_in_any_batch_and_with_any_thread_count(kernel):
    """Pieces are cut by the sequence's own length, so its result does not depend on its
    batch-mates or on how many threads ran the pieces."""
    q, kc, vc, bt, seq_lens, scale = decode_inputs(MORE_CASES["split_mixed_bs32"])
    before = torch.get_num_threads()
    try:
        together = kernel(q, kc, vc, bt, seq_lens, scale)
        for threads in (1, 3):
            torch.set_num_threads(threads)
            for row in range(len(seq_lens)):
                alone = kernel(q[row : row + 1], kc, vc, bt[row : row + 1], seq_lens[row : row + 1], scale)
                assert torch.equal(alone[0], together[row])
    finally:
        torch.set_num_threads(before)


def _padded_rows(cache: torch.Tensor) -> torch.Tensor:
    """The same values in a cache whose token rows are 32 floats apart more than their heads need:
    the kernel's strides allow it, and touch_piece then reads row by row instead of a block's run."""
    blocks, block_size, kv_heads, head_dim = cache.shape
    wide = torch.full((blocks, block_size, kv_heads * head_dim + 32), float("nan"))
    wide[:, :, : kv_heads * head_dim] = cache.reshape(blocks, block_size, -1)
    return wide[:, :, : kv_heads * head_dim].view(blocks, block_size, kv_heads, head_dim)


def test_reading_pieces_ahead_changes_no_float(kernel):
    """touch_piece reads a piece's K and V rows (and prefetches the next block) before its heads
    are attended: only reads, so the very same floats as the build without it, with blocks whose
    rows are one run (the engine's cache) and with padded rows, with one thread and two."""
    off = NativePagedDecode.load(read_ahead=False)
    assert off is not None
    many = dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[5, 70, 300, 33, 1, 129, 16, 64, 700])
    before = torch.get_num_threads()
    try:
        for case in (many, MORE_CASES["split_mixed_bs32"], MORE_CASES["qwen25_gqa7_d64"]):
            q, kc, vc, bt, seq_lens, scale = decode_inputs(case)
            for k, v in ((kc, vc), (_padded_rows(kc), _padded_rows(vc))):
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    got = kernel(q, k, v, bt, seq_lens, scale)
                    assert torch.equal(got, off(q, k, v, bt, seq_lens, scale)), (case["lens"], k.stride(), threads)
                    torch.testing.assert_close(
                        got, ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale), rtol=1e-5, atol=1e-5
                    )
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("change", ["bf16", "head_dim_40", "group_16", "int64_tables", "blocks_of_128"])
def test_shapes_the_kernel_does_not_take_fall_back_to_the_torch_path(kernel, change):
    case = dict(heads=8, kv_heads=2, head_dim=64, block_size=16, lens=[5, 40])
    if change == "head_dim_40":
        case["head_dim"] = 40
    elif change == "group_16":
        case.update(heads=16, kv_heads=1)
    elif change == "blocks_of_128":
        case.update(block_size=128, lens=[5, 200])
    q, kc, vc, bt, seq_lens, scale = decode_inputs(case)
    if change == "bf16":
        q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    if change == "int64_tables":
        bt = bt.long()
    assert not kernel.supports(q, kc, vc, bt, seq_lens)
    out = CpuPagedAttention(kernel).decode(q, kc, vc, bt, seq_lens, scale)
    tol = 2e-2 if change == "bf16" else 1e-5
    torch.testing.assert_close(out, ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale), rtol=tol, atol=tol)


def test_the_cpu_backend_uses_the_kernel():
    from engine.attention.backend import select_backend

    assert select_backend(torch.device("cpu")).decode.__self__.native_decode is not None  # type: ignore[attr-defined]  # the backend's bound method


def test_built_once_then_loaded_from_the_cache(tmp_path):
    first = build_and_load("paged_decode.c", cache_dir=tmp_path)
    assert first.lib is not None and first.error is None
    built = sorted(tmp_path.iterdir())
    assert built == [first.path] and first.path.suffix == ".so"
    stamp = first.path.stat().st_mtime_ns
    second = build_and_load("paged_decode.c", cache_dir=tmp_path)
    assert second.path == first.path and second.path.stat().st_mtime_ns == stamp  # not compiled again
    assert sorted(tmp_path.iterdir()) == built  # no temporary file left behind


def test_no_compiler_and_switched_off_give_a_reason_not_an_error(tmp_path, monkeypatch):
    missing = build_and_load("paged_decode.c", cache_dir=tmp_path, compiler="no-such-cc-baton")
    assert missing.lib is None and "no-such-cc-baton" in (missing.error or "")
    broken = build_and_load("paged_decode.c", cache_dir=tmp_path, compiler="false")
    assert broken.lib is None and "compiling paged_decode.c failed" in (broken.error or "")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    off = build_and_load("paged_decode.c", cache_dir=tmp_path)
    assert off.lib is None and "BATON_NATIVE_KERNELS" in (off.error or "")
    assert NativePagedDecode.load() is None
    from engine.attention.backend import select_backend

    backend = select_backend(torch.device("cpu"))  # the torch path, still correct
    assert backend.decode.__self__.native_decode is None  # type: ignore[attr-defined]  # the backend's bound method
    args = decode_inputs(FP32_DECODE["gqa3_bs16_d64_smollm2"])
    torch.testing.assert_close(backend.decode(*args), ref.paged_decode_attention(*args), rtol=1e-5, atol=1e-5)


def test_the_kernel_shares_torchs_openmp_runtime():
    """Loaded after torch, the kernel's libgomp.so.1 is torch's copy: one thread pool, not two."""
    code = (
        "import torch\n"
        "from engine.native.paged_decode import NativePagedDecode\n"
        "assert NativePagedDecode.load() is not None\n"
        "maps = {line.split()[-1] for line in open('/proc/self/maps') if 'libgomp' in line}\n"
        "print(sorted(maps))\n"
        "assert len(maps) == 1 and 'torch' in next(iter(maps)), maps\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("q_scale", [30.0, 1e-3])
def test_peaked_and_flat_softmax_match_the_reference(kernel, q_scale):
    """Scores far apart (weights underflow: the exp's clamp must give zeros, not NaN) and nearly equal."""
    q, kc, vc, bt, seq_lens, scale = decode_inputs(MORE_CASES["long_ragged"])
    q = q * q_scale
    out = kernel(q, kc, vc, bt, seq_lens, scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale), rtol=1e-4, atol=1e-4)
