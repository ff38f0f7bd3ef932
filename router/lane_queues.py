"""The router's per-lane queues and the weighted deficit round robin that drains them (pure Python).

Queues live in the router, where lanes are visible; workers keep short local queues. Each round a
lane earns ``weight x quantum`` tokens of credit and dispatches queued requests (cost: prompt
tokens + a share for the output) while its credit lasts and the pools have capacity. A lane with
a batch window holds a request until it has waited the window, unless nothing else is waiting
and the pools are idle; requests of such a lane that share a prompt prefix leave together, so
they land on the same prefill worker and reuse its cache. A lane the pace guard holds
(``router.pace_guard``) dispatches nothing until its head has waited the longest hold allowed.

A head the decode pool keeps refusing for ``STARVE_FRACTION`` of its lane's TTFT objective (a
prompt that needs most of the KV cache, while other requests keep taking what frees up) is
*drained for*: its lane and every lane no more important than it dispatch nothing until it fits,
so what they hold drains and it goes (a lone request on an empty pool always does:
``router.capacity``). More important lanes keep going (a batch head must not stall interactive
traffic), and a drain that has not let it in within its lane's TTFT objective is given up and
counted afresh (another router, or a long request, may keep the pool from emptying: a drain
without a bound stopped dispatch for good). Without it, such a request waited as long as any
other traffic of its own or lower priority kept coming, and its lane's requests behind it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from router.lanes import LaneConfig

QUANTUM_TOKENS = 512
STARVE_FRACTION = 0.5  # of the lane's TTFT objective a head may be refused before the pools drain for it
# How far behind a head that waits for the prefill pool a dispatch round looks for requests that
# do not need that pool (bounded: the batch lane may hold thousands).
BACKFILL_SCAN = 32


class Room(Enum):
    """What the pools can take now (a ``take`` capacity check may also answer a plain bool)."""

    YES = "yes"
    NO = "no"  # the decode pool is full: dispatch stops until credits come back
    # Only the prefill pool's backlog is full: requests that prefill on the decode pool may still go.
    PREFILL_FULL = "prefill_full"

    def __bool__(self) -> bool:
        return self is Room.YES


CapacityCheck = Callable[["Pending"], Room | bool]  # what ``take`` asks of the pools about one request


@dataclass(eq=False)
class Pending:
    """A request admitted and waiting in a lane."""

    request_id: str
    lane: str
    cost: int  # prompt tokens (+ a share of the output budget)
    prefix_key: bytes | None  # hash of the first prompt block: requests sharing it are grouped
    enqueued: float = field(default_factory=time.monotonic)
    # The owner's record of the request: the router's RequestContext (Any: the simulator queues its own).
    payload: Any = None
    refused_since: float | None = None  # first refused by the decode pool as its lane's head


JOURNAL_GRACE_S = 5.0  # a journaled job is claimed within a consumer poll (0.1 s) unless its lane is full


class LaneQueues:
    def __init__(self, lanes: tuple[LaneConfig, ...], quantum: int = QUANTUM_TOKENS) -> None:
        self.lanes = {lane.name: lane for lane in lanes}
        self.order = [lane.name for lane in sorted(lanes, key=lambda cfg: cfg.priority)]
        self.quantum = quantum
        self.queues: dict[str, deque[Pending]] = {name: deque() for name in self.order}
        self.deficit: dict[str, float] = {name: 0.0 for name in self.order}
        self._held: dict[str, float] = {}  # this take()'s held lanes
        self._journaled: dict[str, tuple[str, float]] = {}  # durable jobs admitted, not yet queued: (lane, when)
        self.queued_tokens: dict[str, int] = {name: 0 for name in self.order}
        self._cursor = 0  # index into ``order`` of the lane whose turn is next (or in progress)
        # The lane at the cursor is mid-turn: its credit for this turn was given, and a round the
        # pools cut short resumes it without more (else every call under saturation handed credit
        # to, and let dispatch, whichever lane the rotation started at: weights were lost).
        self._in_turn = False
        self._turn_sent = 0  # requests the turn in progress has dispatched, over calls
        self.draining_for: Pending | None = None  # a starved head: no lane as important or less goes
        self._drain_since = 0.0

    # -- queueing ---------------------------------------------------------------------------
    def depth(self, lane: str) -> int:
        return len(self.queues[lane])

    def hold_place(self, request_id: str, lane: str) -> None:
        """A durable job admitted here is on its way through the journal: its place in ``lane`` counts
        for admission until it is pushed (claimed by this replica) or ``JOURNAL_GRACE_S`` passes
        (claimed elsewhere). Not for the consumer's room: that would keep the job from being claimed."""
        self._journaled[request_id] = (lane, time.monotonic())

    def admitted_depth(self, lane: str) -> int:
        """``depth`` plus the durable jobs admitted here and not yet queued: what the bound holds to."""
        now = time.monotonic()
        for rid in [r for r, (_, t) in self._journaled.items() if now - t > JOURNAL_GRACE_S]:
            del self._journaled[rid]
        return len(self.queues[lane]) + sum(1 for held, _ in self._journaled.values() if held == lane)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def push(self, p: Pending) -> None:
        self._journaled.pop(p.request_id, None)
        self.queues[p.lane].append(p)
        self.queued_tokens[p.lane] += p.cost

    def remove(self, request_id: str) -> Pending | None:
        for q in self.queues.values():
            for p in q:
                if p.request_id == request_id:
                    q.remove(p)
                    self.queued_tokens[p.lane] -= p.cost
                    return p
        return None

    def tokens_ahead(self, lane: str) -> int:
        """Queued work a new request of ``lane`` would wait behind: its own lane's queue, all of more
        important lanes' (they go first where the work runs: every worker's waiting queue is in
        priority order), and what lanes of the same priority get dispatched meanwhile (weight_other /
        weight_lane tokens per token of ours). Less important lanes' work is not ahead: what the round
        robin gives them, the request overtakes in the workers' queues."""
        me = self.lanes[lane]
        w = me.weight
        mine = self.queued_tokens[lane]
        ours = max(mine, self.quantum * w)  # at least one round of our own
        ahead: float = mine
        for name, other in self.lanes.items():
            if name == lane or not self.queued_tokens[name] or other.priority > me.priority:
                continue
            share = self.queued_tokens[name] if other.priority < me.priority else ours * other.weight / w
            ahead += min(self.queued_tokens[name], share)
        return int(ahead)

    def requests_ahead(self, lane: str) -> int:
        """Queued requests a new request of ``lane`` would wait behind (a sequence slot each), counted
        like ``tokens_ahead``: its own lane's queue, more important lanes' queues, and what lanes of the
        same priority get while that much of ours goes."""
        me = self.lanes[lane]
        w = me.weight
        mine = len(self.queues[lane])
        ahead = float(mine)
        for name, other in self.lanes.items():
            if name == lane or not self.queues[name] or other.priority > me.priority:
                continue
            share = len(self.queues[name]) if other.priority < me.priority else (mine + 1) * other.weight / w
            ahead += min(len(self.queues[name]), share)
        return int(ahead)

    # -- dispatch ---------------------------------------------------------------------------
    def take(
        self,
        has_capacity: CapacityCheck,
        *,
        idle: bool,
        now: float | None = None,
        limit: int = 64,
        held: dict[str, float] | None = None,
    ) -> list[Pending]:
        """Pop what may be dispatched now, by deficit round robin weighted by lane, until capacity
        runs out or ``limit``. ``idle``: the pools have spare capacity (a batch window may then end
        early). A lane whose head costs more than one quantum accumulates credit over rounds.
        ``held``: lanes held back -> the longest a request of that lane may be held (seconds).

        ``has_capacity`` takes the credits for a request it passes. When it answers
        ``Room.PREFILL_FULL`` for a lane's head (a long prompt waiting for the prefill pool), the
        requests behind it that the pools can take now (short prompts, which prefill on the decode
        pool) go ahead, and the other lanes keep their turns: the head does not wait any longer for
        it, since what it waits for is the prefill pool. A head refused for the decode pool
        (``Room.NO`` or False) stops the round, so nothing overtakes it there."""
        now = time.monotonic() if now is None else now
        self._held = held or {}
        out: list[Pending] = []
        frozen = self._drain(has_capacity, now, out)  # lanes that wait while the pools drain for a head
        blocked: set[str] = set(frozen)  # and lanes whose head waits for the prefill pool, this round
        while len(out) < limit:
            ready = {
                n
                for n in self.order
                if n not in blocked and self.queues[n] and self._eligible(n, self.queues[n][0], now, idle)
            }
            if not ready:
                break
            for _ in range(len(self.order)):  # one pass: each ready lane's turn, from the cursor on
                name = self.order[self._cursor % len(self.order)]
                if name not in ready or name in blocked:
                    self._end_turn()
                    continue
                q = self.queues[name]
                if not self._in_turn:
                    self.deficit[name] += self.lanes[name].weight * self.quantum
                    self._in_turn = True
                while q and self._eligible(name, q[0], now, idle) and q[0].cost <= self.deficit[name]:
                    head = q[0]
                    room = has_capacity(head)
                    if room is Room.PREFILL_FULL:
                        blocked.add(name)
                        out.extend(self._backfill(name, has_capacity, limit - len(out), now, idle))
                        break
                    if not room:  # the pools are full: the round stops
                        if head.refused_since is None:
                            head.refused_since = now
                        elif now - head.refused_since >= STARVE_FRACTION * self.lanes[name].ttft_slo_s:
                            self.draining_for, self._drain_since = head, now
                        if self._turn_sent == 0 and not out:
                            # Refused first thing, before the turn or this call sent anything (a head
                            # bigger than what frees up): the turn passes, its credit with it, so a big
                            # head does not hold the other lanes' smaller requests back until the pools
                            # drain. (Refused after others took this call's room, it keeps its turn.)
                            self.deficit[name] -= self.lanes[name].weight * self.quantum
                            self._end_turn()
                        return out  # else this turn resumes when credits come back
                    q.popleft()
                    self.queued_tokens[name] -= head.cost
                    self.deficit[name] -= head.cost
                    out.append(head)
                    self._turn_sent += 1
                    out.extend(self._same_prefix(name, head, has_capacity, limit - len(out)))
                    if len(out) >= limit:
                        return out
                if not q:
                    self.deficit[name] = 0.0  # an emptied lane does not bank credit
                self._end_turn()
        return out

    def _drain(self, has_capacity: CapacityCheck, now: float, out: list[Pending]) -> set[str]:
        """The drain in progress: dispatch its head if it fits now (into ``out``); else the lanes that
        wait for it (its own and those no more important). Empty when there is none, or it ended."""
        starved = self.draining_for
        if starved is None:
            return set()
        q = self.queues[starved.lane]
        if not q or q[0] is not starved:  # it left the queue (aborted)
            self.draining_for = None
            return set()
        if now - self._drain_since > self.lanes[starved.lane].ttft_slo_s:  # the pools did not drain: give up
            self.draining_for, starved.refused_since = None, now
            return set()
        if has_capacity(starved):
            q.popleft()
            self.queued_tokens[starved.lane] -= starved.cost
            self.deficit[starved.lane] -= starved.cost  # out of turn: the lane pays (a debt carries over)
            self.draining_for = None
            out.append(starved)
            return set()
        rank = self.lanes[starved.lane].priority
        return {n for n in self.order if self.lanes[n].priority >= rank}

    def _end_turn(self) -> None:
        self._cursor = (self._cursor + 1) % len(self.order)
        self._in_turn = False
        self._turn_sent = 0

    def _eligible(self, lane: str, head: Pending, now: float, idle: bool) -> bool:
        hold = self._held.get(lane)
        if hold is not None and now - head.enqueued < hold:
            return False
        window = self.lanes[lane].batch_window_s
        if window <= 0 or now - head.enqueued >= window:
            return True
        others_waiting = any(q for n, q in self.queues.items() if n != lane)
        return idle and not others_waiting

    def _backfill(self, lane: str, has_capacity: CapacityCheck, room: int, now: float, idle: bool) -> list[Pending]:
        """Requests behind ``lane``'s head (which waits for the prefill pool) that the pools take now,
        in order, while the lane's credit lasts."""
        q = self.queues[lane]
        out: list[Pending] = []
        for p in list(q)[1 : BACKFILL_SCAN + 1]:
            if len(out) >= room or p.cost > self.deficit[lane]:
                break
            if not self._eligible(lane, p, now, idle):
                continue
            room_for_p = has_capacity(p)
            if room_for_p is Room.PREFILL_FULL:
                continue  # another long prompt: it waits too
            if not room_for_p:
                break  # the decode pool is full: nothing behind it fits either
            q.remove(p)
            self.queued_tokens[lane] -= p.cost
            self.deficit[lane] -= p.cost
            out.append(p)
        return out

    def _same_prefix(self, lane: str, head: Pending, has_capacity: CapacityCheck, room: int) -> list[Pending]:
        if self.lanes[lane].batch_window_s <= 0 or head.prefix_key is None or room <= 0:
            return []
        q = self.queues[lane]
        group = [p for p in q if p.prefix_key == head.prefix_key][:room]
        out = []
        for p in group:
            if not has_capacity(p):
                break
            q.remove(p)
            self.queued_tokens[lane] -= p.cost
            self.deficit[lane] -= p.cost  # they leave together, but the lane pays (a debt carries over)
            out.append(p)
        return out

    def next_deadline(self, now: float | None = None) -> float | None:
        """When the earliest held (batch-window) request becomes eligible, if any."""
        now = time.monotonic() if now is None else now
        times = [
            q[0].enqueued + self.lanes[n].batch_window_s
            for n, q in self.queues.items()
            if q and self.lanes[n].batch_window_s > 0
        ]
        return min(times) if times else None
