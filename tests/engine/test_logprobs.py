"""Logprobs of generated tokens equal transformers' log-softmax of the same positions' logits (the
raw distribution, whatever the sampling settings), with the top alternatives in order; one per
token through chunked prefill and preemption; none unless asked for."""

from typing import Any

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.logprobs import compute_logprobs
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model, load_hf

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [300, 17, 2, 99], list(range(40, 100))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = build_tiny_hf_model(tmp_path_factory.mktemp("lp"), "qwen2", seed=3)
    return d, load_hf(d)


def _hf_logprobs(hf, prompt, generated):
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + generated])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)], dim=-1)


def _check(hf, prompts, outs, k):
    for prompt, out in zip(prompts, outs):
        assert len(out.logprobs) == len(out.token_ids)
        ref = _hf_logprobs(hf, prompt, out.token_ids)
        for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            assert lp.token_id == tok
            assert lp.logprob == pytest.approx(ref[i, tok].item(), abs=1e-4)
            assert len(lp.top) == k
            values = [v for _, v in lp.top]
            assert values == sorted(values, reverse=True)
            assert values == pytest.approx(ref[i].topk(k).values.tolist(), abs=1e-4)


@pytest.mark.parametrize("setup", ["batched", "chunked_and_preempted"])
def test_greedy_logprobs_equal_hf(tiny, setup):
    d, hf = tiny
    kw: dict[str, Any] = {}
    if setup == "chunked_and_preempted":  # 8-token chunks, and a pool too small for all three at once
        kw = {
            "scheduler": SchedulerConfig(max_num_batched_tokens=8, admission_watermark=0.0),
            "cache": CacheConfig(block_size=4, num_blocks=24),
        }
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32", **kw))
    params = SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False, logprobs=4)
    outs = eng.generate(PROMPTS, params)
    if setup == "chunked_and_preempted":
        assert eng.scheduler.num_preemptions > 0
    _check(hf, PROMPTS, outs, 4)
    for out in outs:  # greedy: the sampled token is the most likely one
        assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)
    assert eng.num_free_blocks == eng.num_total_blocks


def test_sampled_tokens_report_the_raw_distribution(tiny):
    d, hf = tiny
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32"))
    params = SamplingParams(
        max_tokens=10, temperature=1.7, top_k=5, seed=11, ignore_eos=True, detokenize=False, logprobs=0
    )
    outs = eng.generate(PROMPTS[:2], params)
    _check(hf, PROMPTS[:2], outs, 0)  # not the temperature- or top-k-shaped one


def test_no_logprobs_unless_asked_and_mixed_batches(tiny):
    d, _ = tiny
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32"))
    asked = SamplingParams(max_tokens=5, ignore_eos=True, detokenize=False, logprobs=1)
    plain = SamplingParams(max_tokens=5, ignore_eos=True, detokenize=False)
    outs = eng.generate(PROMPTS, [plain, asked, plain])
    assert outs[0].logprobs is None and outs[2].logprobs is None
    assert outs[1].logprobs is not None and len(outs[1].logprobs) == 5
    eng.add_request("s", PROMPTS[0], asked)
    deltas = []
    while eng.has_unfinished_requests():
        deltas += eng.step()
    assert all(
        o.logprobs is not None and len(o.logprobs) == len(o.new_token_ids) for o in deltas
    )  # each delta carries its own


def test_compute_logprobs_counts_per_row():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    out = compute_logprobs(logits, torch.tensor([0, 0]), [2, 0])
    ref = torch.log_softmax(logits, dim=-1)
    first = out[0]
    assert first.token_id == 0 and first.logprob == pytest.approx(ref[0, 0].item())
    assert [t for t, _ in first.top] == [2, 1]
    assert [lp for _, lp in first.top] == pytest.approx([ref[0, 2].item(), ref[0, 1].item()])
    assert out[1].top == () and out[1].logprob == pytest.approx(ref[1, 0].item())


def _check_prompt(hf, prompts, outs, k):
    for prompt, out in zip(prompts, outs):
        lps = out.prompt_logprobs
        assert [lp.token_id for lp in lps] == prompt
        assert lps[0].logprob is None and lps[0].top == ()
        with torch.inference_mode():
            ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
        for j in range(1, len(prompt)):  # position j - 1 predicts token j
            assert lps[j].logprob == pytest.approx(ref[j - 1, prompt[j]].item(), abs=1e-4)
            assert [t for t, _ in lps[j].top] == ref[j - 1].topk(k).indices.tolist()


@pytest.mark.parametrize("setup", ["batched", "chunked_and_preempted"])
def test_prompt_logprobs_equal_hf_even_with_the_prefix_cached(tiny, setup):
    d, hf = tiny
    kw: dict[str, Any] = {}
    if setup == "chunked_and_preempted":
        kw = {
            "scheduler": SchedulerConfig(max_num_batched_tokens=8, admission_watermark=0.0),
            "cache": CacheConfig(block_size=4, num_blocks=24),
        }
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32", **kw))
    # The prompts' blocks are cached first: prompt logprobs must still cover every position.
    eng.generate(PROMPTS, SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False))
    params = SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False, prompt_logprobs=2, logprobs=1)
    outs = eng.generate(PROMPTS, params)
    if setup == "chunked_and_preempted":
        assert eng.scheduler.num_preemptions > 0
    assert all(o.num_cached_tokens == 0 for o in outs)
    _check_prompt(hf, PROMPTS, outs, 2)
    _check(hf, PROMPTS, outs, 1)
    assert eng.num_free_blocks == eng.num_total_blocks
    # and the blocks it computed serve the next request's prefix as usual
    again = eng.generate([PROMPTS[2]], SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False))
    assert again[0].num_cached_tokens > 0 and again[0].prompt_logprobs is None


def test_prompt_logprobs_of_a_one_token_prompt(tiny):
    d, _ = tiny
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32"))
    out = eng.generate([[42]], SamplingParams(max_tokens=2, ignore_eos=True, detokenize=False, prompt_logprobs=0))[0]
    assert [(lp.token_id, lp.logprob) for lp in out.prompt_logprobs] == [(42, None)]
