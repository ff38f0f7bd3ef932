"""The offline engine's API on the tiny model: sampling options, stops, aborts, bad input."""

import pytest

from engine.config import CacheConfig, EngineConfig
from engine.engine import LLMEngine
from engine.errors import ContextLengthError, InvalidParameterError
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=512, cache=CacheConfig(num_blocks=256)))


def _drain(engine):
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks


PROMPTS = ["hello world", "the quick brown fox jumps", "a", "once upon a time in a land far away"]


def test_generate_text_and_ids_are_consistent(engine):
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    for o in outs:
        assert len(o.token_ids) == 12 and o.finish_reason == "length"
        assert o.text == engine.tokenizer.decode(o.token_ids)


def test_streamed_deltas_add_up_to_the_final_text(engine):
    rid = engine.add_request(None, "stream me please", SamplingParams(max_tokens=20, ignore_eos=True))
    text, ids = "", []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid:
                text += o.text_delta
                ids += o.new_token_ids
                if o.finished:
                    assert o.text == text and o.token_ids == ids


def test_seeded_sampling_is_reproducible_regardless_of_batch(engine):
    sp = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = engine.generate(["seeded prompt"], sp)[0].token_ids
    others = [SamplingParams(max_tokens=n, temperature=0.8, ignore_eos=True) for n in (5, 9, 30)]
    batched = engine.generate(["x y z", "seeded prompt", "more", "stuff here"], [others[0], sp, others[1], others[2]])
    assert batched[1].token_ids == alone
    different_seed = engine.generate(["seeded prompt"], SamplingParams(max_tokens=16, temperature=1.0, seed=99,
                                                                       ignore_eos=True))[0].token_ids
    assert different_seed != alone


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    k1 = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=1.5, top_k=1, ignore_eos=True))
    p0 = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=1.5, top_p=1e-6, ignore_eos=True))
    assert [o.token_ids for o in k1] == [o.token_ids for o in greedy] == [o.token_ids for o in p0]


def test_high_temperature_sampling_differs_from_greedy(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    hot = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=2.0, seed=7, ignore_eos=True))
    assert [o.token_ids for o in hot] != [o.token_ids for o in greedy]


def test_stop_token_ids_and_eos(engine):
    ref = engine.generate(["count with me"], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids
    stop_at = ref[4]
    out = engine.generate(["count with me"], SamplingParams(max_tokens=10, stop_token_ids=[stop_at]))[0]
    first = ref.index(stop_at)
    assert out.token_ids == ref[: first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_at
    # With the stop token among the model's EOS ids the same happens unless ignore_eos.
    eng_eos = engine.eos_token_ids
    assert out.finish_reason == "stop" and isinstance(eng_eos, tuple)


def test_stop_string_is_cut_from_text(engine):
    full = engine.generate(["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    out = engine.generate(["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[: full.text.index(stop)]
    kept = engine.generate(["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop],
                                                           include_stop_str_in_output=True))[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]


def test_abort_mid_generation_frees_blocks(engine):
    rid = engine.add_request(None, "abort me", SamplingParams(max_tokens=100, ignore_eos=True))
    keep = engine.add_request(None, "keep me", SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(3):
        engine.step()
    out = engine.abort(rid)
    assert out.finished and out.finish_reason == "abort" and len(out.token_ids) >= 1
    assert engine.abort(rid) is None
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            done[o.request_id] = o
    assert rid not in done and done[keep].finished
    _drain(engine)


def test_bad_input_names_the_problem(engine):
    with pytest.raises(ContextLengthError, match="maximum context length"):
        engine.add_request(None, [5] * 500, SamplingParams(max_tokens=100))
    with pytest.raises(InvalidParameterError, match="vocabulary"):
        engine.add_request(None, [5, 99999], SamplingParams())
    with pytest.raises(InvalidParameterError, match="empty"):
        engine.add_request(None, [], SamplingParams())
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(top_p=0)
    assert e.value.param == "top_p"
    assert not engine.has_unfinished_requests()


def test_samples_of_one_prompt_submitted_together_compute_it_once(engine):
    """What ``n`` choices send a worker: the same prompt several times at once. The first computes
    it; the others wait for its blocks and hit them (all but the block holding the last token)."""
    prompt = list(range(5, 305))  # 300 tokens: 18 full blocks of 16, then 12 tokens
    before = engine.scheduler.prompt_tokens_computed
    outs = engine.generate([prompt] * 4, [SamplingParams(max_tokens=3, temperature=1.0, seed=i, ignore_eos=True)
                                          for i in range(4)])
    assert sorted(o.num_cached_tokens for o in outs) == [0, 288, 288, 288]
    assert engine.scheduler.prompt_tokens_computed - before == 300 + 3 * 12
    assert engine.num_free_blocks == engine.num_total_blocks
