"""Decode capacity by lane: how a lane's priority reaches the decode step (pure Python, no torch).

Lanes reach a worker's scheduler as their requests' priority (``LaneShareConfig`` per priority, from
the router's lane config). Each step, every lane with demand gets a share of the sequence slots by
weight (one decode token per sequence, so the same share of decode tokens), at least its ``floor``
of them while it has demand, and never more than it wants: what a lane does not use is lent to the
others. A lane's demand is its running and locally waiting requests plus the pressure the router
reports with each poll (``LaneDemand``: requests waiting in the router, or turned away for pace).
The step's token budget left after the decodes is shared the same way (``token_shares``) among the
lanes with prompt tokens to compute here (running prompt chunks, recomputes, waiting prompts): a
batch prompt or recompute takes its lane's share of a step, not the whole step, while an
interactive prompt waits. Except in a step that computes a more important lane's prompt: there the
less important lanes keep to their floor, lent nothing, since that step's length is the prompt's time
to first token (a prefill worker's steps are all prompt: lent the rest of a full step, batch
prompts made an interactive prompt's step several times its own length).

The shares act in three places:

- admission (``Admitter``): a waiting request of a lane at its share is passed over while another
  lane with demand is under its own; a prompt's first chunk is cut to its lane's token share;
- prompt chunks of running requests (``Scheduler._schedule_rest``): cut to their lane's token share;
- preemption for pace: while a lane's streams are slower than its TPOT objective, or admission refuses
  it for pace (``LaneDemand.pace_short``), running sequences of less important preemptible lanes are
  preempted (least important, newest first, one a step) down to their floor; and a more important
  request waiting here for a sequence slot takes one from a preemptible lane above its share. A
  victim goes back to the waiting queue and resumes by recompute (``RequestLifecycle.preempt``); its
  lane is held at its floor (a share of the sequences the step runs) until the pace is back (the
  router stops reporting ``pace_short``) and the more important lane has no demand left in the
  routers, and then regrows by one sequence every ``REGROW_S`` up to its share: let back at once,
  the batch lane would set the pace again at once, and every such round trip recomputes what its
  victims had done.
  Meanwhile their prompt work here (recomputes, local prefills) keeps to their floor share of the
  step's prompt tokens, lent nothing: a chunk riding in a step slows every stream in it.

Transitions: DECODING/PREFILLING → PREEMPTED (through ``RequestLifecycle.preempt``, by the scheduler).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.config import LaneShareConfig
from engine.request import Request

# A router's report counts for this long (then it is gone, or stalled, and its pressure with it).
PRESSURE_TTL_S = 5.0
# After a lane was short of pace, the preemptible lanes held at their floor regrow one sequence this often.
REGROW_S = 0.5


@dataclass(frozen=True)
class LaneDemand:
    """One lane's pressure as a router sees it; sent to the decode workers with each poll."""

    priority: int
    waiting: int = 0  # requests in the router's lane queue, plus those recently refused for pace
    pace_short: bool = False  # its streams miss (or would miss) the TPOT objective, or it is refused for pace


@dataclass(frozen=True)
class LaneCounters:
    """Cumulative, by priority, for the load report (the router labels them with its lane names)."""

    decode_tokens: dict[int, int]  # sequences in the batch, summed over steps (a decode token each)
    pace_preemptions: dict[int, int]  # sequences preempted for a more important lane's pace
    preempted_seconds: dict[int, float]  # time those spent preempted, counted when they resumed
    # Now, not cumulative: prompt tokens queued (waiting, or a running prompt's rest, recomputes included).
    # A request goes ahead of less important lanes' (the waiting queue is in priority order): admission
    # does not count their tokens as queued ahead of it.
    queued_tokens: dict[int, int] = field(default_factory=dict)
    # Now: sequences in the batch by priority as the last step started (what preempting for pace can
    # free is there, not in the router's count of dispatched requests, which holds the preempted too).
    running: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class LanePlan:
    """What the shares decide for one step."""

    running: dict[int, int]  # running sequences by priority
    caps: dict[int, int]  # the most sequences a lane may run after this step's admissions
    victims: list[Request] = field(default_factory=list)  # to preempt for pace now
    # Prompt tokens each lane may still compute this step (``token_shares``; taken as chunks are
    # scheduled). None: one lane wants them, or none: no sharing. A lane not in it wants none.
    tokens: dict[int, int] | None = None
    short: int | None = None  # the most important lane short of pace this step (None: none)
    pressed: int | None = None  # the most important lane with demand waiting in the routers (None: none)


