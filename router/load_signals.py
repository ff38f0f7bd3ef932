"""What admission measures (pure Python), shared by the router and the simulator so both predict from
the same signals: the prefill pool's rate from the workers' reports, the live decode pace of the
running streams, and from the requests it let in the completion rate, the service overhead, the
decode pace of finished requests, their output length, the running requests' expected length, and
by lane the time per output token its finished streams got (how far within its objective they ran).

The service overhead is kept by lane too: with lane shares on, a batch request waits on its decode
worker for a slot its lane is over its share for, which is no part of an interactive request's
service (it goes first there), and a lane's prediction reads its own.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque
from collections.abc import Iterable

# Admission trusts a measured dispatch -> first-token time for this long (see Ewma.fresh).
SERVICE_TIME_MAX_AGE_S = 15.0


class PrefillRate:
    """Measured prefill throughput of the pool (tokens/s), an EWMA over worker reports.

    Each prefill-capable worker reports cumulative prompt tokens computed and busy seconds; the rate
    is summed over workers of Δtokens / Δbusy (throughput while working), so idle time does not
    dilute it. Until the first measurement, ``initial`` (e.g. from a ``baton profile`` cost model).
    """

    def __init__(self, initial_tokens_per_s: float = 1000.0, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._per_worker: dict[str, float] = {}
        self._last: dict[str, tuple[int, float]] = {}
        self.initial = initial_tokens_per_s

    def observe(self, worker_id: str, tokens_computed: int, busy_seconds: float) -> None:
        last = self._last.get(worker_id)
        self._last[worker_id] = (tokens_computed, busy_seconds)
        if last is None:
            return
        dt, dbusy = tokens_computed - last[0], busy_seconds - last[1]
        if dt <= 0 or dbusy <= 0.05:
            return
        rate = dt / dbusy
        old = self._per_worker.get(worker_id)
        self._per_worker[worker_id] = rate if old is None else (1 - self.alpha) * old + self.alpha * rate

    def forget(self, worker_id: str) -> None:
        self._per_worker.pop(worker_id, None)
        self._last.pop(worker_id, None)

    def tokens_per_s(self, live_workers: list[str]) -> float:
        rates = [self._per_worker[w] for w in live_workers if w in self._per_worker]
        if not rates:
            return self.initial * max(1, len(live_workers))
        # Workers without a measurement yet count at the measured average.
        return sum(rates) / len(rates) * max(len(live_workers), len(rates))


def live_decode_pace(token_times: list[list[float]], now: float, window: int = 8) -> float | None:
    """Seconds per output token that running requests get right now: per stream, the mean gap over
    its last ``window`` tokens, or the time since its last token if that is longer (a step in
    progress); the median over streams with at least 4 tokens. None when there are none."""
    paces = []
    for tt in token_times:
        n = len(tt)
        if n < 4:
            continue
        k = min(n, window + 1)
        paces.append(max((tt[-1] - tt[-k]) / (k - 1), now - tt[-1]))
    if not paces:
        return None
    paces.sort()
    return paces[len(paces) // 2]


class Ewma:
    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.observed_at: float | None = None

    def observe(self, x: float, now: float | None = None) -> None:
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        self.observed_at = time.monotonic() if now is None else now

    def fresh(self, max_age_s: float, now: float | None = None) -> float | None:
        """The value if observed within ``max_age_s``, else None. Admission uses it so that a high
        service time cannot lock a lane out for good: it is only updated by admitted requests, so
        once nothing is admitted it would never come down; stale, the model estimate takes over and
        lets a probe request through, whose measurement refreshes it."""
        now = time.monotonic() if now is None else now
        if self.observed_at is None or now - self.observed_at > max_age_s:
            return None
        return self.value


class CompletionRate:
    """Requests finished per second over a sliding window (how fast queued requests get a slot)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._times: deque[float] = deque()  # popped from the left as they leave the window

    def tick(self, now: float | None = None) -> None:
        self._times.append(time.monotonic() if now is None else now)

    def per_s(self, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        cut = now - self.window_s
        while self._times and self._times[0] < cut:
            self._times.popleft()
        if len(self._times) < 3:
            return None
        return len(self._times) / max(now - self._times[0], 1e-3)


def service_overhead(dispatch_to_first_token_s: float, prefill_queue_s: float, prefill_compute_s: float) -> float:
    """What a request's first token took beyond queueing for and computing its prefill: placement
    calls, the KV transfer, joining the decode batch. Admission predicts the service time as the
    prompt at the measured prefill rate plus this (recent mean): a mean of whole dispatch -> first
    token times mixes short and long prompts and counts queueing that the wait term already has,
    and a burst's high value then rejected everything on an idle cluster."""
    return max(0.0, dispatch_to_first_token_s - prefill_queue_s - prefill_compute_s)


def expected_total_tokens(generated: int, max_tokens: int, mean_output_tokens: float | None) -> int:
    """A running request's expected output length: the recent mean, but at least one more than it
    has and at most its max_tokens (max_tokens alone is far too pessimistic for chat requests that
    ask for "up to the context length" and stop after a few hundred)."""
    if mean_output_tokens is None:
        return max_tokens
    return min(max_tokens, max(round(mean_output_tokens), generated + 1))


# A lane's time per output token is read from its streams finished this recently, and only when
# enough did (RECENT_TPOT_MIN_STREAMS of its last RECENT_TPOT_STREAMS).
RECENT_TPOT_MAX_AGE_S = 60.0
RECENT_TPOT_STREAMS = 32
RECENT_TPOT_MIN_STREAMS = 8


class LoadSignals:
    def __init__(self) -> None:
        self.completion_rate = CompletionRate()
        self.service_overhead = Ewma()  # dispatch -> first token, less prefill queueing and compute
        self.decode_pace = Ewma()  # seconds per output token, from finished requests' last tokens
        self.output_tokens = Ewma(alpha=0.1)  # output length of finished requests
        self.service_overhead_by_lane: dict[str, Ewma] = {}
        self._tpot_by_lane: dict[str, deque[tuple[float, float]]] = {}  # (when, seconds per token)

    def finished(
        self,
        now: float,
        last_token_times: list[float],
        num_tokens: int,
        dispatch_to_first_token_s: float | None,
        prefill_queue_s: float = 0.0,
        prefill_compute_s: float = 0.0,
        lane: str | None = None,
        first_token_time: float | None = None,
    ) -> None:
        """A request that ran to its end (not aborted) with ``num_tokens`` output tokens, the first
        of which arrived at ``first_token_time`` and the last at ``last_token_times`` (17 are enough:
        the pace is the median of 16 gaps); ``lane``: its lane, for the service overhead and the time
        per output token by lane (None: only the overall ones)."""
        tail = last_token_times[-17:]
        gaps = [b - a for a, b in itertools.pairwise(tail)]
        if len(gaps) >= 4:  # the pace at the end of its life: what running requests get now
            self.decode_pace.observe(statistics.median(gaps), now)
            if lane is not None and first_token_time is not None:  # its time per output token, whole life
                tpot = (tail[-1] - first_token_time) / (num_tokens - 1)
                self._tpot_by_lane.setdefault(lane, deque(maxlen=RECENT_TPOT_STREAMS)).append((now, tpot))
        self.output_tokens.observe(num_tokens, now)
        if dispatch_to_first_token_s is not None:
            overhead = service_overhead(dispatch_to_first_token_s, prefill_queue_s, prefill_compute_s)
            self.service_overhead.observe(overhead, now)
            if lane is not None:
                self.service_overhead_by_lane.setdefault(lane, Ewma()).observe(overhead, now)

    def service_s(
        self, prompt_tokens: int, prefill_tokens_per_s: float, now: float | None = None, lane: str | None = None
    ) -> float | None:
        """Our own prefill at the measured rate plus the recent overhead (None: not measured yet);
        with ``lane``, that lane's recent overhead only (another lane's is not a model of it: a
        lane without a fresh one of its own gets the model estimate, as before any measurement)."""
        ewma = self.service_overhead if lane is None else self.service_overhead_by_lane.get(lane)
        overhead = None if ewma is None else ewma.fresh(SERVICE_TIME_MAX_AGE_S, now)
        return None if overhead is None else prompt_tokens / max(prefill_tokens_per_s, 1e-6) + overhead

    def recent_tpot_s(self, lane: str, now: float | None = None) -> float | None:
        """The 90th percentile of the time per output token the lane's recently finished streams got
        (None: too few finished lately)."""
        now = time.monotonic() if now is None else now
        recent = sorted(t for at, t in self._tpot_by_lane.get(lane, ()) if now - at <= RECENT_TPOT_MAX_AGE_S)
        if len(recent) < RECENT_TPOT_MIN_STREAMS:
            return None
        return recent[min(len(recent) - 1, int(0.9 * len(recent)))]

    def decode_pace_s(self, live_token_times: list[list[float]], now: float | None = None) -> float | None:
        """The running requests' current pace if any are streaming; else recent finished ones'."""
        now = time.monotonic() if now is None else now
        live = live_decode_pace(live_token_times, now)
        return live if live is not None else self.decode_pace.fresh(SERVICE_TIME_MAX_AGE_S, now)

    def running(self, progress: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """(tokens so far, expected output tokens) from (tokens so far, max_tokens) per running request."""
        mean = self.output_tokens.value
        return tuple((done, expected_total_tokens(done, max_tokens, mean)) for done, max_tokens in progress)

    def expected_output(self, max_tokens: int) -> float:
        """Output length of a request that takes a freed slot."""
        mean = self.output_tokens.value
        return float(max_tokens) if mean is None else min(float(max_tokens), mean)
