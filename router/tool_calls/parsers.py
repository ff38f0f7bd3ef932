"""Tool calls in a model's output, per the format its chat template teaches (pure Python):

- ``hermes`` (Hermes, Qwen2.5, SmolLM3...): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call, after any text;
- ``llama3_json`` (Llama 3.1+): the whole output is ``{"name": ..., "parameters": {...}}`` (calls
  separated by ``;``), optionally after ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` after any text.

``scan`` reads text that may still be arriving: the content that is surely not markup (a suffix
that may begin a call is held back), and each call as far as it has arrived, its arguments as the
raw JSON text (so pieces streamed as they come concatenate to the final arguments).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from router.tool_calls.json_scan import object_members, skip_ws


class ToolFormat(enum.StrEnum):
    HERMES = "hermes"
    LLAMA3_JSON = "llama3_json"
    MISTRAL = "mistral"


class ToolFormatSetting(enum.StrEnum):
    """``router.tool_call_format``: the format to parse (and force calls in), or ``auto``: the one
    the model's chat template teaches (``format_for_tokenizer``)."""

    AUTO = "auto"
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"

    @property
    def tool_format(self) -> ToolFormat | None:
        """The format it names (None for ``auto``: detected from the model)."""
        return _SETTING_FORMATS.get(self)


_SETTING_FORMATS = {
    ToolFormatSetting.HERMES: ToolFormat.HERMES,
    ToolFormatSetting.LLAMA3: ToolFormat.LLAMA3_JSON,
    ToolFormatSetting.MISTRAL: ToolFormat.MISTRAL,
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True, slots=True)
class PartialCall:
    name: str | None  # None until its name has arrived whole
    arguments: str  # the raw JSON of its arguments so far ("" until they begin)
    complete: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    content: str
    calls: tuple[PartialCall, ...]


_HERMES_START, _HERMES_END = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_START = "[TOOL_CALLS]"
_ARGUMENT_KEYS = ("arguments", "parameters")


def new_call_id() -> str:
    """A call's id, as OpenAI's look (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def format_for_model(model_name: str, chat_template: str | None) -> ToolFormat:
    """The format a model's chat template teaches (its markup in the template), else by name."""
    t, name = chat_template or "", model_name.lower()
    if _MISTRAL_START in t or "mistral" in name:
        return ToolFormat.MISTRAL
    if _HERMES_START in t:
        return ToolFormat.HERMES
    if _PYTHON_TAG in t or "llama-3" in name or "llama3" in name:
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.HERMES


def keep_markup(fmt: ToolFormat, sampling: SamplingParams) -> SamplingParams:
    """``sampling`` for an output read for tool calls in ``fmt``: Mistral's ``[TOOL_CALLS]`` is a
    special token, which text decoded without special tokens drops (the parser would never see a
    call), so that format's text keeps them (stop tokens stay out of the text either way)."""
    if fmt is ToolFormat.MISTRAL and sampling.skip_special_tokens:
        return dataclasses.replace(sampling, skip_special_tokens=False)
    return sampling


def scan(fmt: ToolFormat, text: str, final: bool) -> Snapshot:
    """What ``text`` (the output so far; all of it when ``final``) holds."""
    if fmt is ToolFormat.HERMES:
        return _scan_marked(text, final, _HERMES_START, _hermes_calls)
    if fmt is ToolFormat.MISTRAL:
        return _scan_marked(text, final, _MISTRAL_START, _mistral_calls)
    return _scan_llama3(text, final)


