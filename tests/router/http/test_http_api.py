"""The OpenAI-compatible HTTP frontend against a scripted router, over real loopback HTTP: the
official ``openai`` client for the happy paths (if it parses our answers, clients will), raw httpx
for exact framing, error shapes, headers and disconnects."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from router.api import ErrorKind, Readiness, RouterError
from router.http.app import create_app
from router.http.responses import response_id
from router.http.server import HttpServer
from tests.router.fake_router import FakeRouter
from tests.waiting import wait_until

MODEL = "baton-test"
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
HELLO = [{"role": "user", "content": "hello there"}]


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def sse_payloads(raw: bytes) -> list[str]:
    """Checks the framing (``data: `` lines, each event ended by a blank line) and returns the payloads."""
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    for ev in events:
        assert ev.startswith("data: ") and "\n" not in ev, repr(ev)
    return [ev[len("data: ") :] for ev in events]


# -- the official client --------------------------------------------------------------------------
def test_openai_chat_completion(client, fake):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=4)
    resp = raw.parse()
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == "alpha beta gamma delta"
    assert resp.choices[0].finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (2, 4, 6)
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    rid = raw.headers["x-request-id"]
    assert resp.id == f"chatcmpl-{rid}" and raw.headers["x-baton-lane"] == "interactive"
    req = fake.requests[-1]
    assert req.endpoint == "chat" and req.messages[0].content == "hello there" and req.tenant == "acme"
    assert req.sampling.max_tokens == 4 and req.max_tokens_given and not req.stream


def test_openai_chat_without_max_tokens_is_unbounded(client, fake):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        ],
    )
    assert resp.usage.completion_tokens == fake.max_model_len - 4  # clamped to what the context leaves
    req = fake.requests[-1]
    assert not req.max_tokens_given and req.messages[1].content == "one\ntwo"
    assert req.sampling.temperature == 1.0  # OpenAI's default


def test_openai_completions(client, fake):
    resp = client.completions.create(
        model=MODEL, prompt="the quick brown fox", max_tokens=3, temperature=0, stop=[" gamma"]
    )
    assert resp.object == "text_completion" and resp.choices[0].text == "alpha beta gamma"
    assert resp.choices[0].finish_reason == "stop" and resp.usage.prompt_tokens == 4
    resp = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2, extra_body={"top_k": 5})
    assert resp.choices[0].text == "alpha beta" and resp.usage.prompt_tokens == 3
    req = fake.requests[-1]
    assert req.prompt_token_ids == (1, 2, 3) and req.prompt is None and req.sampling.top_k == 5
    client.completions.create(model=MODEL, prompt="x")
    assert fake.requests[-1].sampling.max_tokens == 16 and not fake.requests[-1].max_tokens_given
    resp = client.completions.create(model=MODEL, prompt="say", max_tokens=1, echo=True)
    assert resp.choices[0].text == "sayalpha"
    # A token-id prompt is echoed as its text (it was silently dropped), streamed or not.
    resp = client.completions.create(model=MODEL, prompt=[101, 102], max_tokens=1, echo=True)
    assert resp.choices[0].text == " beta gammaalpha"
    chunks = list(client.completions.create(model=MODEL, prompt=[101, 102], max_tokens=1, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " beta gammaalpha"


def test_openai_chat_streaming_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "alpha beta gamma"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.total_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_openai_completion_streaming(client):
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "alpha beta gamma delta"
    assert chunks[-1].usage.completion_tokens == 4


def test_openai_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].object == "model"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


# -- framing and errors (raw HTTP) ----------------------------------------------------------------
def test_sse_framing(url):
    with httpx.stream(
        "POST", url + CHAT, json={"model": MODEL, "messages": HELLO, "max_tokens": 2, "stream": True}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"]
        payloads = sse_payloads(r.read())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:]] == ["alpha", " beta"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all("usage" not in c for c in chunks)  # only with stream_options.include_usage


BAD_INPUTS = [
    # (endpoint, body: raw bytes or JSON-able, expected param, substring of the message)
    (CHAT, b"{not json", None, "parse the JSON"),
    (CHAT, b'{"messages": [], "temperature": NaN}', None, "parse the JSON"),
    (CHAT, b"", None, "parse the JSON"),
    (CHAT, [1, 2], None, "JSON object"),
    (CHAT, {"model": MODEL}, "messages", "Missing required parameter"),
    (CHAT, {"messages": "hi"}, "messages", "expected an array"),
    (CHAT, {"messages": []}, "messages", "at least one"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages.[0].role", "Invalid value"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.[0].content", "Invalid type"),
    # taken as empty text before; OpenAI refuses them (only an assistant turn may omit its content)
    (CHAT, {"messages": [{"role": "user"}]}, "messages.[0].content", "Missing required parameter"),
    (
        CHAT,
        {"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}]},
        "messages.[0].content",
        "Missing required parameter",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages.[0].content",
        "not supported",
    ),
    (CHAT, {"messages": HELLO, "max_tokens": "ten"}, "max_tokens", "expected an integer"),
    (CHAT, {"messages": HELLO, "temperature": "hot"}, "temperature", "expected a number"),
    (CHAT, {"messages": HELLO, "max_tokens": 0}, "max_tokens", "positive"),
    (CHAT, {"messages": HELLO, "max_tokens": -5}, "max_tokens", "positive"),
    (CHAT, {"messages": HELLO, "max_completion_tokens": 0}, "max_completion_tokens", "positive"),
    (CHAT, {"messages": HELLO, "top_p": 1.5}, "top_p", "top_p"),
    (CHAT, {"messages": HELLO, "temperature": -1}, "temperature", "temperature"),
    (CHAT, {"messages": HELLO, "n": 0}, "n", "[1, 16]"),
    (COMPL, {"prompt": "hi", "n": 17}, "n", "[1, 16]"),
    (CHAT, {"messages": HELLO, "stream": "yes"}, "stream", "expected a boolean"),
    (CHAT, {"messages": HELLO, "lane": "vip"}, "lane", "unknown lane"),
    (CHAT, {"messages": HELLO, "top_logprobs": 2}, "top_logprobs", "requires 'logprobs'"),
    (CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    (CHAT, {"messages": HELLO, "logprobs": "yes"}, "logprobs", "expected a boolean"),
    (CHAT, {"messages": HELLO, "presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    (CHAT, {"messages": HELLO, "logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
    (CHAT, {"messages": HELLO, "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    (CHAT, {"messages": HELLO, "logit_bias": {"5": "x"}}, "logit_bias.5", "expected a number"),
    (CHAT, {"messages": HELLO, "repetition_penalty": 0}, "repetition_penalty", "[0.01, 10]"),
    (CHAT, {"messages": HELLO, "min_p": 1.5}, "min_p", "[0, 1]"),
    (CHAT, {"messages": HELLO, "tools": [{"type": "function"}]}, "tools", "must be {'type': 'function'"),
    (
        CHAT,
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]}]},
        "messages.[0].tool_calls",
        "Each of 'tool_calls' must be",
    ),
    # Refused rather than ignored (an OpenAI-client audit): each would have changed what is answered.
    (CHAT, {"messages": HELLO, "tool_choice": "auto"}, "tool_choice", "only allowed when tools"),
    (CHAT, {"messages": HELLO, "tool_choice": "required"}, "tool_choice", "only allowed when tools"),
    (CHAT, {"messages": HELLO, "audio": {"voice": "alloy", "format": "wav"}}, "audio", "not supported"),
    (CHAT, {"messages": HELLO, "modalities": ["text", "audio"]}, "modalities", "not supported"),
    (CHAT, {"messages": HELLO, "web_search_options": {}}, "web_search_options", "not supported"),
    (CHAT, {"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options", "only allowed when"),
    (COMPL, {"prompt": "hi", "max_tokens": 0, "echo": True, "stream": True}, "max_tokens", "without streaming"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "w " * 60}], "max_tokens": 10},
        "max_tokens",
        "maximum context length",
    ),
    (COMPL, {"max_tokens": 4}, "prompt", "Missing required parameter"),
    (COMPL, {"prompt": {"a": 1}}, "prompt", "Invalid type"),
    (COMPL, {"prompt": ["a", "b"]}, "prompt", "not supported"),
    (COMPL, {"prompt": "hi", "logprobs": 21}, "logprobs", "[0, 20]"),
    (COMPL, {"prompt": "hi", "logprobs": -1}, "logprobs", "[0, 20]"),
    (COMPL, {"prompt": "hi", "logprobs": 2, "echo": True, "n": 0}, "n", "[1, 16]"),
    (COMPL, {"prompt": "hi", "stop": 5}, "stop", "stop"),
    (COMPL, {"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty", "[-2, 2]"),
    (COMPL, {"prompt": "hi", "seed": "x"}, "seed", "expected an integer"),
    (COMPL, {"prompt": "hi", "top_k": -3}, "top_k", "top_k"),
    (COMPL, {"prompt": "word " * 60, "max_tokens": 10}, "max_tokens", "maximum context length"),
    # JSON may escape a lone surrogate; no tokenizer (or response) can hold one: a 400, never a 500
    (COMPL, b'{"prompt": "a\\ud800b"}', "prompt", "not valid Unicode"),
    (
        CHAT,
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
        "messages.[0].content.[0].text",
        "not valid Unicode",
    ),
    (COMPL, b'{"model": "m\\ud800", "prompt": "x"}', "model", "not valid Unicode"),
]


@pytest.mark.parametrize(
    "endpoint,body,param,message", BAD_INPUTS, ids=[f"{i}-{p or 'body'}" for i, (_, _, p, _) in enumerate(BAD_INPUTS)]
)
def test_bad_input_is_an_openai_400(url, endpoint, body, param, message):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    err = assert_openai_error(httpx.post(url + endpoint, headers={"Content-Type": "application/json"}, **kwargs), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert message in err["message"], err


def test_context_length_code(url):
    r = httpx.post(url + COMPL, json={"prompt": "w " * 70})
    assert assert_openai_error(r, 400)["code"] == "context_length_exceeded"


def test_unknown_model_routes_and_methods_are_openai_errors(url):
    err = assert_openai_error(httpx.post(url + CHAT, json={"model": "gpt-4", "messages": HELLO}), 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert "/v1/nope" in assert_openai_error(httpx.get(url + "/v1/nope"), 404)["message"]
    assert_openai_error(httpx.post(url + "/nope", json={}), 404)
    r = httpx.get(url + CHAT)
    assert assert_openai_error(r, 405)["code"] == "method_not_allowed" and "POST" in r.headers["allow"]


def test_auth(serve):
    fake = FakeRouter(require_auth=True)
    url = serve(fake)
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-test"}):
        assert (
            assert_openai_error(httpx.post(url + CHAT, json={"messages": HELLO}, headers=headers), 401)["type"]
            == "authentication_error"
        )
        assert_openai_error(httpx.get(url + "/v1/models", headers=headers), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()
    good = {"Authorization": "Bearer sk-test"}
    assert httpx.post(url + CHAT, json={"messages": HELLO, "max_tokens": 1}, headers=good).status_code == 200
    assert fake.requests[-1].tenant == "acme"
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    assert httpx.get(url + "/ready").status_code == 200
    r = httpx.get(url + "/metrics")
    assert (
        r.status_code == 200 and "baton_fake_total 1.0" in r.text and r.headers["content-type"].startswith("text/plain")
    )


@pytest.mark.parametrize("kind,status", [(ErrorKind.RATE_LIMITED, 429), (ErrorKind.OVERLOADED, 503)])
def test_retry_after(url, fake, kind, status):
    fake.fail_next = RouterError(kind, "slow down", code="queue_full", retry_after_s=2.3)
    r = httpx.post(url + CHAT, json={"messages": HELLO})
    err = assert_openai_error(r, status)
    assert err["type"] == kind.type and err["code"] == "queue_full" and r.headers["retry-after"] == "3"
    fake.fail_next = RouterError(kind, "slow down", retry_after_s=0.01)
    assert httpx.post(url + CHAT, json={"messages": HELLO}).headers["retry-after"] == "1"


def test_ready_reports_draining(url, fake):
    fake.ready = Readiness(False, "draining")
    r = httpx.get(url + "/ready")
    assert r.status_code == 503 and r.json()["reason"] == "draining"


def test_in_band_stream_error(url, fake):
    fake.fail_after_tokens = 2
    with httpx.stream("POST", url + COMPL, json={"prompt": "hi", "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200
        payloads = sse_payloads(r.read())
    assert [json.loads(p)["choices"][0]["text"] for p in payloads[:2]] == ["alpha", " beta"]
    assert json.loads(payloads[2])["error"]["type"] == "internal_error" and payloads[3] == "[DONE]"
    assert len(payloads) == 4


def test_non_streaming_failure_after_admission(url, fake):
    fake.fail_after_tokens = 1
    assert assert_openai_error(httpx.post(url + COMPL, json={"prompt": "hi"}), 500)["type"] == "internal_error"


def test_client_disconnect_mid_stream_aborts(serve):
    fake = FakeRouter(token_delay_s=0.05, max_model_len=1000)
    url = serve(fake)
    with (
        httpx.Client(timeout=5) as c,
        c.stream("POST", url + COMPL, json={"prompt": "hi", "max_tokens": 200, "stream": True}) as r,
    ):
        rid = r.headers["x-request-id"]
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    # (unaborted, it would run 10 s)
    wait_until(lambda: rid in fake.aborted, timeout_s=3.0, message=lambda: f"{rid} aborted ({fake.aborted})")
    assert rid not in fake.completed


def test_client_disconnect_while_waiting_for_a_whole_response_aborts(serve):
    fake = FakeRouter(token_delay_s=0.05, max_model_len=1000)
    url = serve(fake)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + CHAT, json={"messages": HELLO, "max_tokens": 200}, timeout=0.3)
    wait_until(lambda: len(fake.aborted) == 1, timeout_s=1.0, message=lambda: f"one abort ({fake.aborted})")
    assert fake.completed == []


def test_headers_pass_through(url, fake):
    r = httpx.post(
        url + CHAT,
        json={"messages": HELLO, "max_tokens": 1},
        headers={"Idempotency-Key": "key-123", "X-Baton-Lane": "batch"},
    )
    assert r.status_code == 200 and r.headers["x-baton-lane"] == "batch"
    req = fake.requests[-1]
    assert req.idempotency_key == "key-123" and req.lane == "batch"
    httpx.post(url + COMPL, json={"prompt": "x", "lane": "long_context", "max_tokens": 1})
    assert fake.requests[-1].lane == "long_context" and fake.requests[-1].idempotency_key is None
    err = assert_openai_error(
        httpx.post(url + COMPL, json={"prompt": "x", "lane": "batch"}, headers={"X-Baton-Lane": "interactive"}), 400
    )
    assert err["param"] == "lane"


def test_abort_and_batch_endpoints(url, fake):
    r = httpx.post(url + "/v1/abort/req-7")
    assert r.status_code == 200 and r.json()["aborted"] and fake.aborted == ["req-7"]
    fake.batch_jobs["job-1"] = {"id": "job-1", "status": "completed", "result": {"text": "hi"}}
    assert httpx.get(url + "/v1/batches/job-1").json()["status"] == "completed"
    assert assert_openai_error(httpx.get(url + "/v1/batches/nope"), 404)["type"] == "not_found_error"


def test_unexpected_router_exception_is_an_openai_500(url, fake):
    fake.fail_next = KeyError("boom")  # not a RouterError: a router bug
    err = assert_openai_error(httpx.post(url + CHAT, json={"messages": HELLO}), 500)
    assert err["type"] == "internal_error" and "boom" not in err["message"]


def test_http_server_in_a_running_loop():
    async def main() -> None:
        fake = FakeRouter(token_delay_s=0.05, max_model_len=1000)
        server = HttpServer(create_app(fake, served_model_name=MODEL), "127.0.0.1", 0, graceful_timeout_s=0.2)
        await server.start()
        assert server.port > 0
        async with httpx.AsyncClient(base_url=server.url) as c:
            assert (await c.get("/health")).status_code == 200
            async with c.stream("POST", COMPL, json={"prompt": "hi", "max_tokens": 200, "stream": True}) as r:
                rid = r.headers["x-request-id"]
                await server.stop()  # graceful period over: the in-flight stream is cancelled and aborted
        assert rid in fake.aborted
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health")

    asyncio.run(main())


def test_frontend_does_not_import_torch():
    code = "import sys, router.http.app, router.http.server; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.strip() == "False", out.stderr


def test_response_ids_do_not_double_the_prefix():
    assert response_id("cmpl-ab12", chat=False) == "cmpl-ab12"
    assert response_id("cmpl-ab12", chat=True) == "chatcmpl-ab12"
    assert response_id("r1", chat=False) == "cmpl-r1" and response_id("r1", chat=True) == "chatcmpl-r1"


def test_penalties_and_logit_bias_reach_the_router(client, fake):
    client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=1,
        presence_penalty=0.5,
        frequency_penalty=-1,
        logit_bias={"17": 5, "3": -100},
        extra_body={
            "repetition_penalty": 1.2,
            "min_p": 0.1,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        },
    )
    sp = fake.requests[-1].sampling
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.5, -1, 1.2)
    assert (sp.min_p, sp.include_stop_str_in_output, sp.skip_special_tokens) == (0.1, True, False)
    assert sp.logit_bias == ((3, -100), (17, 5))
    client.completions.create(model=MODEL, prompt="hi", max_tokens=1, presence_penalty=0, logit_bias={})
    sp = fake.requests[-1].sampling
    assert not sp.processes_logits  # zeros and an empty bias are the identity
