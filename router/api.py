"""The router's public contract for its frontends (HTTP, gRPC): typed requests, stream events,
errors that map onto HTTP statuses and gRPC codes, and the ``RouterAPI`` protocol (pure Python).

A frontend parses and shape-checks its wire format, authenticates (``RouterAPI.authenticate``),
builds a ``GenerateRequest`` and calls ``RouterAPI.generate``; admission failures raise a
``RouterError`` *before* any output. The returned ``GenerationStream`` yields ``StreamEvent``s
until one has ``finished``; a frontend whose client goes away calls ``abort()``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from router.tool_calls.constraint import FunctionTool
from router.tool_calls.parsers import ToolCall


# -- errors -------------------------------------------------------------------------------------
class ErrorKind(enum.Enum):
    """Each kind maps to one HTTP status and one gRPC code."""

    INVALID_REQUEST = ("invalid_request_error", 400, "INVALID_ARGUMENT")
    UNAUTHENTICATED = ("authentication_error", 401, "UNAUTHENTICATED")
    PERMISSION_DENIED = ("permission_error", 403, "PERMISSION_DENIED")
    NOT_FOUND = ("not_found_error", 404, "NOT_FOUND")
    CONFLICT = ("conflict_error", 409, "ALREADY_EXISTS")
    RATE_LIMITED = ("rate_limit_error", 429, "RESOURCE_EXHAUSTED")
    OVERLOADED = ("overloaded_error", 503, "UNAVAILABLE")
    DEADLINE_EXCEEDED = ("timeout_error", 504, "DEADLINE_EXCEEDED")
    INTERNAL = ("internal_error", 500, "INTERNAL")

    @property
    def type(self) -> str:
        return self.value[0]

    @property
    def http_status(self) -> int:
        return self.value[1]

    @property
    def grpc_code(self) -> str:
        """Name of the ``grpc.StatusCode`` member."""
        return self.value[2]


class RouterError(Exception):
    """A request the router will not (or cannot) serve, with everything a frontend needs to say so."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code  # a short machine-readable reason, e.g. "context_length_exceeded", "queue_full"
        self.retry_after_s = retry_after_s

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.kind.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> RouterError:
    return RouterError(ErrorKind.INVALID_REQUEST, message, param=param, code=code)


# -- requests -----------------------------------------------------------------------------------
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # what clients may send (OpenAI's)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers

    @classmethod
    def from_client(
        cls, role: str, content: str, tool_calls: tuple[ToolCall, ...] = (), tool_call_id: str | None = None
    ) -> ChatMessage:
        """A client's message (``role`` one of ``CHAT_ROLES``): OpenAI's newer "developer" is
        "system" to open models' chat templates, which know only that name."""
        return cls("system" if role == "developer" else role, content, tool_calls, tool_call_id)

    def to_template(self) -> dict[str, Any]:
        """As chat templates receive it (transformers' semantics: a call's arguments as an object)."""
        m: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        return m


