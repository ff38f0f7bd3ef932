"""The lanes' pressure, as the router tells the decode workers (pure Python, no torch).

A decode worker's scheduler shares its sequence slots by lane weight (engine/lane_shares.py), but it
sees only the requests it holds: the lanes' demand waiting in the router, and whether a lane's streams
are too slow, are known here. With each poll of a decode worker (the long poll that brings its outputs
back: no extra Ray call) the router sends, per lane, a ``LaneDemand``: the requests waiting in its
lane queue plus those admission refused lately (for pace or for their predicted time to first
token: demand it could not take), and ``pace_short`` when the lane's running streams are slower than
``hold_at x`` its TPOT objective or admission refused it for pace lately. The worker then preempts
running sequences of less important preemptible lanes down to their floor, and keeps their prompt
work to their share of a step while the lane has demand.

Admission's side: ``freeable``, how many running sequences of less important preemptible lanes
are above their floor, i.e. what preempting them would free for a request of a given lane; and
``pace``, the pace a new request would get: every running sequence gets one token a step, so it is
the live pace of the streams of lanes that are not preemptible (a preempted batch stream, stalled
until it resumes, would otherwise read as a slow pace and turn every lane away for good).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise

from engine.config import LaneShareConfig
from engine.lane_shares import LaneDemand
from router.lanes import LaneConfig
from router.load_signals import live_decode_pace


def lane_share_configs(lanes: Iterable[LaneConfig]) -> tuple[LaneShareConfig, ...]:
    """The lanes as the decode workers' schedulers share capacity by them (``SchedulerConfig.lane_shares``).
    Lanes reach the engine as their priority: lanes of one priority share the most generous terms."""
    by_priority: dict[int, LaneShareConfig] = {}
    for lane in lanes:
        old = by_priority.get(lane.priority)
        by_priority[lane.priority] = LaneShareConfig(
            lane.priority,
            lane.weight if old is None else max(old.weight, lane.weight),
            lane.decode_floor if old is None else max(old.floor, lane.decode_floor),
            lane.preemptible if old is None else old.preemptible and lane.preemptible,
        )
    return tuple(by_priority.values())


class LanePressure:
    def __init__(
        self,
        lanes: Iterable[LaneConfig],
        depth: Callable[[str], int],
        running: Callable[[], Iterable[tuple[str, Sequence[float]]]],
        pace_refusals: Callable[[str, float], int],
        ttft_refusals: Callable[[str, float], int],
        *,
        hold_at: float = 0.6,
        recent_s: float = 2.0,
        cache_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``depth``: a lane's router queue depth; ``running``: (lane, token times) per running request;
        ``pace_refusals(lane, since)`` / ``ttft_refusals(lane, since)``: how many of the lane's requests
        admission refused since then for pace / for their predicted time to first token."""
        self.lanes = {lane.name: lane for lane in lanes}
        # Each lane's floor by priority, as the workers' lane shares keep it (router.placement.LaneSteps).
        self.floors = {c.priority: c.floor for c in lane_share_configs(self.lanes.values())}
        self._depth = depth
        self._running = running
        self._pace_refusals = pace_refusals
        self._ttft_refusals = ttft_refusals
        self.hold_at = hold_at
        self.recent_s = recent_s
        self.cache_s = cache_s
        self._clock = clock
        self._report: tuple[float, tuple[LaneDemand, ...]] = (-math.inf, ())
        self._pace: tuple[float, float | None] = (-math.inf, None)  # (when, the live pace ``pace`` read)

    def latest(self) -> tuple[LaneDemand, ...]:
        """The last ``report`` (from any thread: the dispatcher's poll threads send it)."""
        return self._report[1]

    def report(self) -> tuple[LaneDemand, ...]:
        """The lanes' demand now (on the event loop, which owns the queues and streams it reads;
        recomputed at most every ``cache_s``)."""
        now = self._clock()
        if now - self._report[0] < self.cache_s:
            return self._report[1]
        times: dict[str, list[Sequence[float]]] = {}
        for running_lane, tt in self._running():
            times.setdefault(running_lane, []).append(tt[-9:])
        out = []
        for name, lane in self.lanes.items():
            refused = self._pace_refusals(name, now - self.recent_s)
            pace = live_decode_pace([list(t) for t in times.get(name, [])], now)
            short = refused > 0 or (pace is not None and pace > lane.tpot_slo_s * self.hold_at)
            # (refused for TTFT is demand too, but not short of pace: nothing running is slow)
            waiting = self._depth(name) + refused + self._ttft_refusals(name, now - self.recent_s)
            if waiting or short:
                out.append(LaneDemand(lane.priority, waiting, short))
        demands = tuple(out)
        self._report = (now, demands)
        return demands

    def pace(self, overall: Callable[[], float | None]) -> float | None:
        """The live pace of the streams of lanes that are not preemptible; with none, the median gap
        of the preemptible ones' (a stream's one gap across a preemption, or its stall now, is not the
        pace); ``overall()`` (recently finished requests' pace) when nothing streams."""
        now = self._clock()
        if now - self._pace[0] >= self.cache_s:
            firm: list[list[float]] = []
            preemptible: list[list[float]] = []
            for name, tt in self._running():
                lane = self.lanes.get(name)
                (preemptible if lane is not None and lane.preemptible else firm).append(list(tt[-9:]))
            pace = live_decode_pace(firm, now)
            if pace is None:
                gaps = sorted(statistics.median(b - a for a, b in pairwise(t)) for t in preemptible if len(t) >= 4)
                pace = gaps[len(gaps) // 2] if gaps else None
            self._pace = (now, pace)
        pace = self._pace[1]
        return pace if pace is not None else overall()

    def freeable_on(self, lane: str, running_by_priority: Mapping[int, int]) -> int:
        """``freeable`` from a decode worker's own count of its batch by priority
        (``LaneCounters.running``): the sequences it runs, not the router's dispatched ones (those
        already preempted and waiting there free nothing more). Lanes of one priority count with
        the most generous terms, as ``lane_share_configs`` gives them to the workers."""
        mine = self.lanes[lane].priority
        terms = {c.priority: c for c in lane_share_configs(self.lanes.values())}
        total = sum(running_by_priority.values())
        out = 0
        for p, n in running_by_priority.items():
            c = terms.get(p)
            if c is None or not c.preemptible or p <= mine:
                continue
            floor = max(1, math.ceil(c.floor * total)) if c.floor else 0
            out += max(0, n - floor)
        return out

    def freeable(self, lane: str, running_by_lane: Mapping[str, int] | None = None) -> int:
        """Running sequences of preemptible lanes less important than ``lane`` above their floor
        (``running_by_lane``: running requests by lane; None: counted from ``running``)."""
        if running_by_lane is None:
            counts: dict[str, int] = {}
            for name, _ in self._running():
                counts[name] = counts.get(name, 0) + 1
            running_by_lane = counts
        mine = self.lanes[lane].priority
        total = sum(running_by_lane.values())
        out = 0
        for name, n in running_by_lane.items():
            other = self.lanes.get(name)
            if other is None or not other.preemptible or other.priority <= mine:
                continue
            floor = max(1, math.ceil(other.decode_floor * total)) if other.decode_floor else 0
            out += max(0, n - floor)
        return out
