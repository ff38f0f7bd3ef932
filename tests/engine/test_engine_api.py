"""The offline engine's API on the tiny model: sampling options, stops, aborts, bad input."""

import pytest

from engine.config import CacheConfig, EngineConfig
from engine.engine import LLMEngine
from engine.errors import ContextLengthError, InvalidParameterError
from engine.request import FinishReason
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
        assert len(o.token_ids) == 12 and o.finish_reason is FinishReason.LENGTH
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
    different_seed = engine.generate(
        ["seeded prompt"], SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True)
    )[0].token_ids
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
    assert out.token_ids == ref[: first + 1] and out.finish_reason is FinishReason.STOP and out.stop_reason == stop_at
    # vLLM's text: the stop token is in token_ids, its text only with include_stop_str_in_output
    assert out.text == engine.tokenizer.decode(ref[:first])
    kept = engine.generate(
        ["count with me"], SamplingParams(max_tokens=10, stop_token_ids=[stop_at], include_stop_str_in_output=True)
    )[0]
    assert kept.token_ids == out.token_ids and kept.text == engine.tokenizer.decode(ref[: first + 1])
    # With the stop token among the model's EOS ids the same happens unless ignore_eos.
    eng_eos = engine.eos_token_ids
    assert out.finish_reason is FinishReason.STOP and isinstance(eng_eos, tuple)


def test_stop_string_is_cut_from_text(engine):
    full = engine.generate(["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    out = engine.generate(["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop
    assert out.text == full.text[: full.text.index(stop)]
    kept = engine.generate(
        ["tell a story"], SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    )[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]


def test_abort_mid_generation_frees_blocks(engine):
    rid = engine.add_request(None, "abort me", SamplingParams(max_tokens=100, ignore_eos=True))
    keep = engine.add_request(None, "keep me", SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(3):
        engine.step()
    out = engine.abort(rid)
    assert out.finished and out.finish_reason is FinishReason.ABORT and len(out.token_ids) >= 1
    assert engine.abort(rid) is None
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            done[o.request_id] = o
    assert rid not in done and done[keep].finished
    _drain(engine)


def test_the_engines_own_ids_step_over_ids_a_caller_chose(engine):
    """add_request(None, ...) and generate() failed with "duplicate request id 'req-N'" whenever the
    caller had already named a live request like the engine's next id."""
    nxt = f"req-{next(engine._ids) + 1}"  # the id the engine would pick next
    mine = engine.add_request(nxt, "mine", SamplingParams(max_tokens=3, ignore_eos=True))
    auto = engine.add_request(None, "auto", SamplingParams(max_tokens=3, ignore_eos=True))
    assert mine == nxt and auto != nxt
    assert engine.generate(["more"], SamplingParams(max_tokens=2))[0].finished
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
    outs = engine.generate(
        [prompt] * 4, [SamplingParams(max_tokens=3, temperature=1.0, seed=i, ignore_eos=True) for i in range(4)]
    )
    assert sorted(o.num_cached_tokens for o in outs) == [0, 288, 288, 288]
    assert engine.scheduler.prompt_tokens_computed - before == 300 + 3 * 12
    assert engine.num_free_blocks == engine.num_total_blocks


# -- stop strings: where several match, min_tokens, the last allowed token ---------------------------
def _first_token_text(engine, prompt):
    out = engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    return out.text


def test_the_stop_string_that_starts_first_in_the_text_wins_not_the_first_listed(engine):
    prompt = next(p for p in PROMPTS if len(_first_token_text(engine, p)) >= 5)
    t0 = _first_token_text(engine, prompt)
    early, late = t0[0:2], t0[3:5]  # both complete in the first token's text
    out = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, stop=[late, early]))[0]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == early
    assert out.text == t0[: t0.index(early)]  # was cut at ``late``, leaving ``early`` in the text
    _drain(engine)


def test_no_stop_string_ends_a_request_before_its_min_tokens(engine):
    prompt = PROMPTS[1]
    full = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop = _first_token_text(engine, prompt)[:2]
    out = engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop], min_tokens=6))[0]
    assert len(out.token_ids) >= 6 and out.token_ids == full.token_ids[: len(out.token_ids)]
    _drain(engine)


def test_a_stop_string_in_the_last_allowed_token_is_a_stop_not_a_length(engine):
    for prompt in PROMPTS + ["the cat sat on the mat", "numbers one two three"]:
        full = engine.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True))[0]
        before = engine.tokenizer.decode(full.token_ids[:2])
        last = full.text[len(before) :]
        stop = next(
            (last[i : i + 2] for i in range(len(last) - 1) if last[i : i + 2] not in full.text[: len(before) + i + 1]),
            None,
        )
        if stop is None:
            continue
        out = engine.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True, stop=[stop]))[0]
        assert (
            out.finish_reason is FinishReason.STOP and out.stop_reason == stop
        )  # was "length": max_tokens ended it too
        assert out.text == full.text[: full.text.index(stop)]
        return
    pytest.fail("no prompt's last token held a new two-character string")


