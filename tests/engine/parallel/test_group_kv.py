"""A tensor-parallel group's KV handoff steps (engine/parallel/group_kv.py): the whole-head rows a
group exports equal a one-rank engine's (heads split, and replicated at TP 4 over 2 KV heads), and
rows imported into a group come back out the same; and the head routes between groups."""

import pytest
import torch

from engine.parallel.head_routes import HeadRoute, handoff_routes, head_owners, kv_head_range
from engine.request import RequestState
from engine.sampling_params import SamplingParams
from tests.engine.parallel.conftest import group_engine


def _prefilled(engine, prompt):
    rid = engine.add_request(None, prompt, SamplingParams(max_tokens=1, detokenize=False), prefill_only=True)
    while engine.scheduler.requests[rid].state is not RequestState.TRANSFERRING:
        engine.step()
    return engine.scheduler.requests[rid]


def _prefilled_blocks(engine, prompt):
    return _prefilled(engine, prompt).block_ids[: len(prompt) // 4]


@pytest.mark.parametrize("tp", [2, 4])
def test_a_group_exports_and_imports_every_head(tiny, tp):
    prompt = list(range(5, 5 + 23))
    one, group = group_engine(tiny, 1), group_engine(tiny, tp)
    try:
        want = one.export_kv(_prefilled_blocks(one, prompt))
        got = group.export_kv(_prefilled_blocks(group, prompt))
        assert got.shape == want.shape == (5, *one.runner.kv_cache.shape[1:])  # every head, as one rank holds
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

        blocks = [27, 28, 29, 30, 31]  # free: the prompt took the first ones
        rows = torch.randn_like(want)
        group.import_kv(blocks, rows)
        assert torch.equal(group.export_kv(blocks), rows)
    finally:
        group.close()


@pytest.mark.parametrize("tp", [2, 4])
def test_a_group_decodes_from_kv_a_one_rank_engine_prefilled(tiny, tp):
    """The decode role of a group: every rank (each replica of a head too) attends over the imported KV."""
    prompt, n = list(range(40, 40 + 21)), 8
    params = SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False)
    one, group = group_engine(tiny, 1), group_engine(tiny, tp)
    try:
        want = one.generate([prompt], params)[0].token_ids
        src = _prefilled(one, prompt)
        rows = one.export_kv(src.block_ids)
        req = group.reserve("r", prompt, params)
        group.import_kv(req.block_ids, rows)
        outs = group.kv_arrived("r", src.all_token_ids[len(prompt)])
        while group.has_unfinished_requests():
            outs += group.step()
        assert [t for o in outs for t in o.new_token_ids] == want
    finally:
        group.close()


def test_head_ranges_split_and_replicate():
    assert [kv_head_range(r, 2, 4) for r in range(2)] == [(0, 2), (2, 4)]
    assert [kv_head_range(r, 4, 2) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert head_owners(4, 2) == (0, 2)
    with pytest.raises(ValueError, match="neither splits nor replicates"):
        kv_head_range(0, 3, 2)


def test_handoff_routes_between_group_sizes():
    # 2 -> 1: the decode rank takes each prefill rank's heads.
    assert handoff_routes(2, 2, 1) == (HeadRoute(0, 0, 0, 1), HeadRoute(1, 0, 1, 2))
    # 1 -> 2: the one prefill rank feeds both.
    assert handoff_routes(2, 1, 2) == (HeadRoute(0, 0, 0, 1), HeadRoute(0, 1, 1, 2))
    # 2 -> 2: rank to rank.
    assert handoff_routes(4, 2, 2) == (HeadRoute(0, 0, 0, 2), HeadRoute(1, 1, 2, 4))
    # 1 -> 4 over 2 KV heads: each head replicated on two decode ranks.
    assert handoff_routes(2, 1, 4) == tuple(HeadRoute(0, d, d // 2, d // 2 + 1) for d in range(4))
    # 4 -> 2 over 2 KV heads: each head read from the first prefill rank holding it.
    assert handoff_routes(2, 4, 2) == (HeadRoute(0, 0, 0, 1), HeadRoute(2, 1, 1, 2))
