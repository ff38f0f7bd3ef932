"""Recorded raw outputs of each family's tool-call format parsed into the right calls, and the
streaming parser under every split of the raw text into pieces (hypothesis): the content pieces
concatenate to the parsed content, the argument pieces to each call's arguments, and no piece of
markup is ever sent as content."""

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from router.tool_calls.parsers import ToolFormat, format_for_model, parse
from router.tool_calls.streaming import ToolCallStream

# (format, raw output, content, [(name, arguments)])
RECORDED = [
    (
        ToolFormat.HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
        None,
        [("get_weather", {"city": "Paris", "unit": "c"})],
    ),
    (
        ToolFormat.HERMES,
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": "}{"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": [1, {"z": null}]}}\n</tool_call>',
        "Let me check.",
        [("a", {"x": "}{"}), ("b", {"y": [1, {"z": None}]})],
    ),
    (ToolFormat.HERMES, "The answer is 4 < 5.", "The answer is 4 < 5.", []),
    (
        ToolFormat.LLAMA3_JSON,
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        None,
        [("get_weather", {"city": "Oslo"})],
    ),
    (
        ToolFormat.LLAMA3_JSON,
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"q": "\\"x"}}',
        None,
        [("a", {}), ("b", {"q": '"x'})],
    ),
    (ToolFormat.LLAMA3_JSON, "Sure: no tool needed.", "Sure: no tool needed.", []),
    (
        ToolFormat.MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        None,
        [("get_weather", {"city": "Rome"}), ("add", {"a": 1, "b": 2})],
    ),
    (ToolFormat.MISTRAL, "Plain [text] here.", "Plain [text] here.", []),
]


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_recorded_outputs_parse():
    for fmt, raw, content, calls in RECORDED:
        got_content, got = parse(fmt, raw, _ids())
        assert got_content == content, raw
        assert [(c.name, json.loads(c.arguments)) for c in got] == calls, raw
        assert [c.id for c in got] == [f"call_{i}" for i in range(len(calls))]


def test_format_chosen_from_template_or_name():
    assert format_for_model("x", "{% if tools %}<tool_call>{% endif %}") is ToolFormat.HERMES
    assert format_for_model("meta-llama/Llama-3.1-8B-Instruct", "<|python_tag|>") is ToolFormat.LLAMA3_JSON
    assert format_for_model("mistralai/Mistral-7B-Instruct-v0.3", None) is ToolFormat.MISTRAL


def _stream(fmt, pieces):
    stream = ToolCallStream(fmt, _ids())
    deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
    content = "".join(d.content for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for t in d.tool_calls:
            if t.id is not None:
                assert t.index not in calls  # id and name come once, first
                calls[t.index] = {"id": t.id, "name": t.name, "arguments": ""}
            calls[t.index]["arguments"] += t.arguments
    return content, [calls[i] for i in sorted(calls)]


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(RECORDED), data=st.data())
def test_streaming_under_every_split(case, data):
    fmt, raw, content, calls = case
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw))))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if b > a]
    got_content, got_calls = _stream(fmt, pieces)
    assert got_content == (content or ""), pieces
    assert [(c["name"], json.loads(c["arguments"])) for c in got_calls] == calls
    for marker in ("<tool_call", "[TOOL_CALLS", "<|python_tag"):
        if calls:
            assert marker not in got_content


def test_streaming_one_character_at_a_time():
    for fmt, raw, content, calls in RECORDED:
        got_content, got_calls = _stream(fmt, list(raw))
        assert got_content == (content or "")
        assert [(c["name"], json.loads(c["arguments"])) for c in got_calls] == calls