# -- min_tokens keeps stop tokens out ----------------------------------------------------------------
def test_min_tokens_masks_eos_and_stop_tokens_until_reached(engine):
    eos = engine.eos_token_ids[0]
    out = engine.generate(["hello"], SamplingParams(max_tokens=8, min_tokens=4, logit_bias={eos: 50.0}))[0]
    assert eos not in out.token_ids[:4] and out.token_ids[4] == eos and out.finish_reason is FinishReason.STOP
    stop_id = 7
    out = engine.generate(
        ["hello"],
        SamplingParams(
            max_tokens=8, min_tokens=3, stop_token_ids=[stop_id], logit_bias={stop_id: 50.0}, ignore_eos=True
        ),
    )[0]
    assert out.token_ids[:3].count(stop_id) == 0 and out.token_ids[3] == stop_id and out.stop_reason == stop_id
    _drain(engine)


# -- sampling edge values ----------------------------------------------------------------------------
def test_subnormal_temperature_and_top_p_sample_the_top_token_not_token_zero(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    cold = engine.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=1e-40, seed=1, ignore_eos=True))
    narrow = engine.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-46, ignore_eos=True))
    assert [o.token_ids for o in cold] == [o.token_ids for o in greedy] == [o.token_ids for o in narrow]
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-4).greedy


