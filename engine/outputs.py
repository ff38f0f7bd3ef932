"""What an engine step returns per request (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob
from engine.output_error import OutputError
from engine.request import FinishReason


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """A delta: the tokens and text this step added. When ``finished``, ``token_ids`` and ``text``
    hold the whole generation."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    # Where ``new_token_ids`` start among the request's output tokens (a migrated request's resumed
    # ones counted); -1 when not known. The router drops a delta that does not continue what it has
    # delivered: the output of a copy it gave up on, on a worker it had taken for dead. (Fourth: the
    # engine's common delta passes it by position, a quarter cheaper than by keyword.)
    first_index: int = -1
    finished: bool = False
    finish_reason: FinishReason | None = None  # a str on the wire (a StrEnum)
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    metrics: RequestMetrics | None = None
    # On the output carrying the first token: TTFT by stage on the workers (prefill_queue,
    # prefill_compute, transfer, decode_queue), in seconds.
    ttft_breakdown: dict[str, float] | None = None
    # On the final output of a request that was preempted (for KV, or for a lane's pace): each time
    # out as (from, to) in seconds relative to when that output was built (negative: before it).
    preempted: list[tuple[float, float]] | None = None
    # One per token of ``new_token_ids`` when the request asked for logprobs, else None.
    logprobs: list[TokenLogprob] | None = None
    # On the output carrying the first token, when asked for: one per prompt token (the first
    # one's logprob is None).
    prompt_logprobs: list[TokenLogprob] | None = None
    # On a final output with finish reason ERROR, when the engine knows why.
    error: OutputError | None = None
