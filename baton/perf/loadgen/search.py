"""Goodput-rate search (DistServe's definition): the highest offered rate at which at least
``target`` (90%) of requests meet both their TTFT and TPOT objectives.

Bracketing, then bisection: from the start rate, double while the target is met (halve while it
is not) until the rate is bracketed between a passing and a failing rate, then bisect until the
bracket is narrower than ``rel_tol`` of the failing rate or the run budget is spent. Attainment
is assumed to fall as the rate rises (it does, up to noise; the short runs make it noisy, and the
result is the highest *tested* passing rate, never an extrapolation).

``evaluate`` is injected (a real run in ``baton bench serve``, a function in the tests), so the
search logic is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class SearchPoint(Generic[T]):
    rate: float
    attainment: float
    passed: bool
    result: T


@dataclass(frozen=True)
class SearchResult(Generic[T]):
    target: float
    points: list[SearchPoint[T]]

    @property
    def best(self) -> SearchPoint[T] | None:
        """The passing point of the highest rate (None if no rate passed)."""
        passing = [p for p in self.points if p.passed]
        return max(passing, key=lambda p: p.rate) if passing else None

    @property
    def goodput_rate(self) -> float:
        best = self.best
        return best.rate if best is not None else 0.0


def search_goodput_rate(
    evaluate: Callable[[float], tuple[float | None, T]],
    start_rate: float,
    *,
    target: float = 0.9,
    max_runs: int = 8,
    rel_tol: float = 0.1,
    min_rate: float = 0.01,
    max_rate: float = math.inf,
) -> SearchResult[T]:
    """``evaluate(rate) -> (attainment in [0, 1] or None, result)``; None (no request was measured)
    counts as a miss, so the search never reports a rate it has no evidence for."""
    if not start_rate > 0:
        raise ValueError(f"the start rate must be > 0, got {start_rate}")
    if not 0 < target <= 1:
        raise ValueError(f"the target must be in (0, 1], got {target}")
    if max_runs < 1:
        raise ValueError(f"max_runs must be >= 1, got {max_runs}")
    points: list[SearchPoint[T]] = []
    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest failing rate
    rate = min(start_rate, max_rate)
    while len(points) < max_runs:
        attainment, result = evaluate(rate)
        a = 0.0 if attainment is None else attainment
        passed = a >= target
        points.append(SearchPoint(rate, a, passed, result))
        if passed:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:  # everything passed so far: go up
            if rate >= max_rate:
                break
            rate = min(rate * 2.0, max_rate)
        elif lo is None:  # everything failed so far: go down
            rate /= 2.0
            if rate < min_rate:
                break
        else:
            if (hi - lo) / hi <= rel_tol:
                break
            rate = (lo + hi) / 2.0
    return SearchResult(target, points)
