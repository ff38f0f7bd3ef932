"""SmolLM2-135M-Instruct (the default model): greedy outputs equal Hugging Face transformers token for
token for 8 prompts of mixed lengths batched together, and again with prefix caching over shared
prefixes, chunked prefill, a KV pool small enough to force preemption, and n-gram drafts."""

from dataclasses import replace

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import hf_greedy, load_hf

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Summarize the plot of a story where a robot learns to paint, in a short paragraph that a child "
    "could read, with a happy ending and a lesson about patience and practice.",
    "2+2=",
    "Give me a Python function that reverses a string, with a docstring.",
]
MAX_NEW = [24, 32, 40, 16, 12, 40, 8, 32]
SYSTEM = (
    "You are Baton's test assistant. Answer carefully and briefly. This long system prompt is shared by "
    "every conversation so that its KV blocks can be reused from the prefix cache across requests."
)


@pytest.fixture(scope="module")
def oracle(default_model_dir):
    return load_hf(default_model_dir)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from engine.model.tokenizer import Tokenizer

    return Tokenizer.from_dir(default_model_dir)


def _chat(tok, q, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
    return tok.encode_chat(msgs)


def _engine(model_dir, **kw):
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            scheduler=SchedulerConfig(**kw.pop("scheduler", {})),
            cache=CacheConfig(**kw.pop("cache", {})),
            **kw,
        )
    )


def _generate(engine, prompts, max_new):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_new]
    outs = engine.generate(prompts, params)
    assert engine.num_free_blocks == engine.num_total_blocks
    model = engine.runner.model
    # Where the greedy head loads (AVX-512 VNNI), these greedy requests took their tokens from it.
    assert model.greedy_head is None or model.greedy_head_candidates > 0
    # Where AMX loads (Intel Xeon), the prompts' larger products went to it (engine/native/amx_linear.c).
    assert model.kernels.amx is None or all(p.amx is not None for layer in model.layers for p in layer.projections())
    return [o.token_ids for o in outs], outs


def test_batched_greedy_equals_transformers(default_model_dir, oracle, tokenizer):
    prompts = [_chat(tokenizer, q) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) >= 6  # mixed lengths
    got, outs = _generate(_engine(default_model_dir), prompts, MAX_NEW)
    assert got == hf_greedy(oracle, prompts, MAX_NEW)
    assert outs[0].text == tokenizer.decode(got[0])


def test_prefix_cache_chunked_and_preempted_equal_transformers(default_model_dir, oracle, tokenizer):
    prompts = [_chat(tokenizer, q, SYSTEM) for q in QUESTIONS]
    expected = hf_greedy(oracle, prompts, MAX_NEW)

    cached = _engine(default_model_dir, scheduler={"max_num_batched_tokens": 64})
    first, _ = _generate(cached, prompts[:1], MAX_NEW[:1])
    rest, _ = _generate(cached, prompts[1:], MAX_NEW[1:])
    shared = next(i for i, toks in enumerate(zip(*prompts)) if len(set(toks)) > 1)
    assert shared >= 32
    # Every later request found the shared system prompt's full blocks in the cache.
    assert cached.block_manager.num_prefix_hits >= 7 * (shared // 16 * 16)
    assert first + rest == expected

    # A 32-token budget splits every prompt into several chunks; 30 blocks of 16 tokens cannot hold
    # all eight requests at once, so the scheduler must preempt and recompute.
    tight = _engine(
        default_model_dir,
        scheduler={"max_num_batched_tokens": 32, "admission_watermark": 0.0},
        cache={"num_blocks": 30, "enable_prefix_caching": False},
    )
    got, _ = _generate(tight, prompts, MAX_NEW)
    assert tight.scheduler.num_preemptions > 0
    assert got == expected


def test_greedy_with_ngram_drafts_equals_transformers(default_model_dir, oracle, tokenizer):
    # Chat prompts and random-token prompts (on these SmolLM2 falls into loops that drafts predict).
    import random

    rng = random.Random(0)
    prompts = [_chat(tokenizer, q) for q in QUESTIONS[:4]] + [
        [rng.randrange(100, 40000) for _ in range(rng.randint(20, 80))] for _ in range(4)
    ]
    max_new = [24, 32, 40, 16, 48, 48, 40, 32]
    engine = _engine(default_model_dir, scheduler={"speculative": SpeculativeConfig(num_tokens=4)})
    got, _ = _generate(engine, prompts, max_new)
    assert got == hf_greedy(oracle, prompts, max_new)
    s = engine.scheduler
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens


def _greedy_head_engine(model_dir):
    """An engine whose model has the greedy head, and the model; skips where it does not load."""
    engine = _engine(model_dir)
    if engine.runner.model.greedy_head is None:
        pytest.skip("the greedy head needs a GGUF Q8_0 head and AVX-512 VNNI: not here")
    return engine, engine.runner.model


def _use_greedy_head(model, kernels, on: bool) -> None:
    """Greedy rows from the greedy head (``on``) or from every logit: the model's kernel set
    ``kernels`` with or without the kernel."""
    model.use_kernels(kernels if on else replace(kernels, greedy_head=None))


def test_the_greedy_head_gives_the_full_heads_tokens(default_model_dir):
    """Greedy rows' tokens from the screened head (engine/native/greedy_head.c) against the full
    head and its argmax, on the offline workload's kind of prompts (random tokens: flat, loopy
    distributions) with and without drafts: the same tokens, and the screen computed few logits."""
    import random

    engine, model = _greedy_head_engine(default_model_dir)
    kernels = model.kernels
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(16, 96))] for _ in range(12)]
    max_new = [rng.randint(8, 40) for _ in prompts]
    outputs = {}
    for on in (True, False):
        _use_greedy_head(model, kernels, on)
        outputs[on], _ = _generate(engine, prompts, max_new)
    assert outputs[True] == outputs[False]
    steps = sum(max_new)
    assert 0 < model.greedy_head_candidates < 64 * steps  # a few exact logits a token, not 49,152
    drafted = _engine(default_model_dir, scheduler={"speculative": SpeculativeConfig(num_tokens=4)})
    assert _generate(drafted, prompts, max_new)[0] == outputs[False]


