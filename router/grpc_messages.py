"""``baton.v1`` messages <-> ``router.api`` types: shape checks of a ``GenerateRequest`` (each
problem an ``invalid`` error naming the proto field) and a ``GenerateResponse`` per stream event."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from engine.errors import InvalidParameterError
from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from router.api import CHAT_ROLES, ChatMessage, GenerateRequest, StreamEvent, invalid
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.request_ids import REQUEST_ID_RULE, is_valid_request_id

MAX_ID_LEN = 256  # idempotency_key (request_id follows router/request_ids.py)


# -- proto -> router.api --------------------------------------------------------------------------
def _optional_str(msg: Any, name: str, *, max_len: int | None = None) -> str | None:
    if not msg.HasField(name):
        return None
    value = getattr(msg, name)
    if not value:
        raise invalid("must not be empty when set", param=name)
    if max_len is not None and len(value) > max_len:
        raise invalid(f"must be at most {max_len} characters", param=name)
    return value


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
        "stop": tuple(msg.stop), "stop_token_ids": tuple(msg.stop_token_ids),
        "ignore_eos": msg.ignore_eos, "include_stop_str_in_output": msg.include_stop_str_in_output,
        "logit_bias": dict(msg.logit_bias),
    }
    for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "skip_special_tokens",
                 "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
                 "min_p"):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    try:
        return SamplingParams(**kwargs)
    except InvalidParameterError as err:
        raise invalid(err.message, param=f"sampling.{err.param}") from None


def request_from_proto(msg: pb.GenerateRequest, tenant: str, time_remaining: float | None) -> GenerateRequest:
    """Shape-check a ``GenerateRequest`` and build the router's; raises ``RouterError`` (invalid)."""
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
                raise invalid(f"the role must be one of {', '.join(CHAT_ROLES)}, got {m.role[:40]!r}",
                              param=f"chat.messages[{i}].role")
            if not m.HasField("content") and m.role != "assistant":  # (the HTTP API's rule: schemas.py)
                raise invalid(f"a '{m.role}' message needs content", param=f"chat.messages[{i}].content")
        messages = tuple(ChatMessage.from_client(m.role, m.content) for m in msg.chat.messages)
        if msg.chat.HasField("add_generation_prompt"):
            add_generation_prompt = msg.chat.add_generation_prompt
    has_sampling = msg.HasField("sampling")
    deadline_s = None
    if time_remaining is not None and math.isfinite(time_remaining):
        deadline_s = time.monotonic() + max(0.0, time_remaining)
    return GenerateRequest(
        sampling=sampling_from_proto(msg.sampling if has_sampling else None),
        prompt=prompt, prompt_token_ids=token_ids, messages=messages,
        add_generation_prompt=add_generation_prompt, stream=True,
        lane=_optional_str(msg, "lane"), tenant=tenant,
        request_id=_request_id(msg),
        idempotency_key=_optional_str(msg, "idempotency_key", max_len=MAX_ID_LEN),
        max_tokens_given=has_sampling and msg.sampling.HasField("max_tokens"),
        deadline_s=deadline_s, endpoint="grpc",
    )


def _token_logprobs(logprobs: Sequence[TokenLogprob],
                    token_bytes: Callable[[Sequence[int]], list[bytes]]) -> list[pb.TokenLogprob]:
    if not logprobs:
        return []
    ids = [lp.token_id for lp in logprobs] + [t for lp in logprobs for t, _ in lp.top]
    raw = dict(zip(ids, token_bytes(ids)))
    return [pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, token=raw[lp.token_id],
                            top_logprobs=[pb.TopLogprob(token_id=t, logprob=v, token=raw[t]) for t, v in lp.top])
            for lp in logprobs]


def response_from_event(ev: StreamEvent, lane: str,
                        token_bytes: Callable[[Sequence[int]], list[bytes]] | None = None) -> pb.GenerateResponse:
    """``token_bytes`` names the tokens of the event's logprobs (RouterAPI.token_bytes)."""
    out = pb.GenerateResponse(request_id=ev.request_id, text=ev.text, token_ids=ev.token_ids,
                              finished=ev.finished, finish_reason=ev.finish_reason or "", lane=lane)
    if token_bytes is not None:
        out.logprobs.extend(_token_logprobs(ev.logprobs or (), token_bytes))
        out.prompt_logprobs.extend(_token_logprobs([lp for lp in ev.prompt_logprobs or () if lp.logprob is not None],
                                                   token_bytes))
    if ev.usage is not None:
        out.usage.CopyFrom(pb.Usage(prompt_tokens=ev.usage.prompt_tokens,
                                    completion_tokens=ev.usage.completion_tokens,
                                    cached_tokens=ev.usage.cached_tokens))
    if isinstance(ev.stop_reason, str):
        out.stop_string = ev.stop_reason
    elif isinstance(ev.stop_reason, int):
        out.stop_token_id = ev.stop_reason
    return out
