"""A grammar that fails mid-request, seen by an HTTP client (the real app, router and engine over
the tiny model, without Ray: tests/router/http/engine_stack.py): a whole response is a 400 naming
the constraint's field, a stream ends with that error object in band and ``[DONE]``; the engine
frees the request's blocks and serves on."""

import json
from collections.abc import Iterator

import httpx
import pytest

from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from tests.router.http.engine_stack import MODEL_NAME, EngineDispatcher, make_engine_router
from tests.waiting import wait_until

OPTIONS = [f"option number {i} of the list" for i in range(2001)]
# A grammar rule of two thousand and one alternatives: consuming the first token overflows
# llguidance's Earley row (its limit is two thousand items).
MANY_RULE = "start: " + " | ".join(map(json.dumps, OPTIONS))


@pytest.fixture(scope="module")
def stack(tiny_model_dir) -> Iterator[tuple[str, EngineDispatcher]]:
    router, dispatcher = make_engine_router(tiny_model_dir)
    server = ThreadedHttpServer(create_app(router, served_model_name=MODEL_NAME)).start()
    server.call(router.start())
    try:
        yield server.url, dispatcher
    finally:
        server.call(router.stop(), timeout_s=30)
        server.stop()
        dispatcher.stop()


def _body(**kw):
    return {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 20, "guided_grammar": MANY_RULE, **kw}


def _drained(dispatcher: EngineDispatcher) -> None:
    engine = dispatcher.engine
    wait_until(
        lambda: not engine.has_unfinished_requests() and engine.num_free_blocks == engine.num_total_blocks,
        message="the engine drained, every block free",
    )


def test_whole_response_is_a_400_naming_the_field(stack):
    url, dispatcher = stack
    r = httpx.post(f"{url}/v1/completions", json=_body(), timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "guided_grammar" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("guided_grammar could not be enforced")
    _drained(dispatcher)
    # The server serves on (the same options as a guided_choice: one lexer terminal, no Earley row).
    choice = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 20, "guided_choice": OPTIONS}
    ok = httpx.post(f"{url}/v1/completions", json=choice, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] in OPTIONS


def test_stream_ends_with_the_error_in_band(stack):
    url, dispatcher = stack
    with httpx.stream("POST", f"{url}/v1/completions", json=_body(stream=True), timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"param":"guided_grammar"' in lines[-2].replace(" ", "") and "could not be enforced" in lines[-2]
    _drained(dispatcher)
