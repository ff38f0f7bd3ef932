"""Tensor parallel (engine/parallel/): greedy outputs of a sharded engine equal TP 1 and transformers
token for token, batched, with chunked prefill, prefix caching and preemption in one run; KV heads
split (TP 2) and replicated (TP 4 over 2 KV heads); a rank holds 1/N of the projection weights.

Each engine starts N-1 local rank processes with one torch thread each (gloo on CPU).
"""

import random

import pytest

from engine.config import EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model, hf_greedy, load_hf
from tests.engine.parallel.conftest import tp_engine


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    d = build_tiny_hf_model(tmp_path_factory.mktemp(f"tp-{request.param}"), request.param, seed=1)
    return d, load_hf(d)


def _prompts(seed, n=8, shared_prefix=24):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    return prompts, [rng.randint(8, 20) for _ in range(n)]


def _engine(model_dir, tp, **cache):
    # Small blocks, a small pool and a 16-token budget: chunked prefill and preemption in every run.
    return tp_engine(model_dir, tp, SchedulerConfig(max_num_batched_tokens=16, admission_watermark=0.0), **cache)


def _run(engine, prompts, max_new):
    params = [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in max_new]
    first = engine.generate(prompts[:1], params[:1])  # warms the prefix cache with the shared prefix
    rest = engine.generate(prompts[1:], params[1:])
    assert engine.num_free_blocks == engine.num_total_blocks  # nothing leaked
    return [o.token_ids for o in first + rest]


def _projection_numel(engine):
    return sum(p.weight.numel() for layer in engine.runner.model.layers for p in layer.projections())


@pytest.mark.parametrize("tp", [2])
def test_tp_equals_tp1_and_hf_batched_chunked_prefix_cached_preempted(tiny, tp):
    d, hf = tiny
    prompts, max_new = _prompts(0)
    want = hf_greedy(hf, prompts, max_new)
    one = _engine(d, 1, num_blocks=40)
    assert _run(one, prompts, max_new) == want
    eng = _engine(d, tp, num_blocks=40)
    try:
        got = _run(eng, prompts, max_new)
        assert eng.scheduler.num_preemptions > 0
        assert eng.block_manager.num_prefix_hits > 0
        assert got == want
        # The rank holds 1/N of the projections (8 heads and 2 KV heads split evenly in two).
        assert _projection_numel(eng) * tp == _projection_numel(one)
        assert eng.runner.kv_cache.shape[-2] == 1  # its KV head only
    finally:
        eng.close()


def test_tp4_replicates_two_kv_heads(tmp_path):
    d = build_tiny_hf_model(tmp_path, "llama", seed=2)
    prompts, max_new = _prompts(1, n=5)
    eng = _engine(d, 4)
    try:
        assert eng.runner.kv_cache.shape[-2] == 1  # one KV head per rank, each held by two ranks
        assert _run(eng, prompts, max_new) == hf_greedy(load_hf(d), prompts, max_new)
    finally:
        eng.close()


def test_a_size_that_does_not_divide_the_heads_is_refused_at_start(tmp_path):
    d = build_tiny_hf_model(tmp_path, "llama", seed=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the model's 8 attention heads"):
        LLMEngine(EngineConfig(model=str(d), tensor_parallel_size=3, num_threads=1))
