"""Size limits of the HTTP frontend: the request body (413 before it is read whole), list fields,
``logit_bias`` keys, and big inputs handled off the event loop."""

from __future__ import annotations

import threading

import httpx
import pytest

from engine.sampling_params import MAX_STOP_TOKEN_IDS
from router.http import body as body_module
from router.http.app import create_app
from router.http.body import MAX_BODY_BYTES, OFF_LOOP_BYTES
from router.http.schemas import MAX_DETOKENIZE_TOKENS, MAX_LOGIT_BIAS, MAX_STOP_STRINGS
from router.http.server import ThreadedHttpServer
from tests.router.fake_router import FakeRouter
from tests.router.http.conftest import MODEL
from tests.router.http.test_http_api import CHAT, COMPL, HELLO, assert_openai_error

JSON = {"content-type": "application/json"}


@pytest.fixture
def small_limit(fake):
    """The app with a 64 KiB body limit."""
    srv = ThreadedHttpServer(create_app(fake, served_model_name=MODEL, max_body_bytes=64 * 1024)).start()
    yield srv.url
    srv.stop()


def token_body(n: int) -> bytes:
    return b'{"prompt":[' + b"1," * n + b'1],"max_tokens":1}'


def assert_too_large(resp: httpx.Response, limit: int) -> None:
    err = assert_openai_error(resp, 413)
    assert err["type"] == "invalid_request_error" and err["code"] == "request_too_large"
    assert str(limit) in err["message"], err


# -- the body limit -------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_413_and_never_reaches_the_router(small_limit, fake):
    r = httpx.post(small_limit + COMPL, content=token_body(40_000), headers=JSON)  # 80 KB, Content-Length
    assert_too_large(r, 64 * 1024)
    assert fake.requests == []


def test_a_chunked_body_is_cut_off_at_the_limit(small_limit, fake):
    def chunks():  # no Content-Length: the limit must hold while the body streams in
        yield b'{"prompt":['
        for _ in range(64):
            yield b"1," * 1024
        yield b'1],"max_tokens":1}'

    r = httpx.post(small_limit + COMPL, content=chunks(), headers=JSON)
    assert_too_large(r, 64 * 1024)
    assert fake.requests == []


def test_every_body_reading_endpoint_is_bounded(small_limit):
    big = b"x" * (65 * 1024)
    for path, raw in (
        (CHAT, b'{"messages":[{"role":"user","content":"' + big + b'"}]}'),
        ("/tokenize", b'{"prompt":"' + big + b'"}'),
        ("/detokenize", b'{"tokens":[' + b"1," * 40_000 + b"1]}"),
    ):
        assert_too_large(httpx.post(small_limit + path, content=raw, headers=JSON), 64 * 1024)


def test_a_connection_is_usable_after_a_413(small_limit):
    with httpx.Client(base_url=small_limit) as c:
        assert c.post(COMPL, content=token_body(40_000), headers=JSON).status_code == 413
        assert c.post(COMPL, json={"prompt": "hello there", "max_tokens": 2}).status_code == 200


def test_the_default_limit_is_16_mib_and_admits_a_long_context_prompt(url, fake):
    assert MAX_BODY_BYTES == 16 * 1024 * 1024
    assert_too_large(
        httpx.post(url + COMPL, content=token_body(MAX_BODY_BYTES // 2), headers=JSON, timeout=30), MAX_BODY_BYTES
    )
    # 128k token ids and a text of several MB pass the limit (the fake's 64-token context refuses them: 400)
    for body in (
        {"prompt": list(range(1000, 1000 + 131_072)), "max_tokens": 1},
        {"prompt": "word " * 1_000_000, "max_tokens": 1},
    ):
        assert_openai_error(httpx.post(url + COMPL, json=body, timeout=30), 400)
    assert len(fake.requests) == 2


# -- list bounds and logit_bias keys --------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [
        ("stop_token_ids", [1] * (MAX_STOP_TOKEN_IDS + 1)),
        ("logit_bias", {str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}),
        ("stop", ["s"] * (MAX_STOP_STRINGS + 1)),
    ],
)
def test_long_lists_are_refused(url, fake, field, value):
    for path, body in ((COMPL, {"prompt": "hi", "max_tokens": 2}), (CHAT, {"messages": HELLO, "max_tokens": 2})):
        err = assert_openai_error(httpx.post(url + path, json={**body, field: value}), 400)
        assert err["param"] == field, err
    assert fake.requests == []


