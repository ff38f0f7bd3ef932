"""Responses as OpenAI's published types read them: real answers of the app in front of a real router
and engine (the tiny model), whole and streamed, validated with the ``openai`` package's own pydantic
models in strict mode with unknown fields forbidden (what a strictly typed client would notice), and
with the published schema's models (router/http/response_models.py, which forbid unknown fields too)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import httpx
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from router.http import response_models as rm
from tests.router.http.engine_stack import MODEL_NAME

M = TypeVar("M", bound=BaseModel)
CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def openai_valid(model: type[M], obj: dict[str, Any]) -> M:
    """``obj`` as the openai package's ``model``, strictly: no coercion, no field it does not know."""
    return model.model_validate(obj, strict=True, extra="forbid")


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json={"temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(url + path, json={"temperature": 0, **body, "stream": True}, timeout=60)
    assert r.status_code == 200, r.text
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


CHAT_BODIES = {
    "plain": {"messages": HELLO, "max_tokens": 4},
    "n=2 with logprobs": {"messages": HELLO, "max_tokens": 3, "n": 2, "logprobs": True, "top_logprobs": 2},
    "forced tool call": {"messages": HELLO, "max_tokens": 48, "tools": TOOLS, "tool_choice": "required"},
    "json object": {"messages": HELLO, "max_tokens": 8, "response_format": {"type": "json_object"}},
}
COMPLETION_BODIES = {
    "plain": {"prompt": "Once upon", "max_tokens": 4},
    "echo with logprobs": {"prompt": "Once upon", "max_tokens": 3, "echo": True, "logprobs": 2},
    "token ids, n=2": {"prompt": [5, 6, 7], "max_tokens": 3, "n": 2},
}


@pytest.mark.parametrize("body", CHAT_BODIES.values(), ids=CHAT_BODIES)
def test_chat_completions_are_openai_chat_completions(engine_url, body):
    obj = post(engine_url, CHAT, body)
    done = openai_valid(ChatCompletion, obj)
    rm.ChatCompletion.model_validate(obj)
    assert isinstance(done.system_fingerprint, str) and done.system_fingerprint.startswith("fp_")
    for choice in done.choices:
        assert choice.message.refusal is None and "refusal" in obj["choices"][choice.index]["message"]
    if body.get("tool_choice") == "required":
        assert all(c.finish_reason in ("tool_calls", "length") for c in done.choices), obj
    chunks = stream(engine_url, CHAT, {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks:
        openai_valid(ChatCompletionChunk, chunk)
        rm.ChatCompletionChunk.model_validate(chunk)
        assert chunk["system_fingerprint"] == done.system_fingerprint
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def _without_first_prompt_logprob(obj: dict[str, Any]) -> dict[str, Any]:
    """The first echoed prompt token has no logprob: null, as OpenAI answers it, where the openai
    package's types (narrower than its API) want a number. Checked, then left out for them."""
    obj = json.loads(json.dumps(obj))
    for choice in obj["choices"]:
        lp = choice["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            del lp[key][0]
    return obj


@pytest.mark.parametrize("body", COMPLETION_BODIES.values(), ids=COMPLETION_BODIES)
def test_completions_are_openai_completions(engine_url, body):
    obj = post(engine_url, COMPL, body)
    rm.Completion.model_validate(obj)
    echo_scored = body.get("echo") and body.get("logprobs") is not None
    done = openai_valid(Completion, _without_first_prompt_logprob(obj) if echo_scored else obj)
    assert isinstance(done.system_fingerprint, str) and done.system_fingerprint.startswith("fp_")
    if echo_scored:
        return
    for chunk in stream(engine_url, COMPL, body):
        rm.CompletionChunk.model_validate(chunk)
        assert chunk["system_fingerprint"] == done.system_fingerprint
        # OpenAI streams completions as Completion objects, whose finish_reason is null until the
        # last chunk of a choice (as OpenAI sends it; the openai package's type wants a reason).
        if all(c["finish_reason"] is not None for c in chunk["choices"]):
            openai_valid(Completion, chunk)


def test_models_are_openai_models(engine_url):
    listed = httpx.get(engine_url + "/v1/models").json()
    rm.ModelList.model_validate(listed)
    [card] = listed["data"]
    model = Model.model_validate(card, strict=True)  # (max_model_len and lanes: Baton's additions)
    assert model.id == MODEL_NAME and set(model.model_extra or {}) == {"max_model_len", "lanes"}


def test_errors_are_openai_error_objects(engine_url):
    r = httpx.post(engine_url + CHAT, json={"messages": HELLO, "max_tokens": -1})
    assert r.status_code == 400
    err = rm.ErrorResponse.model_validate(r.json()).error
    assert err.param == "max_tokens" and err.type == "invalid_request_error"
