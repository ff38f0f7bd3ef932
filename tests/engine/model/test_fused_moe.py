"""The fused MoE kernel (engine/model/moe_fused.py) against the torch path (engine/model/moe.py),
and the expert alignment it reads (engine/model/moe_align.py).

The kernel runs in one child process under ``TRITON_INTERPRET=1`` (on CUDA where there is one), as
tests/engine/attention/test_triton_kernels.py does: nothing in this pytest process imports it.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.model.family import MoeLayout, MoeSpec
from engine.model.moe import MoeWeights, moe_mlp
from engine.model.moe_align import align_by_expert, padded_bound
from tests.engine.triton_child import run_triton_child

_MARKER = "FUSED_MOE_JSON:"
_TOL = 1e-4  # fp32

# tokens: the batch sizes each case runs; uneven: the router favours expert 0 and never picks the last two.
CASES: dict[str, dict[str, Any]] = {
    "mixtral_softmax_top2_of_4": dict(
        experts=4, top_k=2, hidden=32, inter=24, norm=True, layout="mixtral", tokens=[1, 7, 40]
    ),
    "qwen2_moe_shared_expert_norm_off": dict(
        experts=6, top_k=3, hidden=32, inter=20, norm=False, shared=40, tokens=[1, 9, 33]
    ),
    "qwen3_moe_norm_on_uneven_routing": dict(
        experts=8, top_k=2, hidden=48, inter=40, norm=True, uneven=True, tokens=[3, 50]
    ),
    "large_batch_64_row_tiles": dict(experts=4, top_k=2, hidden=32, inter=24, norm=False, tokens=[300]),
    "small_tiles_inputs_not_a_multiple": dict(
        experts=5, top_k=2, hidden=40, inter=18, norm=True, tokens=[21], tiles=(16, 16, 16)
    ),
}


def case_inputs(case: dict[str, Any], tokens: int) -> tuple[torch.Tensor, MoeWeights, MoeSpec]:
    gen = torch.Generator().manual_seed(tokens)
    e, h, i = case["experts"], case["hidden"], case["inter"]
    layout = MoeLayout.MIXTRAL if case.get("layout") == "mixtral" else MoeLayout.QWEN
    spec = MoeSpec(e, case["top_k"], i, case["norm"], layout, case.get("shared", 0))
    x = torch.randn(tokens, h, generator=gen)
    router = torch.randn(e, h, generator=gen) * 0.5
    if case.get("uneven"):
        u = torch.ones(h) / h**0.5
        x = x + 3 * u
        router[0] += 2 * u
        router[-2:] -= 4 * u
    shared: dict[str, torch.Tensor] = {}
    if spec.shared_intermediate_size:
        s = spec.shared_intermediate_size
        shared = dict(
            shared_gate_up=torch.randn(2 * s, h, generator=gen) * h**-0.5,
            shared_down=torch.randn(h, s, generator=gen) * s**-0.5,
            shared_gate=torch.randn(1, h, generator=gen) * h**-0.5,
        )
    w = MoeWeights(
        router,
        torch.randn(e, 2 * i, h, generator=gen) * h**-0.5,
        torch.randn(e, h, i, generator=gen) * i**-0.5,
        **shared,
    )
    return x, w, spec


def _on_device(w: MoeWeights, device: str) -> MoeWeights:
    def to(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return MoeWeights(
        w.router.to(device),
        w.gate_up.to(device),
        w.down.to(device),
        to(w.shared_gate_up),
        to(w.shared_down),
        to(w.shared_gate),
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---- the child process ---------------------------------------------------------------------------


def run_cases(device: str) -> dict[str, dict[str, Any]]:
    from engine.model.moe_fused import MoeTiles, fused_experts

    results: dict[str, dict[str, Any]] = {}
    for name, case in CASES.items():
        tiles = MoeTiles(*case["tiles"]) if "tiles" in case else None
        for t in case["tokens"]:
            try:
                x, w, spec = case_inputs(case, t)
                want = moe_mlp(x, w, spec, silu_mul)
                fused = functools.partial(fused_experts, tiles=tiles)
                got = moe_mlp(x.to(device), _on_device(w, device), spec, silu_mul, fused).cpu()
                err = (got - want).abs().max().item()
                results[f"{name}/{t}"] = {"err": float("inf") if got.isnan().any() else err}
            except Exception:  # noqa: BLE001 - reported to the parent test
                results[f"{name}/{t}"] = {"error": traceback.format_exc()}
    return results


def _child_main() -> None:
    print(_MARKER + json.dumps(run_cases(sys.argv[1])), flush=True)


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return run_triton_child("tests.engine.model.test_fused_moe", _MARKER, device, "fused MoE")


@pytest.mark.parametrize("key", [f"{n}/{t}" for n, c in CASES.items() for t in c["tokens"]])
def test_fused_experts_match_the_torch_path(results: dict[str, dict[str, Any]], key: str) -> None:
    res = results[key]
    assert "error" not in res, res.get("error")
    assert res["err"] <= _TOL, f"max abs error {res['err']:.3g} > {_TOL:.3g}"


def test_the_uneven_case_routes_unevenly() -> None:
    case = CASES["qwen3_moe_norm_on_uneven_routing"]
    x, w, spec = case_inputs(case, 50)
    chosen = torch.topk(F.linear(x, w.router), spec.top_k, dim=-1).indices.reshape(-1)
    counts = torch.bincount(chosen, minlength=spec.num_experts)
    assert counts[-2:].sum() == 0 and counts[0] == 50  # two experts idle, one chosen by every token


# ---- the alignment (torch only) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens,top_k,experts,block_m", [(1, 2, 8, 16), (7, 2, 4, 16), (50, 3, 6, 16), (300, 2, 4, 64)]
)
def test_alignment_sorts_rows_by_expert_in_whole_tiles(tokens: int, top_k: int, experts: int, block_m: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    ids[: tokens // 2, 0] = 0  # uneven
    a = align_by_expert(ids, experts, block_m)
    n, flat = tokens * top_k, ids.reshape(-1)
    counts = torch.bincount(flat, minlength=experts)
    used = int(((counts + block_m - 1) // block_m * block_m).sum())
    assert int(a.num_padded) == used <= a.sorted_ids.numel() == padded_bound(n, experts, block_m)
    real = a.sorted_ids[a.sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))  # every row once
    assert (a.sorted_ids[used:] == n).all()
    for tile, expert in enumerate(a.block_experts.tolist()):
        rows = a.sorted_ids[tile * block_m : (tile + 1) * block_m]
        rows = rows[rows < n].long()
        if tile * block_m >= used:
            assert expert == experts and rows.numel() == 0
        else:
            assert rows.numel() > 0 and (flat[rows] == expert).all()
            assert torch.equal(rows, rows.sort().values)  # stable: a token's rows keep their order


def test_alignment_bound_covers_the_worst_case() -> None:
    # Every row on its own expert: each pads a whole tile.
    ids = torch.arange(8).view(4, 2)
    a = align_by_expert(ids, 8, 16)
    assert int(a.num_padded) == 8 * 16 == a.sorted_ids.numel()
