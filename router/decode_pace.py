"""What a decode worker's steps are made of lately, from its load reports (pure Python, no torch).

A decode worker's step computes one token for each running sequence plus, within its prompt budget
(``WorkerLoad.step_prompt_budget``), prompt tokens of its own: short prompts prefilled there, and the
recompute of preempted sequences. Those prompt tokens lengthen the step, so they slow every stream
it runs: a pace read off the streams alone does not say how much of it is decoding and how much is
prompt work, nor what the prompts queued there will cost. The reports carry cumulative steps, busy
seconds and prompt tokens computed; over a short window of them, ``StepSplit`` is the mean step
time, the mean prompt tokens a step, and the sequences running now. Admission
(``router.admission.predict_pace``) splits the step time with the measured prefill cost per token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.worker_stats import WorkerLoad
    from router.worker_pool import WorkerPool

# The window the split is measured over: long enough for a few steps, short enough to follow a burst.
WINDOW_S = 2.0


@dataclass(frozen=True)
class StepSplit:
    step_s: float  # mean seconds a step took lately
    prompt_tokens_per_step: float  # mean prompt tokens a step computed lately
    running: int  # sequences running there now (a decode token each a step)
    prompt_budget: int  # the most prompt tokens one step computes (0: not reported)


class DecodeSteps:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        # worker id -> (when, steps, busy seconds, prompt tokens computed) of its distinct reports
        self._reports: dict[str, deque[tuple[float, int, float, int]]] = {}

    def observe(self, load: WorkerLoad, now: float) -> None:
        """Fold in a worker's latest report (the same report again changes nothing)."""
        q = self._reports.setdefault(load.worker_id, deque())
        if q and load.steps < q[-1][1]:  # a restarted worker: its counters began again
            q.clear()
        if q and load.steps == q[-1][1]:
            return
        q.append((now, load.steps, load.busy_seconds, load.prompt_tokens_computed))
        while len(q) > 2 and now - q[1][0] >= self.window_s:  # keep one report at least a window old
            q.popleft()

    def split(self, load: WorkerLoad | None, now: float) -> StepSplit | None:
        """The split of ``load``'s worker (observed first), or None before it has stepped twice."""
        if load is None:
            return None
        self.observe(load, now)
        q = self._reports[load.worker_id]
        if len(q) < 2:
            return None
        _, steps0, busy0, prompt0 = q[0]
        _, steps1, busy1, prompt1 = q[-1]
        steps = steps1 - steps0
        if steps <= 0 or busy1 <= busy0:
            return None
        return StepSplit(
            (busy1 - busy0) / steps, max(0, prompt1 - prompt0) / steps, load.num_running, load.step_prompt_budget
        )

    def forget(self, worker_id: str) -> None:
        self._reports.pop(worker_id, None)


@dataclass(frozen=True)
class PaceInputs:
    """What admission's ``predict_pace`` reads of the decode worker a request would run on."""

    steps: StepSplit | None
    prompt_token_s: float  # seconds one prompt token takes (one prefill-capable worker's measured rate)
    backlog_tokens: int  # prompt tokens it will compute for lanes as important or more, this prompt's included
    running_by_priority: dict[int, int] | None  # its batch by priority (None: not reported)


def pace_inputs(
    pool: WorkerPool,
    steps: DecodeSteps,
    priority: int,
    prompt_tokens: int,
    prefilled_there: bool,
    rate_of: Callable[[list[str]], float],
    now: float,
) -> PaceInputs:
    """``PaceInputs`` for a request of lane ``priority`` on the decode worker placement picks now
    (``prefilled_there``: its prompt is computed there). Prompt tokens queued there for less important
    lanes wait for it (the waiting queue is in priority order) and are in the recent split already."""
    from router.placement import choose_decode

    d = choose_decode(pool)
    if d is None or d.load is None:
        return PaceInputs(None, 0.0, 0, None)
    load = d.load
    counters = load.lane_counters
    if counters is not None and counters.queued_tokens:
        queued = sum(n for p, n in counters.queued_tokens.items() if p <= priority)
    else:
        queued = load.queued_prefill_tokens
    prefill = pool.live("prefill")
    ids = [w.worker_id for w in prefill] or [d.worker_id]
    rate = rate_of(ids) / len(ids)
    return PaceInputs(
        steps.split(load, now),
        1.0 / rate if rate > 0 else 0.0,
        queued + (prompt_tokens if prefilled_there else 0),
        dict(counters.running) if counters is not None else None,
    )


def local_prompt_rate(prefill_tokens_per_s: float, steps: StepSplit | None) -> float:
    """The prompt tokens/s a decode worker gives a prompt it prefills itself beside a prefill pool: at
    most ``prompt_budget`` a step, each step also computing its decodes, so slower than the prefill
    worker's measured rate (``prefill_tokens_per_s``, the per-token cost it is read at). Unchanged
    when the split is not known."""
    if steps is None or steps.prompt_budget <= 0 or prefill_tokens_per_s <= 0:
        return prefill_tokens_per_s
    c = 1.0 / prefill_tokens_per_s
    decode_s = max(steps.step_s - c * steps.prompt_tokens_per_step, 0.1 * steps.step_s)
    return steps.prompt_budget / (decode_s + c * steps.prompt_budget)
