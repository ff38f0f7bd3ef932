"""``router.tool_call_format``: validated where the config is built (an unknown name is an error
naming the setting), ``auto`` by default (the format is read from the chat template), and a set
format is the one both frontends force calls in and parse them with."""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from baton.config import ConfigError, load_config
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pb_grpc
from router.grpc_server import GrpcServer
from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from router.tool_calls.parsers import ToolFormat, ToolFormatSetting
from tests.router.fake_router import FakeRouter

PARAMS: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "weather?"}]
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        (None, None),
        ("auto", None),
        ("hermes", ToolFormat.HERMES),
        ("llama3", ToolFormat.LLAMA3_JSON),
        ("mistral", ToolFormat.MISTRAL),
    ],
)
def test_the_setting_names_a_format_or_auto(name, fmt):
    cfg = load_config(overrides={"router.tool_call_format": name})
    assert cfg.router.tool_call_format is ToolFormatSetting(name or "auto")
    assert cfg.router.tool_call_format.tool_format is fmt


@pytest.mark.parametrize("name", ["llama", "MISTRAL", "", 3])
def test_an_unknown_format_is_refused_naming_the_setting(name):
    with pytest.raises(ConfigError, match=r"router\.tool_call_format") as e:
        load_config(overrides={"router.tool_call_format": name})
    assert "mistral" in str(e.value)  # (the allowed names are listed)


def _forced_grammar(fake: FakeRouter) -> str:
    c = fake.requests[-1].sampling.structured
    assert c is not None and c.field == "tool_choice"
    return c.spec


def test_grpc_forces_calls_in_the_set_format():
    fake = FakeRouter(max_model_len=1000)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = GrpcServer(fake, "127.0.0.1", 0, tool_format=ToolFormatSetting.MISTRAL.tool_format)
    port = asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            req = pb.GenerateRequest(
                chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="weather?")]),
                tools=[pb.Tool(name="get_weather", parameters_json=json.dumps(PARAMS))],
                tool_choice=pb.ToolChoice(mode=pb.ToolChoice.REQUIRED),
            )
            list(pb_grpc.GenerationStub(ch).Generate(req, timeout=10))
        assert _forced_grammar(fake).startswith('start: <[TOOL_CALLS]> "["')
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_http_forces_calls_in_the_set_format():
    fake = FakeRouter()
    app = create_app(fake, served_model_name="m", tool_format=ToolFormatSetting.LLAMA3.tool_format)
    srv = ThreadedHttpServer(app, "127.0.0.1", 0).start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="sk", max_retries=0, timeout=10)
        client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=4)
        assert _forced_grammar(fake).startswith("start: obj")  # (Llama 3's bare JSON call)
    finally:
        srv.stop()


@pytest.mark.parametrize(("setting", "skips"), [(ToolFormatSetting.MISTRAL, False), (ToolFormatSetting.HERMES, True)])
def test_mistral_text_keeps_special_tokens(setting, skips):
    """(Its ``[TOOL_CALLS]`` is a special token: test_mistral_special_token.py.)"""
    fake = FakeRouter()
    srv = ThreadedHttpServer(create_app(fake, served_model_name="m", tool_format=setting.tool_format), "127.0.0.1", 0)
    srv.start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="sk", max_retries=0, timeout=10)
        client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=4)
        assert fake.requests[-1].sampling.skip_special_tokens is skips
    finally:
        srv.stop()
