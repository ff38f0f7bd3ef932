"""Admission control, before anything reaches an accelerator (pure Python + an optional rate limiter).

(The ordered checks one request passes, which share the charge taken in (2) and given back by any
later refusal, and the predictions they compare with the objectives; what they predict from is
measured in router.load_signals; queues, capacity and pressure are their own modules.)

In order: (1) the context length (prompt + max_tokens) -> 400; (2) the tenant's token buckets
(requests/min, tokens/min; in Redis, shared by router replicas) -> 429 + Retry-After; a request
refused by a later check gets that charge back, and the ``n`` choices of one request are charged
together (ChoiceCharge); (3) the lane's queue bound -> 503 + Retry-After; (4) SLO-predictive early
rejection: the request's TTFT is predicted from the work queued ahead of it (in the router's lanes
and in the prefill pool) and the measured prefill rate; if it would miss the lane's TTFT SLO it is
rejected now (503 + Retry-After) instead of timing out later; (5) the decode pace: while the time
per output token the running streams get right now exceeds the lane's TPOT objective, another
sequence would only slow every running one further, so the request is rejected (503 + Retry-After)
until the pace recovers.
With ``freeable_seqs`` (router.lane_pressure: running sequences of less important preemptible lanes
above their floor, which the decode workers would preempt for this lane's pace) both predictions
count what preempting them frees: those slots are free, and the pace is the one the remaining
sequences would get; so a request is refused for pace only once those lanes are at their floor.
The pace is predicted (``predict_pace``) from the decode worker's step split (router.decode_pace):
its steps' decode part, scaled to the sequences left, plus the prompt work those steps carry (its
own prefills and recomputes, lately and queued), which slows every stream it runs.
Every rejection is counted by lane and reason.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from router.api import ChoiceCharge, ErrorKind, RouterError
from router.decode_pace import StepSplit
from router.lanes import LaneConfig, TenantConfig


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_s: float = 0.0
    reason: str | None = None  # "requests" | "tokens"
    # Gives back what an allowed acquire took, for a request refused after it (None: nothing to give).
    refund: Callable[[], Awaitable[None]] | None = None


class RateLimiter(Protocol):
    async def acquire(self, tenant: TenantConfig, n_tokens: int, n_requests: int = 1) -> RateDecision: ...


class RejectionMetrics(Protocol):
    """Where refusals are counted (router/metrics.py's RouterMetrics)."""

    def rejection(self, lane: str, reason: str) -> None: ...


# The headrooms' defaults (Admission; the router's and the simulator's configs take them from here).
SLO_HEADROOM = 0.75
PACE_HEADROOM = 0.95
# In the message of a refusal for pace (the load generator tells the two SLO refusals apart by it).
PACE_REFUSAL = "time-per-output-token objective"


@dataclass(frozen=True)
class AdmissionInput:
    lane: LaneConfig
    tenant: TenantConfig
    prompt_tokens: int
    max_tokens: int
    lane_depth: int  # requests already queued in the lane
    tokens_ahead: int  # router-queued prefill work ahead of this request
    pool_queued_tokens: int  # prefill work already in the workers' queues
    prefill_tokens_per_s: float
    requests_ahead: int = 0  # requests queued in the router ahead of this one
    free_seq_slots: int = 1 << 30  # sequence slots free on the decode workers
    completions_per_s: float | None = None  # measured request completion rate (None: not yet known)
    service_s: float | None = None  # predicted dispatch -> first token without queueing (None: prompt / rate)
    decode_pace_s: float | None = None  # measured time per output token lately (None: not known)
    # Dispatched, unfinished requests: (output tokens so far, expected output tokens) each. The
    # router builds it only when the request must wait for a slot (what it is read for then), and
    # says how many run in ``num_running`` (None: ``len(running)``).
    running: tuple[tuple[int, int], ...] = ()
    num_running: int | None = None
    expected_output_tokens: float | None = None  # of a request that takes a freed slot (None: max_tokens)
    # The lane's depth when the queue bound is checked, after the rate limiter's await: requests of a
    # burst admitted meanwhile count (``lane_depth`` is from before it). None: ``lane_depth``.
    lane_depth_now: Callable[[], int] | None = None
    # One of a request's ``n`` choices: the group's charge, taken all at once by the first (None: alone).
    choice_charge: ChoiceCharge | None = None
    # Running sequences of less important preemptible lanes above their floor: what preempting them
    # for this request's pace would free (router.lane_pressure; 0: nothing, or the policy is off).
    freeable_seqs: int = 0
    # Of ``pool_queued_tokens``, those of less important lanes, which this request goes ahead of.
    yielding_tokens: int = 0
    # The decode worker's steps lately (router.decode_pace; None: not known, the measured pace alone),
    # the seconds one prompt token takes there (one prefill worker's measured rate), and the prompt
    # tokens it will compute for this request and lanes as important or more (its queue there, and
    # this prompt when it is prefilled there): ``predict_pace``.
    decode_steps: StepSplit | None = None
    prompt_token_s: float = 0.0
    decode_backlog_tokens: int = 0
    # The time per output token the lane's recently finished streams got, 90th percentile
    # (LoadSignals.recent_tpot_s; None: too few lately): how far the pace check's headroom may loosen.
    recent_tpot_s: float | None = None


@dataclass(frozen=True)
class TtftPrediction:
    wait_s: float  # queueing ahead of the request: a model, the uncertain part
    service_s: float  # dispatch -> first token, as recently measured
    window_s: float  # the lane's batch window

    @property
    def total_s(self) -> float:
        return self.wait_s + self.service_s + self.window_s


def slot_free_after(remaining_s: list[float], needed: int, refill_s: float) -> float:
    """When the ``needed``-th sequence slot frees up: slots free as running requests finish
    (``remaining_s`` each), and every freed slot but ours goes to a request ahead of us, which then
    holds it for ``refill_s``. (Running requests that started together also finish together: a
    completion *rate* would promise the first slot long before any frees.)"""
    if needed <= 0:
        return 0.0
    if not remaining_s:
        return refill_s * needed
    heap = sorted(max(0.0, r) for r in remaining_s)
    for _ in range(needed - 1):
        heapq.heapreplace(heap, heap[0] + refill_s)
    return heap[0]


def predict_ttft(x: AdmissionInput) -> TtftPrediction:
    """Queue wait + service time + batch window.

    Queue wait is the later of: prefilling the work ahead at the measured prefill rate, and — when
    the decode pool is full — enough running requests finishing to free a sequence slot for us and
    for each request ahead: each running request's expected remaining tokens at the live decode
    pace (or, before the pace is known, the measured completion rate). Service time is our own
    prompt at the measured prefill rate plus the recent ``service_overhead``, as the caller gives
    it (before any measurement, the prompt alone).
    """
    rate = max(x.prefill_tokens_per_s, 1e-6)
    prefill_wait = (x.tokens_ahead + max(0, x.pool_queued_tokens - x.yielding_tokens)) / rate
    service = x.service_s if x.service_s is not None else x.prompt_tokens / rate
    slot_wait = 0.0
    short = x.requests_ahead + 1 - x.free_seq_slots - x.freeable_seqs
    if short > 0 and x.running and x.decode_pace_s:
        pace = x.decode_pace_s
        remaining = [(total - done) * pace + (service if done == 0 else 0.0) for done, total in x.running]
        expected = x.expected_output_tokens if x.expected_output_tokens is not None else x.max_tokens
        slot_wait = slot_free_after(remaining, short, service + expected * pace)
    elif short > 0 and x.completions_per_s:
        slot_wait = short / x.completions_per_s
    return TtftPrediction(max(prefill_wait, slot_wait), service, x.lane.batch_window_s)


def freed_pace(x: AdmissionInput) -> float | None:
    """The decode pace a new request of ``x``'s lane would see: the measured one, or with
    ``freeable_seqs`` preempted, the measured one scaled by the sequences left (a step's time grows
    about linearly with its sequences)."""
    pace = x.decode_pace_s
    running = len(x.running) if x.num_running is None else x.num_running
    if pace is None or x.freeable_seqs <= 0 or running <= 0:
        return pace
    return pace * max(1, running - x.freeable_seqs + 1) / running


def predict_pace(x: AdmissionInput) -> float | None:
    """The seconds per token a new request of ``x``'s lane would get over its life on the decode
    worker. With the worker's step split (``decode_steps``): its steps' decode part (the step time
    less its prompt tokens at ``prompt_token_s`` each), scaled to the sequences left once
    ``freeable_seqs`` are preempted and this one joins, plus the prompt work its steps will carry:
    what they carried lately, and the backlog spread over this request's expected tokens, at most
    the step's prompt budget. Without it, ``freed_pace``."""
    s = x.decode_steps
    if s is None or s.running <= 0 or x.prompt_token_s <= 0:
        return freed_pace(x)
    c = x.prompt_token_s
    # (a floor: the prefill cost per token is measured on another worker, and may overstate it here)
    decode_s = max(s.step_s - c * s.prompt_tokens_per_step, 0.1 * s.step_s)
    rows = max(1, s.running - x.freeable_seqs + 1)
    expected = max(1.0, x.expected_output_tokens if x.expected_output_tokens is not None else float(x.max_tokens))
    prompt = s.prompt_tokens_per_step + x.decode_backlog_tokens / expected
    if s.prompt_budget > 0:
        prompt = min(prompt, float(s.prompt_budget))
    return decode_s * rows / s.running + c * prompt


def predict_ttft_s(x: AdmissionInput) -> float:
    return predict_ttft(x).total_s


class Admission:
    def __init__(
        self,
        max_model_len: int,
        rate_limiter: RateLimiter | None,
        metrics: RejectionMetrics | None = None,
        *,
        slo_rejection: bool = True,
        slo_headroom: float = SLO_HEADROOM,
        pace_headroom: float = PACE_HEADROOM,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_model_len = max_model_len
        self.rate_limiter = rate_limiter
        self.metrics = metrics
        self.slo_rejection = slo_rejection
        # The queue-wait estimate is inflated by 1/headroom before it is compared with the
        # objective: it is a model and errs low under bursts, and an admitted request that misses
        # its SLO costs more than a quick 503. The service time is mostly measured, so it is not inflated:
        # inflating it too rejected 78% at 1.7x capacity for a third of the goodput (BENCHMARKS).
        self.slo_headroom = slo_headroom
        # The most the pace check's headroom loosens to (``pace_check_headroom``).
        self.pace_headroom = pace_headroom
        self.rejections: dict[tuple[str, str], int] = {}
        # (lane, reason) -> when its recent requests were refused for the SLO predictions (router.lane_pressure)
        self._refused_at: dict[tuple[str, str], deque[float]] = {}
        self._clock = clock  # the simulator passes its own

    def check_context(
        self,
        prompt_tokens: int,
        max_tokens: int,
        lane: str = "none",
        *,
        max_tokens_given: bool = True,
        prompt_param: str = "messages",
        max_tokens_param: str = "max_tokens",
    ) -> None:
        """A prompt that leaves no room, or an output bound the client set that does not fit, is a
        400 naming the field at fault (a bound the client did not set is the server's default: it
        is never the client's fault, and is never named)."""
        total = prompt_tokens + max_tokens
        if total <= self.max_model_len:
            return
        self._count(lane, "context_length")
        where = "the messages" if prompt_param == "messages" else "the prompt"
        if prompt_tokens >= self.max_model_len or not max_tokens_given:
            raise RouterError(
                ErrorKind.INVALID_REQUEST,
                f"This model's maximum context length is {self.max_model_len} tokens. However, {where} resulted "
                f"in {prompt_tokens} tokens, which leaves no room for a completion. Please reduce the length of "
                f"{where}.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        raise RouterError(
            ErrorKind.INVALID_REQUEST,
            f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
            f"{total} tokens ({prompt_tokens} in {where}, {max_tokens} in the completion). Please reduce "
            f"the length of {where} or {max_tokens_param}.",
            param=max_tokens_param,
            code="context_length_exceeded",
        )

    async def admit(self, x: AdmissionInput) -> float:
        """Raise RouterError if the request must be rejected; else return its predicted TTFT."""
        lane = x.lane.name
        self.check_context(x.prompt_tokens, x.max_tokens, lane)
        group = x.choice_charge
        units = 1 if group is None else (0 if group.charged else group.pending)
        refund = None
        if self.rate_limiter is not None and units > 0:
            refund = await self._charge(self.rate_limiter, x, units)
        try:
            ttft = self._decide(x)
        except RouterError:
            if refund is not None:  # refused after it was charged: a refused request spends no budget
                await refund()
            raise
        if group is not None and units > 0:
            group.charged, group.refund = True, refund
        return ttft

    async def _charge(
        self, limiter: RateLimiter, x: AdmissionInput, units: int
    ) -> Callable[[], Awaitable[None]] | None:
        """Take ``units`` requests and their tokens from the tenant's buckets (429 / 400 if not)."""
        lane = x.lane.name
        n_tokens = units * (x.prompt_tokens + x.max_tokens)
        d = await limiter.acquire(x.tenant, n_tokens, units)
        if not d.allowed and math.isinf(d.retry_after_s):
            self._count(lane, "rate_limit_too_large")
            what = (
                f"{n_tokens} tokens"
                if units == 1
                else (f"{units} choices" if d.reason == "requests" else f"{n_tokens} tokens for {units} choices")
            )
            raise RouterError(
                ErrorKind.INVALID_REQUEST,
                f"The request ({what}) is larger than tenant {x.tenant.name!r}'s per-minute "
                f"{d.reason} limit allows at once.",
                param="n" if units > 1 and d.reason == "requests" else "max_tokens",
                code="rate_limit_too_large",
            )
        if not d.allowed:
            self._count(lane, f"rate_limit_{d.reason or 'requests'}")
            raise RouterError(
                ErrorKind.RATE_LIMITED,
                f"Rate limit reached for tenant {x.tenant.name!r} ({d.reason} per minute). "
                f"Retry in {math.ceil(d.retry_after_s)} s.",
                code="rate_limit_exceeded",
                retry_after_s=max(d.retry_after_s, 1.0),
            )
        return getattr(d, "refund", None)

    def _decide(self, x: AdmissionInput) -> float:
        """The checks after the rate limiter, with no await: the queue bound, the SLO predictions."""
        lane = x.lane.name
        if (x.lane_depth_now() if x.lane_depth_now else x.lane_depth) >= x.lane.queue_bound:
            self._count(lane, "queue_full")
            raise RouterError(
                ErrorKind.OVERLOADED,
                f"The {lane} lane is full ({x.lane.queue_bound} requests waiting). Retry later.",
                code="queue_full",
                retry_after_s=self._retry_after(x),
            )
        prediction = predict_ttft(x)
        ttft = prediction.total_s
        busy = (len(x.running) if x.num_running is None else x.num_running) > 0
        if not busy and prediction.wait_s == 0:
            # Nothing ahead and nothing running: waiting cannot make it faster. (A prompt too long
            # for the objective even on idle pools is served now rather than locked out for good.)
            return ttft
        guarded = prediction.wait_s / self.slo_headroom + prediction.service_s + prediction.window_s
        if self.slo_rejection and guarded > x.lane.ttft_slo_s:
            self._count(lane, "slo_predicted", timed=True)
            raise RouterError(
                ErrorKind.OVERLOADED,
                f"The {lane} lane cannot meet its time-to-first-token objective ({x.lane.ttft_slo_s:g} s) now: "
                f"predicted {ttft:.1f} s. Retry later.",
                code="slo_predicted_violation",
                retry_after_s=self._retry_after(x),
            )
        pace = predict_pace(x)
        if self.slo_rejection and busy and pace is not None and pace > x.lane.tpot_slo_s * self.pace_check_headroom(x):
            self._count(lane, "slo_tpot", timed=True)
            raise RouterError(
                ErrorKind.OVERLOADED,
                f"The {lane} lane cannot meet its {PACE_REFUSAL} ({x.lane.tpot_slo_s:g} s) now: "
                f"tokens would take {pace:.2f} s each. Retry later.",
                code="slo_predicted_violation",
                retry_after_s=self._retry_after(x),
            )
        return ttft

    def pace_check_headroom(self, x: AdmissionInput) -> float:
        """``slo_headroom``, loosened up to ``pace_headroom`` in proportion as the lane's recently
        finished streams ran faster than ``slo_headroom`` x its TPOT objective (``recent_tpot_s``).
        The predicted pace errs high while the lane's streams are short and its decode batch thins
        out as they end: at a fixed headroom it refused requests whose streams would have kept the
        pace (BENCHMARKS, lanes under overload). Outcomes, not the prediction, loosen it, and only
        while they keep their margin: a lane whose streams run near the guard gets the fixed one."""
        base, recent = self.slo_headroom, x.recent_tpot_s
        if recent is None or recent <= 0 or self.pace_headroom <= base:
            return base
        return min(self.pace_headroom, max(base, base * base * x.lane.tpot_slo_s / recent))

    def pace_refusals(self, lane: str, since: float) -> int:
        """How many of ``lane``'s requests were refused for pace since ``since`` (router.lane_pressure)."""
        return self._refused_since(lane, "slo_tpot", since)

    def ttft_refusals(self, lane: str, since: float) -> int:
        """How many of ``lane``'s requests were refused for their predicted TTFT since ``since``."""
        return self._refused_since(lane, "slo_predicted", since)

    def _refused_since(self, lane: str, reason: str, since: float) -> int:
        times = self._refused_at.get((lane, reason))
        return 0 if not times else sum(1 for t in times if t >= since)

    def reject(self, lane: str, reason: str, error: RouterError) -> RouterError:
        """Count a rejection decided elsewhere (draining, no workers) and return the error to raise."""
        self._count(lane, reason)
        return error

    @staticmethod
    def _retry_after(x: AdmissionInput) -> float:
        # When the work ahead of it would have drained: a useful hint, bounded to keep clients sane.
        drain = (x.tokens_ahead + x.pool_queued_tokens) / max(x.prefill_tokens_per_s, 1e-6)
        return float(min(60.0, max(1.0, drain)))

    def _count(self, lane: str, reason: str, timed: bool = False) -> None:
        """``timed``: also when, for ``pace_refusals`` / ``ttft_refusals``."""
        self.rejections[(lane, reason)] = self.rejections.get((lane, reason), 0) + 1
        if timed:
            self._refused_at.setdefault((lane, reason), deque(maxlen=1024)).append(self._clock())
        if self.metrics is not None:
            self.metrics.rejection(lane, reason)
