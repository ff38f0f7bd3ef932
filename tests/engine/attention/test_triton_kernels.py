"""Triton paged-attention kernels against the torch reference, and the reference against dense attention.

Without a GPU the kernels run under Triton's interpreter, which must be enabled (``TRITON_INTERPRET=1``)
before any kernel is decorated. So the kernel comparisons run in one child process started with that
environment; it reports every case's max error as JSON and the parametrised tests here judge it. Nothing
in this pytest process imports the kernel modules, so other tests are unaffected. On a CUDA machine
the child runs the same cases natively on the GPU.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, NamedTuple

import pytest
import torch

from engine.attention import reference as ref
from tests.engine.triton_child import run_triton_child

_MARKER = "TRITON_CASES_JSON:"
_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}

# Cases are plain data so that pytest can collect them without importing triton.
# "layer" picks which layer's strided view of the block-major cache the kernels see.
DECODE_CASES: dict[str, dict[str, Any]] = {
    "gqa1_bs8_d64": dict(heads=4, kv_heads=4, head_dim=64, block_size=8, lens=[1, 8, 13, 24]),
    "gqa3_bs16_d64_smollm2": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[1, 16, 33, 47]),
    "gqa4_bs32_d128": dict(heads=8, kv_heads=2, head_dim=128, block_size=32, lens=[32, 64, 5], layer=0),
    "gqa8_bs16_d64_split": dict(heads=8, kv_heads=1, head_dim=64, block_size=16, lens=[100, 3, 64], partition=32),
    "gqa3_bs8_split_at_partition_edges": dict(
        heads=6, kv_heads=2, head_dim=64, block_size=8, lens=[32, 64, 65, 1], partition=32
    ),
    "gqa2_bs16_auto_split_long": dict(heads=4, kv_heads=2, head_dim=64, block_size=16, lens=[600, 1]),
    "fp16_gqa4_split": dict(
        heads=8, kv_heads=2, head_dim=64, block_size=16, lens=[40, 7], partition=32, dtype="float16"
    ),
    "bf16_gqa3": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[40, 7], dtype="bfloat16"),
    # Head dims below tl.dot's minimum of 16 (the tests' tiny models) and not a power of two.
    "gqa2_bs8_d8": dict(heads=4, kv_heads=2, head_dim=8, block_size=8, lens=[1, 9, 30]),
    "gqa1_bs16_d80_split": dict(heads=2, kv_heads=2, head_dim=80, block_size=16, lens=[70, 5], partition=32),
    # Other launch shapes (bench/kernel_sweep.py): key tiles wider than a cache block, and narrower.
    "tiles_n128_split": dict(
        heads=8,
        kv_heads=2,
        head_dim=64,
        block_size=16,
        lens=[300, 7, 129],
        partition=256,
        tiles=dict(block_n=128, num_warps=8),
    ),
    "tiles_original_n32": dict(heads=8, kv_heads=2, head_dim=64, block_size=16, lens=[100, 3], tiles=dict(block_n=32)),
    "tiles_n16": dict(
        heads=9, kv_heads=3, head_dim=64, block_size=32, lens=[70, 1, 33], tiles=dict(block_n=16, num_warps=2)
    ),
    # Split-K by each sequence's own length: short and long contexts in one batch, a block table
    # far wider than any context (CUDA graphs pass the model's whole context), a padding row of length 0.
    "splits_by_length_mixed": dict(
        heads=8, kv_heads=2, head_dim=64, block_size=16, lens=[1, 700, 17, 129, 300], splits=4, width=256
    ),
    "splits_by_length_wide_table_gqa3": dict(
        heads=9, kv_heads=3, head_dim=64, block_size=16, lens=[5, 1000], splits=8, width=512
    ),
    "splits_more_than_keys": dict(heads=4, kv_heads=2, head_dim=64, block_size=8, lens=[3, 1, 40], splits=32, width=64),
    "splits_auto_wide_table": dict(heads=4, kv_heads=2, head_dim=64, block_size=16, lens=[2, 900], width=1024),
    # Head dim 128 (Llama-3.1-8B, Qwen2.5-7B class): the interpreter checks fp32; bf16 on CUDA only.
    "d128_gqa4_splits": dict(heads=8, kv_heads=2, head_dim=128, block_size=16, lens=[1, 333, 70], splits=4, width=128),
    "bf16_d128_gqa4_splits": dict(
        heads=8, kv_heads=2, head_dim=128, block_size=16, lens=[1, 333, 70], splits=4, width=128, dtype="bfloat16"
    ),
    "bf16_d128_gqa8_auto": dict(
        heads=32, kv_heads=4, head_dim=128, block_size=16, lens=[2000, 9], width=512, dtype="bfloat16"
    ),
    # seq_lens as a strided view: the kernel read it as a plain array (error 1.05 before the wrapper
    # made it contiguous; the engine's are contiguous, so it was latent).
    "strided_seq_lens": dict(heads=4, kv_heads=2, head_dim=64, block_size=8, lens=[40, 9, 17], strided=True),
}
PREFILL_CASES: dict[str, dict[str, Any]] = {
    "no_prefix_gqa1_bs8": dict(heads=4, kv_heads=4, head_dim=64, block_size=8, q_lens=[1, 8, 20], ctx=[1, 8, 20]),
    "long_prefix_gqa3_bs16_smollm2": dict(
        heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[5, 30], ctx=[150, 40]
    ),
    "mixed_gqa4_bs32_d128": dict(
        heads=8, kv_heads=2, head_dim=128, block_size=32, q_lens=[32, 1, 0, 70], ctx=[64, 33, 10, 70], layer=0
    ),
    "gqa8_bs16_multi_tile": dict(heads=8, kv_heads=1, head_dim=64, block_size=16, q_lens=[64, 3, 20], ctx=[64, 96, 39]),
    "fp16_gqa4": dict(heads=8, kv_heads=2, head_dim=64, block_size=16, q_lens=[40, 7], ctx=[60, 7], dtype="float16"),
    "bf16_gqa3": dict(heads=9, kv_heads=3, head_dim=64, block_size=16, q_lens=[20, 7], ctx=[60, 7], dtype="bfloat16"),
    "gqa2_bs8_d8": dict(heads=4, kv_heads=2, head_dim=8, block_size=8, q_lens=[9, 1, 30], ctx=[20, 5, 30]),
    "gqa1_bs16_d80": dict(heads=2, kv_heads=2, head_dim=80, block_size=16, q_lens=[33, 4], ctx=[50, 4]),
    "tiles_m128_n128": dict(
        heads=8,
        kv_heads=2,
        head_dim=64,
        block_size=16,
        q_lens=[150, 3, 40],
        ctx=[300, 3, 170],
        tiles=dict(block_m=128, block_n=128, num_warps=8, num_stages=2),
    ),
    "tiles_original_m64_n32": dict(
        heads=8, kv_heads=2, head_dim=64, block_size=16, q_lens=[70, 5], ctx=[90, 5], tiles=dict(block_m=64, block_n=32)
    ),
    "tiles_m16_group7": dict(
        heads=14,
        kv_heads=2,
        head_dim=64,
        block_size=16,
        q_lens=[20, 9],
        ctx=[45, 9],
        tiles=dict(block_m=16, block_n=64),
    ),
    "strided_cu_seqlens_and_seq_lens": dict(
        heads=4, kv_heads=2, head_dim=64, block_size=8, q_lens=[9, 1, 20], ctx=[20, 5, 30], strided=True
    ),  # (inf / 3e18 before)
}
KV_WRITE_CASES: dict[str, dict[str, Any]] = {
    "kvh3_bs16_d64": dict(kv_heads=3, head_dim=64, block_size=16, tokens=40),
    "kvh2_bs8_d128_fp16": dict(kv_heads=2, head_dim=128, block_size=8, tokens=17, dtype="float16"),
    "kvh2_bs8_d8": dict(kv_heads=2, head_dim=8, block_size=8, tokens=11),
    "strided_slots": dict(kv_heads=2, head_dim=64, block_size=8, tokens=13, strided=True),  # wrong slots before
}
# The interpreter's tl.dot multiplies bf16 operands as their raw uint16 bits (Triton 3.9), so
# bf16 attention is only checked on a GPU.
_CUDA_ONLY = {
    ("decode", "bf16_gqa3"),
    ("prefill", "bf16_gqa3"),
    ("decode", "bf16_d128_gqa4_splits"),
    ("decode", "bf16_d128_gqa8_auto"),
}


# ---- inputs (shared by the child process and the reference checks) -------------------------------


def _paged_cache(
    gen: torch.Generator, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype, layer: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block-major ``[blocks, layers=2, 2, bs, kvh, D]`` cache and one layer's strided K/V views."""
    kv = torch.randn(num_blocks, 2, 2, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    return kv, kv[:, layer, 0], kv[:, layer, 1]


def _block_tables(
    gen: torch.Generator, lens: list[int], block_size: int, num_blocks: int, width: int | None = None
) -> torch.Tensor:
    """Each sequence's blocks are a random (non-contiguous) set of ids; unused entries are garbage
    (``width``: entries per row, at least the longest sequence's blocks)."""
    needed = max(max(-(-n // block_size) for n in lens), 1)
    width = max(width or 0, needed)
    if width > num_blocks:  # a table wider than the cache: its unused entries repeat ids
        return torch.stack([torch.randint(0, num_blocks, (width,), generator=gen) for _ in lens]).to(torch.int32)
    rows = [torch.randperm(num_blocks, generator=gen)[:width] for _ in lens]
    return torch.stack(rows).to(torch.int32)


class DecodeInputs(NamedTuple):
    """``paged_decode_attention``'s positional arguments, in its order."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    def to(self, device: str) -> DecodeInputs:
        q, k_cache, v_cache, block_tables, seq_lens = (t.to(device) for t in self[:5])
        return DecodeInputs(q, k_cache, v_cache, block_tables, seq_lens, self.scale)


class PrefillInputs(NamedTuple):
    """``paged_prefill_attention``'s positional arguments, in its order."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    def to(self, device: str) -> PrefillInputs:
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens = (t.to(device) for t in self[:6])
        return PrefillInputs(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, self.scale)


def decode_inputs(case: dict[str, Any], device: str = "cpu") -> DecodeInputs:
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, case.get("dtype", "float32"))
    bs, lens = case["block_size"], case["lens"]
    num_blocks = sum(-(-n // bs) for n in lens) + 8
    _, kc, vc = _paged_cache(gen, num_blocks, bs, case["kv_heads"], case["head_dim"], dtype, case.get("layer", 1))
    q = torch.randn(len(lens), case["heads"], case["head_dim"], generator=gen).to(dtype)
    bt = _block_tables(gen, lens, bs, num_blocks, case.get("width"))
    seq_lens = _maybe_strided(torch.tensor(lens, dtype=torch.int32), case)
    return DecodeInputs(q, kc, vc, bt, seq_lens, case["head_dim"] ** -0.5).to(device)


def _maybe_strided(t: torch.Tensor, case: dict[str, Any]) -> torch.Tensor:
    """With ``strided``: the same values as every other element of a twice-as-long tensor."""
    if not case.get("strided"):
        return t
    wide = torch.full((2 * len(t),), 7, dtype=t.dtype)
    wide[::2] = t
    return wide[::2]


def prefill_inputs(case: dict[str, Any], device: str = "cpu") -> PrefillInputs:
    gen = torch.Generator().manual_seed(1)
    dtype = getattr(torch, case.get("dtype", "float32"))
    bs, ctx, q_lens = case["block_size"], case["ctx"], case["q_lens"]
    num_blocks = sum(-(-n // bs) for n in ctx) + 8
    _, kc, vc = _paged_cache(gen, num_blocks, bs, case["kv_heads"], case["head_dim"], dtype, case.get("layer", 1))
    q = torch.randn(sum(q_lens), case["heads"], case["head_dim"], generator=gen).to(dtype)
    bt = _block_tables(gen, ctx, bs, num_blocks)
    cu = _maybe_strided(torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32), case)
    seq_lens = _maybe_strided(torch.tensor(ctx, dtype=torch.int32), case)
    return PrefillInputs(q, kc, vc, bt, cu, seq_lens, case["head_dim"] ** -0.5).to(device)


# ---- the child process: run every case, print errors as JSON -------------------------------------


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference; NaN anywhere counts as infinitely wrong."""
    d = (a.float() - b.float()).abs()
    return float("inf") if d.isnan().any() else (d.max().item() if d.numel() else 0.0)


def _run_kv_write(case: dict[str, Any], device: str) -> float:
    from engine.attention.triton_kv_write import write_kv

    gen = torch.Generator().manual_seed(2)
    dtype = getattr(torch, case.get("dtype", "float32"))
    bs, t = case["block_size"], case["tokens"]
    num_blocks = -(-t // bs) + 4
    kv, _kc, _vc = _paged_cache(gen, num_blocks, bs, case["kv_heads"], case["head_dim"], dtype, 1)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:t]  # distinct slots, scattered
    blk, off = _maybe_strided((slots // bs).to(torch.int32), case), _maybe_strided((slots % bs).to(torch.int32), case)
    k = torch.randn(t, case["kv_heads"], case["head_dim"], generator=gen).to(dtype)
    v = torch.randn(t, case["kv_heads"], case["head_dim"], generator=gen).to(dtype)
    want = kv.clone()
    ref.write_kv(want[:, 1, 0], want[:, 1, 1], k, v, blk, off)
    got = kv.to(device)
    write_kv(got[:, 1, 0], got[:, 1, 1], k.to(device), v.to(device), blk.to(device), off.to(device))
    # A padding token (negative block) must leave the cache untouched.
    neg = torch.tensor([-1], dtype=torch.int32, device=device)
    write_kv(got[:, 1, 0], got[:, 1, 1], k[:1].to(device) + 100, v[:1].to(device) + 100, neg, neg + 1)
    return _err(got.cpu(), want)  # compares every layer, so stray writes show up too


def run_cases(device: str) -> dict[str, dict[str, Any]]:
    """Every case's max abs error (or its traceback), keyed ``kind/name``."""
    from engine.attention.triton_decode import DecodeTiles, paged_decode_attention
    from engine.attention.triton_prefill import PrefillTiles, paged_prefill_attention

    results: dict[str, dict[str, Any]] = {}

    def record(key: str, fn: Any) -> None:
        try:
            results[key] = {"err": fn()}
        except Exception:  # noqa: BLE001 - reported to the parent test
            results[key] = {"error": traceback.format_exc()}

    for name, case in DECODE_CASES.items():
        if ("decode", name) in _CUDA_ONLY and device != "cuda":
            continue

        def decode(case: dict[str, Any] = case) -> float:
            args = decode_inputs(case, device)
            tiles = DecodeTiles(**case["tiles"]) if "tiles" in case else None  # None: the kernel's choice
            got = paged_decode_attention(
                *args, partition_size=case.get("partition"), num_splits=case.get("splits"), tiles=tiles
            )
            return _err(got.cpu(), ref.paged_decode_attention(*args.to("cpu")))

        record(f"decode/{name}", decode)
    for name, case in PREFILL_CASES.items():
        if ("prefill", name) in _CUDA_ONLY and device != "cuda":
            continue

        def prefill(case: dict[str, Any] = case) -> float:
            args = prefill_inputs(case, device)
            tiles = PrefillTiles(**case["tiles"]) if "tiles" in case else None
            got = paged_prefill_attention(*args, tiles=tiles)
            return _err(got.cpu(), ref.paged_prefill_attention(*args.to("cpu")))

        record(f"prefill/{name}", prefill)
    for name, case in KV_WRITE_CASES.items():
        record(f"kv_write/{name}", lambda case=case: _run_kv_write(case, device))
    for name, (kind, change, words) in BAD_INPUTS.items():
        record(f"bad_input/{name}", lambda kind=kind, change=change, words=words: _refused(kind, change, words, device))
    return results


# Inputs the kernels cannot take: a ValueError naming the problem (it read out of bounds, or past
# the table, or crashed the interpreter with a double free).
BAD_INPUTS: dict[str, tuple[str, Any, str]] = {
    "decode_seq_lens_too_short": ("decode", lambda a: (*a[:4], a[4][:-1], a[5]), "seq_lens has shape"),
    "decode_block_tables_rows": ("decode", lambda a: (*a[:3], a[3][:-1], *a[4:]), "block_tables has shape"),
    "decode_dtype_mismatch": ("decode", lambda a: (a[0].half(), *a[1:]), "dtypes differ"),
    "decode_head_size": ("decode", lambda a: (a[0][..., :32].contiguous(), *a[1:]), "head size"),
    "prefill_cu_seqlens_shape": ("prefill", lambda a: (*a[:4], a[4][:-1], *a[5:]), "cu_seqlens_q has shape"),
    "prefill_seq_lens_int64": ("prefill", lambda a: (*a[:5], a[5].long(), a[6]), "must be int32"),
}


def _refused(kind: str, change: Any, words: str, device: str) -> float:
    from engine.attention.triton_decode import paged_decode_attention
    from engine.attention.triton_prefill import paged_prefill_attention

    try:
        if kind == "decode":
            paged_decode_attention(*change(decode_inputs(DECODE_CASES["gqa3_bs16_d64_smollm2"], device)))
        else:
            paged_prefill_attention(*change(prefill_inputs(PREFILL_CASES["no_prefix_gqa1_bs8"], device)))
    except ValueError as e:
        assert words in str(e), str(e)
        return 0.0
    raise AssertionError("accepted")


def _child_main() -> None:
    device = sys.argv[1]
    print(_MARKER + json.dumps(run_cases(device)), flush=True)


@pytest.fixture(scope="module")
def kernel_results() -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = run_triton_child("tests.engine.attention.test_triton_kernels", _MARKER, device, "kernel")
    out["_device"] = {"name": device}
    return out


def _check(results: dict[str, dict[str, Any]], kind: str, name: str, case: dict[str, Any]) -> None:
    if (kind, name) in _CUDA_ONLY and results["_device"]["name"] != "cuda":
        pytest.skip("the Triton interpreter's tl.dot is wrong for bf16; checked on CUDA only")
    res = results[f"{kind}/{name}"]
    assert "error" not in res, res.get("error")
    tol = 0.0 if kind == "kv_write" else _TOL[getattr(torch, case.get("dtype", "float32"))]
    assert res["err"] <= tol, f"max abs error {res['err']:.3g} > {tol:.3g}"


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_kernel_matches_reference(kernel_results: dict[str, dict[str, Any]], name: str) -> None:
    _check(kernel_results, "decode", name, DECODE_CASES[name])


@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_prefill_kernel_matches_reference(kernel_results: dict[str, dict[str, Any]], name: str) -> None:
    _check(kernel_results, "prefill", name, PREFILL_CASES[name])


@pytest.mark.parametrize("name", list(KV_WRITE_CASES))
def test_kv_write_kernel_matches_reference(kernel_results: dict[str, dict[str, Any]], name: str) -> None:
    _check(kernel_results, "kv_write", name, KV_WRITE_CASES[name])


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_inputs_the_kernels_cannot_take_are_refused_naming_the_problem(
    kernel_results: dict[str, dict[str, Any]], name: str
) -> None:
    _check(kernel_results, "bad_input", name, {})


# ---- the oracle itself: reference vs naive dense attention (no triton needed) ---------------------


def _dense_context(
    kc: torch.Tensor, vc: torch.Tensor, table: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first n K/V rows ``[n, kvh, D]``, read position by position (float64)."""
    bs = kc.shape[1]
    rows = [(int(table[p // bs]), p % bs) for p in range(n)]
    k = torch.stack([kc[b, o] for b, o in rows]).double()
    v = torch.stack([vc[b, o] for b, o in rows]).double()
    return k, v


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_pos: int, scale: float) -> torch.Tensor:
    """Query row i (context position first_pos + i) attends to keys 0..first_pos + i, head by head."""
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for i in range(q.shape[0]):
        visible = first_pos + i + 1
        for h in range(q.shape[1]):
            kk, vv = k[:visible, h // group], v[:visible, h // group]
            w = torch.softmax((kk @ q[i, h].double()) * scale, dim=0)
            out[i, h] = w @ vv
    return out


@pytest.mark.parametrize("name", [n for n in DECODE_CASES if "dtype" not in DECODE_CASES[n]])
def test_reference_decode_matches_dense(name: str) -> None:
    q, kc, vc, bt, seq_lens, scale = decode_inputs(DECODE_CASES[name])
    assert not kc.is_contiguous()
    got = ref.paged_decode_attention(q, kc, vc, bt, seq_lens, scale)
    for s, n in enumerate(seq_lens.tolist()):
        k, v = _dense_context(kc, vc, bt[s], n)
        want = _dense_attention(q[s : s + 1], k, v, n - 1, scale)[0]
        assert _err(got[s], want) <= 1e-5


@pytest.mark.parametrize("name", [n for n in PREFILL_CASES if "dtype" not in PREFILL_CASES[n]])
def test_reference_prefill_matches_dense(name: str) -> None:
    q, kc, vc, bt, cu, seq_lens, scale = prefill_inputs(PREFILL_CASES[name])
    got = ref.paged_prefill_attention(q, kc, vc, bt, cu, seq_lens, scale)
    for s, n in enumerate(seq_lens.tolist()):
        lo, hi = int(cu[s]), int(cu[s + 1])
        k, v = _dense_context(kc, vc, bt[s], n)
        want = _dense_attention(q[lo:hi], k, v, n - (hi - lo), scale)
        assert _err(got[lo:hi], want) <= 1e-5


def test_reference_write_kv_reaches_the_right_slots() -> None:
    gen = torch.Generator().manual_seed(3)
    kv, kc, vc = _paged_cache(gen, 6, 8, 3, 64, torch.float32, 1)
    before = kv.clone()
    k, v = torch.randn(5, 3, 64, generator=gen), torch.randn(5, 3, 64, generator=gen)
    blk, off = torch.tensor([4, 0, 4, 5, 2], dtype=torch.int32), torch.tensor([7, 0, 1, 3, 3], dtype=torch.int32)
    ref.write_kv(kc, vc, k, v, blk, off)
    for t in range(5):
        b, o = int(blk[t]), int(off[t])
        assert torch.equal(kv[b, 1, 0, o], k[t]) and torch.equal(kv[b, 1, 1, o], v[t])
        before[b, 1, :, o] = kv[b, 1, :, o]
    assert torch.equal(kv, before)  # nothing else changed


def test_cases_cover_the_brief() -> None:
    """Guard against the case tables silently losing coverage."""
    groups = {c["heads"] // c["kv_heads"] for c in (*DECODE_CASES.values(), *PREFILL_CASES.values())}
    assert {1, 3, 4, 8} <= groups
    sizes = {c["block_size"] for c in (*DECODE_CASES.values(), *PREFILL_CASES.values())}
    assert {8, 16, 32} <= sizes
    assert {64, 128} <= {c["head_dim"] for c in (*DECODE_CASES.values(), *PREFILL_CASES.values())}
    assert any(c["ctx"] == c["q_lens"] for c in PREFILL_CASES.values())
    assert any(1 in c["lens"] for c in DECODE_CASES.values())


def test_wide_tiles_only_where_their_buffers_fit_in_shared_memory() -> None:
    pytest.importorskip("triton")
    from engine.attention.triton_decode import DEFAULT_DECODE_TILES, default_decode_tiles
    from engine.attention.triton_prefill import DEFAULT_PREFILL_TILES, default_prefill_tiles

    assert default_decode_tiles(64, torch.bfloat16).block_n == 128
    assert default_prefill_tiles(64, torch.bfloat16).block_m == 128
    assert default_decode_tiles(8, torch.float32).block_n == 128  # padded to 16 fp32: 64-byte rows
    assert default_decode_tiles(128, torch.bfloat16) == DEFAULT_DECODE_TILES
    assert default_prefill_tiles(64, torch.float32) == DEFAULT_PREFILL_TILES


def test_tiles_follow_the_devices_shared_memory_limit() -> None:
    """Head dim 128 in bf16: the wide tiles where an H100/H200's 227 KiB holds their K/V buffers, the
    narrower ones on a 99 KiB GPU (where the wide ones fail to compile), never more than the limit."""
    pytest.importorskip("triton")
    from engine.attention.triton_decode import (
        DEFAULT_DECODE_TILES,
        SMALL_GPU_SHARED_MEMORY,
        decode_tile_shared_memory,
        default_decode_tiles,
    )

    small, big = 99 * 1024, 227 * 1024
    assert small == SMALL_GPU_SHARED_MEMORY
    assert default_decode_tiles(128, torch.bfloat16, big).block_n == 128
    assert default_decode_tiles(128, torch.bfloat16, small) == DEFAULT_DECODE_TILES
    assert default_decode_tiles(128, torch.bfloat16) == DEFAULT_DECODE_TILES  # unknown limit: the small GPU's
    assert default_decode_tiles(64, torch.bfloat16, small).block_n == 128
    for limit in (small, big):
        for head_dim, dtype in ((64, torch.bfloat16), (128, torch.bfloat16), (128, torch.float16), (64, torch.float32)):
            tiles = default_decode_tiles(head_dim, dtype, limit)
            assert decode_tile_shared_memory(tiles, head_dim, dtype) <= limit, (head_dim, dtype, limit, tiles)


def test_splits_depend_on_the_batch_shape_and_sm_count_only() -> None:
    """Split-K's shape comes from (seqs, kv heads, SMs): never from a context length or the block
    table's width, so a growing context never compiles a new variant."""
    pytest.importorskip("triton")
    from engine.attention.triton_decode import decode_num_splits

    assert decode_num_splits(1, 8, 132) == 32  # batch 1 on an H100/H200: capped at 32 splits
    assert decode_num_splits(4, 8, 132) == 9
    assert decode_num_splits(64, 8, 132) == 1  # 512 programs already fill 132 SMs twice
    assert decode_num_splits(0, 8, 132) == 32
    assert decode_num_splits(2, 2, 4) == 2


def test_dot_operands_are_padded_to_what_a_gpu_compiles() -> None:
    """tl.dot on NVIDIA GPUs refuses operand dimensions below 16; the interpreter accepts them, so
    the CPU suite checks the padding itself (a head dim of 8 once failed to compile on an H200)."""
    pytest.importorskip("triton")
    from engine.attention.triton_common import dot_pad

    assert [dot_pad(n) for n in (1, 8, 15, 16, 17, 64, 80, 128)] == [16, 16, 16, 16, 32, 64, 128, 128]
