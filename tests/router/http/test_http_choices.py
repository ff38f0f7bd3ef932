"""``n`` choices on the HTTP API: one router request per choice, merged into one response (indices,
summed usage), streamed interleaved, and started, failed and stopped together."""

from __future__ import annotations

import json

import httpx
import pytest

from router.api import ErrorKind, RouterError
from tests.router.fake_router import FakeRouter
from tests.router.http.conftest import MODEL
from tests.router.http.test_http_api import CHAT, COMPL, HELLO, assert_openai_error, sse_payloads
from tests.waiting import wait_until


def test_chat_choices_with_the_openai_client(client, fake):
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, n=3, seed=7, temperature=0.5)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(c.message.content == "alpha beta" and c.finish_reason == "length" for c in resp.choices)
    assert resp.usage.prompt_tokens == 2 and resp.usage.completion_tokens == 6  # the prompt counted once
    assert [r.sampling.seed for r in fake.requests] == [7, 8, 9]  # distinct, reproducible choices


def test_choice_seeds_wrap_within_64_bits(url, fake):
    # seed + index past 2**64 - 1 was refused as "seed must fit in 64 bits, got 18446744073709551616",
    # a seed the client never sent; it wraps (the sampler uses a seed's 64 bits: the same stream)
    r = httpx.post(url + COMPL, json={"prompt": "hi", "max_tokens": 1, "n": 3, "seed": 2**64 - 2, "temperature": 1})
    assert r.status_code == 200, r.text
    assert [q.sampling.seed for q in fake.requests] == [2**64 - 2, 2**64 - 1, 0]


def test_request_ids_and_idempotency_keys_per_choice(url, fake):
    r = httpx.post(
        url + COMPL,
        json={"prompt": "hi", "max_tokens": 1, "n": 2},
        headers={"X-Request-Id": "job-1", "Idempotency-Key": "k"},
    )
    assert r.status_code == 200
    assert [q.request_id for q in fake.requests] == ["job-1-0", "job-1-1"]
    assert [q.idempotency_key for q in fake.requests] == ["k", "k#1"]  # choice 0 holds the client's key
    assert [q.num_choices for q in fake.requests] == [2, 2]  # fingerprinted: reused with another n, it collides
    assert r.headers["x-request-id"] == "job-1-0,job-1-1"
    assert [q.sampling.seed for q in fake.requests] == [None, None]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]


def test_streamed_choices_interleave_and_sum_their_usage(url):
    body = {
        "messages": HELLO,
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
    }
    with httpx.stream("POST", url + CHAT, json=body) as r:
        chunks = [json.loads(p) for p in sse_payloads(r.read())[:-1]]
    per_choice: dict[int, list[dict]] = {0: [], 1: []}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        per_choice[choice["index"]].append(choice)
    for choices in per_choice.values():
        assert choices[0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
        assert "".join(c["delta"].get("content", "") for c in choices) == "alpha beta gamma"
        assert [c["finish_reason"] for c in choices][-1] == "length"
        # each choice's logprobs are its own tokens'
        assert [t["token"] for c in choices if c["logprobs"] for t in c["logprobs"]["content"]] == [
            "alpha",
            " beta",
            " gamma",
        ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_a_choice_refused_at_admission_stops_the_started_ones(url, fake):
    fake.fail_calls[2] = RouterError(ErrorKind.RATE_LIMITED, "Rate limit reached.", retry_after_s=3)
    r = httpx.post(url + COMPL, json={"prompt": "hi", "max_tokens": 2, "n": 3})
    assert assert_openai_error(r, 429)["type"] == "rate_limit_error"
    assert len(fake.requests) == 2 and fake.aborted == ["fake-0"]  # the third was never started


def test_a_choice_failing_mid_stream_ends_them_all(url, fake):
    fake.fail_after_tokens = 1
    with httpx.stream("POST", url + COMPL, json={"prompt": "hi", "max_tokens": 5, "n": 2, "stream": True}) as r:
        payloads = sse_payloads(r.read())
    assert payloads[-1] == "[DONE]" and any('"error"' in p for p in payloads)
    assert {"fake-0", "fake-1"} <= set(fake.aborted)


def test_a_client_going_away_aborts_every_choice(serve):
    fake = FakeRouter(token_delay_s=0.05, max_model_len=1000)
    url = serve(fake)
    with (
        httpx.Client(timeout=5) as c,
        c.stream("POST", url + COMPL, json={"prompt": "hi", "max_tokens": 200, "n": 2, "stream": True}) as r,
    ):
        assert r.status_code == 200
        next(r.iter_lines())
    with pytest.raises(httpx.ReadTimeout):  # waiting for a whole response, then gone
        httpx.post(url + CHAT, json={"messages": HELLO, "max_tokens": 200, "n": 2}, timeout=0.3)
    wait_until(lambda: len(fake.aborted) >= 4, timeout_s=5, message=lambda: f"four aborts ({fake.aborted})")
    assert sorted(fake.aborted) == ["fake-0", "fake-1", "fake-2", "fake-3"] and fake.completed == []
