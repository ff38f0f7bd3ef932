"""When a workload's requests arrive and what each one is: ``plan_requests`` turns a
``WorkloadSpec`` (baton/perf/loadgen/workload.py) into a seeded list of ``PlannedRequest``s for a
rate and a duration, optionally with a ``Burst``; ``sample_requests`` draws them without arrival
times for closed-loop clients.

Arrivals are a renewal process (Poisson, or gamma with shape k: inter-arrival CV = 1/sqrt(k)) at
unit rate, mapped onto wall time through the cumulative rate, so a ``Burst`` multiplies the
instantaneous rate inside its window without changing the process's shape. Drawn only with
``random.Random`` (no numpy): a plan is bit-identical in every process and on every platform.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from baton.perf.loadgen.run_checks import MAX_PLANNED_REQUESTS, check_non_negative, check_positive, check_request_count
from baton.perf.loadgen.workload import WorkloadSpec


@dataclass(frozen=True)
class Burst:
    """Multiply the arrival rate by ``factor`` during ``[start_s, start_s + length_s)``."""

    factor: float
    start_s: float
    length_s: float

    def __post_init__(self) -> None:
        # A NaN start or an infinite factor makes plan_requests loop forever: finite values only.
        check_positive("burst factor", self.factor)
        check_non_negative("burst start", self.start_s)
        check_non_negative("burst length", self.length_s)

    @staticmethod
    def parse(text: str) -> Burst:
        """``FACTOR:START:LEN``, e.g. ``2:30:10`` (twice the rate from t=30 s for 10 s)."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"--burst must be FACTOR:START:LEN, got {text!r}")
        try:
            return Burst(float(parts[0]), float(parts[1]), float(parts[2]))
        except ValueError as e:
            raise ValueError(f"--burst {text!r}: {e}") from None

    def rate_factor(self, t: float) -> float:
        return self.factor if self.start_s <= t < self.start_s + self.length_s else 1.0


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    arrival_s: float
    lane: str
    prompt_len: int  # shared prefix included
    output_len: int
    prefix_group: int | None


def _operational_to_wall(u: float, rate: float, burst: Burst | None) -> float:
    """Invert the cumulative rate Λ(t) = rate * (t + (factor - 1) * |[0, t) ∩ burst|)."""
    if burst is None:
        return u / rate
    a, b, f = burst.start_s, burst.start_s + burst.length_s, burst.factor
    ua = rate * a  # Λ at the burst's start
    ub = ua + rate * f * (b - a)  # Λ at its end
    if u < ua:
        return u / rate
    if u < ub:
        return a + (u - ua) / (rate * f)
    return b + (u - ub) / rate


def sample_request(spec: WorkloadSpec, index: int, rng: random.Random, arrival_s: float = 0.0) -> PlannedRequest:
    """One request's lane, lengths and prefix group (draws in that fixed order)."""
    lanes = list(spec.lanes.items())
    x, acc, lane = rng.random(), 0.0, lanes[-1][0]
    for name, share in lanes:
        acc += share
        if x < acc:
            lane = name
            break
    input_len = spec.input_dist(lane).sample(rng)
    output_len = spec.output_dist(lane).sample(rng)
    group = rng.randrange(spec.prefix_groups) if spec.prefix_groups > 0 else None
    prompt_len = input_len + (spec.prefix_len if group is not None else 0)
    return PlannedRequest(index, arrival_s, lane, prompt_len, output_len, group)


def sample_requests(spec: WorkloadSpec, n: int, seed: int = 0) -> list[PlannedRequest]:
    """``n`` requests without arrival times (closed-loop clients take them in order)."""
    rng = random.Random(f"baton-requests:{seed}")
    return [sample_request(spec, i, rng) for i in range(n)]


def plan_requests(
    spec: WorkloadSpec, rate: float, duration_s: float, seed: int = 0, burst: Burst | None = None
) -> list[PlannedRequest]:
    """Every request arriving in ``[0, duration_s)`` at ``rate`` requests/s (open loop), sorted by arrival.

    Arrival times and request contents come from two independent seeded streams, so changing the
    rate (or adding a burst) changes when requests arrive but not the sequence of requests sent.
    """
    # An infinite rate puts every arrival at 0 and an infinite (or NaN) duration never ends: both loop forever.
    check_positive("rate", rate)
    check_non_negative("duration", duration_s)
    check_request_count(rate, duration_s, burst)  # and a huge rate x duration holds more than memory does
    arrivals_rng = random.Random(f"baton-arrivals:{seed}")
    content_rng = random.Random(f"baton-requests:{seed}")
    shape = spec.gamma_shape
    out: list[PlannedRequest] = []
    u = 0.0  # operational time: the unit-rate process
    while True:
        if spec.arrival == "poisson":
            u += arrivals_rng.expovariate(1.0)
        else:
            u += arrivals_rng.gammavariate(shape, 1.0 / shape)  # mean 1, CV 1/sqrt(shape)
        t = _operational_to_wall(u, rate, burst)
        if t >= duration_s:
            return out
        if len(out) >= 2 * MAX_PLANNED_REQUESTS:  # (unreachable unless the draws are absurdly unlucky)
            raise ValueError(f"the plan holds over {len(out)} requests: lower --rate or --duration")
        out.append(sample_request(spec, len(out), content_rng, arrival_s=t))
