"""Pydantic models of the OpenAI request bodies Baton accepts (router/http/body.py parses bodies
with them and maps their validation errors onto OpenAI error objects).

(Over 400 lines as one concept: the request bodies, which share one strict base, one set of
sampling fields and one refusal rule; their published shapes are in request_shapes.py and the
responses' in response_models.py.)

Models validate in *strict* mode: OpenAI rejects ``"max_tokens": "10"`` and so do we, instead of
silently coercing. Unknown fields are ignored (clients send many we have no use for), but fields
that would change the output in ways Baton cannot honour (``best_of``, ``suffix``, vLLM's
``structured_outputs``, ``chat_template_kwargs``, ... : ``REFUSED_FIELDS``) are rejected with a 400
naming the field rather than ignored, so that a client never gets an answer to a different question
than the one it asked. Range checks of sampling values are left to ``SamplingParams`` so there is a
single source of truth for them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from engine.errors import InvalidParameterError
from engine.logprobs import MAX_TOP_LOGPROBS
from engine.sampling_params import MAX_STOP_TOKEN_IDS, SamplingParams
from engine.structured.constraint import StructuredOutput
from router.api import CHAT_ROLES, ChatMessage
from router.choices import MAX_CHOICES
from router.http.request_shapes import (
    CONTENT_UNLESS_ASSISTANT,
    NON_EMPTY,
    ONE_OF_PROMPT_AND_MESSAGES,
    STREAM_OPTIONS_NEED_STREAM,
    ContentInput,
    PromptInput,
    StopInput,
    ToolCallsInput,
    ToolsInput,
)
from router.http.structured_fields import GUIDED_FIELDS, REFUSED_FIELDS, structured_output
from router.http.tool_fields import check_tool_choice, forced_tools, function_tools, message_tool_call
from router.tool_calls.constraint import FunctionTool
from router.tool_calls.parsers import ToolCall

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
# List bounds, checked here so that a long list is refused before the router walks it (the body
# limit bounds the schema's own work). Stop strings and logit_bias keep SamplingParams' own limits
# (OpenAI's are 4 and 300).
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 1024
MAX_DETOKENIZE_TOKENS = 1 << 20  # longer than any served context
# A token id has at most this many digits (vocabularies are far below 10**10); int() of a longer
# string is slow, and past 4300 digits it raises ValueError (a 500, once).
MAX_TOKEN_ID_DIGITS = 10


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_parameter", "{what} is not supported by this server.", {"what": what})


def _bad_value(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)


def _bad_type(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_type", message)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _refuse_unknown(model: type[BaseModel], data: Any) -> Any:
    """A 400 naming the first field of ``REFUSED_FIELDS`` in ``data`` that ``model`` does not
    implement (other unknown fields are ignored)."""
    if isinstance(data, dict):
        for name in REFUSED_FIELDS:
            if name in data and name not in model.model_fields:
                raise ValidationError.from_exception_data(
                    model.__name__, [InitErrorDetails(type=_unsupported(f"'{name}'"), loc=(name,), input=data[name])]
                )
    return data


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(json_schema_extra=STREAM_OPTIONS_NEED_STREAM)

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = None  # None: the server default (OpenAI's is 1.0)
    top_p: float | None = None
    top_k: int | None = Field(None, description="Extension: sample from the k likeliest tokens (0 or -1: off).")
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, description="Extension: token ids that end the output.")
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON keys are) -> bias
    repetition_penalty: float | None = Field(None, description="Extension (vLLM's): 1 is off.")
    min_p: float | None = Field(None, description="Extension (vLLM's): 0 is off.")
    include_stop_str_in_output: bool = Field(False, description="Extension (vLLM's).")
    skip_special_tokens: bool = Field(True, description="Extension (vLLM's).")
    user: str | None = None
    ignore_eos: bool = Field(False, description="Extension: generate past the end-of-sequence token.")
    min_tokens: int = Field(0, description="Extension: no stop before this many tokens.")
    lane: str | None = Field(
        None, description="Baton: the traffic-class lane (as the X-Baton-Lane header; the tenant must be allowed it)."
    )
    # Structured outputs (engine/structured/): OpenAI's response_format, vLLM's guided fields.
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = Field(None, description="Extension (vLLM's): a JSON schema.")
    guided_regex: str | None = Field(None, description="Extension (vLLM's): a regular expression.")
    guided_choice: list[str] | None = Field(None, description="Extension (vLLM's): one of these strings.")
    guided_grammar: str | None = Field(None, description="Extension (vLLM's): a Lark or GBNF grammar.")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        return _refuse_unknown(cls, data)

    def structured_output(self) -> StructuredOutput | None:
        """The constraint the request's fields ask for (InvalidParameterError naming a bad one)."""
        return structured_output({name: getattr(self, name) for name in GUIDED_FIELDS})

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_CHOICES:
            raise _bad_value(f"n must be an integer in [1, {MAX_CHOICES}], got {v}.")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise _bad_value(f"logit_bias may bias at most {MAX_LOGIT_BIAS} tokens, got {len(v)}.")
        if not all(k.isascii() and k.isdigit() and len(k) <= MAX_TOKEN_ID_DIGITS for k in v):
            raise _bad_value(
                f"logit_bias keys must be token ids (non-negative integers of at most "
                f"{MAX_TOKEN_ID_DIGITS} digits, as strings)."
            )
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and len(v) > MAX_STOP_TOKEN_IDS:
            raise _bad_value(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} token ids, got {len(v)}.")
        return v

    @field_validator("stop", mode="plain", json_schema_input_type=StopInput)
    @classmethod
    def _stop(cls, v: Any) -> str | list[str] | None:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            if len(v) > MAX_STOP_STRINGS:
                raise _bad_value(f"'stop' may hold at most {MAX_STOP_STRINGS} strings, got {len(v)}.")
            return v
        raise _bad_type("Invalid type for 'stop': expected a string or an array of strings.")

    @field_validator("stream_options")
    @classmethod
    def _streaming_only(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):  # as OpenAI and vLLM answer it
            raise _bad_value("'stream_options' is only allowed when 'stream' is true.")
        return v

    @property
    def wants_stream(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def _sampling(self, max_tokens: int, default_temperature: float, logprobs: int | None = None) -> SamplingParams:
        """Raises ``InvalidParameterError`` for out-of-range values."""
        top_k = self.top_k
        if top_k == -1:
            top_k = 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=default_temperature if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if top_k is None else top_k,
            seed=self.seed,
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=tuple((int(k), b) for k, b in (self.logit_bias or {}).items()),
            structured=self.structured_output(),
        )


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``. ``prompt`` is normalized to one string or one tuple of token ids."""

    prompt: str | tuple[int, ...]
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="plain", json_schema_input_type=PromptInput)
    @classmethod
    def _prompt(cls, v: Any) -> str | tuple[int, ...]:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one prompt
        elif isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
            raise _unsupported("More than one prompt per request")
        if isinstance(v, str):
            if not v:
                raise _bad_value("'prompt' must not be empty.")
            return v
        if isinstance(v, list):
            if not v:
                raise _bad_value("'prompt' must not be empty.")
            if all(_is_int(t) and t >= 0 for t in v):
                return tuple(v)
        raise _bad_type(
            "Invalid type for 'prompt': expected a string, an array of token ids (non-negative "
            "integers), or an array holding one of those."
        )

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise _unsupported("best_of > 1")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise _unsupported("suffix")
        return v

    @property
    def max_tokens_given(self) -> bool:
        return self.max_tokens is not None

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens`` 0: the prompt (and its logprobs) back, nothing generated, as
        OpenAI's legacy completions answer it (evaluation harnesses score texts this way)."""
        return bool(self.echo) and self.max_tokens == 0

    def sampling_params(self, *, default_temperature: float) -> SamplingParams:
        """With ``echo``, ``logprobs`` covers the prompt's tokens too (how harnesses score a text).
        ``echo_only`` runs one token, which the response leaves out."""
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        if self.echo_only:
            if self.stream:
                raise InvalidParameterError(
                    "max_tokens",
                    "max_tokens 0 with echo (the prompt alone) is served without streaming; set 'stream' to false.",
                )
            max_tokens = 1
        sp = self._sampling(max_tokens, default_temperature, self.logprobs)
        return replace(sp, prompt_logprobs=self.logprobs) if self.echo and self.logprobs is not None else sp


