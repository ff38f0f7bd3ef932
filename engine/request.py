"""A request's state inside one engine, and the one request-state enum every part of Baton shares.

Lifecycle (each arrow is a legal transition; ``Request.transition`` enforces the table)::

    QUEUED ──schedule──► PREFILLING ──prompt done, first token──► DECODING ──stop/length──► FINISHED
      │                     │   └──(prefill role) last chunk sent──► TRANSFERRING ──ack──► FINISHED
      │                     └──out of blocks──► PREEMPTED ──rescheduled (recompute)──► PREFILLING
      └──(decode role) reserve──► RESERVED ──KV + first token arrived──► DECODING
                                     └──transfer failed / deadline──► PREFILLING (local recompute)
                                     └──the same, whole prompt a local hit──► PREEMPTED (queued afresh)
      (PREFILLING ──the last prompt token stops it (max_tokens 1, a stop token)──► FINISHED)
    DECODING ──out of blocks, or passing longrope's original length (recompute, long)──► PREEMPTED
    any live state ──client gone / abort──► ABORTED

Who moves requests: ``engine.scheduler`` (QUEUED/PREEMPTED→PREFILLING, →PREEMPTED, →DECODING,
→FINISHED, →ABORTED) and ``engine.scheduler_disagg``, which the workers call (→RESERVED,
RESERVED→DECODING/PREFILLING/PREEMPTED; PREFILLING→TRANSFERRING→FINISHED on the prefill side).
A request whose decode worker died is not moved: the router resubmits it to another worker as a
new request (QUEUED there) with the tokens already delivered (``resume_token_ids``), and one whose
worker failed ends in the router's stream (finish reason "error"), not in this enum.

This module is pure Python (no torch): the router imports it.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from engine.draft_state import DraftState
from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.output_error import OutputError


class RequestState(enum.Enum):
    QUEUED = "queued"
    RESERVED = "reserved"
    PREFILLING = "prefilling"
    TRANSFERRING = "transferring"
    DECODING = "decoding"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


class FinishReason(enum.StrEnum):
    """A StrEnum: the reason is its own OpenAI string in outputs and on the wire."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"
    ERROR = "error"  # the worker failed (the router's), or the engine step computing it raised


_TERMINAL = frozenset({RequestState.FINISHED, RequestState.ABORTED})
_S = RequestState
ALLOWED_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.QUEUED: frozenset({_S.PREFILLING, _S.RESERVED, _S.ABORTED}),
    _S.RESERVED: frozenset({_S.DECODING, _S.PREFILLING, _S.PREEMPTED, _S.ABORTED}),
    _S.PREFILLING: frozenset({_S.DECODING, _S.TRANSFERRING, _S.PREEMPTED, _S.FINISHED, _S.ABORTED}),
    _S.TRANSFERRING: frozenset({_S.FINISHED, _S.ABORTED}),
    _S.DECODING: frozenset({_S.FINISHED, _S.PREEMPTED, _S.ABORTED}),
    _S.PREEMPTED: frozenset({_S.PREFILLING, _S.ABORTED}),
    _S.FINISHED: frozenset(),
    _S.ABORTED: frozenset(),
}


class IllegalTransitionError(RuntimeError):
    pass


