"""The dispatcher's side of the simulation: placing requests on the workers with the router's real
placement functions, through Ray-like calls that block one of the router's dispatch threads
(``router.dispatcher``), and recording the tokens the clients receive.

Placement (``Dispatcher._place``): choose a decode worker; prefill there (``generate_local``) when
``prefill_on_decode`` says so or no prefill worker is alive; else reserve on it, and when the
reservation is accepted start the prompt on the chosen prefill worker, otherwise prefill locally.
The outputs and load reports coming back are ``baton.perf.sim.polls``'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from baton.perf.sim.clock import EventLoop
from baton.perf.sim.requests import RequestRecord
from baton.perf.sim.transfer import PrefillHooks
from baton.perf.sim.worker import ReserveResult, SimWorker
from engine.request import Request
from engine.request_spec import RequestSpec
from router.placement import PlacementHint, choose_decode, choose_prefill, prefill_on_decode, short_prompt_still_fits
from router.worker_pool import WorkerHandle, WorkerPool


@dataclass(eq=False)
class Tracked:
    """A request between admission and its last token (the router's ``RequestContext``)."""

    record: RequestRecord
    spec: RequestSpec
    hint: PlacementHint
    lane: str
    dispatched: float | None = None
    decode: WorkerHandle | None = None
    prefill: WorkerHandle | None = None  # where the prompt was computed (the decode worker if local)
    prefill_queue_s: float = 0.0
    prefill_compute_s: float = 0.0


class SimDispatcher:
    def __init__(
        self,
        loop: EventLoop,
        pool: WorkerPool,
        prefill_hooks: PrefillHooks,
        *,
        threshold: int,
        threads: int,
        on_finished: Callable[[Tracked], None],
        short_to_idle_prefill: bool = True,
    ) -> None:
        self.loop = loop
        self.pool = pool
        self.prefill_hooks = prefill_hooks
        self.threshold = threshold
        self.short_to_idle_prefill = short_to_idle_prefill
        self.free_threads = threads
        self.on_finished = on_finished
        self._backlog: deque[Tracked] = deque()  # submits waiting for a dispatch thread
        self.tracked: dict[str, Tracked] = {}
        self.num_local = 0
        self.num_disaggregated = 0
        self.num_refused = 0  # reservations refused (then prefilled locally)

    # -- placing ---------------------------------------------------------------------------------
    def submit(self, t: Tracked) -> None:
        self.tracked[t.spec.request_id] = t
        if self.free_threads:
            self._place(t)
        else:
            self._backlog.append(t)

    def _place(self, t: Tracked) -> None:
        self.free_threads -= 1
        spec = t.spec
        d = choose_decode(self.pool)
        assert d is not None  # the simulated pool's decode workers never die
        t.decode = d
        t.record.decode_worker = d.worker_id
        d.requests.add(spec.request_id)
        d.count_placed(spec.origin, spec.num_prompt_tokens)  # before the calls, as the dispatcher does
        dw: SimWorker = d.actor
        p = None
        if not prefill_on_decode(
            self.pool, spec, d, t.hint, self.threshold, short_to_idle_prefill=self.short_to_idle_prefill
        ):
            p = choose_prefill(self.pool, spec, t.hint)
        if p is None:
            t.prefill = d
            dw.call(lambda w: w.add_request(spec), lambda _: self._placed(t, "local"))
            return
        p.count_dispatched(spec.origin, spec.num_prompt_tokens)  # before the reserve, as the dispatcher does
        dw.call(lambda w: w.reserve(spec), lambda res: self._reserved(t, d, p, res))

    def _reserved(self, t: Tracked, d: WorkerHandle, p: WorkerHandle, res: ReserveResult) -> None:
        spec = t.spec
        if not res.accepted:  # the decode worker is full now: it prefills the prompt when it can
            self.num_refused += 1
            p.count_dispatched(spec.origin, -spec.num_prompt_tokens)
            t.prefill = d
            d.actor.call(lambda w: w.add_request(spec), lambda _: self._placed(t, "local"))
            return
        if spec.num_prompt_tokens < self.threshold and not short_prompt_still_fits(p, self.threshold):
            p.count_dispatched(spec.origin, -spec.num_prompt_tokens)  # P got busy: prefill it on D after all
            t.prefill = d
            d.actor.call(
                lambda w: w.scheduler.fallback_to_local_prefill(spec.request_id), lambda _: self._placed(t, "local")
            )
            return
        t.record.prefill_worker = p.worker_id
        t.prefill = p
        hooks, dw = self.prefill_hooks, d.actor
        p.actor.call(
            lambda w: hooks.start(w, spec, dw, res.num_cached_blocks), lambda _: self._placed(t, "disaggregated")
        )

    def _placed(self, t: Tracked, how: str) -> None:
        t.record.placement = how
        if how == "local":
            self.num_local += 1
        else:
            self.num_disaggregated += 1
        self.free_threads += 1
        if self._backlog:
            self._place(self._backlog.popleft())

    # -- outputs (what the decode workers' polls bring back) --------------------------------------
    def deliver(self, w: SimWorker, reqs: list[Request]) -> None:
        """Requests that got a token this step: the client sees it ``output_s`` later."""
        at = w.loop.now + w.cost.overheads.output_s
        w.host.note_tokens(at, len(reqs))
        for req in reqs:
            t = self.tracked.get(req.request_id)
            if t is None:
                continue
            rec = t.record
            rec.token_times.append(at)
            if req.num_preemptions > rec.preemptions:
                rec.preemptions = req.num_preemptions
            if len(rec.token_times) == 1:
                rec.cached_tokens = req.num_cached_tokens
                if t.prefill is not None:
                    t.prefill_queue_s, t.prefill_compute_s = t.prefill.actor.take_prefill_timing(req.request_id)
            if req.is_finished:
                rec.finished_s = at
                del self.tracked[req.request_id]
                self.loop.at(at, self._finished, t)

    def _finished(self, t: Tracked) -> None:
        if t.decode is not None:
            t.decode.requests.discard(t.spec.request_id)
        self.on_finished(t)