def test_a_step_mixing_greedy_and_sampled_rows_screens_the_greedy_ones(default_model_dir):
    """Greedy rows take the greedy head while, in the same steps, seeded sampled rows and a greedy
    row with a repetition penalty take their own logits: every request gets the tokens it gets with
    every logit computed."""
    import random

    engine, model = _greedy_head_engine(default_model_dir)
    kernels = model.kernels
    rng = random.Random(2)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(16, 64))] for _ in range(6)]
    for i in (1, 2, 4):  # a phrase over and over: the n-grams propose drafts for these rows too
        prompts[i] = [rng.randrange(100, 40000) for _ in range(6)] * 8
    params = [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.0, seed=5),
        SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(max_tokens=16, ignore_eos=True),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.9, top_p=0.95, seed=7),
        SamplingParams(max_tokens=12, ignore_eos=True),
    ]
    outputs = {}
    for on in (True, False):
        _use_greedy_head(model, kernels, on)
        before = model.greedy_head_candidates
        outputs[on] = [o.token_ids for o in engine.generate(prompts, params)]
        assert (model.greedy_head_candidates > before) == on
    assert outputs[True] == outputs[False]
    assert engine.num_free_blocks == engine.num_total_blocks
    # With drafts: a sampled position's seed index and penalty history follow the drafts before it.
    drafted = _engine(
        default_model_dir, scheduler={"speculative": SpeculativeConfig(num_tokens=4, min_keep_chance=0.0)}
    )
    before = drafted.runner.model.greedy_head_candidates
    assert [o.token_ids for o in drafted.generate(prompts, params)] == outputs[False]
    assert drafted.runner.model.greedy_head_candidates > before and drafted.scheduler.num_draft_tokens > 0


def test_greedy_rows_are_screened_beside_rows_that_want_logprobs(default_model_dir):
    """A row asking for logprobs needs its logits, but not the others': plain greedy rows still take
    the greedy head in those steps (every logit was computed for every row). Tokens are those of
    the full head; logprobs too, to fp32's rounding (the head's rows computed in another grouping
    differ in the last bits: ~1e-6 here)."""
    import random

    engine, model = _greedy_head_engine(default_model_dir)
    kernels = model.kernels
    rng = random.Random(3)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(16, 64))] for _ in range(5)]
    params = [
        SamplingParams(max_tokens=20, ignore_eos=True),
        SamplingParams(max_tokens=16, ignore_eos=True, logprobs=3),  # greedy, with logprobs
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, seed=11, logprobs=0),
        SamplingParams(max_tokens=12, ignore_eos=True),
        SamplingParams(max_tokens=18, ignore_eos=True, repetition_penalty=1.2, logprobs=1),
    ]
    outputs = {}
    for on in (True, False):
        _use_greedy_head(model, kernels, on)
        before = model.greedy_head_candidates
        outs = engine.generate(prompts, params)
        outputs[on] = [(o.token_ids, o.logprobs) for o in outs]
        assert (model.greedy_head_candidates > before) == on
    assert [ids for ids, _ in outputs[True]] == [ids for ids, _ in outputs[False]]
    assert [lp is None for _, lp in outputs[True]] == [True, False, False, True, False]
    for (ids, screened), (_, full) in zip(outputs[True], outputs[False]):
        if screened is None:
            continue
        assert len(screened) == len(full) == len(ids)
        for a, b in zip(screened, full):
            assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-5)
    # With drafts: a drafted row's positions that ask for logprobs are among the rows computed alone.
    for i in (1, 4):
        prompts[i] = prompts[i][:6] * 8  # a phrase over and over: the n-grams propose drafts
    drafted = _engine(
        default_model_dir, scheduler={"speculative": SpeculativeConfig(num_tokens=4, min_keep_chance=0.0)}
    )
    if drafted.runner.model.greedy_head is None:
        return
    _use_greedy_head(model, kernels, False)
    full = engine.generate(prompts, params)
    got = drafted.generate(prompts, params)
    assert drafted.scheduler.num_draft_tokens > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in full]
    for a, b in zip(got, full):
        assert (a.logprobs is None) == (b.logprobs is None)
        if a.logprobs is not None:
            assert [x.token_id for x in a.logprobs] == [x.token_id for x in b.logprobs]
            assert [x.logprob for x in a.logprobs] == pytest.approx([x.logprob for x in b.logprobs], abs=1e-5)
    assert engine.num_free_blocks == engine.num_total_blocks
