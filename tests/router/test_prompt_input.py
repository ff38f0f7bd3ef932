"""A request's prompt as token ids: huge prompts are tokenized off the event loop, and what makes two
requests "the same" for an Idempotency-Key includes how many choices they ask for."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from router.api import GenerateRequest
from router.prompt_input import OFF_LOOP_CHARS, request_fingerprint, tokenize_off_loop, tokenize_request
from tests.waiting import async_wait_until


def test_the_fingerprint_tells_apart_requests_for_another_number_of_choices():
    req = GenerateRequest(sampling=SamplingParams(max_tokens=4), prompt="hi")
    same = replace(req)
    assert request_fingerprint(req, [1, 2]) == request_fingerprint(same, [1, 2])
    assert request_fingerprint(req, [1, 2]) != request_fingerprint(replace(req, num_choices=2), [1, 2])
    assert request_fingerprint(req, [1, 2]) != request_fingerprint(req, [1, 3])


def test_a_huge_prompt_is_tokenized_while_the_event_loop_keeps_serving(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    huge = GenerateRequest(sampling=SamplingParams(), prompt="the quick brown fox jumps " * 40_000)  # 1 MB
    assert huge.prompt is not None and len(huge.prompt) > OFF_LOOP_CHARS

    async def main() -> tuple[list[int], float]:
        gaps, last = [], time.monotonic()

        async def ticker() -> None:
            nonlocal last
            while True:
                await asyncio.sleep(0.005)  # the behaviour under test: the loop's ticks, whose gaps are stalls
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await async_wait_until(lambda: len(gaps) >= 4, message="the ticker running")
        ids, _ = await tokenize_off_loop(huge, tokenizer, 1 << 20)
        tick.cancel()
        return ids, max(gaps)

    ids, longest_stall = asyncio.run(main())
    assert ids == tokenize_request(huge, tokenizer, 1 << 20)[0]
    assert longest_stall < 0.4, f"the event loop stalled {longest_stall:.2f} s"  # inline it takes ~0.5-1 s


def test_a_huge_token_id_prompt_is_checked_off_the_event_loop(monkeypatch):
    """Each id is checked against the vocabulary: for millions of ids that took ~0.4 s on the loop."""

    on_threads: list[int] = []
    real = asyncio.to_thread

    async def to_thread(fn, *args):
        on_threads.append(len(args[0].prompt_token_ids or ()))
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)  # (what prompt_input calls)
    small = GenerateRequest(sampling=SamplingParams(), prompt_token_ids=tuple(range(100)))
    huge = GenerateRequest(sampling=SamplingParams(), prompt_token_ids=tuple(i % 1000 for i in range(OFF_LOOP_CHARS)))
    for req in (small, huge):
        assert req.prompt_token_ids is not None
        assert asyncio.run(tokenize_off_loop(req, None, 1000))[0] == list(req.prompt_token_ids)
    assert on_threads == [OFF_LOOP_CHARS]


def test_token_ids_the_sampling_names_are_checked_against_the_vocabulary():
    from router.api import RouterError

    for sampling, param in (
        (SamplingParams(stop_token_ids=[5, 1000]), "stop_token_ids"),
        (SamplingParams(logit_bias={1000: 1.0}), "logit_bias"),
    ):
        req = GenerateRequest(sampling=sampling, prompt_token_ids=(1, 2))
        try:
            tokenize_request(req, None, 1000)
            raise AssertionError(f"{param} outside the vocabulary was accepted")
        except RouterError as e:
            assert e.param == param and "outside the vocabulary" in e.message
