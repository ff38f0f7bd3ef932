"""``logprobs`` on the HTTP API, in OpenAI's two shapes, through the real app and the openai client
(the FakeRouter scripts token 100 + i with logprob -(i + 1) / 4 and alternatives 300 + i, half of
"é", and 200 + i, ...)."""

from __future__ import annotations

import json

import httpx

from tests.router.http.conftest import MODEL
from tests.router.http.test_http_api import CHAT, COMPL, HELLO, sse_payloads


def test_completion_logprobs(url, fake):
    r = httpx.post(url + COMPL, json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "logprobs": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert fake.requests[-1].sampling.logprobs == 2
    assert lp["tokens"] == ["alpha", " beta", " gamma"]
    assert lp["token_logprobs"] == [-0.25, -0.5, -0.75]
    assert lp["text_offset"] == [0, 5, 10]  # into the returned text
    # the requested alternatives, and the sampled token (already among them here)
    assert lp["top_logprobs"][0] == {"bytes:\\xc3": -0.15, "alpha": -0.25}


def test_completion_logprobs_zero_reports_the_sampled_token(url):
    r = httpx.post(url + COMPL, json={"prompt": "hi", "max_tokens": 2, "logprobs": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-0.25, -0.5]
    assert lp["top_logprobs"] == [{"alpha": -0.25}, {" beta": -0.5}]


def test_no_logprobs_unless_asked(url, fake):
    for path, body in (
        (COMPL, {"prompt": "hi", "max_tokens": 2}),
        (CHAT, {"messages": HELLO, "max_tokens": 2}),
        (CHAT, {"messages": HELLO, "max_tokens": 2, "logprobs": False}),
    ):
        r = httpx.post(url + path, json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None
        assert fake.requests[-1].sampling.logprobs is None


def test_chat_logprobs_with_the_openai_client(client, fake):
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert fake.requests[-1].sampling.logprobs == 3
    assert [c.token for c in content] == ["alpha", " beta"]
    assert [c.logprob for c in content] == [-0.25, -0.5]
    assert content[0].bytes == list(b"alpha")
    top = content[0].top_logprobs
    assert [t.token for t in top] == ["bytes:\\xc3", "alpha", "alt200"]
    assert top[0].bytes == [0xC3]  # half a character: its exact byte
    assert [t.logprob for t in top] == [-0.15, -0.25, -1.25]


def test_chat_logprobs_without_top_logprobs(client):
    resp = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, logprobs=True)
    assert [(c.token, c.top_logprobs) for c in resp.choices[0].logprobs.content] == [("alpha", [])]


def test_streamed_logprobs_ride_with_their_tokens(url):
    for path, body in (
        (CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 1}),
        (COMPL, {"prompt": "hi", "logprobs": 1}),
    ):
        with httpx.stream("POST", url + path, json={**body, "max_tokens": 3, "stream": True}) as r:
            chunks = [json.loads(p) for p in sse_payloads(r.read())[:-1]]
        per_token = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"] is not None]
        if path == CHAT:
            assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
            assert [lp["content"][0]["token"] for lp in per_token] == ["alpha", " beta", " gamma"]
        else:
            assert [lp["tokens"] for lp in per_token] == [["alpha"], [" beta"], [" gamma"]]
            assert [lp["text_offset"] for lp in per_token] == [[0], [5], [10]]  # continued across chunks


def test_streamed_logprobs_with_the_openai_client(client):
    stream = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, logprobs=1, stream=True)
    got = [(c.choices[0].text, c.choices[0].logprobs.token_logprobs) for c in stream if c.choices]
    assert got == [("alpha", [-0.25]), (" beta", [-0.5])]


def test_echo_with_logprobs_scores_the_prompt_too(url, fake):
    """How evaluation harnesses score a text: the prompt's tokens first, the first one null."""
    r = httpx.post(url + COMPL, json={"prompt": "one two three", "max_tokens": 1, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    assert fake.requests[-1].sampling.prompt_logprobs == 1 and fake.requests[-1].sampling.logprobs == 1
    choice = r.json()["choices"][0]
    assert choice["text"] == "one two threealpha"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["p0", "p1", "p2", "alpha"]
    assert lp["token_logprobs"] == [None, -0.125, -0.25, -0.25]
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {"p1": -0.125}
    # into the returned text: the fake's prompt tokens ("p0p1p2") are shorter than the prompt's text,
    # so they are placed to end where it ends, and "alpha" starts right after the echoed prompt
    assert lp["text_offset"] == [7, 9, 11, 13]
    assert choice["text"][lp["text_offset"][-1] :] == "alpha"
    plain = httpx.post(url + COMPL, json={"prompt": "one two", "max_tokens": 1, "logprobs": 1})
    assert plain.json()["choices"][0]["logprobs"]["tokens"] == ["alpha"]  # without echo: none of the prompt
    assert fake.requests[-1].sampling.prompt_logprobs is None


def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs_only(url, fake):
    """OpenAI's legacy completions (and vLLM) take it: older evaluation harnesses score texts this way.
    It was a 400 ("max_tokens must be a positive integer")."""
    r = httpx.post(url + COMPL, json={"prompt": "one two three", "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    assert fake.requests[-1].sampling.max_tokens == 1  # it runs one token, left out of the answer
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["text"] == "one two three" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["p0", "p1", "p2"]
    assert choice["logprobs"]["token_logprobs"] == [None, -0.125, -0.25]
    assert usage["completion_tokens"] == 0 and usage["total_tokens"] == usage["prompt_tokens"]
    no_echo = httpx.post(url + COMPL, json={"prompt": "x", "max_tokens": 0})
    assert no_echo.status_code == 400 and no_echo.json()["error"]["param"] == "max_tokens"


def test_streamed_echo_with_logprobs(url):
    body = {"prompt": "one two", "max_tokens": 2, "echo": True, "logprobs": 0, "stream": True}
    with httpx.stream("POST", url + COMPL, json=body) as r:
        chunks = [json.loads(p) for p in sse_payloads(r.read())[:-1]]
    assert chunks[0]["choices"][0]["text"] == "one two" and chunks[0]["choices"][0]["logprobs"] is None
    tokens = [t for c in chunks[1:] if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert tokens == ["p0", "p1", "alpha", " beta"]
    offsets = [t for c in chunks[1:] if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [3, 5, 7, 12]  # "one two" is 7 characters: "alpha" at 7, " beta" at 12
