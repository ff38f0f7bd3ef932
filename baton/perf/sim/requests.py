"""The simulator's requests: what arrives (``SimRequest``) and what happened to it (``RequestRecord``).

Prompts are synthetic token ids, a pure function of (seed, request index, prefix group): requests of
one prefix group share their first ``prefix_len`` tokens, so prefix caching and cache-aware
placement see the same structure as with real text. Token values do not affect timing.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimRequest:
    index: int
    arrival_s: float
    lane: str
    prompt_len: int
    output_len: int
    prefix_group: int | None = None
    prefix_len: int = 0
    stream: bool = True

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"request {self.index}: prompt_len and output_len must be >= 1")
        if self.arrival_s < 0:
            raise ValueError(f"request {self.index}: arrival_s must be >= 0")


def from_planned(planned: Iterable, prefix_len: int = 0, stream: bool = True) -> list[SimRequest]:
    """``baton.perf.loadgen.arrivals.PlannedRequest``s (or anything with the same fields) as ``SimRequest``s."""
    return [
        SimRequest(
            p.index,
            p.arrival_s,
            p.lane,
            p.prompt_len,
            p.output_len,
            p.prefix_group,
            prefix_len if p.prefix_group is not None else 0,
            stream,
        )
        for p in planned
    ]


def prompt_token_ids(req: SimRequest, vocab_size: int, seed: int = 0) -> list[int]:
    lo = 3  # never the usual special ids (0, 1, 2)
    shared = 0
    out: list[int] = []
    if req.prefix_group is not None and req.prefix_len:
        shared = min(req.prefix_len, req.prompt_len - 1)  # the last token is the request's own
        g = random.Random(f"{seed}/prefix/{req.prefix_group}")
        out = [g.randrange(lo, vocab_size) for _ in range(shared)]
    r = random.Random(f"{seed}/request/{req.index}")
    out += [r.randrange(lo, vocab_size) for _ in range(req.prompt_len - shared)]
    return out


@dataclass
class RequestRecord:
    """One request's life in the simulation; times in simulated seconds, as the client sees them."""

    index: int
    lane: str
    prompt_len: int
    output_len: int
    arrival_s: float
    rejected: str | None = None  # the admission error code (e.g. slo_predicted_violation)
    dispatched_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_s: float | None = None
    placement: str | None = None  # "local" | "disaggregated"
    decode_worker: str | None = None
    prefill_worker: str | None = None
    preemptions: int = 0
    cached_tokens: int = 0  # prefix-cache hit where the prompt was computed

    @property
    def done(self) -> bool:
        return self.rejected is not None or self.finished_s is not None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def e2e_s(self) -> float | None:
        return self.finished_s - self.arrival_s if self.finished_s is not None else None

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (0 for a one-token answer)."""
        t = self.token_times
        if self.finished_s is None or not t:
            return None
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "lane": self.lane,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "arrival_s": self.arrival_s,
            "rejected": self.rejected,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "itl_s": self.itl_s,
            "placement": self.placement,
            "decode_worker": self.decode_worker,
            "prefill_worker": self.prefill_worker,
            "preemptions": self.preemptions,
            "cached_tokens": self.cached_tokens,
            "router_queue_s": None if self.dispatched_s is None else self.dispatched_s - self.arrival_s,
        }