class Request:
    """One request as an engine sees it: computed tokens chasing total tokens.

    ``all_token_ids`` is prompt + generated; ``num_computed_tokens`` counts the tokens whose KV is in
    the cache (or is being computed by the step in flight). Prefix-cache hits, prefill chunks and KV
    received from a prefill worker all advance it.
    """

    __slots__ = (
        "all_token_ids",
        "arrival_seq",
        "arrival_time",
        "block_hashes",
        "block_ids",
        "cache_salt",
        "draft_state",
        "eos_token_ids",
        "error",
        "finish_reason",
        "first_scheduled_time",
        "first_token_time",
        "is_padding",
        "long_rope",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_registered_blocks",
        "num_window_freed",
        "pending_logprobs",
        "preempted_at",
        "preempted_spans",
        "preemptible",
        "prefill_only",
        "priority",
        "prompt_logprobs",
        "prompt_token_ids",
        "request_id",
        "sampling_params",
        "slot",
        "spec_token_ids",
        "state",
        "stop_reason",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        eos_token_ids: tuple[int, ...] = (),
        priority: int = 0,
        preemptible: bool = True,
        arrival_time: float | None = None,
        arrival_seq: int = 0,
        cache_salt: str | None = None,
        resume_token_ids: list[int] | None = None,
        prefill_only: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        # A migrated request resumes with the tokens it already generated elsewhere (recomputed).
        self.all_token_ids = list(prompt_token_ids) + list(resume_token_ids or ())
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.priority = priority  # lower is more important (lanes map onto it)
        self.preemptible = preemptible  # False: preempted only when no preemptible request runs
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.arrival_seq = arrival_seq
        self.cache_salt = cache_salt
        self.state = RequestState.QUEUED
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.error: OutputError | None = None  # why it ended with ERROR, where known
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at (first) admission
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []  # one per full block of all_token_ids, chained
        # longrope's long state (``use_long_rope``): its sequence is rotated with the long factors.
        self.long_rope = False
        self.num_registered_blocks = 0  # how many of block_ids are in the prefix cache
        self.num_window_freed = 0  # leading block_ids freed behind an all-sliding model's window (block_manager)
        self.num_preemptions = 0
        # Time spent preempted (monotonic): since when now, and (from, to) of each past preemption.
        self.preempted_at: float | None = None
        self.preempted_spans: list[tuple[float, float]] | None = None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.is_padding = False  # static-batching baseline: finished, but its row still computes
        self.prefill_only = prefill_only  # prefill role: stop after the first token, then hand off
        # Logprobs of tokens appended since the last output (sampling_params.logprobs set), in order.
        self.pending_logprobs: list[TokenLogprob] = []
        # Prompt tokens 1.. as the prefill computes them (sampling_params.prompt_logprobs set); a
        # resumed (migrated) request reported them where it started.
        self.prompt_logprobs: list[TokenLogprob] | None = (
            [] if sampling_params.prompt_logprobs is not None and not resume_token_ids else None
        )
        self.slot = -1  # the runner row while running (assigned by the scheduler)
        # Speculative decoding (engine/spec_decode.py): tokens drafted to follow all_token_ids, which
        # the next step verifies (not yet part of the sequence), and its drafting state (n-gram
        # index, keep rate).
        self.spec_token_ids: list[int] = []
        self.draft_state: DraftState | None = None

    # -- token accounting -------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling_params.max_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Its prompt must be computed whole (a prefix-cache hit would skip positions)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    def use_long_rope(self) -> None:
        """From now on its sequence is rotated with longrope's long factors at every position, as
        transformers does once a sequence passes the original length. Its KV must be computed anew
        (it holds no blocks now), and its block hashes change with the state (engine/block_hash.py)."""
        assert not self.block_ids, "a request enters the long rope state holding no KV"
        self.long_rope = True
        self.block_hashes = []

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)

    # -- state ------------------------------------------------------------------------------
    def transition(self, new_state: RequestState) -> None:
        if new_state not in ALLOWED_TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"request {self.request_id}: {self.state.name} -> {new_state.name}")
        self.state = new_state

    @property
    def is_finished(self) -> bool:
        return self.state.is_terminal

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.state.name}, computed={self.num_computed_tokens}/"
            f"{self.num_tokens}, blocks={len(self.block_ids)})"
        )


def check_stop(req: Request, tok: int, max_len: int) -> FinishReason | None:
    """Whether ``req`` ends with ``tok``, its newest token (already appended): a stop token once
    ``min_tokens`` are out (``stop_reason`` set), or its length (``max_tokens``, the context)."""
    sp = req.sampling_params
    n = len(req.all_token_ids)  # (not the property: this runs for every token of every request)
    n_out = n - req.num_prompt_tokens
    if n_out >= sp.min_tokens:
        # (A constrained request's EOS is its grammar's end: it finishes it even with ignore_eos.)
        if (not sp.ignore_eos or sp.structured is not None) and tok in req.eos_token_ids:
            req.stop_reason = tok
            return FinishReason.STOP
        if tok in sp.stop_token_ids:
            req.stop_reason = tok
            return FinishReason.STOP
    if n_out >= sp.max_tokens or n >= max_len:
        return FinishReason.LENGTH
    return None
