"""N-gram speculative decoding (engine/spec_decode.py): the proposer against a brute-force search, the
runner's batch with drafts, and the engine with drafts on against transformers' greedy outputs and
against the same engine without drafts (stops inside a run of drafts, sampled and logprob requests
in the same batch, chunked prefill, preemption, prefix caching, static batching), with no block
leaked."""

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import BlockManager
from engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from engine.draft_state import INITIAL_KEEP_RATE, DraftState
from engine.engine import LLMEngine
from engine.input_batch import InputBatch
from engine.output_processor import OutputProcessor
from engine.request import FinishReason, Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import NewRequestData, RunnerOutput, SchedulerOutput
from engine.spec_decode import PROBE_EVERY, NgramProposer
from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf


def _brute_force(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The k tokens after the latest earlier occurrence of the longest suffix (max_ngram .. min_ngram)."""
    n = len(tokens)
    for m in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = tokens[n - m :]
        for end in range(n - 2, m - 2, -1):  # an occurrence ending before the last token
            if tokens[end - m + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + k]
    return []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=60),
    st.integers(1, 6),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(1, 8),
)
def test_proposals_equal_a_brute_force_search_as_the_sequence_grows(tokens, k, max_ngram, min_gap, steps):
    min_ngram = max(1, max_ngram - min_gap)
    proposer = NgramProposer(
        SpeculativeConfig(num_tokens=k, max_ngram=max_ngram, min_ngram=min_ngram, min_keep_chance=0)
    )
    req = Request("r", tokens[:1], SamplingParams())
    rng = random.Random(len(tokens))
    # Grow the sequence by uneven amounts between proposals, as kept drafts do.
    i = 1
    while i <= len(tokens):
        req.all_token_ids = tokens[:i]
        assert proposer.propose(req, limit=k) == _brute_force(tokens[:i], k, max_ngram, min_ngram)
        i += rng.randint(1, steps)


def test_a_proposal_is_capped_by_its_limit_and_needs_an_earlier_match():
    proposer = NgramProposer(SpeculativeConfig(num_tokens=4, max_ngram=2, min_keep_chance=0))
    req = Request("r", [1, 2, 3, 4, 5, 1, 2], SamplingParams())
    assert proposer.propose(req, limit=10) == [3, 4, 5, 1]
    assert proposer.propose(req, limit=2) == [3, 4]
    assert proposer.propose(req, limit=0) == []
    assert proposer.propose(Request("s", [1, 2, 3], SamplingParams()), limit=4) == []


def test_the_draft_length_follows_the_keep_rate():
    """k is the largest with rate^k >= the chance; kept drafts raise the rate, a run's first miss
    lowers it (the drafts after it are not counted); a rate too low drafts one token every
    PROBE_EVERY steps."""
    proposer = NgramProposer(SpeculativeConfig(num_tokens=6, min_keep_chance=0.5))
    state = DraftState(3)
    assert state.keep_rate == INITIAL_KEEP_RATE == 0.8 and proposer.draft_length(state) == 3  # 0.8^3 >= 0.5 > 0.8^4
    proposer.record(state, 3, 3)  # all kept: 1 - 0.2 * 0.8^3
    assert state.keep_rate == pytest.approx(1 - 0.2 * 0.8**3) and proposer.draft_length(state) == 6
    proposer.record(state, 6, 0)  # missed at once: one miss judged
    assert state.keep_rate == pytest.approx((1 - 0.2 * 0.8**3) * 0.8)
    before = state.keep_rate
    proposer.record(state, 4, 2)  # two kept, then the first miss; the fourth never judged
    assert state.keep_rate == pytest.approx((1 - (1 - before) * 0.8**2) * 0.8)
    state.keep_rate = 0.45  # below the chance: nothing, then a probe of one token
    lengths = [proposer.draft_length(state) for _ in range(2 * PROBE_EVERY)]
    assert lengths == ([0] * (PROBE_EVERY - 1) + [1]) * 2
    for _ in range(10_000):  # misses without end never reach a rate of 0
        proposer.record(state, 1, 0)
    assert state.keep_rate > 0 and proposer.draft_length(state) == 0
    fixed = NgramProposer(SpeculativeConfig(num_tokens=5, min_keep_chance=0))
    assert fixed.draft_length(state) == 5  # no adaptation: always num_tokens


@pytest.mark.parametrize(
    "bad",
    [
        {"num_tokens": 0},
        {"num_tokens": 33},
        {"max_ngram": 0},
        {"max_ngram": 2, "min_ngram": 3},
        {"num_tokens": 2.5},
        {"min_keep_chance": 1.0},
        {"min_keep_chance": -0.1},
        {"min_keep_chance": True},
    ],
)
def test_bad_speculative_settings_are_refused(bad):
    with pytest.raises(ValueError, match="speculative"):
        SpeculativeConfig(**bad)


def test_a_draft_count_of_zero_is_off_and_a_negative_one_is_named():
    assert SpeculativeConfig.from_num_tokens(0) is None
    assert SpeculativeConfig.from_num_tokens(3) == SpeculativeConfig(num_tokens=3)
    with pytest.raises(ValueError, match="--speculative-tokens must be 0"):
        SpeculativeConfig.from_num_tokens(-1, "--speculative-tokens")
    with pytest.raises(ValueError, match="speculative num_tokens"):
        SpeculativeConfig.from_num_tokens(33)


def test_the_scheduler_config_takes_only_a_speculative_config():
    with pytest.raises(ValueError, match="speculative"):
        SchedulerConfig(speculative={"num_tokens": 4})  # type: ignore[arg-type]  # the wrong type is the subject


def test_a_row_with_drafts_computes_them_as_decode_tokens_and_samples_every_one():
    batch = InputBatch(max_num_seqs=4, max_model_len=64, block_size=4)
    new = [
        NewRequestData("a", 0, [5, 6, 7, 8, 9], [10, 11], 4, 3, SamplingParams()),
        NewRequestData("b", 1, [1, 2, 3], [20], 0, 3, SamplingParams()),
    ]
    so = SchedulerOutput(new, {}, ["a", "b"], [0, 1], [3, 3], 6, set(), spec_token_ids={0: [40, 41]})
    batch.apply(so)
    x = batch.prepare(so)
    # Row 0: its last token (position 4) and two drafts (5, 6) as three decode tokens; row 1's
    # prompt chunk after them.
    assert x.num_decode_tokens == 3
    assert x.input_ids.tolist() == [9, 40, 41, 1, 2, 3]
    assert x.positions.tolist() == [4, 5, 6, 0, 1, 2]
    assert x.decode_seq_lens.tolist() == [5, 6, 7]
    assert x.decode_block_tables.tolist() == [[10, 11]] * 3
    assert x.slot_block.tolist() == [11, 11, 11, 20, 20, 20] and x.slot_offset.tolist() == [0, 1, 2, 0, 1, 2]
    assert x.logits_indices.tolist() == [0, 1, 2, 5] and x.sample_rows.tolist() == [0, 0, 0, 1]
    # One draft kept, then the model's own token: two known tokens more, KV computed up to the kept draft.
    batch.take_verified(0, 1, 77)
    assert batch.token_ids[0, :7].tolist() == [5, 6, 7, 8, 9, 40, 77]
    assert batch.num_tokens[0] == 7 and batch.num_computed[0] == 6
    # The next step has no drafts: nothing of them is left in the batch.
    plain = SchedulerOutput([], {}, ["a"], [0], [1], 1, set())
    batch.apply(plain)
    assert not batch.draft_rows and batch.num_drafts[0] == 0
    assert batch.prepare(plain).input_ids.tolist() == [77]


# -- the scheduler, driven by hand ---------------------------------------------------------
def _decoding(max_tokens=20, budget=64, stop=(), num_blocks=16):
    """A scheduler with drafts on, and one request decoding (prompt 10..15, first token 50)."""
    config = SchedulerConfig(max_num_batched_tokens=budget, speculative=SPEC)
    sched = Scheduler(config, BlockManager(num_blocks, 4), 128)
    r = Request(
        "r", list(range(10, 16)), SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=list(stop))
    )
    sched.add_request(r)
    while r.state is not RequestState.DECODING:  # the prompt, in chunks of at most the budget
        sched.schedule()
        done = r.num_computed_tokens == len(r.all_token_ids)
        sched.update_from_output(RunnerOutput([r.slot], [50]) if done else RunnerOutput([], []))
    assert r.num_computed_tokens == 6 and r.output_token_ids == [50]
    return sched, r


def test_a_kept_stop_token_ends_the_request_there_and_the_rest_is_dropped():
    sched, r = _decoding(stop=[8])
    r.spec_token_ids = [7, 8, 9]
    so = sched.schedule()
    assert so.counts == [4] and so.spec_token_ids == {r.slot: [7, 8, 9]}
    slot = r.slot
    sched.update_from_output(RunnerOutput([slot], [11], accepted_draft_ids={slot: [7, 8, 9]}))
    assert r.output_token_ids == [50, 7, 8]
    assert r.finish_reason is FinishReason.STOP and r.stop_reason == 8
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_rejected_drafts_give_back_their_positions_and_kept_ones_count_as_computed():
    sched, r = _decoding()
    r.spec_token_ids = [7, 8, 9]
    sched.schedule()
    assert r.num_computed_tokens == 10  # advanced over the last token and the three drafts
    sched.update_from_output(RunnerOutput([r.slot], [60], accepted_draft_ids={r.slot: [7]}))
    assert r.output_token_ids == [50, 7, 60]
    assert r.num_computed_tokens == 8  # the last token and the kept draft: position 8 is next
    assert r.num_registered_blocks == 2  # the block the kept draft filled is in the prefix cache now
    assert sched.num_draft_tokens == 3 and sched.num_accepted_tokens == 1
    assert r.spec_token_ids == []  # no earlier occurrence of (..., 7, 60)


def test_max_tokens_bounds_the_drafts_and_a_short_budget_cuts_them():
    sched, r = _decoding(budget=2)
    r.spec_token_ids = [7, 8, 9]
    so = sched.schedule()
    assert so.counts == [2] and so.spec_token_ids == {r.slot: [7]}
    sched.update_from_output(RunnerOutput([r.slot], [61], accepted_draft_ids={r.slot: [7]}))
    assert r.output_token_ids == [50, 7, 61] and r.num_computed_tokens == 8
    # Three tokens short of max_tokens: two drafts at most (both may be kept, and one token more).
    sched, r = _decoding(max_tokens=6)
    r.all_token_ids += [10, 11]  # (prompt 10..15, then 50, 10, 11: "10 11" occurred before)
    r.num_computed_tokens = len(r.all_token_ids) - 1
    sched.speculation.draft([r])
    assert r.spec_token_ids == [12, 13]


def test_a_preempted_request_drops_its_drafts():
    sched, r = _decoding()
    r.spec_token_ids = [7, 8]
    sched.lifecycle.preempt(r)
    assert r.spec_token_ids == [] and r.state is RequestState.PREEMPTED


# -- the engine -----------------------------------------------------------------------------
ARCHS = ["llama", "qwen2"]
# Without adaptation: these tests are about verification, so every chance to draft is taken.
SPEC = SpeculativeConfig(num_tokens=4, max_ngram=3, min_keep_chance=0)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    # Smaller weights than the other golden tests': these models' greedy outputs fall into loops, as
    # SmolLM2's do on random prompts, so drafts are kept (and missed) often enough to test both.
    d = build_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param, seed=1, initializer_range=0.1)
    return d, load_hf(d)


def _prompts(seed, n=8, shared_prefix=0, vocab=40):
    """Prompts over a few tokens: they repeat, so the drafts find matches (and miss some)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(2, 40))] for _ in range(n)]