def water_fill(
    demand: dict[int, int], weights: dict[int, float], floors: dict[int, float], capacity: int
) -> dict[int, int]:
    """Slots by lane: ``capacity`` shared by weight among the lanes with demand, each capped at its
    demand (a capped lane's excess goes to the others: lending) and raised to its floor (a fraction of
    ``capacity``, at least one slot, at most its demand). Slots left by the rounding go to the most
    important lanes (lowest priority value) still short."""
    lanes = [p for p, d in demand.items() if d > 0]
    out = {p: 0 for p in demand}
    if not lanes or capacity <= 0:
        return out
    floor = {
        p: min(float(demand[p]), max(1.0, floors.get(p, 0.0) * capacity)) if floors.get(p, 0.0) else 0.0 for p in lanes
    }
    fixed: dict[int, float] = {}
    while True:  # fix the lanes capped at their demand or raised to their floor; share the rest by weight
        free = [p for p in lanes if p not in fixed]
        left = capacity - sum(fixed.values())
        total = sum(weights.get(p, 1.0) for p in free)
        share = {p: left * weights.get(p, 1.0) / total for p in free} if total else {}
        newly = {p: float(demand[p]) for p, s in share.items() if s >= demand[p]}
        if not newly:
            newly = {p: floor[p] for p, s in share.items() if s < floor[p]}
        if not newly:
            break
        fixed.update(newly)
    for p, s in {**share, **fixed}.items():
        out[p] = math.floor(s + 1e-9)
    spare = min(capacity, sum(demand[p] for p in lanes)) - sum(out.values())
    for p in sorted(lanes):
        if spare <= 0:
            break
        if out[p] < demand[p]:
            out[p] += 1
            spare -= 1
    return out


def floor_tokens(share: float, budget: int) -> int:
    """``share`` of a step's ``budget`` prompt tokens, at least one: a lane's floor is what it keeps in
    a step that computes a more important lane's prompt (``LaneShares.token_shares``; router.placement
    reads the same to predict that prompt's step), and its held share beside one pressing in the routers."""
    return max(1, math.floor(budget * share))


