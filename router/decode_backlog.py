"""Preemptible lanes the decode pool already holds back wait in the router (pure Python).

With lane shares on, a decode worker keeps a preemptible lane to its share of the batch while a
more important lane has demand, and preempts its running sequences for that lane's pace; they wait
in the worker's queue, to be recomputed when they resume. A request of such a lane dispatched
meanwhile has its prompt computed on a prefill worker, its KV shipped, joins the batch, and is
preempted again within a step or two, its KV thrown away: prefill capacity spent on work the decode
pool does not run, and taken from the more important lane's prompts, which wait behind it there.
So while every live decode worker holds waiting requests of a preemptible lane, that lane is held
in the router: its requests wait in their lane queue (durable, fairly shared, seen by admission),
and the decode workers' own backlog of the lane keeps it at its floor. Once a worker's backlog of
the lane is gone, dispatch resumes. A held request is released anyway once it has waited
``max_hold_fraction`` of its lane's TTFT objective.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.worker_stats import WorkerLoad
from router.lanes import LaneConfig


def backlogged_lanes(
    lanes: Iterable[LaneConfig], decode_loads: Iterable[WorkerLoad | None], max_hold_fraction: float = 0.25
) -> dict[str, float]:
    """Preemptible lanes every decode worker holds waiting work of -> the longest a request of that
    lane may be held (seconds). ``decode_loads``: the live decode workers' last reports; none, or a
    worker not yet reported, holds nothing (it may take the lane's work)."""
    loads = list(decode_loads)
    if not loads or any(load is None for load in loads):
        return {}
    return {
        lane.name: lane.ttft_slo_s * max_hold_fraction
        for lane in lanes
        if lane.preemptible
        and all(load is not None and load.waiting_tokens_by_priority.get(lane.priority, 0) > 0 for load in loads)
    }


def merge_holds(*holds: dict[str, float]) -> dict[str, float]:
    """Lanes held by any of ``holds`` -> the shortest of their longest holds."""
    out: dict[str, float] = {}
    for held in holds:
        for lane, longest in held.items():
            out[lane] = min(longest, out.get(lane, longest))
    return out
