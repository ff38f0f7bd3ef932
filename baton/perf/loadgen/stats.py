"""Latency percentiles, SLO attainment and goodput over request records (pure Python).

Definitions (all over the *measured* requests: those planned to arrive inside the measured window):
- TTFT: send -> first streamed token; TPOT: (e2e - TTFT) / (output tokens - 1); ITL: every gap
  between streamed chunks (split over the tokens a chunk carried); e2e: send -> last token.
  Latencies are over ``ok`` requests only.
- A request *meets its SLO* when it finished ``ok`` with TTFT <= the lane's TTFT objective and TPOT
  <= its TPOT objective (a one-token answer has no TPOT and meets that half). A rejected, failed
  or timed-out request never meets it: refusing work is not serving it.
- SLO attainment: requests meeting the SLO / requests sent.
- Goodput (at the offered rate): requests meeting the SLO per second of the measured window.
  With ``--search``, the *goodput rate* (DistServe) is the highest offered rate whose attainment
  is at least the target (90%): see ``baton.perf.loadgen.search``.
- Throughput: completed requests and their output tokens per second, from the window's start to
  the last measured request's completion.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from baton.perf.loadgen.records import RequestRecord
from baton.perf.loadgen.slo import LaneSLO


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Dist:
    """Mean and percentiles of one latency, in seconds (None when there is no sample)."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @staticmethod
    def of(xs: Iterable[float]) -> Dist:
        v = list(xs)
        if not v:
            return Dist(0, None, None, None, None, None)
        return Dist(len(v), sum(v) / len(v), percentile(v, 50), percentile(v, 90), percentile(v, 99), max(v))

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {
            "n": self.n,
            "mean": r(self.mean),
            "p50": r(self.p50),
            "p90": r(self.p90),
            "p99": r(self.p99),
            "max": r(self.max),
        }


def meets_slo(rec: RequestRecord, slo: LaneSLO) -> bool:
    if rec.status != "ok" or rec.ttft_s is None or rec.ttft_s > slo.ttft_s:
        return False
    tpot = rec.tpot_s
    return tpot is None or tpot <= slo.tpot_s


@dataclass(frozen=True)
class LaneStats:
    requests: int  # sent
    completed: int
    rejected: int
    errors: int  # failed after output started, connection errors, client timeouts
    rejections: dict[str, int]  # reason -> count (rejections and failures)
    duration_s: float  # the measured window
    elapsed_s: float  # window start -> last completion
    request_throughput: float  # completed / elapsed
    output_token_throughput: float  # output tokens of completed requests / elapsed
    ttft_s: Dist
    tpot_s: Dist
    itl_s: Dist
    e2e_s: Dist
    slo: LaneSLO | None
    slo_met: int
    slo_attainment: float | None  # slo_met / requests
    goodput_rps: float  # slo_met / duration
    offered_rate: float | None  # planned requests/s (None: closed loop)
    lag_s: Dist = field(default_factory=lambda: Dist.of(()))  # send_s - arrival_s (client lag)

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {
            "requests": self.requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "errors": self.errors,
            "rejections": dict(sorted(self.rejections.items())),
            "duration_s": r(self.duration_s),
            "elapsed_s": r(self.elapsed_s),
            "offered_rate": r(self.offered_rate),
            "request_throughput": r(self.request_throughput),
            "output_token_throughput": r(self.output_token_throughput),
            "ttft_s": self.ttft_s.to_dict(),
            "tpot_s": self.tpot_s.to_dict(),
            "itl_s": self.itl_s.to_dict(),
            "e2e_s": self.e2e_s.to_dict(),
            "client_lag_s": self.lag_s.to_dict(),
            "slo": None if self.slo is None else self.slo.to_dict(),
            "slo_met": self.slo_met,
            "slo_attainment": r(self.slo_attainment),
            "goodput_rps": r(self.goodput_rps),
        }


def summarize(
    records: Sequence[RequestRecord],
    slos: dict[str, LaneSLO] | LaneSLO | None,
    duration_s: float,
    window_start_s: float = 0.0,
    offered_rate: float | None = None,
) -> LaneStats:
    """Statistics of ``records`` (already restricted to the measured window). ``slos`` is one SLO,
    or a lane -> SLO map (each request is scored against its own lane's)."""
    ok = [r for r in records if r.status == "ok"]
    ends = [r.end_s for r in records if r.end_s is not None]
    elapsed = max((max(ends) - window_start_s) if ends else duration_s, 1e-9)
    if isinstance(slos, LaneSLO) or slos is None:
        slo_of = lambda r: slos  # noqa: E731
        single = slos
    else:
        slo_of = lambda r: slos.get(r.lane)  # noqa: E731
        lanes = {r.lane for r in records}
        single = slos.get(next(iter(lanes))) if len(lanes) == 1 else None
    met = sum(1 for r in records if (s := slo_of(r)) is not None and meets_slo(r, s))
    scored = [r for r in records if slo_of(r) is not None]
    return LaneStats(
        requests=len(records),
        completed=len(ok),
        rejected=sum(1 for r in records if r.status == "rejected"),
        errors=sum(1 for r in records if r.status in ("error", "timeout")),
        rejections=dict(Counter(r.reason for r in records if r.reason is not None)),
        duration_s=duration_s,
        elapsed_s=elapsed,
        request_throughput=len(ok) / elapsed if elapsed > 0 else 0.0,
        output_token_throughput=sum(r.output_tokens for r in ok) / elapsed if elapsed > 0 else 0.0,
        ttft_s=Dist.of(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_s=Dist.of(t for r in ok if (t := r.tpot_s) is not None),
        itl_s=Dist.of(x for r in ok for x in r.itl_s),
        e2e_s=Dist.of(r.e2e_s for r in ok if r.e2e_s is not None),
        slo=single,
        slo_met=met,
        slo_attainment=met / len(scored) if scored else None,
        goodput_rps=met / duration_s if duration_s > 0 else 0.0,
        offered_rate=offered_rate,
        lag_s=Dist.of(r.send_s - r.arrival_s for r in records),
    )


def summarize_by_lane(
    records: Sequence[RequestRecord],
    slos: dict[str, LaneSLO],
    duration_s: float,
    window_start_s: float = 0.0,
    lane_rates: dict[str, float] | None = None,
) -> dict[str, LaneStats]:
    lanes = sorted({r.lane for r in records} | set(lane_rates or {}))
    return {
        lane: summarize(
            [r for r in records if r.lane == lane],
            slos.get(lane),
            duration_s,
            window_start_s,
            (lane_rates or {}).get(lane),
        )
        for lane in lanes
    }
