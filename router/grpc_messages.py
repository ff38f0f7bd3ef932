"""``baton.v1`` messages <-> ``router.api`` types: shape checks of a ``GenerateRequest`` (each
problem an ``invalid`` error naming the proto field) and a ``GenerateResponse`` per stream event."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.errors import InvalidParameterError
from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from engine.structured.constraint import ConstraintKind, StructuredOutput
from router.api import CHAT_ROLES, ChatMessage, GenerateRequest, StreamEvent, invalid
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.request_ids import REQUEST_ID_RULE, is_valid_request_id
from router.tool_calls.constraint import FunctionTool, tool_call_constraint
from router.tool_calls.parsers import ToolCall, ToolFormat, keep_markup
from router.tool_calls.streaming import StreamDelta

MAX_ID_LEN = 256  # idempotency_key (request_id follows router/request_ids.py)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name


# -- proto -> router.api --------------------------------------------------------------------------
def _optional_str(msg: Any, name: str, *, max_len: int | None = None) -> str | None:
    if not msg.HasField(name):
        return None
    value = getattr(msg, name)
    if not value:
        raise invalid("must not be empty when set", param=name)
    if max_len is not None and len(value) > max_len:
        raise invalid(f"must be at most {max_len} characters", param=name)
    return str(value)  # (a proto string field)


def _request_id(msg: pb.GenerateRequest) -> str | None:
    """The HTTP frontend's rule for a client-chosen id: it reaches logs and names durable batch
    jobs, which ``GET /v1/batches/{id}`` must be able to name."""
    rid = _optional_str(msg, "request_id")
    if rid is not None and not is_valid_request_id(rid):
        raise invalid(f"must be {REQUEST_ID_RULE}", param="request_id", code="invalid_request_id")
    return rid


def sampling_from_proto(msg: pb.SamplingParameters | None) -> SamplingParams:
    """Absent optional fields keep the ``SamplingParams`` defaults; its validation names the field."""
    if msg is None:
        return SamplingParams()
    kwargs: dict[str, Any] = {
        "stop": tuple(msg.stop),
        "stop_token_ids": tuple(msg.stop_token_ids),
        "ignore_eos": msg.ignore_eos,
        "include_stop_str_in_output": msg.include_stop_str_in_output,
        "logit_bias": dict(msg.logit_bias),
    }
    for name in (
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "min_tokens",
        "skip_special_tokens",
        "logprobs",
        "prompt_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
    ):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    try:
        if msg.HasField("response_format"):
            kwargs["structured"] = _response_format(msg.response_format)
        return SamplingParams(**kwargs)
    except InvalidParameterError as err:
        raise invalid(err.message, param=f"sampling.{err.param}") from None


def _response_format(rf: pb.ResponseFormat) -> StructuredOutput:
    """(Field names as the HTTP API's, so errors name ``response_format...`` in both.)"""
    kind = rf.WhichOneof("format")
    field = f"response_format.{kind}"
    if kind == "json_object":
        return StructuredOutput(ConstraintKind.JSON_OBJECT, "", field)
    if kind == "json_schema":
        try:
            schema = json.loads(rf.json_schema)
        except ValueError:
            raise InvalidParameterError(field, "json_schema is not valid JSON") from None
        return StructuredOutput.json_schema(schema, field)
    if kind == "choice":
        return StructuredOutput.choice(list(rf.choice.choices), field)
    if kind == "regex":
        return StructuredOutput(ConstraintKind.REGEX, rf.regex, field)
    if kind == "grammar":
        return StructuredOutput(ConstraintKind.GRAMMAR, rf.grammar, field)
    raise InvalidParameterError(
        "response_format", "one of json_object, json_schema, regex, choice or grammar is required"
    )


def _tools(msg: pb.GenerateRequest) -> tuple[FunctionTool, ...]:
    tools = []
    for i, t in enumerate(msg.tools):
        if not _TOOL_NAME.fullmatch(t.name):
            raise invalid("must be 1 to 64 letters, digits, '_' or '-'", param=f"tools[{i}].name")
        try:
            params = json.loads(t.parameters_json) if t.parameters_json else {"type": "object", "properties": {}}
        except ValueError:
            params = None
        if not isinstance(params, dict):
            raise invalid("must be a JSON schema object", param=f"tools[{i}].parameters_json")
        tools.append(FunctionTool(t.name, json.dumps(params), t.description if t.HasField("description") else None))
    if len({t.name for t in tools}) != len(tools):
        raise invalid("names a function twice", param="tools")
    return tuple(tools)


def _forced_tools(msg: pb.GenerateRequest, tools: tuple[FunctionTool, ...]) -> list[FunctionTool] | None:
    """The tools the output must call (REQUIRED: any; a named function: it), or None."""
    if not msg.HasField("tool_choice"):
        return None
    which = msg.tool_choice.WhichOneof("choice")
    if which == "function":
        named = [t for t in tools if t.name == msg.tool_choice.function]
        if not named:
            raise invalid(
                f"names the function {msg.tool_choice.function[:64]!r}, which is not among tools",
                param="tool_choice.function",
            )
        return named
    if which == "mode" and msg.tool_choice.mode == pb.ToolChoice.REQUIRED:
        if not tools:
            raise invalid("REQUIRED is only allowed when tools are given", param="tool_choice.mode")
        return list(tools)
    return None


def parses_tools(msg: pb.GenerateRequest) -> bool:
    """Whether the output is read for tool calls (tools given, tool_choice not NONE)."""
    none = (
        msg.HasField("tool_choice")
        and msg.tool_choice.WhichOneof("choice") == "mode"
        and msg.tool_choice.mode == pb.ToolChoice.NONE
    )
    return bool(msg.tools) and not none


def request_from_proto(
    msg: pb.GenerateRequest,
    tenant: str,
    time_remaining: float | None,
    tool_format: Callable[[], ToolFormat] = lambda: ToolFormat.HERMES,
) -> GenerateRequest:
    """Shape-check a ``GenerateRequest`` and build the router's; raises ``RouterError`` (invalid).
    ``tool_format()``: the served model's tool-call format (a forced call's grammar is in it)."""
    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    add_generation_prompt = True
    kind = msg.WhichOneof("input")
    if kind is None:
        raise invalid("one of text, token_ids or chat is required", param="input")
    if kind == "text":
        if not msg.text:
            raise invalid("the prompt must not be empty", param="text")
        prompt = msg.text
    elif kind == "token_ids":
        if not msg.token_ids.ids:
            raise invalid("the prompt must contain at least one token id", param="token_ids")
        token_ids = tuple(msg.token_ids.ids)
    else:
        if not msg.chat.messages:
            raise invalid("at least one message is required", param="chat.messages")
        for i, m in enumerate(msg.chat.messages):
            if not m.role:
                raise invalid("the role must not be empty", param=f"chat.messages[{i}].role")
            if m.role not in CHAT_ROLES:  # (the HTTP schema's roles: was passed to the template as sent)
                raise invalid(
                    f"the role must be one of {', '.join(CHAT_ROLES)}, got {m.role[:40]!r}",
                    param=f"chat.messages[{i}].role",
                )
            if not m.HasField("content") and m.role != "assistant":  # (the HTTP API's rule: schemas.py)
                raise invalid(f"a '{m.role}' message needs content", param=f"chat.messages[{i}].content")
        messages = tuple(
            ChatMessage.from_client(
                m.role, m.content, _message_calls(m, i), m.tool_call_id if m.HasField("tool_call_id") else None
            )
            for i, m in enumerate(msg.chat.messages)
        )
        if msg.chat.HasField("add_generation_prompt"):
            add_generation_prompt = msg.chat.add_generation_prompt
    has_sampling = msg.HasField("sampling")
    sampling = sampling_from_proto(msg.sampling if has_sampling else None)
    tools = _tools(msg)
    if tools and kind != "chat":
        raise invalid("tools need chat input", param="tools")
    forced = _forced_tools(msg, tools)
    if forced:  # the output is a call, by grammar
        if sampling.structured is not None:
            raise invalid("a forced tool call cannot be combined with sampling.response_format", param="tool_choice")
        parallel = msg.parallel_tool_calls if msg.HasField("parallel_tool_calls") else True
        sampling = dataclasses.replace(sampling, structured=tool_call_constraint(tool_format(), forced, parallel))
    if tools and parses_tools(msg):
        sampling = keep_markup(tool_format(), sampling)
    deadline_s = None
    if time_remaining is not None and math.isfinite(time_remaining):
        deadline_s = time.monotonic() + max(0.0, time_remaining)
    return GenerateRequest(
        sampling=sampling,
        tools=tools,
        prompt=prompt,
        prompt_token_ids=token_ids,
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        stream=True,
        lane=_optional_str(msg, "lane"),
        tenant=tenant,
        request_id=_request_id(msg),
        idempotency_key=_optional_str(msg, "idempotency_key", max_len=MAX_ID_LEN),
        max_tokens_given=has_sampling and msg.sampling.HasField("max_tokens"),
        deadline_s=deadline_s,
        endpoint="grpc",
    )


def _token_logprobs(
    logprobs: Sequence[TokenLogprob], token_bytes: Callable[[Sequence[int]], list[bytes]]
) -> list[pb.TokenLogprob]:
    if not logprobs:
        return []
    ids = [lp.token_id for lp in logprobs] + [t for lp in logprobs for t, _ in lp.top]
    raw = dict(zip(ids, token_bytes(ids)))
    return [
        pb.TokenLogprob(
            token_id=lp.token_id,
            logprob=lp.logprob,
            token=raw[lp.token_id],
            top_logprobs=[pb.TopLogprob(token_id=t, logprob=v, token=raw[t]) for t, v in lp.top],
        )
        for lp in logprobs
    ]


def response_from_event(
    ev: StreamEvent, lane: str, token_bytes: Callable[[Sequence[int]], list[bytes]] | None = None
) -> pb.GenerateResponse:
    """``token_bytes`` names the tokens of the event's logprobs (RouterAPI.token_bytes)."""
    out = pb.GenerateResponse(
        request_id=ev.request_id,
        text=ev.text,
        token_ids=ev.token_ids,
        finished=ev.finished,
        finish_reason=ev.finish_reason or "",
        lane=lane,
    )
    if token_bytes is not None:
        out.logprobs.extend(_token_logprobs(ev.logprobs or (), token_bytes))
        out.prompt_logprobs.extend(
            _token_logprobs([lp for lp in ev.prompt_logprobs or () if lp.logprob is not None], token_bytes)
        )
    if ev.usage is not None:
        out.usage.CopyFrom(
            pb.Usage(
                prompt_tokens=ev.usage.prompt_tokens,
                completion_tokens=ev.usage.completion_tokens,
                cached_tokens=ev.usage.cached_tokens,
            )
        )
    if isinstance(ev.stop_reason, str):
        out.stop_string = ev.stop_reason
    elif isinstance(ev.stop_reason, int):
        out.stop_token_id = ev.stop_reason
    return out


def _message_calls(m: pb.ChatMessage, i: int) -> tuple[ToolCall, ...]:
    calls = []
    for j, c in enumerate(m.tool_calls):
        try:
            ok = isinstance(json.loads(c.arguments), dict)
        except ValueError:
            ok = False
        if not c.id or not c.name or not ok:
            raise invalid(
                "needs an id, a name and arguments that are a JSON object", param=f"chat.messages[{i}].tool_calls[{j}]"
            )
        calls.append(ToolCall(c.id, c.name, c.arguments))
    return tuple(calls)


def tool_call_deltas(delta: StreamDelta) -> list[pb.ToolCallDelta]:
    return [
        pb.ToolCallDelta(index=t.index, id=t.id or "", name=t.name or "", arguments=t.arguments)
        for t in delta.tool_calls
    ]
