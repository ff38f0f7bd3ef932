"""Triton paged attention with sliding windows, soft-capped scores and a query scale other than
head_dim ** -0.5 (Gemma 2/3's local layers and ``query_pre_attn_scalar``, Mistral's window), against
``reference.paged_windowed_attention``.

As in test_triton_kernels.py, the kernels run in one child process (under ``TRITON_INTERPRET=1``
without a GPU) that reports every case's max error as JSON. Each sequence owns its own blocks, and
the blocks wholly before its first query's window hold NaN: a kernel that read one (rather than
skipping it in its loop bounds) returns NaN, which counts as infinitely wrong.
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

_MARKER = "TRITON_WINDOWED_JSON:"
_TOL = 1e-4  # fp32

# ctx: each sequence's context length; q_lens: its new tokens (decode cases: 1 each).
# window / softcap None: off. scale: the query scale (None: head_dim ** -0.5).
DECODE_CASES: dict[str, dict[str, Any]] = {
    "window_shorter_than_contexts_gqa2": dict(heads=4, kv_heads=2, head_dim=32, bs=8, ctx=[1, 7, 40, 100], window=16),
    "window_and_softcap_split_by_length": dict(
        heads=4, kv_heads=2, head_dim=32, bs=8, ctx=[1, 33, 200], window=20, softcap=1.0, splits=4
    ),
    "softcap_only_gqa4_query_scalar": dict(
        heads=8, kv_heads=2, head_dim=32, bs=16, ctx=[5, 60], softcap=0.8, scale=24**-0.5
    ),
    "window_fixed_partitions": dict(heads=2, kv_heads=1, head_dim=16, bs=8, ctx=[100, 3, 64], window=50, partition=32),
    "window_of_one_key": dict(heads=2, kv_heads=2, head_dim=16, bs=8, ctx=[9, 1, 30], window=1),
    "window_longer_than_contexts": dict(heads=4, kv_heads=1, head_dim=16, bs=8, ctx=[9, 30], window=1000, softcap=2.0),
    "gemma2_like_window_softcap_gqa2_d8": dict(
        heads=4, kv_heads=2, head_dim=8, bs=4, ctx=[3, 21, 50], window=8, softcap=1.5, scale=10**-0.5
    ),
}
PREFILL_CASES: dict[str, dict[str, Any]] = {
    "window_chunks_after_prefixes": dict(
        heads=4, kv_heads=2, head_dim=32, bs=8, q_lens=[5, 30, 1], ctx=[150, 40, 70], window=24
    ),
    "window_whole_prompts_small_tiles": dict(
        heads=4, kv_heads=2, head_dim=16, bs=8, q_lens=[64, 20], ctx=[64, 20], window=10, tiles=(16, 16)
    ),
    "window_and_softcap_gqa4": dict(
        heads=8, kv_heads=2, head_dim=32, bs=16, q_lens=[40, 7], ctx=[100, 7], window=33, softcap=1.0, scale=0.3
    ),
    "softcap_only": dict(heads=4, kv_heads=4, head_dim=16, bs=8, q_lens=[9, 20], ctx=[30, 20], softcap=0.5),
    "window_wider_than_a_tile_default_tiles": dict(
        heads=2, kv_heads=1, head_dim=16, bs=8, q_lens=[90], ctx=[200], window=40
    ),
    "window_of_one_key": dict(heads=2, kv_heads=1, head_dim=16, bs=4, q_lens=[17, 3], ctx=[17, 12], window=1),
    "window_narrower_than_the_query_tile": dict(
        heads=2, kv_heads=2, head_dim=16, bs=4, q_lens=[50, 33], ctx=[80, 33], window=5, tiles=(32, 16)
    ),
}


class WindowedInputs(NamedTuple):
    """``reference.paged_windowed_attention``'s arguments, in its order."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    window: int | None
    softcap: float | None


