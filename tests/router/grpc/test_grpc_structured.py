"""gRPC parity of structured outputs and tool calling: response formats, tools, tool choice and
tool calls in the history reach the router as the HTTP API's do; bad ones are INVALID_ARGUMENT
naming the field; streamed text read for tool calls becomes ``tool_calls`` deltas."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest

from engine.structured.constraint import ConstraintKind
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from router.grpc_server import _with_tool_calls
from router.tool_calls.parsers import ToolFormat
from router.tool_calls.streaming import ToolCallStream
from tests.router.fake_router import FakeRouter
from tests.router.grpc.test_grpc_api import ServerThread

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = pb.Tool(
    name="get_weather",
    parameters_json=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
CHAT = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])


@pytest.fixture
def fake() -> FakeRouter:
    return FakeRouter(max_model_len=1000)


@pytest.fixture
def stub(fake) -> Iterator[pb_grpc.GenerationStub]:
    srv = ServerThread(fake)
    ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield pb_grpc.GenerationStub(ch)
    finally:
        ch.close()
        srv.close()


def _run(stub, req):
    return list(stub.Generate(req, timeout=10))


@pytest.mark.parametrize(
    ("rf", "kind"),
    [
        (pb.ResponseFormat(json_object=True), ConstraintKind.JSON_OBJECT),
        (pb.ResponseFormat(json_schema=json.dumps(SCHEMA)), ConstraintKind.JSON_SCHEMA),
        (pb.ResponseFormat(regex="[a-z]+"), ConstraintKind.REGEX),
        (pb.ResponseFormat(choice=pb.ChoiceList(choices=["yes", "no"])), ConstraintKind.CHOICE),
        (pb.ResponseFormat(grammar='start: "a"+'), ConstraintKind.GRAMMAR),
    ],
)
def test_response_formats_reach_the_router(stub, fake, rf, kind):
    _run(stub, pb.GenerateRequest(text="hi", sampling=pb.SamplingParameters(response_format=rf)))
    assert fake.requests[-1].sampling.structured.kind is kind


def test_tools_history_and_forced_choice(stub, fake):
    chat = pb.ChatMessages(
        messages=[
            pb.ChatMessage(role="user", content="weather?"),
            pb.ChatMessage(
                role="assistant", tool_calls=[pb.ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}')]
            ),
            pb.ChatMessage(role="tool", content="sunny", tool_call_id="c1"),
        ]
    )
    _run(stub, pb.GenerateRequest(chat=chat, tools=[WEATHER], tool_choice=pb.ToolChoice(function="get_weather")))
    req = fake.requests[-1]
    assert [t.name for t in req.tools] == ["get_weather"]
    assert req.messages[1].tool_calls[0].name == "get_weather" and req.messages[2].tool_call_id == "c1"
    c = req.sampling.structured
    assert c.kind is ConstraintKind.GRAMMAR and c.field == "tool_choice"
    _run(stub, pb.GenerateRequest(chat=CHAT, tools=[WEATHER]))  # auto: read, not constrained
    assert fake.requests[-1].sampling.structured is None


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (
            pb.GenerateRequest(chat=CHAT, tools=[WEATHER], tool_choice=pb.ToolChoice(function="nope")),
            "tool_choice.function",
        ),
        (pb.GenerateRequest(chat=CHAT, tool_choice=pb.ToolChoice(mode=pb.ToolChoice.REQUIRED)), "tool_choice.mode"),
        (pb.GenerateRequest(chat=CHAT, tools=[pb.Tool(name="f", parameters_json="[1]")]), "tools[0].parameters_json"),
        (pb.GenerateRequest(chat=CHAT, tools=[pb.Tool(name="bad name")]), "tools[0].name"),
        (pb.GenerateRequest(text="hi", tools=[WEATHER]), "tools"),
        (
            pb.GenerateRequest(
                text="hi", sampling=pb.SamplingParameters(response_format=pb.ResponseFormat(json_schema="{not json"))
            ),
            "sampling.response_format.json_schema",
        ),
    ],
)
def test_bad_input_names_the_field(stub, req, field):
    with pytest.raises(grpc.RpcError) as e:
        _run(stub, req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field), e.value.details()


def test_streamed_tool_call_deltas():
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    stream = ToolCallStream(ToolFormat.HERMES, lambda: "call_0")
    msgs = []
    for i in range(0, len(raw), 7):
        last = i + 7 >= len(raw)
        msg = pb.GenerateResponse(request_id="r", finished=last, finish_reason="stop" if last else "")
        _with_tool_calls(msg, stream, raw[i : i + 7], last)
        msgs.append(msg)
    assert all(not m.text for m in msgs)
    deltas = [d for m in msgs for d in m.tool_calls]
    assert deltas[0].id == "call_0" and deltas[0].name == "get_weather"
    assert json.loads("".join(d.arguments for d in deltas)) == {"city": "Paris"}
    assert msgs[-1].finish_reason == "tool_calls"