# -- input checks ------------------------------------------------------------------------------------
def test_generate_is_all_or_nothing(engine):
    with pytest.raises(ContextLengthError):
        engine.generate([[5, 6], [5] * 600], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests() and not engine.scheduler.requests  # [5, 6] was left queued
    _drain(engine)


def test_numpy_token_ids_are_accepted_and_other_types_named(engine):
    import numpy as np

    ids = engine.generate([np.array([5, 6, 7])], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids
    assert ids == engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids
    for bad in ([5, 6.0], [5, True], [5, "6"]):
        with pytest.raises(InvalidParameterError, match="must be integers") as e:
            engine.add_request(None, bad, SamplingParams())
        assert e.value.param == "prompt"
    _drain(engine)


def test_resumed_tokens_must_leave_something_to_generate(engine):
    with pytest.raises(InvalidParameterError, match="nothing is left") as e:
        engine.add_request(None, [5, 6], SamplingParams(max_tokens=2, ignore_eos=True), resume_token_ids=[7, 8, 9])
    assert e.value.param == "resume_token_ids"
    with pytest.raises(InvalidParameterError, match="vocabulary") as e:
        engine.add_request(None, [5, 6], SamplingParams(stop_token_ids=[10**6]))
    assert e.value.param == "stop_token_ids"
    assert not engine.has_unfinished_requests()


def test_a_lone_surrogate_in_a_text_prompt_is_named(engine):
    with pytest.raises(InvalidParameterError, match="not valid Unicode") as e:
        engine.add_request(None, "a\ud800b", SamplingParams())
    assert e.value.param == "prompt"


def test_a_resumed_request_sends_the_text_its_first_worker_held_back(engine):
    """Migration: the router resumes a request with the tokens it received and how much of their text;
    the text the first worker held back (here: the possible start of a stop string) must still come."""
    prompt = engine.tokenizer.encode("tell a story")
    sp = SamplingParams(max_tokens=16, ignore_eos=True, stop=["\x00never\x00"])  # holds back 6 characters
    full = engine.generate([prompt], sp)[0]
    rid = engine.add_request(None, prompt, sp)
    tokens: list[int] = []
    delivered = ""
    while len(tokens) < 6:
        for o in engine.step():
            if o.request_id == rid:
                tokens += o.new_token_ids
                delivered += o.text_delta
    engine.abort(rid)  # its worker is gone
    assert len(delivered) < len(engine.tokenizer.decode(full.token_ids[: len(tokens)]))  # some text was held
    resumed = engine.add_request(None, prompt, sp, resume_token_ids=tokens, resume_text_chars=len(delivered))
    text = delivered
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == resumed:
                text += o.text_delta
                if o.finished:
                    assert o.token_ids == full.token_ids and o.text == full.text
    assert text == full.text  # was short by what the first worker held back
    _drain(engine)


def test_a_request_whose_output_stream_fails_to_start_is_not_left_queued(engine, monkeypatch):
    """It was queued before its detokenizer failed: it then ran to its end unseen, holding blocks and
    its id, and the caller never got the id to abort it."""

    def broken(*args, **kwargs):
        raise RuntimeError("detokenizer failed")

    monkeypatch.setattr(engine.output_processor, "add", broken)
    with pytest.raises(RuntimeError):
        engine.add_request("orphan", "hello", SamplingParams(max_tokens=5))
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    _drain(engine)
    assert engine.add_request("orphan", "hello", SamplingParams(max_tokens=2)) == "orphan"  # the id is free
    _drain(engine)


def test_each_delta_says_where_its_tokens_start_resumed_ones_counted(engine):
    """RequestOutput.first_index: the router drops a delta that does not continue what it has
    delivered (a stale copy's, on a worker it had taken for dead)."""
    fresh = engine.add_request(None, [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    resumed = engine.add_request(
        None, [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True), resume_token_ids=[9, 9]
    )
    seen = {fresh: [], resumed: [9, 9]}
    while engine.has_unfinished_requests():
        for o in engine.step():
            assert o.first_index == len(seen[o.request_id]), o
            seen[o.request_id] += o.new_token_ids
    assert len(seen[fresh]) == 6 and len(seen[resumed]) == 6
    rid = engine.add_request(None, [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    got = [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    assert engine.abort(rid).first_index == len(got)


def _fail_once(engine, monkeypatch, after: int = 0):
    """Make the runner raise on its call number ``after`` (0 = the next), without computing anything."""
    real = engine.runner.execute
    calls = {"n": 0}

    def execute(so):
        calls["n"] += 1
        if calls["n"] == after + 1:
            raise RuntimeError("injected step failure")
        return real(so)

    monkeypatch.setattr(engine.runner, "execute", execute)


def test_a_failed_step_ends_its_requests_and_withdraws_the_cache_entries_it_made(engine, monkeypatch):
    """The scheduler enters a step's newly full blocks in the prefix cache as it schedules the step.
    A step that raised left them there with no KV written, and a later request with the same prompt
    reused that garbage."""
    prompt = list(range(100, 100 + 70))  # 4 full blocks of 16, found in no earlier test
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    cached_before = dict(engine.block_manager.pool.cached)
    prompt_tokens_before = engine.scheduler.prompt_tokens_computed
    rid = engine.add_request(None, prompt, sp)
    _fail_once(engine, monkeypatch)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    monkeypatch.undo()
    assert engine.block_manager.pool.cached == cached_before
    assert engine.scheduler.prompt_tokens_computed == prompt_tokens_before  # the router's prefill rate
    assert engine.has_unfinished_requests()  # its final output is still to be sent
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [(rid, True, FinishReason.ERROR)]
    assert not engine.has_unfinished_requests()
    assert engine.num_free_blocks == engine.num_total_blocks

    again = engine.generate([prompt], sp)[0].token_ids  # computes the prompt: nothing cached for it
    assert engine.generate([prompt], sp)[0].token_ids == again  # and now from the cache it made
    other = engine.generate([prompt[:-1] + [7]], sp)[0].token_ids  # same first 4 blocks, a cache hit
    assert engine.block_manager.pool.reset_prefix_cache()
    assert engine.generate([prompt], sp)[0].token_ids == again
    assert engine.generate([prompt[:-1] + [7]], sp)[0].token_ids == other


def test_a_failed_step_mid_generation_spares_the_requests_outside_it(engine, monkeypatch):
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    want = engine.generate(["later request"], sp)[0].token_ids
    rid = engine.add_request(None, "this one fails after a few tokens", SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    _fail_once(engine, monkeypatch)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    later = engine.add_request(None, "later request", sp)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    assert done[rid].finish_reason is FinishReason.ERROR and len(done[rid].token_ids) == 3
    assert done[later].token_ids == want
    _drain(engine)


def test_generate_leaves_no_request_behind_when_a_step_fails(engine, monkeypatch):
    _fail_once(engine, monkeypatch, after=2)
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    assert not engine.has_unfinished_requests()
    assert engine.num_free_blocks == engine.num_total_blocks
    monkeypatch.undo()
    assert len(engine.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))) == len(PROMPTS)


def _plain_stream(engine, params):
    ids = [engine.add_request(None, p, sp) for p, sp in zip([[5, 6, 7], [8, 9], [10, 11, 12, 13]], params)]
    outs = []
    while engine.has_unfinished_requests():
        outs += [
            (
                o.request_id,
                o.new_token_ids,
                o.text_delta,
                o.first_index,
                o.finished,
                o.finish_reason,
                o.token_ids,
                o.logprobs is not None,
                o.ttft_breakdown is not None,
                o.metrics is not None,
            )
            for o in engine.step()
        ]
    rename = {rid: i for i, rid in enumerate(ids)}
    return [(rename[o[0]], *o[1:]) for o in outs]


def test_plain_decoding_deltas_equal_the_general_paths(engine, monkeypatch):
    """The output processor builds a decoding request's plain delta (no text, no logprobs) in its
    loop: the same outputs as the general path gives, first, middle and last."""
    params = [
        SamplingParams(max_tokens=5, ignore_eos=True, detokenize=False),
        SamplingParams(max_tokens=7, ignore_eos=True, detokenize=False, logprobs=1),
        SamplingParams(max_tokens=3, ignore_eos=True),
    ]
    fast = _plain_stream(engine, params)
    import engine.output_processor as op

    monkeypatch.setattr(op, "_DECODING", object())  # no request matches: every delta takes the general path
    general = _plain_stream(engine, params)
    assert fast == general
    assert next(o for o in fast if o[0] == 0)[8] and [o for o in fast if o[0] == 0][-1][9]  # first, last
    assert sum(len(o[1]) for o in fast if o[0] == 0) == 5 and _drain(engine) is None
