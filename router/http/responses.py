"""Builders of the OpenAI response objects: whole completions, stream chunks, usage and errors.

Plain dicts rather than pydantic models: they are built once per token on the streaming path and
only ever serialized, so validation would buy nothing. Ids are ``cmpl-<request id>`` /
``chatcmpl-<request id>`` (without doubling a ``cmpl-`` the router already put there); the bare
request id is the ``X-Request-Id`` header (what ``/v1/abort/{request_id}`` takes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from router.api import GenerationResult, StreamEvent, Usage
from router.http.logprobs import LogprobsFormatter

SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def sse(obj: object) -> bytes:
    """One server-sent event: a ``data:`` line and the blank line that ends the event."""
    return f"data: {dumps(obj)}\n\n".encode()


def response_id(request_id: str, *, chat: bool) -> str:
    base = request_id if request_id.startswith("cmpl-") else f"cmpl-{request_id}"
    return f"chat{base}" if chat else base


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _finish(reason: str | None) -> str:
    return reason or "stop"


def _logprobs(result: GenerationResult, formatter: LogprobsFormatter | None) -> dict | None:
    if formatter is None or result.logprobs is None:
        return None
    return formatter.format(result.logprobs)


def text_completion(result: GenerationResult, *, model: str, created: int, echo_text: str | None = None,
                    logprobs: LogprobsFormatter | None = None) -> dict:
    """The ``text_completion`` object of a non-streaming /v1/completions call."""
    text = (echo_text or "") + result.text
    return {
        "id": response_id(result.request_id, chat=False),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": _logprobs(result, logprobs),
                     "finish_reason": _finish(result.finish_reason)}],
        "usage": usage_dict(result.usage),
        "system_fingerprint": None,
    }


def chat_completion(result: GenerationResult, *, model: str, created: int,
                    logprobs: LogprobsFormatter | None = None) -> dict:
    """The ``chat.completion`` object of a non-streaming /v1/chat/completions call."""
    return {
        "id": response_id(result.request_id, chat=True),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": _logprobs(result, logprobs),
            "finish_reason": _finish(result.finish_reason),
        }],
        "usage": usage_dict(result.usage),
        "system_fingerprint": None,
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
    include_usage: bool = False
    logprobs: LogprobsFormatter | None = None  # set when the request asked for logprobs

    def _chunk(self, choice: dict | None) -> dict:
        chunk = {
            "id": response_id(self.request_id, chat=self.chat),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [] if choice is None else [choice],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(self, text: str, finish_reason: str | None, *, role: bool = False, logprobs: dict | None = None) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        delta: dict = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self, echo_text: str | None = None) -> dict | None:
        """The chunk sent before any token: the assistant role for chat, the echoed prompt for
        completions with ``echo`` (nothing otherwise)."""
        if self.chat:
            return self._chunk(self._choice("", None, role=True))
        if echo_text:
            return self._chunk(self._choice(echo_text, None))
        return None

    def delta(self, ev: StreamEvent) -> dict | None:
        """The chunk for one event; None for an empty non-final event (nothing to say). Logprobs go
        with the chunk of the event that carried their tokens, even if its text is held back (a
        possible stop string)."""
        logprobs = self.logprobs.format(ev.logprobs) if self.logprobs is not None and ev.logprobs else None
        if not ev.text and not ev.finished and logprobs is None:
            return None
        return self._chunk(self._choice(ev.text, _finish(ev.finish_reason) if ev.finished else None,
                                        logprobs=logprobs))

    def usage(self, usage: Usage) -> dict:
        chunk = self._chunk(None)
        chunk["usage"] = usage_dict(usage)
        return chunk