class LaneShares:
    def __init__(
        self, lanes: Iterable[LaneShareConfig], max_num_seqs: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lanes = {lane.priority: lane for lane in lanes}
        self.weights = {p: lane.weight for p, lane in self.lanes.items()}
        self.floors = {p: lane.floor for p, lane in self.lanes.items()}
        self.max_num_seqs = max_num_seqs
        self._clock = clock
        # The routers' latest reports: origin -> (when, demands). Replaced whole by the poll's thread,
        # read by the step's: each value is immutable.
        self._pressure: dict[str, tuple[float, tuple[LaneDemand, ...]]] = {}
        # Counters (cumulative, for the load report): preempted for pace, and seconds spent preempted,
        # by priority; and decode tokens scheduled by priority.
        self.pace_preemptions: dict[int, int] = {}
        self.preempted_seconds: dict[int, float] = {}
        self.decode_tokens: dict[int, int] = {}
        self._out: dict[str, float] = {}  # request id -> when it was preempted for pace
        # When a lane was last reported short of pace and which (None: the lanes below it have regrown).
        self._short_at: float | None = None
        self._short = 0
        self._running: dict[int, int] = {}  # the batch by priority as the last step was planned

    # -- the router's side ------------------------------------------------------------------
    def set_pressure(self, origin: str, demands: tuple[LaneDemand, ...]) -> None:
        self._pressure = {**self._pressure, origin: (self._clock(), demands)}

    def router_demand(self) -> tuple[dict[int, int], int | None]:
        """(requests waiting in the routers by priority, the most important lane short of pace or None)."""
        now = self._clock()
        waiting: dict[int, int] = {}
        short: int | None = None
        for at, demands in self._pressure.values():
            if now - at > PRESSURE_TTL_S:
                continue
            for d in demands:
                waiting[d.priority] = waiting.get(d.priority, 0) + d.waiting
                if d.pace_short and (short is None or d.priority < short):
                    short = d.priority
        return waiting, short

    # -- the step -----------------------------------------------------------------------------
    def plan(
        self, running: list[Request], running_counts: dict[int, int], local_waiting: dict[int, int]
    ) -> LanePlan | None:
        """The shares for this step (``running_counts``: the running requests by priority, kept by the
        batch as they join and leave; ``local_waiting``: this scheduler's waiting requests by
        priority, kept by the queue), or None when fewer than two lanes have demand (nothing to
        share). O(lanes): ``running`` is read only to pick a victim."""
        counts = {p: n for p, n in running_counts.items() if n}
        self._running = dict(counts)  # (the plan's own is updated as the step admits and preempts)
        tokens = self.decode_tokens  # (the batch as the step starts: one token each, counted here for free)
        for p, n in counts.items():
            tokens[p] = tokens.get(p, 0) + n
        demand = dict(counts)
        router_waiting, short = self.router_demand()
        for src in (local_waiting, router_waiting):
            for p, n in src.items():
                demand[p] = demand.get(p, 0) + n
        if sum(1 for n in demand.values() if n > 0) < 2:
            return None
        capacity = min(self.max_num_seqs, sum(demand.values()))
        shares = water_fill(demand, self.weights, self.floors, capacity)
        # A held lane's floor is a share of the sequences the step runs (the decode tokens), not of the
        # slots demanded: the lane's own queue must not raise the floor it is held to.
        stepping = max(1, sum(counts.values()))
        floor_slots = {
            p: (min(demand[p], max(1, math.ceil(self.floors.get(p, 0.0) * stepping))) if self.floors.get(p, 0.0) else 0)
            for p in demand
        }
        caps = dict(shares)
        plan = LanePlan(counts, caps)
        plan.pressed = min((p for p, n in router_waiting.items() if n > 0), default=short)
        preemptible = [p for p in demand if p in self.lanes and self.lanes[p].preemptible]
        if short is not None and any(p > short for p in preemptible):
            # a lane misses its pace: the less important preemptible lanes go to their floor
            self._short_at, self._short = self._clock(), short
            plan.short = short
            for p in preemptible:
                if p > short:
                    caps[p] = min(caps[p], floor_slots[p])
            over = {p for p in preemptible if p > short and counts.get(p, 0) > floor_slots[p]}
            victim = self._newest(running, over) if over else None
            if victim is not None:
                plan.victims.append(victim)
            return plan
        if self._short_at is not None and plan.pressed is not None and plan.pressed <= self._short:
            self._short_at = self._clock()  # the pace is back, but the lane still has demand it cannot place: held
        if self._short_at is not None:  # the pace is back: the preemptible lanes regrow, one at a time
            grown = int((self._clock() - self._short_at) / REGROW_S)
            held = [p for p in preemptible if p > self._short]
            for p in held:
                caps[p] = min(caps[p], floor_slots[p] + grown)
            if all(caps[p] >= shares[p] for p in held):
                self._short_at = None
        if len(running) >= self.max_num_seqs:  # a more important request wants a slot: an over-share lane gives one
            want = min((p for p, n in local_waiting.items() if n and counts.get(p, 0) < shares.get(p, 0)), default=None)
            over = {p for p in preemptible if want is not None and p > want and counts.get(p, 0) > shares[p]}
            victim = self._newest(running, over) if over else None
            if victim is not None:
                plan.victims.append(victim)
        return plan

    def token_shares(
        self, plan: LanePlan, budget: int, rest: list[Request], waiting_tokens: dict[int, int], room: bool
    ) -> dict[int, int] | None:
        """Prompt tokens by lane for this step: ``budget`` (what the decodes left) shared by weight
        with floors and lending among the lanes that want some, i.e. the prompt chunks and recomputes
        of ``rest`` (the running requests that are not plain decodes) and the waiting prompts
        (``waiting_tokens``, by priority, kept by the queue) of lanes that may admit one now (``room``:
        a sequence slot is free; and the lane is under its cap in ``plan``): a share held for a prompt
        that cannot start would only idle. None when fewer than two lanes want any."""
        demand = (
            {p: n for p, n in waiting_tokens.items() if n > 0 and plan.running.get(p, 0) < plan.caps.get(p, 1 << 30)}
            if room
            else {}
        )
        for r in rest:
            n = len(r.all_token_ids) - r.num_computed_tokens
            if n > 1 and not r.is_padding:
                demand[r.priority] = demand.get(r.priority, 0) + n
        if budget <= 0:
            return None
        shares = water_fill(demand, self.weights, self.floors, budget) if len(demand) >= 2 else None
        if plan.pressed is not None and any(p > plan.pressed for p in demand):
            # A more important lane has demand in the routers (waiting, or refused): its share of the
            # step is kept for it, not lent, so its prompts, when they come here, wait for a short step.
            out = dict(shares) if shares is not None else {}
            for p, n in demand.items():
                if p > plan.pressed:
                    out[p] = min(out.get(p, n), self.held_tokens(p, plan.pressed, budget))
            shares = out
        computing = min(demand, default=None)
        if shares is not None and computing is not None and any(p > computing for p in demand):
            # The step computes a more important lane's prompt: its time is that prompt's time to first
            # token, so the less important lanes keep to their floor of it, lent nothing; they have
            # the steps after it (admission bounds how many such prompts come).
            for p in demand:
                if p > computing:
                    shares[p] = min(shares.get(p, demand[p]), floor_tokens(self.floors.get(p, 0.0), budget))
        if plan.short is None:
            return shares
        # A lane short of pace: less important preemptible lanes' prompt work (their recomputes and
        # local prefills ride in every step and slow its streams) keeps to their floor, lent nothing.
        out = dict(shares) if shares is not None else {}
        for p, n in demand.items():
            lane = self.lanes.get(p)
            if lane is not None and lane.preemptible and p > plan.short:
                out[p] = min(out.get(p, n), floor_tokens(lane.floor, budget))
        return out or None

    def held_tokens(self, priority: int, above: int, budget: int) -> int:
        """The prompt tokens of a step of ``budget`` that lane ``priority`` keeps to beside the more
        important lane ``above``: its weight's share of the two, at least its floor and one token."""
        w = self.weights.get(priority, 1.0)
        share = max(self.floors.get(priority, 0.0), w / (w + self.weights.get(above, 1.0)))
        return floor_tokens(share, budget)

    @staticmethod
    def _newest(running: list[Request], lanes: set[int]) -> Request | None:
        """The victim: least important lane first, then the newest (it has the least work to redo). A
        prefill role's request (shipping its KV as it computes) is never one."""
        return max(
            (r for r in running if r.priority in lanes and not r.prefill_only),
            key=lambda r: (r.priority, r.arrival_seq),
            default=None,
        )

    def preempted(self, req: Request) -> None:
        """``req`` was preempted for pace."""
        self.pace_preemptions[req.priority] = self.pace_preemptions.get(req.priority, 0) + 1
        self._out[req.request_id] = self._clock()

    def resumed(self, req: Request) -> None:
        """``req`` joined the running batch (again, after a preemption for pace: the time out is counted)."""
        since = self._out.pop(req.request_id, None)
        if since is not None:
            self.preempted_seconds[req.priority] = self.preempted_seconds.get(req.priority, 0.0) + self._clock() - since

    def forget(self, request_id: str) -> None:
        """``request_id`` ended (an abort while it was preempted: no time to count)."""
        self._out.pop(request_id, None)

    def counters(self, queued_tokens: dict[int, int] | None = None) -> LaneCounters:
        return LaneCounters(
            dict(self.decode_tokens),
            dict(self.pace_preemptions),
            dict(self.preempted_seconds),
            queued_tokens or {},
            dict(self._running),
        )
