"""SmolLM2-135M-Instruct (the default model: 9 heads, 3 KV heads) at tensor parallel 3: greedy
outputs equal transformers token for token (exactly: no near-tie excuse for the default model),
batched, then with the shared system prompt from the prefix cache, chunked and preempted."""

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.test_golden_smollm2 import MAX_NEW, QUESTIONS, SYSTEM

pytestmark = pytest.mark.slow

# Half of test_golden_smollm2's new tokens (a quarter after the cached system prompt): the same
# steps (chunks, prefix hits, preemption) at three ranks, for less decode; the batch still outgrows
# the cache.
MAX_NEW_TP = [n // 2 for n in MAX_NEW]
SHARED_NEW = [n // 4 for n in MAX_NEW[:4]]
BUDGET = 32


def test_tp3_equals_transformers(default_model_dir):
    from engine.model.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(default_model_dir)
    plain = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    shared = [
        tok.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in QUESTIONS[:4]
    ]
    oracle = load_hf(default_model_dir)
    # A 32-token budget chunks every prompt; 12 blocks of 16 tokens cannot hold the batch at once.
    assert min(len(p) for p in plain + shared) > BUDGET
    engine = LLMEngine(
        EngineConfig(
            model=str(default_model_dir),
            tensor_parallel_size=3,
            num_threads=1,
            scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET, admission_watermark=0.0),
            cache=CacheConfig(num_blocks=12),
        )
    )
    try:
        model = engine.runner.model
        assert (model.num_heads, model.num_kv_heads) == (3, 1)
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_NEW_TP]
        got = [o.token_ids for o in engine.generate(plain, params)]
        assert engine.scheduler.num_preemptions > 0
        assert got == hf_greedy(oracle, plain, MAX_NEW_TP)
        shared_params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in SHARED_NEW]
        first = engine.generate(shared[:1], shared_params[:1])
        rest = engine.generate(shared[1:], shared_params[1:])
        assert engine.block_manager.num_prefix_hits > 0
        assert [o.token_ids for o in first + rest] == hf_greedy(oracle, shared, SHARED_NEW)
        assert engine.num_free_blocks == engine.num_total_blocks
    finally:
        engine.close()