def test_bounded_lists_at_their_limit_pass_the_schema(url, fake):
    body = {
        "prompt": "hi",
        "max_tokens": 2,
        "stop_token_ids": [7] * MAX_STOP_TOKEN_IDS,
        "logit_bias": {str(i): 1.0 for i in range(MAX_LOGIT_BIAS)},
        "stop": ["s"] * MAX_STOP_STRINGS,
    }
    assert httpx.post(url + COMPL, json=body).status_code == 200


@pytest.mark.parametrize("key", ["9" * 5000, "9" * 11, "1e3", "-1", "１"])  # noqa: RUF001 - a fullwidth digit
def test_a_logit_bias_key_that_is_no_token_id_is_400(url, fake, key):
    for path, body in ((COMPL, {"prompt": [1, 2, 3], "max_tokens": 2}), (CHAT, {"messages": HELLO, "max_tokens": 2})):
        err = assert_openai_error(httpx.post(url + path, json={**body, "logit_bias": {key: 1}}), 400)
        assert err["param"] == "logit_bias", err
    assert fake.requests == []


def test_a_ten_digit_logit_bias_key_is_a_token_id(url, fake):
    r = httpx.post(url + COMPL, json={"prompt": "hi", "max_tokens": 2, "logit_bias": {"0000000042": 1}})
    assert r.status_code == 200 and dict(fake.requests[0].sampling.logit_bias) == {42: 1}


def test_detokenize_refuses_more_tokens_than_any_context(url):
    raw = b'{"tokens":[' + b"1," * MAX_DETOKENIZE_TOKENS + b"1]}"
    err = assert_openai_error(httpx.post(url + "/detokenize", content=raw, headers=JSON, timeout=30), 400)
    assert err["param"] == "tokens"


# -- big inputs off the event loop ----------------------------------------------------------------
class ThreadRecordingRouter(FakeRouter):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def detokenize(self, token_ids) -> str:
        self.threads.append(threading.current_thread().name)
        return super().detokenize(token_ids)


def test_a_long_detokenize_runs_off_the_event_loop(serve):
    fake = ThreadRecordingRouter()
    url = serve(fake)
    assert httpx.post(url + "/detokenize", json={"tokens": [100, 101]}).json() == {"prompt": "alpha beta"}
    r = httpx.post(url + "/detokenize", json={"tokens": [100] * 100_000}, timeout=30)
    assert r.status_code == 200 and r.json()["prompt"].startswith("alphaalpha")
    assert fake.threads[0] == "baton-http"  # short: inline, on the server's loop thread
    assert fake.threads[1] != "baton-http"


def test_a_big_body_is_parsed_off_the_event_loop(url, monkeypatch):
    threads: list[tuple[int, str]] = []
    parse = body_module.parse_body

    def recording_parse(raw, schema):
        threads.append((len(raw), threading.current_thread().name))
        return parse(raw, schema)

    monkeypatch.setattr(body_module, "parse_body", recording_parse)
    httpx.post(url + COMPL, json={"prompt": "hi", "max_tokens": 1})
    httpx.post(url + COMPL, content=token_body(OFF_LOOP_BYTES // 2), headers=JSON, timeout=30)
    (small, small_thread), (big, big_thread) = threads
    assert small < OFF_LOOP_BYTES <= big
    assert small_thread == "baton-http" and big_thread != "baton-http"