class InputMessage(_Strict):
    """One chat message. ``content`` is normalized to a string (text parts joined by newlines)."""

    model_config = ConfigDict(json_schema_extra=CONTENT_UNLESS_ASSISTANT)

    role: Literal[CHAT_ROLES]  # type: ignore[valid-type]
    content: str | None = Field(default=None, validate_default=True)  # required but for the assistant's
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None  # an assistant turn's calls (rendered by the chat template)
    tool_call_id: str | None = None  # a tool turn: the call it answers
    # Refused, not dropped: the chat template would render the assistant turn empty, and the model
    # would answer a different conversation than the client sent.
    function_call: dict[str, Any] | None = None

    @field_validator("function_call")
    @classmethod
    def _no_calls(cls, v: Any, info: ValidationInfo) -> Any:
        if v:
            raise _unsupported(
                f"An assistant message's '{info.field_name}' (the legacy function calling; use 'tool_calls')"
            )
        return v

    @field_validator("tool_calls", mode="plain", json_schema_input_type=ToolCallsInput)
    @classmethod
    def _calls(cls, v: Any) -> tuple[ToolCall, ...] | None:
        if v is None:
            return v
        if not isinstance(v, list):
            raise _bad_type("Invalid type for 'tool_calls': expected an array.")
        return tuple(message_tool_call(c) for c in v)

    @field_validator("content", mode="plain", json_schema_input_type=ContentInput)
    @classmethod
    def _content(cls, v: Any, info: ValidationInfo) -> str | None:
        if v is None:  # (OpenAI: only an assistant turn, one with tool calls, may omit it)
            role = info.data.get("role")
            if role is not None and role != "assistant":
                # (reported as OpenAI reports a missing parameter: router/http/body.py)
                raise PydanticCustomError("missing", "A '{role}' message needs 'content'.", {"role": role})
            return v
        if isinstance(v, str):
            return v
        if isinstance(v, list):
            texts = []
            for part in v:
                if not isinstance(part, dict):
                    raise _bad_type("Invalid type for a content part: expected an object.")
                if part.get("type") != "text":
                    raise _unsupported(f"Content part type {part.get('type')!r} (only 'text' is)")
                if not isinstance(part.get("text"), str):
                    raise _bad_type("Invalid type for a text content part's 'text': expected a string.")
                texts.append(part["text"])
            return "\n".join(texts)
        raise _bad_type("Invalid type for 'content': expected a string or an array of text content parts.")

    def to_router(self) -> ChatMessage:
        return ChatMessage.from_client(self.role, self.content or "", self.tool_calls or (), self.tool_call_id)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[InputMessage] = Field(json_schema_extra=NON_EMPTY)
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: tuple[FunctionTool, ...] | None = None
    functions: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    function_call: str | dict[str, Any] | None = None
    # Output this server cannot produce: refused, as fields ignored would change the answer's kind.
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    web_search_options: dict[str, Any] | None = None
    add_generation_prompt: bool = Field(True, description="Extension: end the prompt with the assistant's turn.")

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[InputMessage]) -> list[InputMessage]:
        if not v:
            raise _bad_value("'messages' must contain at least one message.")
        return v

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise _unsupported("The legacy 'functions' (use 'tools')")
        return v

    @field_validator("tools", mode="plain", json_schema_input_type=ToolsInput)
    @classmethod
    def _tools(cls, v: Any) -> tuple[FunctionTool, ...] | None:
        return None if v is None else function_tools(v)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None, info: ValidationInfo) -> str | dict[str, Any] | None:
        if v is not None:
            check_tool_choice(v, info.data.get("tools") or ())
        return v

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, v: str | dict[str, Any] | None, info: ValidationInfo) -> str | dict[str, Any] | None:
        if v is not None and v != "none":
            raise _unsupported("The legacy 'function_call' (use 'tool_choice')")
        return v

    def forced_tools(self) -> list[FunctionTool] | None:
        """The tools one of which the output must call (``required``: any; a named one: it), or None."""
        return forced_tools(self.tool_choice, self.tools or ())

    @property
    def parses_tools(self) -> bool:
        """Whether the output is read for tool calls (tools given, ``tool_choice`` not ``none``)."""
        return bool(self.tools) and self.tool_choice != "none"

    @field_validator("audio", "web_search_options")
    @classmethod
    def _no_audio_or_search(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if v is not None:
            raise _unsupported(f"'{info.field_name}'")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and set(v) - {"text"}:
            raise _unsupported(f"Output modalities {sorted(set(v) - {'text'})}")
        return v

    @property
    def max_tokens_given(self) -> bool:
        return self.max_completion_tokens is not None or self.max_tokens is not None

    def sampling_params(self, *, default_temperature: float, default_max_tokens: int) -> SamplingParams:
        """``default_max_tokens`` applies when the client bounds nothing (OpenAI's "up to the context
        length"); the router may then clamp it to what the prompt leaves of the context."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = default_max_tokens if self.max_tokens is None else self.max_tokens
        if self.max_completion_tokens is not None:
            max_tokens = self.max_completion_tokens
        try:
            return self._sampling(max_tokens, default_temperature, logprobs)
        except InvalidParameterError as e:  # name the fields the client actually sent
            if e.param == "max_tokens" and self.max_completion_tokens is not None:
                raise InvalidParameterError(
                    "max_completion_tokens", e.message.replace("max_tokens", "max_completion_tokens")
                ) from e
            if e.param == "logprobs":
                raise InvalidParameterError(
                    "top_logprobs",
                    f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}",
                ) from e
            raise

    def router_messages(self) -> tuple[ChatMessage, ...]:
        return tuple(m.to_router() for m in self.messages)


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's): a completions ``prompt`` or chat ``messages``, tokenized exactly
    as a generation request would be."""

    model: str | None = None
    model_config = ConfigDict(json_schema_extra=ONE_OF_PROMPT_AND_MESSAGES)

    prompt: str | None = Field(None, json_schema_extra={"minLength": 1})
    messages: list[InputMessage] | None = Field(None, json_schema_extra=NON_EMPTY)
    add_generation_prompt: bool = True

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise _bad_value("'prompt' must not be empty.")
        return v

    @field_validator("messages")
    @classmethod
    def _non_empty_messages(cls, v: list[InputMessage] | None) -> list[InputMessage] | None:
        if v is not None and not v:
            raise _bad_value("'messages' must contain at least one message.")
        return v


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` (vLLM's)."""

    model: str | None = None
    tokens: list[int]

    @field_validator("tokens")
    @classmethod
    def _bounded(cls, v: list[int]) -> list[int]:
        if len(v) > MAX_DETOKENIZE_TOKENS:
            raise _bad_value(f"'tokens' may hold at most {MAX_DETOKENIZE_TOKENS} token ids, got {len(v)}.")
        return v
