"""What admission measures from the requests it let in (pure Python), shared by the router and the
simulator so both predict from the same signals: the completion rate, the service overhead, the
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

from router.admission import (
    SERVICE_TIME_MAX_AGE_S,
    CompletionRate,
    Ewma,
    expected_total_tokens,
    live_decode_pace,
    service_overhead,
)

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
