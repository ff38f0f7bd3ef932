"""Structured outputs and tool calling on the HTTP frontend: the fields reach the router as a typed
constraint (response_format, guided_*, on both endpoints; tool_choice required / named as a call
grammar; tools and tool calls in the history), output-changing fields other servers accept are a
400 naming them, and outputs read for tool calls come back as OpenAI shapes them (whole and streamed)."""

import json

import httpx
import pytest

from engine.structured.constraint import ConstraintKind
from router.api import GenerationResult, StreamEvent, Usage
from router.http.responses import ChunkBuilder, chat_completion
from router.tool_calls.parsers import ToolFormat
from tests.router.http.conftest import MODEL

HELLO = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _post(url, path, body):
    return httpx.post(url + path, json={"model": MODEL, **body}, timeout=10)


@pytest.mark.parametrize(
    ("path", "base"), [("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "hi"})]
)
@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"response_format": {"type": "json_object"}}, ConstraintKind.JSON_OBJECT),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            ConstraintKind.JSON_SCHEMA,
        ),
        ({"guided_json": SCHEMA}, ConstraintKind.JSON_SCHEMA),
        ({"guided_regex": "[a-z]+"}, ConstraintKind.REGEX),
        ({"guided_choice": ["yes", "no"]}, ConstraintKind.CHOICE),
        ({"guided_grammar": 'start: "a"+'}, ConstraintKind.GRAMMAR),
    ],
)
def test_constraints_reach_the_router(url, fake, path, base, fields, kind):
    r = _post(url, path, {**base, **fields})
    assert r.status_code == 200, r.text
    c = fake.requests[-1].sampling.structured
    assert c.kind is kind
    if kind is ConstraintKind.JSON_SCHEMA:
        assert json.loads(c.spec) == SCHEMA


def test_text_response_format_is_no_constraint(url, fake):
    body = {"messages": HELLO, "response_format": {"type": "text"}}
    assert _post(url, "/v1/chat/completions", body).status_code == 200
    assert fake.requests[-1].sampling.structured is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"structured_outputs": {"json": SCHEMA}}, "structured_outputs"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"priority": 3}, "priority"),
        ({"cache_salt": "x"}, "cache_salt"),
        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_refused_with_the_field_named(url, fake, fields, param):
    r = _post(url, "/v1/chat/completions", {"messages": HELLO, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert _post(url, "/v1/chat/completions", {"messages": HELLO}).status_code == 200  # the server unaffected


def test_completions_refuse_tools(url):
    r = _post(url, "/v1/completions", {"prompt": "hi", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


@pytest.mark.parametrize(
    ("choice", "names"),
    [("required", None), ({"type": "function", "function": {"name": "get_weather"}}, ["get_weather"])],
)
def test_forced_tool_choice_is_a_call_grammar(url, fake, choice, names):
    other = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    r = _post(url, "/v1/chat/completions", {"messages": HELLO, "tools": [WEATHER, other], "tool_choice": choice})
    assert r.status_code == 200, r.text
    req = fake.requests[-1]
    c = req.sampling.structured
    assert c.kind is ConstraintKind.GRAMMAR and c.field == "tool_choice" and "<tool_call>" in c.spec
    assert ('"add"' in c.spec) is (names is None)
    assert [t.name for t in req.tools] == ["get_weather", "add"]


def test_auto_and_history_with_tool_calls(url, fake):
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = _post(url, "/v1/chat/completions", {"messages": history, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    req = fake.requests[-1]
    assert req.sampling.structured is None  # auto: parsed, not constrained
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.tool_calls[0].name == "get_weather" and tool.tool_call_id == "call_1"
    assert assistant.to_template()["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


def _result(text, reason="stop"):
    return GenerationResult("r1", text, (1, 2), reason, Usage(3, 2), "interactive")


def test_chat_completion_with_tool_calls():
    raw = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    out = chat_completion(
        [_result(raw), _result("plain")], model=MODEL, created=0, fingerprint="fp_test", tool_format=ToolFormat.HERMES
    )
    first, second = out["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] == "Checking."
    [call] = first["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert second["message"] == {"role": "assistant", "content": "plain", "refusal": None}
    assert second["finish_reason"] == "stop" and out["system_fingerprint"] == "fp_test"


def test_streamed_tool_call_chunks():
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    chunks = ChunkBuilder("r1", MODEL, 0, chat=True, fingerprint="fp_test", tool_format=ToolFormat.HERMES)
    pieces = [raw[i : i + 5] for i in range(0, len(raw), 5)]
    out = [
        chunks.delta(
            StreamEvent(
                "r1", p, (), finished=i == len(pieces) - 1, finish_reason="stop" if i == len(pieces) - 1 else None
            )
        )
        for i, p in enumerate(pieces)
    ]
    deltas = [c["choices"][0] for c in out if c is not None]
    assert not any("content" in d["delta"] for d in deltas)  # no markup leaked as content
    calls = [t for d in deltas for t in d["delta"].get("tool_calls", ())]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(t["function"]["arguments"] for t in calls)) == {"city": "Paris"}
    assert deltas[-1]["finish_reason"] == "tool_calls"
