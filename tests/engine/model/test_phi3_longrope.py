"""Phi-3's longrope past its original length equals transformers token for token (fp32): a sequence
longer than the original length is rotated with the long factors at every position, a prompt longer
than it is prefilled so, and a generation growing past it is computed again, whole, with them
(engine/scheduler_long_rope.py). On the tiny seeded Phi-3 (original length
``PHI3_ORIGINAL_MAX``)."""

from __future__ import annotations

import random

import pytest

from engine.config import SpeculativeConfig
from engine.request import RequestState
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import PHI3_ORIGINAL_MAX, build_family_model
from tests.engine.test_golden_tiny import _engine, _run

N = PHI3_ORIGINAL_MAX


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    d = build_family_model(tmp_path_factory.mktemp("phi3"), "phi3", seed=2)
    return d, load_hf(d)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def test_generation_crossing_the_original_length_equals_hf(phi3):
    """Prompts within the original length generating past it (one crossing right after its
    prefill), batched with one that stays short."""
    d, hf = phi3
    rng = random.Random(4)
    prompts = [_tokens(rng, n) for n in (N - 20, N, N - 1, 20)]
    max_new = [30, 4, 3, 5]
    want = hf_greedy(hf, prompts, max_new)
    eng = _engine(d, cache={"block_size": 8})
    assert _run(eng, prompts, max_new) == want
    assert eng.scheduler.long_rope is not None
    assert eng.scheduler.long_rope.num_crossings == 3  # (N - 1 + 3 tokens: fed up to N + 1)
    # With drafts (speculative decoding), cut where they would pass the original length.
    spec = _engine(d, cache={"block_size": 8}, scheduler={"speculative": SpeculativeConfig(min_keep_chance=0.0)})
    assert _run(spec, prompts, max_new) == want
    assert spec.scheduler.num_draft_tokens > 0


def test_long_prompt_chunked_and_batched_with_short_equals_hf(phi3):
    """A prompt longer than the original length (prefilled in chunks, all with the long factors)
    batched with short ones, one of them crossing."""
    d, hf = phi3
    rng = random.Random(5)
    prompts = [_tokens(rng, n) for n in (N + 30, 24, N - 4)]
    max_new = [6, 8, 10]
    eng = _engine(d, scheduler={"max_num_batched_tokens": 32}, cache={"block_size": 8})
    assert _run(eng, prompts, max_new) == hf_greedy(hf, prompts, max_new)
    assert eng.scheduler.long_rope is not None and eng.scheduler.long_rope.num_crossings == 1


def test_prefix_cache_keeps_short_and_long_rope_apart(phi3):
    """Blocks cached by a short-rope request serve a short one with the same prefix, but not a long
    prompt sharing it; a crossing request's recompute is served by the long request's blocks."""
    d, hf = phi3
    rng = random.Random(6)
    prefix = _tokens(rng, N - 8)
    short, long_prompt, crossing = prefix + _tokens(rng, 4), prefix + _tokens(rng, 30), prefix + _tokens(rng, 6)
    eng = _engine(d, cache={"block_size": 8})
    bm = eng.block_manager
    got = _run(eng, [prefix], [2])
    hits = bm.num_prefix_hits
    got += _run(eng, [short], [3])
    assert bm.num_prefix_hits - hits == len(prefix) // 8 * 8  # the short prefix is reused
    hits = bm.num_prefix_hits
    got += _run(eng, [long_prompt], [3])
    assert bm.num_prefix_hits == hits  # not by a long request
    got += _run(eng, [crossing], [6])  # its prefix hits short blocks, then its recompute the long ones
    assert bm.num_prefix_hits - hits == 2 * (len(prefix) // 8 * 8)
    assert eng.scheduler.long_rope is not None and eng.scheduler.long_rope.num_crossings == 1
    prompts = [prefix, short, long_prompt, crossing]
    assert got == hf_greedy(hf, prompts, [2, 3, 3, 6])


def _prefill_then_decode(prefill, decode, rid: str, prompt: list[int], max_new: int) -> tuple[list[int], int]:
    """``prompt`` prefilled on ``prefill``, its KV copied into ``decode``'s reserved blocks, decoded
    there: the tokens, and the blocks the decode side found cached with the same hashes."""
    params = SamplingParams(max_tokens=max_new, ignore_eos=True, detokenize=False)
    pid = prefill.add_request(None, prompt, params, prefill_only=True)
    while prefill.scheduler.requests[pid].state is not RequestState.TRANSFERRING:
        prefill.step()
    src = prefill.scheduler.requests[pid]
    req = decode.reserve(rid, prompt, params)
    assert req is not None
    assert req.long_rope == src.long_rope and req.block_hashes == src.block_hashes[: len(req.block_hashes)]
    cached = req.num_cached_tokens // 8
    decode.import_kv(req.block_ids[cached:], prefill.export_kv(src.block_ids[cached : len(req.block_ids)]))
    outs = decode.kv_arrived(rid, src.all_token_ids[len(prompt)])
    prefill.release_transferred(pid)
    while decode.has_unfinished_requests():
        outs += decode.step()
    return [t for o in outs for t in o.new_token_ids], cached


def test_prefill_and_decode_workers_agree_and_decode_recomputes_crossing(phi3):
    """Through a prefill engine and a decode engine (the KV copied between them as a transfer
    would): a long prompt is long on both sides with the same block hashes, and a short one whose
    decode passes the original length is recomputed on the decode side."""
    d, hf = phi3
    rng = random.Random(7)
    prompts = [_tokens(rng, N + 20), _tokens(rng, N - 3)]
    max_new = [4, 8]
    prefill, decode = _engine(d, cache={"block_size": 8}), _engine(d, cache={"block_size": 8})
    got = [_prefill_then_decode(prefill, decode, f"r{i}", p, n)[0] for i, p, n in zip(range(2), prompts, max_new)]
    assert decode.scheduler.long_rope is not None and decode.scheduler.long_rope.num_crossings == 1
    assert got == hf_greedy(hf, prompts, max_new)
