"""Tool calls in chat responses: a finished output's message (content and ``tool_calls``) and a
streamed choice's deltas, as OpenAI shapes them; ``finish_reason`` ``tool_calls`` where the output
ended in calls."""

from __future__ import annotations

from typing import Any

from router.tool_calls.parsers import ToolCall, ToolFormat, new_call_id, parse
from router.tool_calls.streaming import StreamDelta, ToolCallStream


def _call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def assistant_message(content: str | None, **extra: Any) -> dict[str, Any]:
    """A chat completion's message: ``refusal`` is always present (null: Baton never refuses in-band)."""
    return {"role": "assistant", "content": content, "refusal": None, **extra}


def tool_message(fmt: ToolFormat, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
    """(the assistant message, the finish reason) of a whole output read for tool calls."""
    content, calls = parse(fmt, text, new_call_id)
    if not calls:
        return assistant_message(text), finish_reason
    return (
        assistant_message(content, tool_calls=[_call(c) for c in calls]),
        "tool_calls" if finish_reason == "stop" else finish_reason,
    )


class ToolDeltas:
    """One streamed choice's text turned into chat deltas with ``tool_calls``."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.stream = ToolCallStream(fmt, new_call_id)

    def delta(self, text: str, finished: bool) -> dict[str, Any]:
        d = self.stream.feed(text)
        if finished:
            rest = self.stream.finish()
            d = StreamDelta(d.content + rest.content, d.tool_calls + rest.tool_calls)
        out: dict[str, Any] = {}
        if d.content:
            out["content"] = d.content
        if d.tool_calls:
            out["tool_calls"] = [
                {
                    "index": t.index,
                    **({"id": t.id, "type": "function"} if t.id else {}),
                    "function": {**({"name": t.name} if t.name else {}), "arguments": t.arguments},
                }
                for t in d.tool_calls
            ]
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if reason == "stop" and self.stream.num_calls else reason