def _engine(model_dir, spec=SPEC, **kw):
    sched = dict(kw.pop("scheduler", {}), speculative=spec)
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            scheduler=SchedulerConfig(**sched),
            cache=CacheConfig(**kw.pop("cache", {})),
            **kw,
        )
    )


def _run(engine, prompts, params):
    outs = engine.generate(prompts, params)
    assert engine.num_free_blocks == engine.num_total_blocks  # nothing leaked
    return outs


def _greedy(max_new):
    return [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]


def _drafted(engine):
    s = engine.scheduler
    return s.num_draft_tokens, s.num_accepted_tokens


@pytest.mark.parametrize("case", ["batched", "chunked", "preempted"])
def test_greedy_with_drafts_equals_transformers(tiny, case):
    d, hf = tiny
    prompts = _prompts({"batched": 0, "chunked": 1, "preempted": 2}[case])
    max_new = [random.Random(i).randint(8, 40) for i in range(len(prompts))]
    cases: dict[str, dict[str, Any]] = {
        "chunked": {"scheduler": {"max_num_batched_tokens": 12}, "cache": {"block_size": 8}},
        "preempted": {"scheduler": {"admission_watermark": 0.0}, "cache": {"block_size": 4, "num_blocks": 48}},
        "batched": {},
    }
    kw = cases[case]
    eng = _engine(d, **kw)
    got = [o.token_ids for o in _run(eng, prompts, _greedy(max_new))]
    assert got == hf_greedy(hf, prompts, max_new)
    drafted, kept = _drafted(eng)
    assert 0 < kept < drafted  # drafts were kept, and some were not
    if case == "preempted":
        assert eng.scheduler.num_preemptions > 0
    if case == "chunked":  # a 12-token budget cut some steps' drafts short, and the outputs held
        assert eng.num_steps > sum(max_new) // 12


