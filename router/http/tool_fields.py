"""The tool-calling fields of a chat request (``tools``, ``tool_choice``, a message's ``tool_calls``)
validated into typed values; a malformed one is a 400 naming it (pydantic custom errors, mapped
by router/http/body.py). A function's parameters schema is compiled by the router (router/grammar_check.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic_core import PydanticCustomError

from router.tool_calls.constraint import FunctionTool
from router.tool_calls.parsers import ToolCall

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name


def _bad(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)


def function_tools(v: Any) -> tuple[FunctionTool, ...]:
    if not isinstance(v, list):
        raise PydanticCustomError("invalid_type", "Invalid type for 'tools': expected an array.")
    if len(v) > MAX_TOOLS:
        raise _bad(f"'tools' may hold at most {MAX_TOOLS} functions, got {len(v)}.")
    tools = []
    for i, t in enumerate(v):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}.")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _bad(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}.")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object.")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"tools[{i}].function.description must be a string.")
        tools.append(FunctionTool(name, json.dumps(params), description))
    if len({t.name for t in tools}) != len(tools):
        raise _bad("'tools' names a function twice.")
    return tuple(tools)


def _named(choice: dict[str, Any]) -> str:
    fn = choice.get("function")
    if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}."
        )
    return str(fn["name"])


def check_tool_choice(choice: str | dict[str, Any], tools: tuple[FunctionTool, ...]) -> None:
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _bad(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got {choice!r}.")
        if choice != "none" and not tools:
            raise _bad(f"'tool_choice' {choice!r} is only allowed when tools are specified.")
        return
    name = _named(choice)
    if name not in {t.name for t in tools}:
        raise _bad(f"'tool_choice' names the function {name!r}, which is not among 'tools'.")


def forced_tools(choice: str | dict[str, Any] | None, tools: tuple[FunctionTool, ...]) -> list[FunctionTool] | None:
    if not tools or choice in (None, "none", "auto"):
        return None
    if choice == "required":
        return list(tools)
    name = _named(choice)  # type: ignore[arg-type]
    return [t for t in tools if t.name == name]


def message_tool_call(c: Any) -> ToolCall:
    """One entry of an assistant message's ``tool_calls``."""
    fn = c.get("function") if isinstance(c, dict) else None
    if (
        not isinstance(c, dict)
        or not isinstance(fn, dict)
        or not isinstance(c.get("id"), str)
        or not isinstance(fn.get("name"), str)
        or not isinstance(fn.get("arguments"), str)
    ):
        raise _bad(
            "Each of 'tool_calls' must be {'id': ..., 'type': 'function', 'function': {'name': ..., "
            "'arguments': '<JSON text>'}}."
        )
    try:
        if not isinstance(json.loads(fn["arguments"]), dict):
            raise ValueError
    except ValueError:
        raise _bad(f"The arguments of tool call {c['id']!r} are not a JSON object.") from None
    return ToolCall(c["id"], fn["name"], fn["arguments"])
