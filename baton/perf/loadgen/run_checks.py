"""Checks of a load run's numbers, before anything is planned: finite and positive values, and a
bound on how many requests a run may plan (a plan is built in memory first)."""

from __future__ import annotations

import math
from typing import Any, Protocol


class BurstWindow(Protocol):
    """What the count needs of a burst (``arrivals.Burst``, which imports these checks)."""

    @property
    def factor(self) -> float: ...
    @property
    def start_s(self) -> float: ...
    @property
    def length_s(self) -> float: ...


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_positive(name: str, v: Any) -> float:
    """``v`` if it is a finite number > 0 (NaN and inf are not), else a ValueError naming ``name``."""
    if not (_finite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v}")
    return v


def check_non_negative(name: str, v: Any) -> float:
    if not (_finite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    return v


# The most requests one plan may hold: a plan is built in memory before the run (or the simulation)
# starts, so rate x duration must stay bounded (1e9 req/s, or 1e12 s, grew until the OOM killer came).
MAX_PLANNED_REQUESTS = 1_000_000


def expected_requests(rate: float, duration_s: float, burst: BurstWindow | None = None) -> float:
    """How many requests a plan at ``rate`` over ``duration_s`` holds on average (the burst included)."""
    n = rate * duration_s
    if burst is not None:
        overlap = max(0.0, min(duration_s, burst.start_s + burst.length_s) - burst.start_s)
        n += rate * (burst.factor - 1.0) * overlap
    return n


def check_request_count(
    rate: float, duration_s: float, burst: BurstWindow | None = None, rate_flag: str = "--rate"
) -> None:
    """ValueError naming the flags when a plan at ``rate`` over ``duration_s`` would hold more than
    MAX_PLANNED_REQUESTS requests (a few standard deviations above the mean are still accepted)."""
    n = expected_requests(rate, duration_s, burst)
    if n > MAX_PLANNED_REQUESTS:
        with_burst = " (with the --burst)" if burst is not None and burst.factor > 1 else ""
        raise ValueError(
            f"{rate_flag} {rate:g} req/s over --duration {duration_s:g} s is about {n:.3g} requests"
            f"{with_burst}; at most {MAX_PLANNED_REQUESTS} a run: lower {rate_flag} or --duration"
        )