def parse(fmt: ToolFormat, text: str, new_id: Callable[[], str]) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output; content None when it is only calls. ``new_id()`` names a call."""
    snap = scan(fmt, text, final=True)
    calls = [ToolCall(new_id(), c.name, c.arguments) for c in snap.calls if c.complete and c.name is not None]
    return (snap.content or None) if calls else text, calls


def _held(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _scan_marked(text: str, final: bool, marker: str, calls_of: Callable[[str, bool], list[PartialCall]]) -> Snapshot:
    k = text.find(marker)
    if k < 0:
        return Snapshot(text if final else text[: len(text) - _held(text, marker)].rstrip(), ())
    calls = calls_of(text[k + len(marker) :], final)
    content = text[:k].rstrip()
    if final and not any(c.complete and c.name for c in calls):
        content = text  # markup without a call in it: the text as it is
    return Snapshot(content, tuple(calls))


def _call(body: str, start: int, final: bool) -> tuple[PartialCall | None, int | None]:
    """The call whose object starts at ``body[start]`` and the index after it (None: incomplete)."""
    if start >= len(body) or body[start] != "{":
        return None, None
    members, end = object_members(body, start)
    name = None
    if "name" in members and members["name"][1] is not None:
        a, e = members["name"]
        try:
            name = json.loads(body[a:e])
        except ValueError:
            return None, None
        if not isinstance(name, str):
            return None, None
    args = ""
    for key in _ARGUMENT_KEYS:
        if key in members:
            a, e = members[key]
            if e is not None:
                args = body[a:e]
            elif body[a] in "{[":  # streams as it comes
                args = body[a:]
            break
    complete = end is not None and name is not None and bool(args) and _is_object(args)
    return PartialCall(name, args, complete), end


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _hermes_calls(rest: str, final: bool) -> list[PartialCall]:
    calls = []
    while True:
        end_tag = rest.find(_HERMES_END)
        body = rest if end_tag < 0 else rest[:end_tag]
        call, _ = _call(body, skip_ws(body, 0), final)
        if call is not None:
            calls.append(call)
        if end_tag < 0:
            return calls
        nxt = rest.find(_HERMES_START, end_tag)
        if nxt < 0:
            return calls
        rest = rest[nxt + len(_HERMES_START) :]


def _mistral_calls(rest: str, final: bool) -> list[PartialCall]:
    i = skip_ws(rest, 0)
    if i >= len(rest) or rest[i] != "[":
        return []
    calls, i = [], skip_ws(rest, i + 1)
    while i < len(rest):
        call, end = _call(rest, i, final)
        if call is None:
            break
        calls.append(call)
        if end is None:
            break
        i = skip_ws(rest, end)
        if i < len(rest) and rest[i] == ",":
            i = skip_ws(rest, i + 1)
    return calls


def _scan_llama3(text: str, final: bool) -> Snapshot:
    body = text[len(_PYTHON_TAG) :] if text.startswith(_PYTHON_TAG) else text
    i = skip_ws(body, 0)
    if i >= len(body):  # nothing but whitespace yet (or a tag's prefix)
        return Snapshot(text if final else "", ())
    if body[i] != "{":
        if not final and _held(text, _PYTHON_TAG) == len(text):
            return Snapshot("", ())
        return Snapshot(text if final else text.rstrip(), ())
    calls = []
    while i < len(body):
        call, end = _call(body, i, final)
        if call is None:
            break
        calls.append(call)
        if end is None:
            break
        i = skip_ws(body, end)
        if i < len(body) and body[i] == ";":
            i = skip_ws(body, i + 1)
        elif i < len(body):
            break
    if final and not any(c.complete for c in calls):
        return Snapshot(text, ())  # JSON, but not a call: the text as it is
    return Snapshot("", tuple(calls))


_PROBE: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": {}}}],
    },
    {"role": "tool", "content": "{}", "tool_call_id": "call_0"},
)
_PROBE_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}


def format_for_tokenizer(tokenizer: Tokenizer | None, model_name: str) -> ToolFormat:
    """The format a model's chat template teaches: the markup it renders an assistant's call with
    (a template that renders none, or fails on the probe: by the model's name)."""
    if tokenizer is not None:
        try:
            rendered = tokenizer.apply_chat_template(_PROBE, add_generation_prompt=False, tools=[_PROBE_TOOL])
        except (ValueError, TypeError, KeyError, AttributeError):  # (a template may refuse the probe)
            rendered = ""
        for marker, fmt in (
            (_MISTRAL_START, ToolFormat.MISTRAL),
            (_HERMES_START, ToolFormat.HERMES),
            (_PYTHON_TAG, ToolFormat.LLAMA3_JSON),
        ):
            if marker in rendered:
                return fmt
    return format_for_model(model_name, None)