def inputs(case: dict[str, Any], decode: bool, device: str = "cpu") -> WindowedInputs:
    """Every sequence on blocks of its own, those wholly before its first query's window set to NaN."""
    gen = torch.Generator().manual_seed(7)
    bs, ctx = case["bs"], case["ctx"]
    q_lens = [1] * len(ctx) if decode else case["q_lens"]
    window = case.get("window")
    need = [-(-n // bs) for n in ctx]
    num_blocks = sum(need) + 3
    kv = torch.randn(num_blocks, 2, 2, bs, case["kv_heads"], case["head_dim"], generator=gen)
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need)
    tables = torch.zeros(len(ctx), width, dtype=torch.int32)
    start = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[start : start + n].to(torch.int32)
        start += n
        if window is not None:
            first_seen = max(0, ctx[s] - q_lens[s] - window + 1)
            kv[tables[s, : first_seen // bs].long()] = float("nan")
    q = torch.randn(sum(q_lens), case["heads"], case["head_dim"], generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(ctx, dtype=torch.int32)
    scale = case.get("scale", case["head_dim"] ** -0.5)
    k, v, tables, cu, seq_lens = (t.to(device) for t in (kv[:, 1, 0], kv[:, 1, 1], tables, cu, seq_lens))
    return WindowedInputs(q.to(device), k, v, tables, cu, seq_lens, scale, window, case.get("softcap"))


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.float() - b.float()).abs()
    return float("inf") if d.isnan().any() else (d.max().item() if d.numel() else 0.0)


# ---- the child process -----------------------------------------------------------------------


def run_cases(device: str) -> dict[str, dict[str, Any]]:
    from engine.attention.triton_decode import paged_decode_attention
    from engine.attention.triton_prefill import PrefillTiles, paged_prefill_attention

    results: dict[str, dict[str, Any]] = {}

    def record(key: str, fn: Any) -> None:
        try:
            results[key] = {"err": fn()}
        except Exception:  # noqa: BLE001 - reported to the parent test
            results[key] = {"error": traceback.format_exc()}

    def decode(case: dict[str, Any]) -> float:
        q, kc, vc, bt, cu, lens, scale, window, cap = inputs(case, True, device)
        got = paged_decode_attention(
            q, kc, vc, bt, lens, scale, window, cap, num_splits=case.get("splits"), partition_size=case.get("partition")
        )
        want = ref.paged_windowed_attention(
            q.cpu(), kc.cpu(), vc.cpu(), bt.cpu(), cu.cpu(), lens.cpu(), scale, window, cap
        )
        return _err(got.cpu(), want)

    def prefill(case: dict[str, Any]) -> float:
        q, kc, vc, bt, cu, lens, scale, window, cap = inputs(case, False, device)
        tiles = PrefillTiles(block_m=case["tiles"][0], block_n=case["tiles"][1]) if "tiles" in case else None
        got = paged_prefill_attention(q, kc, vc, bt, cu, lens, scale, window, cap, tiles=tiles)
        want = ref.paged_windowed_attention(
            q.cpu(), kc.cpu(), vc.cpu(), bt.cpu(), cu.cpu(), lens.cpu(), scale, window, cap
        )
        return _err(got.cpu(), want)

    for name, case in DECODE_CASES.items():
        record(f"decode/{name}", lambda case=case: decode(case))
    for name, case in PREFILL_CASES.items():
        record(f"prefill/{name}", lambda case=case: prefill(case))

    def refused() -> float:
        q, kc, vc, bt, _cu, lens, scale, _, _ = inputs(DECODE_CASES["window_of_one_key"], True, device)
        for window, cap, words in ((0, None, "window must be"), (None, -1.0, "softcap must be")):
            try:
                paged_decode_attention(q, kc, vc, bt, lens, scale, window, cap)
            except ValueError as e:
                assert words in str(e), str(e)
            else:
                raise AssertionError(f"window={window} softcap={cap} accepted")
        return 0.0

    record("bad_input/window_and_cap", refused)
    return results


def _child_main() -> None:
    print(_MARKER + json.dumps(run_cases(sys.argv[1])), flush=True)


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return run_triton_child("tests.engine.attention.test_triton_windowed", _MARKER, device, "kernel")


def _check(res: dict[str, Any]) -> None:
    assert "error" not in res, res.get("error")
    assert res["err"] <= _TOL, f"max abs error {res['err']:.3g} > {_TOL:.3g}"


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_windowed_decode_matches_reference(results: dict[str, dict[str, Any]], name: str) -> None:
    _check(results[f"decode/{name}"])


@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_windowed_prefill_matches_reference(results: dict[str, dict[str, Any]], name: str) -> None:
    _check(results[f"prefill/{name}"])


def test_a_window_or_cap_that_is_not_positive_is_refused(results: dict[str, dict[str, Any]]) -> None:
    _check(results["bad_input/window_and_cap"])


# ---- the inputs themselves (no triton needed) ---------------------------------------------------


@pytest.mark.parametrize(
    "kind,name",
    [("decode", n) for n, c in DECODE_CASES.items() if c.get("window")]
    + [("prefill", n) for n, c in PREFILL_CASES.items() if c.get("window")],
)
def test_blocks_out_of_reach_are_poisoned_and_the_reference_skips_them(kind: str, name: str) -> None:
    """The NaN blocks are real (so a kernel reading one fails) and the oracle does not read them."""
    decode = kind == "decode"
    case = DECODE_CASES[name] if decode else PREFILL_CASES[name]
    q, kc, vc, bt, cu, lens, scale, window, cap = inputs(case, decode)
    assert window is not None  # the cases picked above all have one
    poisoned = any(
        max(0, c - ql - window + 1) >= case["bs"]
        for c, ql in zip(case["ctx"], [1] * len(case["ctx"]) if decode else case["q_lens"], strict=True)
    )
    assert kc.isnan().any() == poisoned
    assert not ref.paged_windowed_attention(q, kc, vc, bt, cu, lens, scale, window, cap).isnan().any()


def test_cases_cover_the_brief() -> None:
    cases = [*DECODE_CASES.values(), *PREFILL_CASES.values()]
    assert {c["heads"] // c["kv_heads"] for c in cases} >= {1, 2, 4}
    assert any(c.get("window") and c.get("softcap") for c in cases)
    assert any(c.get("softcap") and not c.get("window") for c in cases)
    assert any("scale" in c for c in cases)
    assert any(c.get("window", 10**9) < max(c["ctx"]) for c in PREFILL_CASES.values())
