"""Mistral (every layer sliding) gives the blocks behind its window back to the pool as a sequence
moves on, and still equals transformers token for token: a sequence far longer than the window
holds at most ceil(window / block) + 1 blocks while it decodes, nothing leaks, and a later prompt
sharing its prefix hits the released blocks that are still cached, even with a prompt longer than
the pool. Gemma (global layers too) keeps every block."""

from __future__ import annotations

import random

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import build_family_model
from tests.engine.test_golden_tiny import _engine

WINDOW, BLOCK = 16, 4  # family_oracle's Mistral window; small blocks, so many are released


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    d = build_family_model(tmp_path_factory.mktemp("mistral"), "mistral", seed=1)
    return d, load_hf(d)


def test_long_sequences_hold_their_window_and_equal_transformers(mistral):
    """Two sequences, each touching twice the pool's blocks: the blocks they release are reused (and
    overwritten) by the other while both run, so a read behind the window would show."""
    d, hf = mistral
    rng = random.Random(5)
    prompts, max_new = [[rng.randrange(3, 512) for _ in range(40)] for _ in range(2)], 90
    eng = _engine(d, cache={"block_size": BLOCK, "num_blocks": 16}, scheduler={"max_num_batched_tokens": 16})
    bm = eng.block_manager
    assert bm.window == WINDOW and 2 * -(-(40 + max_new) // BLOCK) > 2 * bm.num_blocks
    ids = [eng.add_request(None, p, SamplingParams(max_tokens=max_new, ignore_eos=True)) for p in prompts]
    most, got = 0, {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                got[out.request_id] = out.token_ids
        for rid in ids:
            req = eng.scheduler.requests.get(rid)
            if req is not None and req.num_computed_tokens > len(prompts[0]):  # decoding: the steady state
                most = max(most, len(req.block_ids) - req.num_window_freed)
    assert most == -(-WINDOW // BLOCK) + 1
    assert bm.num_free_blocks == bm.num_blocks  # no leak
    assert [got[i] for i in ids] == hf_greedy(hf, prompts, [max_new] * 2)


def test_a_prefix_hit_on_released_blocks_equals_transformers(mistral):
    d, hf = mistral
    rng = random.Random(6)
    shared = [rng.randrange(3, 512) for _ in range(48)]
    prompts = [shared + [rng.randrange(3, 512) for _ in range(n)] for n in (5, 9)]
    eng = _engine(d, cache={"block_size": BLOCK, "num_blocks": 64})
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    first = [o.token_ids for o in eng.generate(prompts[:1], [params])]
    assert eng.block_manager.num_window_freed > 0  # the shared prefix's early blocks went back (cached)
    hits = eng.block_manager.num_prefix_hits
    second = [o.token_ids for o in eng.generate(prompts[1:], [params])]
    assert eng.block_manager.num_prefix_hits - hits == len(shared)
    assert first + second == hf_greedy(hf, prompts, [30, 30])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_a_prompt_longer_than_the_pool_on_a_cached_prefix_equals_transformers(mistral):
    """Colocated, a prompt of more blocks than the pool runs: its prefix hit takes only the blocks its
    window reaches (placeholders for the rest, in the runner's table too) and its chunks release
    the blocks they pass."""
    d, hf = mistral
    rng = random.Random(7)
    shared = [rng.randrange(3, 512) for _ in range(40)]
    prompts = [shared, shared + [rng.randrange(3, 512) for _ in range(40)]]
    eng = _engine(d, cache={"block_size": BLOCK, "num_blocks": 16}, scheduler={"max_num_batched_tokens": 16})
    bm = eng.block_manager
    assert -(-len(prompts[1]) // BLOCK) > bm.num_blocks
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    first = [o.token_ids for o in eng.generate(prompts[:1], [params])]
    hits = bm.num_prefix_hits
    second = [o.token_ids for o in eng.generate(prompts[1:], [params])]
    assert bm.num_prefix_hits - hits == len(shared)
    assert first + second == hf_greedy(hf, prompts, [6, 6])
    assert bm.num_free_blocks == bm.num_blocks


def test_a_model_with_global_layers_keeps_every_block(tmp_path):
    d = build_family_model(tmp_path / "gemma2", "gemma2", seed=1)
    eng = _engine(d, cache={"block_size": BLOCK, "num_blocks": 64})
    assert eng.model_config.family.window is not None and eng.block_manager.window is None
    eng.generate([list(range(3, 60))], [SamplingParams(max_tokens=8, ignore_eos=True)])
    assert eng.block_manager.num_window_freed == 0
