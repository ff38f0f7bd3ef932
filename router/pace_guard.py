"""The pace guard: lanes that can wait do not slow the streams of lanes that cannot (pure Python).

Every sequence a decode worker runs lengthens each of its steps, so every request dispatched slows
the streams already running. Admission turns new interactive requests away once the live decode
pace is past ``headroom x`` their TPOT objective; if batch requests kept being dispatched all the
while, they would hold the pace there and the lane that can wait hours would crowd out the one
that cannot wait a second. So while the pace is past ``hold_at x`` the tightest TPOT objective
among the lanes in use (running, queued, or with an arrival in the last ``recent_s``), lanes with
a looser objective are held in the router: their requests stay in their lane queue, where weighted
fair sharing, admission and the durable journal see them, instead of in the workers' batches.
``hold_at`` is below admission's headroom (0.8 of it by default): holding only where admission
starts refusing settles the pace on the refusal line, and half the tight lane's arrivals are
turned away.

A held request is released anyway once it has waited ``max_hold_fraction`` of its own lane's TTFT
objective: a tight lane that saturates the decode pool on its own must not starve the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.lanes import LaneConfig


def hold_at_for(slo_headroom: float) -> float:
    """The pace guard's (and lane pressure's) threshold for an admission headroom: below it, so lanes
    are held before admission starts refusing for pace."""
    return 0.8 * slo_headroom


class PaceGuard:
    def __init__(
        self,
        lanes: Iterable[LaneConfig],
        *,
        hold_at: float = 0.6,
        recent_s: float = 30.0,
        max_hold_fraction: float = 0.25,
    ) -> None:
        if not 0 < hold_at <= 1:
            raise ValueError(f"hold_at must be in (0, 1], got {hold_at!r}")
        if not 0 <= max_hold_fraction <= 1:
            raise ValueError(f"max_hold_fraction must be in [0, 1], got {max_hold_fraction!r}")
        self.lanes = {lane.name: lane for lane in lanes}
        self.hold_at = hold_at
        self.recent_s = recent_s
        self.max_hold_fraction = max_hold_fraction
        self._last_arrival: dict[str, float] = {}
        # Lanes that can ever be held: looser than the tightest lane there is. While none of them
        # has anything queued the guard has nothing to decide (the dispatch loop skips it).
        tightest = min(lane.tpot_slo_s for lane in self.lanes.values())
        self.holdable = frozenset(n for n, lane in self.lanes.items() if lane.tpot_slo_s > tightest)

    def arrived(self, lane: str, now: float) -> None:
        self._last_arrival[lane] = now

    def held(self, pace_s: float | None, active_lanes: Iterable[str], now: float) -> dict[str, float]:
        """Lanes to hold now -> how long a request of that lane may be held at most (seconds).

        ``pace_s``: the running streams' live seconds per token (None: none streaming);
        ``active_lanes``: lanes with requests running or queued."""
        if pace_s is None:
            return {}
        in_use = set(active_lanes) | {n for n, t in self._last_arrival.items() if now - t <= self.recent_s}
        tpots = [self.lanes[n].tpot_slo_s for n in in_use if n in self.lanes]
        if not tpots:
            return {}
        tightest = min(tpots)
        if pace_s <= tightest * self.hold_at:
            return {}
        return {
            n: lane.ttft_slo_s * self.max_hold_fraction for n, lane in self.lanes.items() if lane.tpot_slo_s > tightest
        }
