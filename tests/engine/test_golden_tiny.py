"""Greedy outputs equal Hugging Face transformers token for token on tiny seeded Llama/Qwen2/Mistral models:
batched together, with chunked prefill, shared prefixes (prefix caching) and forced preemption."""

import random

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf

ARCHS = ["llama", "qwen2", "llama3", "mistral"]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    d = build_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param, seed=1)
    return d, load_hf(d)


def _prompts(seed=0, n=8, shared_prefix=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(rng.randint(1, 70))] for _ in range(n)]
    max_new = [rng.randint(1, 24) for _ in range(n)]
    return prompts, max_new


def _engine(model_dir, **kw):
    sched = kw.pop("scheduler", {})
    cache = kw.pop("cache", {})
    # fp32 on every device, like the oracle: on a GPU machine this checks the CUDA path (Triton
    # attention) token for token instead of comparing bf16 against fp32.
    return LLMEngine(
        EngineConfig(
            model=str(model_dir), dtype="float32", scheduler=SchedulerConfig(**sched), cache=CacheConfig(**cache), **kw
        )
    )


def _run(engine, prompts, max_new):
    params = [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]
    outs = engine.generate(prompts, params)
    assert engine.num_free_blocks == engine.num_total_blocks  # nothing leaked
    return [o.token_ids for o in outs]


def test_batched_equals_hf(tiny):
    d, hf = tiny
    prompts, max_new = _prompts(0)
    assert _run(_engine(d), prompts, max_new) == hf_greedy(hf, prompts, max_new)


def test_chunked_prefill_equals_hf(tiny):
    d, hf = tiny
    prompts, max_new = _prompts(1)
    eng = _engine(d, scheduler={"max_num_batched_tokens": 16}, cache={"block_size": 8})
    assert _run(eng, prompts, max_new) == hf_greedy(hf, prompts, max_new)


def test_prefix_caching_equals_hf(tiny):
    d, hf = tiny
    prompts, max_new = _prompts(2, shared_prefix=40)
    eng = _engine(d, cache={"block_size": 8})
    first = _run(eng, prompts[:1], max_new[:1])  # warm the cache with the shared prefix
    hits_before = eng.block_manager.num_prefix_hits
    rest = _run(eng, prompts[1:], max_new[1:])
    assert eng.block_manager.num_prefix_hits - hits_before >= 7 * 40 // 8 * 8
    assert first + rest == hf_greedy(hf, prompts, max_new)


def test_preemption_equals_hf(tiny):
    d, hf = tiny
    prompts, max_new = _prompts(3, n=10)
    max_new = [24] * len(prompts)
    eng = _engine(d, cache={"block_size": 4, "num_blocks": 40}, scheduler={"admission_watermark": 0.0})
    got = _run(eng, prompts, max_new)
    assert eng.scheduler.num_preemptions > 0
    assert got == hf_greedy(hf, prompts, max_new)