def test_prefix_caching_with_drafts_equals_transformers(tiny):
    d, hf = tiny
    prompts = _prompts(3, shared_prefix=24)
    max_new = [24] * len(prompts)
    eng = _engine(d, cache={"block_size": 4})
    first = [o.token_ids for o in _run(eng, prompts[:1], _greedy(max_new[:1]))]
    hits = eng.block_manager.num_prefix_hits
    rest = [o.token_ids for o in _run(eng, prompts[1:], _greedy(max_new[1:]))]
    assert eng.block_manager.num_prefix_hits - hits >= 7 * 24
    assert first + rest == hf_greedy(hf, prompts, max_new)
    # A request whose whole prompt and output another one computed (drafts kept included) hits
    # the blocks that output filled.
    again = _engine(d, cache={"block_size": 4})
    out = _run(again, prompts[:1], _greedy([24]))[0]
    before = again.block_manager.num_prefix_hits
    _run(again, [prompts[0] + out.token_ids[:16]], _greedy([4]))
    assert again.block_manager.num_prefix_hits - before >= (len(prompts[0]) + 16) // 4 * 4 - 4


def test_stops_inside_a_run_of_drafts_end_where_plain_decoding_ends(tiny):
    d, _ = tiny
    prompts = _prompts(4)
    plain = _run(_engine(d, spec=None), prompts, _greedy([40] * len(prompts)))
    # Stop at a token each plain output reaches midway: the drafted engine must stop at its first
    # occurrence too, even when a kept draft is that token and more drafts follow it.
    params = [
        SamplingParams(max_tokens=40, ignore_eos=True, detokenize=False, stop_token_ids=[o.token_ids[12]])
        for o in plain
    ]
    want = _run(_engine(d, spec=None), prompts, params)
    eng = _engine(d)
    got = _run(eng, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [FinishReason.STOP] * len(prompts)
    assert _drafted(eng)[1] > 0


def test_sampled_and_logprob_requests_share_the_batch_with_drafted_ones(tiny):
    d, _ = tiny
    prompts = _prompts(5, n=6)
    params = [
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False),
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False, temperature=0.9, seed=7),
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False, logprobs=2),
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False, repetition_penalty=1.3),
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False),
        SamplingParams(max_tokens=30, ignore_eos=True, detokenize=False, temperature=0.5, top_k=5, seed=3),
    ]
    want = _run(_engine(d, spec=None), prompts, params)
    eng = _engine(d)
    got = _run(eng, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [t.token_id for t in got[2].logprobs] == want[2].token_ids
    np.testing.assert_allclose(
        [t.logprob for t in got[2].logprobs], [t.logprob for t in want[2].logprobs], rtol=1e-4, atol=1e-5
    )
    assert _drafted(eng)[1] > 0


SAMPLED: list[dict[str, Any]] = [
    dict(temperature=0.8, seed=11),
    dict(temperature=1.0, top_k=8, seed=12),
    dict(temperature=0.7, top_p=0.9, seed=13),
    dict(temperature=0.9, min_p=0.05, seed=14),
    dict(temperature=0.6, repetition_penalty=1.1, seed=15),
    dict(frequency_penalty=0.3, presence_penalty=0.2),
    dict(temperature=0.8, min_tokens=20, stop_token_ids=[5, 6, 7], seed=16),
    dict(logit_bias=((9, 2.0), (10, -3.0)), temperature=0.5, seed=17),
]


def test_sampled_and_processed_requests_are_drafted_and_get_plain_decodings_tokens(tiny):
    """Each drafted position samples with the noise of its own output index (seeded) and the
    penalties' history and min_tokens count of the drafts before it: a seeded or greedy request's
    tokens are plain decoding's, drafts or not."""
    d, _ = tiny
    prompts = _prompts(8, n=len(SAMPLED))
    params = [SamplingParams(max_tokens=40, ignore_eos=True, detokenize=False, **kw) for kw in SAMPLED]
    want = _run(_engine(d, spec=None), prompts, params)
    eng = _engine(d)
    got = _run(eng, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert not set(got[6].token_ids[:19]) & {5, 6, 7}  # min_tokens held inside runs of drafts
    drafted, kept = _drafted(eng)
    assert 0 < kept < drafted


def test_penalties_at_a_drafted_position_count_the_drafts_before_it(tiny):
    """Frequency and presence penalties at a drafted position see the drafts before it in the
    output, as plain decoding would have generated them: greedy requests, drafts or not, the same."""
    d, _ = tiny
    prompts = _prompts(10, n=12)
    params = [
        SamplingParams(max_tokens=40, ignore_eos=True, detokenize=False, frequency_penalty=f, presence_penalty=p)
        for f in (0.05, 0.1, 0.2, -0.1)
        for p in (0.0, 0.1, -0.05)
    ]
    want = _run(_engine(d, spec=None), prompts, params)
    eng = _engine(d)
    got = _run(eng, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert _drafted(eng)[1] > 0


def test_requests_whose_drafts_miss_draft_less_and_keep_their_tokens(tiny):
    """The keep-rate adaptation: greedy requests whose drafts are kept often enough go on drafting,
    with fewer misses per draft than without it; requests sampled at a high temperature, whose
    drafts miss, draft far less. The tokens are plain decoding's either way."""
    d, _ = tiny
    prompts = _prompts(11, n=6)
    greedy = _greedy([40] * 6)
    hot = [SamplingParams(max_tokens=40, ignore_eos=True, detokenize=False, temperature=1.5, seed=i) for i in range(6)]
    adaptive = SpeculativeConfig(num_tokens=4, max_ngram=3)  # min_keep_chance 0.5
    counts = {}
    for name, params in (("greedy", greedy), ("hot", hot)):
        want = [o.token_ids for o in _run(_engine(d, spec=None), prompts, params)]
        for spec in (SPEC, adaptive):
            eng = _engine(d, spec=spec)
            assert [o.token_ids for o in _run(eng, prompts, params)] == want
            counts[name, spec.min_keep_chance] = _drafted(eng)
    (g_fixed, g_kept_fixed), (g_adapt, g_kept_adapt) = counts["greedy", 0], counts["greedy", 0.5]
    (h_fixed, h_kept_fixed), (h_adapt, _) = counts["hot", 0], counts["hot", 0.5]
    assert g_kept_adapt > 0 and g_kept_adapt / g_adapt > g_kept_fixed / g_fixed  # fewer misses per draft
    assert h_kept_fixed / h_fixed < 0.5  # hot drafts mostly miss ...
    assert h_adapt < 0.5 * h_fixed  # ... and are mostly not drafted


def test_logprobs_of_kept_drafts_are_plain_decodings(tiny):
    d, _ = tiny
    prompts = _prompts(9, n=4)
    params = [
        SamplingParams(
            max_tokens=30, ignore_eos=True, detokenize=False, logprobs=k, seed=3, temperature=0.0 if k != 2 else 0.7
        )
        for k in (0, 1, 2, 5)
    ]
    want = _run(_engine(d, spec=None), prompts, params)
    eng = _engine(d)
    got = _run(eng, prompts, params)
    assert _drafted(eng)[1] > 0
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert [t.token_id for t in g.logprobs] == g.token_ids  # one per token, in order
        np.testing.assert_allclose(
            [t.logprob for t in g.logprobs], [t.logprob for t in w.logprobs], rtol=1e-4, atol=1e-5
        )
        assert [[a for a, _ in t.top] for t in g.logprobs] == [[a for a, _ in t.top] for t in w.logprobs]


def test_a_stop_string_inside_a_run_of_drafts_ends_the_output_at_its_token(tiny_model_dir, monkeypatch):
    """A step that keeps drafts appends several tokens; a stop string completed by one of them ends
    the output at that token (the ones after it taken back, with their logprobs), as plain
    decoding would have stopped there."""
    prompts = [
        p
        for p in ("the cat sat on the mat and the cat sat on the", "a b c a b c a b", "once upon a time once upon")
        for _ in range(3)
    ]
    base: dict[str, Any] = dict(max_tokens=60, ignore_eos=True, logprobs=1)
    plain = _run(_engine(tiny_model_dir, spec=None), prompts, SamplingParams(**base))
    # 12 characters ending late in each output, where it repeats itself and drafts are kept.
    stops = [o.text[int(len(o.text) * f) - 12 : int(len(o.text) * f)] for o, f in zip(plain, [0.6, 0.75, 0.9] * 3)]
    params = [SamplingParams(**base, stop=[s]) for s in stops]
    want = _run(_engine(tiny_model_dir, spec=None), prompts, params)
    taken_back = []
    take_back = OutputProcessor._take_back
    monkeypatch.setattr(
        OutputProcessor, "_take_back", staticmethod(lambda req, st, n: (taken_back.append(n), take_back(req, st, n)))
    )
    got = _run(_engine(tiny_model_dir), prompts, params)
    assert taken_back  # some stop string was completed before the end of a run of kept drafts
    for g, w in zip(got, want):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        )
        assert [t.token_id for t in g.logprobs] == g.token_ids
    assert all(o.finish_reason is FinishReason.STOP for o in got)


def test_static_batching_with_drafts_gives_the_same_tokens(tiny):
    d, _ = tiny
    prompts = _prompts(6, n=6)
    max_new = [5, 30, 12, 30, 3, 20]
    static = {"scheduler": {"policy": "static", "static_batch_size": 3}}
    want = [o.token_ids for o in _run(_engine(d, spec=None, **static), prompts, _greedy(max_new))]
    eng = _engine(d, **static)
    assert [o.token_ids for o in _run(eng, prompts, _greedy(max_new))] == want
    assert _drafted(eng)[1] > 0


def test_a_request_at_the_end_of_the_context_is_never_drafted_past_it(tiny):
    d, _ = tiny
    prompts = _prompts(7, n=2)
    eng = _engine(d, max_model_len=64)
    outs = _run(eng, prompts, _greedy([64 - len(p) for p in prompts]))
    want = _run(_engine(d, spec=None, max_model_len=64), prompts, _greedy([64 - len(p) for p in prompts]))
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert all(len(p) + len(o.token_ids) == 64 for p, o in zip(prompts, outs))
