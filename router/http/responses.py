"""Builders of the OpenAI response objects: whole completions, stream chunks, usage and errors.

Plain dicts rather than pydantic models: they are built once per token on the streaming path and
only ever serialized, so validation would buy nothing. Ids are ``cmpl-<request id>`` /
``chatcmpl-<request id>`` (without doubling a ``cmpl-`` the router already put there); the bare
request id is the ``X-Request-Id`` header (what ``/v1/abort/{request_id}`` takes).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from router.api import ErrorKind, GenerationResult, RouterError, StreamEvent, Usage
from router.http.logprobs import LogprobsFormatter
from router.http.tool_output import ToolDeltas, assistant_message, tool_message
from router.tool_calls.parsers import ToolFormat

SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def sse(obj: object) -> bytes:
    """One server-sent event: a ``data:`` line and the blank line that ends the event."""
    return f"data: {dumps(obj)}\n\n".encode()


def internal_error(message: str = "The server had an error while processing your request.") -> RouterError:
    return RouterError(ErrorKind.INTERNAL, message)


def response_id(request_id: str, *, chat: bool) -> str:
    base = request_id if request_id.startswith("cmpl-") else f"cmpl-{request_id}"
    return f"chat{base}" if chat else base


def baton_version() -> str:
    try:
        return importlib.metadata.version("baton")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def system_fingerprint(model: str) -> str:
    """OpenAI's ``system_fingerprint`` (a string; typed clients reject null): names the backend
    configuration, here the served model and the Baton release, so it changes when either does."""
    return "fp_" + hashlib.sha256(f"{model}\0baton {baton_version()}".encode()).hexdigest()[:10]


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _finish(reason: str | None) -> str:
    return reason or "stop"


def _logprobs(result: GenerationResult, formatter: Callable[[], LogprobsFormatter] | None) -> dict[str, Any] | None:
    if formatter is None or result.logprobs is None:
        return None
    return formatter().format(result.logprobs, prompt=result.prompt_logprobs or ())


def total_usage(usages: Sequence[Usage]) -> Usage:
    """The usage of a request's choices together: the prompt counted once, every choice's output."""
    return Usage(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages), usages[0].cached_tokens)


def prompt_only(r: GenerationResult) -> GenerationResult:
    """A completion with ``echo`` and ``max_tokens`` 0: the token it ran for taken out."""
    return replace(
        r,
        text="",
        token_ids=(),
        finish_reason="length",
        usage=replace(r.usage, completion_tokens=0),
        logprobs=None if r.logprobs is None else (),
    )


def text_completion(
    results: Sequence[GenerationResult],
    *,
    model: str,
    created: int,
    fingerprint: str,
    echo_text: str | None = None,
    logprobs: Callable[[], LogprobsFormatter] | None = None,
) -> dict[str, Any]:
    """The ``text_completion`` object of a non-streaming /v1/completions call (one choice per result)."""
    return {
        "id": response_id(results[0].request_id, chat=False),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "text": (echo_text or "") + r.text,
                "logprobs": _logprobs(r, logprobs),
                "finish_reason": _finish(r.finish_reason),
            }
            for i, r in enumerate(results)
        ],
        "usage": usage_dict(total_usage([r.usage for r in results])),
        "system_fingerprint": fingerprint,
    }


def chat_completion(
    results: Sequence[GenerationResult],
    *,
    model: str,
    created: int,
    fingerprint: str,
    logprobs: Callable[[], LogprobsFormatter] | None = None,
    tool_format: ToolFormat | None = None,
) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streaming /v1/chat/completions call (one choice per
    result); with ``tool_format``, each output is read for tool calls in that format."""
    if tool_format is not None:
        messages = [tool_message(tool_format, r.text, _finish(r.finish_reason)) for r in results]
    else:
        messages = [(assistant_message(r.text), _finish(r.finish_reason)) for r in results]
    return {
        "id": response_id(results[0].request_id, chat=True),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "message": messages[i][0], "logprobs": _logprobs(r, logprobs), "finish_reason": messages[i][1]}
            for i, r in enumerate(results)
        ],
        "usage": usage_dict(total_usage([r.usage for r in results])),
        "system_fingerprint": fingerprint,
    }


@dataclass
class ChunkBuilder:
    """Turns one request's ``StreamEvent``s into OpenAI stream chunks (``chat.completion.chunk`` or
    streamed ``text_completion``). With ``include_usage`` every chunk carries ``"usage": null`` and a
    last chunk with empty ``choices`` carries the usage, as OpenAI does."""

    request_id: str
    model: str
    created: int
    chat: bool
    fingerprint: str
    include_usage: bool = False
    logprobs: Callable[[], LogprobsFormatter] | None = None  # set when the request asked for logprobs
    tool_format: ToolFormat | None = None  # set when the output is read for tool calls
    _formatters: dict[int, LogprobsFormatter] = field(default_factory=dict)  # one per choice
    _tools: dict[int, ToolDeltas] = field(default_factory=dict)  # one per choice

    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": response_id(self.request_id, chat=self.chat),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [] if choice is None else [choice],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        *,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        delta: dict[str, Any] = (
            {"role": "assistant", "content": text, "refusal": None} if role else ({"content": text} if text else {})
        )
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self, echo_text: str | None = None, index: int = 0) -> dict[str, Any] | None:
        """The chunk sent for a choice before any token: the assistant role for chat, the echoed
        prompt for completions with ``echo`` (nothing otherwise)."""
        if self.chat:
            return self._chunk(self._choice(index, "", None, role=True))
        if echo_text:
            return self._chunk(self._choice(index, echo_text, None))
        return None

    def delta(self, ev: StreamEvent, index: int = 0) -> dict[str, Any] | None:
        """The chunk for one event of choice ``index``; None for an empty non-final event (nothing
        to say). Logprobs go with the chunk of the event that carried their tokens, even if its text
        is held back (a possible stop string)."""
        logprobs = None
        if self.logprobs is not None and (ev.logprobs or ev.prompt_logprobs):
            formatter = self._formatters.get(index)
            if formatter is None:
                formatter = self._formatters[index] = self.logprobs()
            logprobs = formatter.format(ev.logprobs or (), prompt=ev.prompt_logprobs or ())
        if self.tool_format is not None:
            return self._tool_delta(ev, index, logprobs)
        if not ev.text and not ev.finished and logprobs is None:
            return None
        return self._chunk(
            self._choice(index, ev.text, _finish(ev.finish_reason) if ev.finished else None, logprobs=logprobs)
        )

    def _tool_delta(self, ev: StreamEvent, index: int, logprobs: dict[str, Any] | None) -> dict[str, Any] | None:
        """A chat delta whose text is read for tool calls (markup held back, calls as ``tool_calls``)."""
        tools = self._tools.get(index)
        if tools is None:
            tools = self._tools[index] = ToolDeltas(self.tool_format)  # type: ignore[arg-type]
        delta = tools.delta(ev.text, ev.finished)
        if not delta and not ev.finished and logprobs is None:
            return None
        finish = tools.finish_reason(_finish(ev.finish_reason)) if ev.finished else None
        return self._chunk({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})

    def usage(self, usage: Usage) -> dict[str, Any]:
        chunk = self._chunk(None)
        chunk["usage"] = usage_dict(usage)
        return chunk
