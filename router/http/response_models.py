"""Pydantic models of the HTTP API's responses, as router/http/responses.py and app.py build them.

They exist for the published schema (router/http/openapi.py) and for tests that hold real responses
to it; the serving path builds plain dicts (validating every chunk would buy nothing). Objects are
closed (``extra="forbid"``): a field the builders add without adding it here fails the tests, so the
published schema cannot fall behind what is served. Shapes follow OpenAI's published ones; Baton's
additions are said where they occur.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# "abort" (stopped through POST /v1/abort or a server drain) and "error" (ended by a worker failure
# after streaming began) are vLLM's additions to OpenAI's reasons; the others are OpenAI's.
FinishReason = Literal["stop", "length", "tool_calls", "abort", "error"]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Closed):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...")
    param: str | None = Field(description="The request field (or header) at fault, when one is.")
    code: str | None = Field(description="A machine-readable reason, such as context_length_exceeded.")


class ErrorResponse(_Closed):
    """Every error: HTTP 4xx/5xx bodies, and the in-band event that ends a failed stream."""

    error: ErrorDetail


class PromptTokensDetails(_Closed):
    cached_tokens: int = Field(description="Prompt tokens served from the prefix cache.")


class Usage(_Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


# -- logprobs -----------------------------------------------------------------------------------
class CompletionLogprobs(_Closed):
    """Legacy completions' shape (with ``echo``, the prompt's tokens come first)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(_Closed):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(_Closed):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Closed):
    content: list[TokenLogprob] | None
    refusal: None = None


# -- /v1/completions ----------------------------------------------------------------------------
class CompletionChoice(_Closed):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(_Closed):
    """``POST /v1/completions`` without ``stream``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str


class CompletionChunkChoice(_Closed):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(_Closed):
    """One ``data:`` event of a streamed ``/v1/completions`` (the stream ends with ``data: [DONE]``).
    With ``stream_options.include_usage``, every chunk has ``"usage": null`` and a last one with no
    choices carries the usage."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


# -- /v1/chat/completions -----------------------------------------------------------------------
class FunctionCall(_Closed):
    name: str
    arguments: str = Field(description="JSON text of the arguments object.")


class MessageToolCall(_Closed):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Closed):
    role: Literal["assistant"]
    content: str | None
    refusal: None = Field(description="Always null: Baton does not refuse in-band.")
    tool_calls: list[MessageToolCall] | None = None


class ChatChoice(_Closed):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(_Closed):
    """``POST /v1/chat/completions`` without ``stream``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str


class FunctionCallDelta(_Closed):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Closed):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChatDelta(_Closed):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Closed):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Closed):
    """One ``data:`` event of a streamed ``/v1/chat/completions`` (the stream ends with ``data:
    [DONE]``); ``usage`` as for ``CompletionChunk``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# -- the other endpoints ------------------------------------------------------------------------
class Model(_Closed):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int = Field(description="Baton: the context length, prompt and output together.")
    lanes: list[str] = Field(description="Baton: the traffic-class lanes a request may name.")


class ModelList(_Closed):
    object: Literal["list"]
    data: list[Model]


class BatchJob(_Closed):
    """A durable batch-lane job (``GET /v1/batches/{job_id}``)."""

    id: str
    object: Literal["batch.job"]
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    result: dict[str, Any] | None = Field(
        default=None, description="When done: the generation (text, token_ids, finish_reason, usage, ...)."
    )
    error: str | None = None


class Aborted(_Closed):
    id: str
    object: Literal["abort"]
    aborted: Literal[True]


class Tokenized(_Closed):
    count: int
    max_model_len: int
    tokens: list[int]


class Detokenized(_Closed):
    prompt: str


class Health(_Closed):
    status: Literal["ok"]


class Ready(_Closed):
    status: Literal["ready", "not_ready"]
    reason: str
    details: dict[str, Any]


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    ErrorResponse,
    Completion,
    CompletionChunk,
    ChatCompletion,
    ChatCompletionChunk,
    Model,
    ModelList,
    BatchJob,
    Aborted,
    Tokenized,
    Detokenized,
    Health,
    Ready,
)