class ChoiceCharge:
    """The rate-limit charge of one frontend request's ``n`` choices (router/choices.py), taken all at
    once: the first choice to reach the rate limiter takes ``pending`` requests (itself and every
    choice after it) and their tokens, the later ones take nothing. So ``n`` can never be admitted
    piecemeal (choices started, then a 429 throws them away) and ``n`` beyond the bucket is a 400
    like any request too large for it. ``Choices.start`` sets ``pending`` before each choice and
    gives the charge back if a later choice is refused."""

    def __init__(self, n: int) -> None:
        self.pending = n  # choices not yet started, the one being admitted included
        self.charged = False
        self.refund: Callable[[], Awaitable[None]] | None = None

    async def give_back(self) -> None:
        refund, self.refund, self.charged = self.refund, None, False
        if refund is not None:
            await refund()


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request, whichever frontend it came through. Exactly one of ``prompt``,
    ``prompt_token_ids`` and ``messages`` is set."""

    sampling: SamplingParams
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    add_generation_prompt: bool = True
    tools: tuple[FunctionTool, ...] = ()  # rendered by the chat template (tools=); their schemas compiled
    stream: bool = False
    lane: str | None = None  # explicit lane (request field or X-Baton-Lane header); checked against the tenant
    tenant: str = "default"
    request_id: str | None = None  # None: the router assigns one
    idempotency_key: str | None = None
    max_tokens_given: bool = True  # classification rules look at whether the client bounded the output
    max_tokens_param: str = "max_tokens"  # the field the client bounded it with (errors name it)
    deadline_s: float | None = None  # absolute monotonic time after which the request is aborted
    echo_prompt: bool = False  # completions' ``echo``
    endpoint: str = "completions"  # "completions" | "chat" | "grpc" (for metrics labels)
    num_choices: int = 1  # the client's ``n``: this request is one of them (router/choices.py)
    charge: ChoiceCharge | None = field(default=None, compare=False)  # its choices' shared rate-limit charge
    # The client's W3C trace context (HTTP headers / gRPC metadata): the request's spans join its trace.
    traceparent: str | None = None
    tracestate: str | None = None


# -- outputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class StreamEvent:
    """A delta of one request; the last one has ``finished=True`` and ``usage``."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    usage: Usage | None = None
    error: RouterError | None = None  # set when the request failed after streaming started
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of ``token_ids``, when asked for
    # On the event with the first token, when asked for: one per prompt token (the first's is None).
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    usage: Usage
    lane: str
    prompt_text: str | None = None  # for ``echo``
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of ``token_ids``, when asked for
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # one per prompt token, when asked for

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what Redis keeps for idempotent replays and batch jobs)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GenerationResult:
        u = d.get("usage") or {}
        return cls(
            d["request_id"],
            d["text"],
            tuple(d["token_ids"]),
            d.get("finish_reason"),
            Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0), u.get("cached_tokens", 0)),
            d.get("lane", ""),
            d.get("prompt_text"),
            _logprobs(d.get("logprobs")),
            _logprobs(d.get("prompt_logprobs")),
        )


def _logprobs(stored: list[dict[str, Any]] | None) -> tuple[TokenLogprob, ...] | None:
    if stored is None:
        return None
    return tuple(TokenLogprob(lp["token_id"], lp["logprob"], tuple((t, v) for t, v in lp["top"])) for lp in stored)


class GenerationStream(Protocol):
    request_id: str
    lane: str

    def __aiter__(self) -> AsyncIterator[StreamEvent]: ...

    async def result(self) -> GenerationResult:
        """Consume the stream to the end and return the whole generation (raises RouterError if it failed)."""
        ...

    async def abort(self) -> None:
        """The client went away: stop the request in both pools and free its blocks (a durable
        batch job goes on: it outlives its client)."""
        ...

    async def cancel(self) -> None:
        """The request is refused after all (a later choice of the same request was): stop it
        wherever it is, a durable batch job too."""
        ...


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_model_len: int
    vocab_size: int
    created: int
    lanes: tuple[str, ...] = ()
    owned_by: str = "baton"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class RouterAPI(Protocol):
    """What the HTTP and gRPC frontends need from the router."""

    def authenticate(self, api_key: str | None) -> str:
        """The tenant for an API key (None: no key given). Raises RouterError(UNAUTHENTICATED)."""
        ...

    async def generate(self, request: GenerateRequest) -> GenerationStream:
        """Validate, classify, admit and queue. Raises RouterError before anything is streamed."""
        ...

    async def abort(self, request_id: str, tenant: str) -> bool: ...

    def model_info(self) -> ModelInfo: ...

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        """The bytes each token stands for (logprobs name their tokens with them)."""
        ...

    def tokenize(self, request: GenerateRequest) -> list[int]:
        """The prompt's token ids exactly as a generation would see them (chat template included).
        Raises RouterError (invalid) for a bad prompt."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Raises RouterError (invalid) for ids outside the vocabulary or a model without a tokenizer."""
        ...

    def readiness(self) -> Readiness:
        """Not ready while draining or while a pool has no live worker."""
        ...

    def metrics(self) -> tuple[bytes, str]:
        """(Prometheus exposition of the whole cluster, content type)."""
        ...

    async def batch_result(self, job_id: str, tenant: str) -> dict[str, Any]:
        """A durable batch-lane job: {"id", "status", "result"?}. Raises RouterError(NOT_FOUND)."""
        ...
