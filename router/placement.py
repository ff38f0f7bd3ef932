"""Placement: which decode worker serves a request, whether it prefills there (conditional
disaggregation), and which prefill worker computes its prompt (pure Python).

- Decode worker: the most free KV (as a fraction, less the blocks of requests placed there since its
  last load report), then the fewest sequences.
- Prefill worker: the least work to finish this prompt — prompt tokens it does not already cache
  (from the cluster prefix index) plus the prefill tokens already queued on it — among those whose
  cache holds the whole prompt.
- Prefill on the decode worker itself when the request is a migration (recompute), when the prompt
  is short, when the decode worker already caches most of it, or when no prefill worker is alive.
  With ``short_to_idle_prefill``, a short prompt still goes to a prefill worker that has room for it
  within one threshold's worth of queued tokens: the prefill pool is idle between long prompts,
  and a prompt computed there is one the decode worker's streams do not wait for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

from engine.lane_shares import floor_tokens
from engine.request_spec import RequestSpec
from engine.worker_stats import WorkerLoad
from router.worker_pool import WorkerHandle, WorkerPool


@dataclass(frozen=True)
class PlacementHint:
    """What the cluster prefix index says about this prompt: worker id -> leading tokens it caches."""

    overlap_tokens: dict[str, int] = field(default_factory=dict)


NO_HINT = PlacementHint()


def choose_decode(pool: WorkerPool, exclude: Set[str] = frozenset()) -> WorkerHandle | None:
    cands = [w for w in pool.live("decode") if w.worker_id not in exclude]
    if not cands:
        return None
    return max(cands, key=lambda w: (_free_ratio(w), -_sequences(w), -len(w.requests), w.worker_id))


def choose_prefill(pool: WorkerPool, spec: RequestSpec, hint: PlacementHint = NO_HINT) -> WorkerHandle | None:
    """None where no live prefill worker's whole cache holds the prompt: a prefill worker keeps every
    block of a prompt until it is shipped (a sliding-window model's too), so it would refuse it;
    the decode worker prefills it instead, holding only the window where the model slides."""
    cands = [w for w in pool.live("prefill") if _holds(w, spec.num_prompt_tokens)]
    if not cands:
        return None

    def work(w: WorkerHandle) -> tuple[int, str]:
        queued = _queued(w)
        remaining = max(0, spec.num_prompt_tokens - hint.overlap_tokens.get(w.worker_id, 0))
        return remaining + queued, w.worker_id

    return min(cands, key=work)


def _holds(w: WorkerHandle, num_tokens: int) -> bool:
    info = w.reported_info
    return info.num_blocks * info.block_size >= num_tokens


def prefill_on_decode(
    pool: WorkerPool,
    spec: RequestSpec,
    d: WorkerHandle,
    hint: PlacementHint,
    threshold_tokens: int,
    cached_fraction: float = 0.5,
    short_to_idle_prefill: bool = False,
) -> bool:
    if spec.resume_token_ids or not pool.live("prefill"):
        return True
    if spec.sampling_params.prompt_logprobs is not None:
        return True  # its prompt's logprobs come out of the prefill, and only decode workers report
    if _stays_local(pool, spec.num_prompt_tokens, threshold_tokens, short_to_idle_prefill):
        return True
    return hint.overlap_tokens.get(d.worker_id, 0) >= cached_fraction * spec.num_prompt_tokens


def prompt_stays_local(
    pool: WorkerPool, prompt_tokens: int, threshold_tokens: int, short_to_idle_prefill: bool
) -> bool:
    """Whether a new prompt would be computed on its decode worker (as ``prefill_queue`` assumes)."""
    return not pool.live("prefill") or _stays_local(pool, prompt_tokens, threshold_tokens, short_to_idle_prefill)


def _stays_local(pool: WorkerPool, prompt_tokens: int, threshold_tokens: int, short_to_idle_prefill: bool) -> bool:
    """A short prompt prefills on its decode worker, unless (``short_to_idle_prefill``) a prefill
    worker would still have at most ``threshold_tokens`` queued with it; so does one no prefill
    worker's cache holds (``choose_prefill``)."""
    if not any(_holds(w, prompt_tokens) for w in pool.live("prefill")):
        return True
    if prompt_tokens >= threshold_tokens:
        return False
    return not (
        short_to_idle_prefill and any(_queued(w) + prompt_tokens <= threshold_tokens for w in pool.live("prefill"))
    )


def short_prompt_still_fits(p: WorkerHandle, threshold_tokens: int) -> bool:
    """After the decode worker's reserve (up to a decode step later): is the prefill worker chosen for
    a short prompt still within one threshold of queued tokens, this prompt included? A long prompt
    that reached it meanwhile would be computed in the same step, and the short one wait for it."""
    return _queued(p) <= threshold_tokens


def prefill_queue(
    pool: WorkerPool,
    prompt_tokens: int,
    threshold_tokens: int,
    rate_of: Callable[[list[str]], float],
    short_to_idle_prefill: bool = False,
) -> tuple[int, float]:
    """(prompt tokens queued ahead, prefill tokens/s) where a new prompt will be computed, for the
    admission's TTFT prediction: the prefill pool, or — when conditional disaggregation will keep
    it on a decode worker (short prompt, or no prefill worker alive) — the decode worker
    ``choose_decode`` picks, at one prefill worker's measured speed when there is a prefill pool
    (a decode worker's own rate mixes in its decode steps). A short interactive prompt does not
    wait behind the long batch prompts queued on the prefill workers.
    ``rate_of``: worker ids -> their measured prefill tokens/s (``PrefillRate.tokens_per_s``)."""
    prefill = pool.live("prefill")
    if prefill and not _stays_local(pool, prompt_tokens, threshold_tokens, short_to_idle_prefill):
        return sum(_queued(w) for w in prefill), rate_of([w.worker_id for w in prefill])
    decode = pool.live("decode")
    if not prefill:  # colocated: every decode worker prefills
        return sum(_queued_on_decode(w) for w in decode), rate_of([w.worker_id for w in decode])
    d = choose_decode(pool)
    return (_queued_on_decode(d) if d else 0), rate_of([w.worker_id for w in prefill]) / len(prefill)


@dataclass(frozen=True)
class LaneSteps:
    """How the workers' steps share prompt tokens by lane (``SchedulerConfig.lane_shares``): in a step
    that computes a prompt, less important lanes keep to their floor of it (engine/lane_shares.py).
    ``floors``: each lane's floor by priority; ``rate_of``: worker ids -> their measured prefill
    tokens/s; ``now``: the clock ``WorkerHandle.load_at`` is on."""

    floors: Mapping[int, float]
    rate_of: Callable[[list[str]], float]
    now: float


def yielding_tokens(
    pool: WorkerPool,
    priority: int,
    prompt_tokens: int,
    threshold_tokens: int,
    short_to_idle_prefill: bool = False,
    lanes: LaneSteps | None = None,
) -> int:
    """Of ``prefill_queue``'s tokens, those that are not work ahead of a prompt of lane ``priority``
    where it will be computed. Every worker's waiting queue is in priority order, so it goes ahead of
    less important lanes' waiting prompts, but not of a running prompt's next chunk (scheduled before
    new admissions). A worker with lane counters (a decode worker with lane shares) gives the less
    important lanes no more than their share of a step that computes a more important prompt: all
    of theirs yield. Otherwise, with ``lanes`` (a prefill worker with lane shares): the step that
    started as the worker's load report was taken is ahead whole (it computes the head of the queue,
    up to ``WorkerLoad.step_prompt_budget``), less what the worker has computed of it since (at its
    measured rate); after it, the less important prompts yield but for their floor of this prompt's
    step. Without ``lanes``: the less important waiting prompts yield, but not those that fill the
    rest of the step that computes this prompt (the budget less the prompt): that step takes as long
    as they make it."""
    prefill = pool.live("prefill")
    if prefill and not _stays_local(pool, prompt_tokens, threshold_tokens, short_to_idle_prefill):
        workers = prefill
    elif not prefill:
        workers = pool.live("decode")
    else:
        d = choose_decode(pool)
        workers = [d] if d is not None else []
    out = 0
    for w in workers:
        load = w.load
        if load is None:
            continue
        if load.lane_counters is not None:
            out += sum(n for p, n in load.lane_counters.queued_tokens.items() if p > priority)
            continue
        if lanes is not None:
            out += _yielding_on_lane_steps(w, load, priority, lanes)
            continue
        behind = sum(n for p, n in load.waiting_tokens_by_priority.items() if p > priority)
        out += max(0, behind - max(0, load.step_prompt_budget - prompt_tokens))
    return out


def _yielding_on_lane_steps(w: WorkerHandle, load: WorkerLoad, priority: int, lanes: LaneSteps) -> int:
    queued = load.queued_prefill_tokens
    budget = load.step_prompt_budget or queued
    step = min(budget, queued)  # in flight since the report (taken between two steps)
    less = sorted((p, n) for p, n in load.waiting_tokens_by_priority.items() if p > priority and n > 0)
    in_step = max(0, step - (queued - sum(n for _, n in less)))  # the less important are computed last
    out = 0
    for p, n in less:
        taken = min(n, in_step)
        in_step -= taken
        out += max(0, n - taken - floor_tokens(lanes.floors.get(p, 0.0), budget))
    if step and w.load_at is not None:
        done = max(0.0, lanes.now - w.load_at) * lanes.rate_of([w.worker_id])
        out += min(step, int(done))
    return out


def _queued(w: WorkerHandle) -> int:
    return (w.load.queued_prefill_tokens if w.load else 0) + w.dispatched_tokens


def _queued_on_decode(d: WorkerHandle) -> int:
    """``_queued`` plus the prompts placed on decode worker ``d`` that its report does not include yet.
    Its report is taken before a step, so a prompt placed during a long step shows only two steps
    later: without them, each request of a burst was predicted as if it alone were queued, and
    admitted requests missed their TTFT. (A placement whose KV a prefill worker computes counts
    too, until reported: an overestimate for at most those two steps.)"""
    return _queued(d) + d.placed_tokens


def _free_ratio(w: WorkerHandle) -> float:
    total = w.load.num_total_blocks if w.load is not None else (w.info.num_blocks if w.info else 0)
    if not total:
        return 1.0
    free = w.load.num_free_blocks if w.load is not None else total
    # Less the blocks that the prompts placed there since its last report will take, about.
    pending = -(-w.placed_tokens // w.info.block_size) if w.info is not None else 0
    return (free - pending) / total


def _sequences(w: WorkerHandle) -> int:
    return w.load.num_running + w.load.num_waiting + w.load.num_reserved if w.load else 0
