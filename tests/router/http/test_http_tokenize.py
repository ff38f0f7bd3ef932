"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's): shapes, authentication and bad input."""

from __future__ import annotations

import httpx

from tests.router.fake_router import FakeRouter
from tests.router.http.conftest import MODEL
from tests.router.http.test_http_api import HELLO, assert_openai_error


def test_tokenize_a_prompt_or_messages(url):
    r = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": "one two three"})
    assert r.status_code == 200 and r.json() == {"count": 3, "max_model_len": 64, "tokens": [500, 501, 502]}
    r = httpx.post(url + "/tokenize", json={"messages": HELLO, "add_generation_prompt": False})
    assert r.json()["tokens"] == [500, 501]


def test_detokenize(url):
    r = httpx.post(url + "/detokenize", json={"tokens": [100, 101]})
    assert r.status_code == 200 and r.json() == {"prompt": "alpha beta"}


def test_bad_input(url):
    for path, body, param in (
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": HELLO}, "prompt"),
        ("/tokenize", {"prompt": ""}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [5, 5000]}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ):
        assert assert_openai_error(httpx.post(url + path, json=body), 400)["param"] == param, (path, body)
    assert assert_openai_error(httpx.post(url + "/tokenize", json={"model": "nope", "prompt": "x"}), 404)


def test_they_authenticate(serve):
    url = serve(FakeRouter(require_auth=True))
    assert_openai_error(httpx.post(url + "/tokenize", json={"prompt": "x"}), 401)
    r = httpx.post(url + "/detokenize", json={"tokens": [100]}, headers={"Authorization": "Bearer sk-test"})
    assert r.status_code == 200
