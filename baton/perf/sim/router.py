"""The simulated router: the real classification, admission, lane queues, capacity credits and
prefix index, on simulated time (``router.router.Router`` minus HTTP, Redis and threads).

Per arrival: classify (explicit lane) → admit (context length, lane bound, SLO-predictive TTFT
from the work queued ahead and the measured prefill rate) → placement hint from the cluster prefix
index → lane queue. The dispatch loop drains the lanes by weighted deficit round robin while the
capacity credits allow (and the pace guard does not hold the lane), retrying every
``dispatch_retry_s`` while anything is queued. Every ``housekeeping_s`` the workers' load reports
update the prefill rate; every ``monitor_interval_s`` the prefill workers are asked for their load
(answered at their next step boundary).
"""

from __future__ import annotations

from baton.perf.profile.cost_model import CostModel
from baton.perf.sim.clock import EventLoop
from baton.perf.sim.config import SimConfig
from baton.perf.sim.dispatch import SimDispatcher, Tracked
from baton.perf.sim.requests import RequestRecord, SimRequest, prompt_token_ids
from engine.block_hash import hash_blocks
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from router.admission import Admission, AdmissionInput
from router.api import RouterError
from router.capacity import PREFILL_BACKLOG_SHARE, Capacity
from router.classify import classify
from router.decode_backlog import backlogged_lanes, merge_holds
from router.decode_pace import DecodeSteps, local_prompt_rate, pace_inputs
from router.lane_pressure import LanePressure
from router.lane_queues import LaneQueues, Pending, Room
from router.load_signals import LoadSignals, PrefillRate
from router.pace_guard import PaceGuard, hold_at_for
from router.placement import NO_HINT, LaneSteps, PlacementHint, prefill_queue, prompt_stays_local, yielding_tokens
from router.state.prefix_index import LocalPrefixIndex
from router.worker_pool import WorkerHandle, WorkerPool


def run_sync(coro):
    """Run a coroutine that never suspends (admission without a rate limiter, the local index)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a simulated router call tried to wait on I/O")


class SimRouter:
    def __init__(self, loop: EventLoop, cfg: SimConfig, cost: CostModel, pool: WorkerPool, seed: int = 0) -> None:
        self.loop = loop
        self.cfg = cfg
        self.cost = cost
        self.pool = pool
        self.seed = seed
        self.policy = cfg.lanes
        self.tenant = next((t for t in self.policy.tenants if t.name == cfg.tenant), self.policy.tenants[0])
        self.block_size = cost.model.block_size
        self.admission = Admission(
            cost.model.max_model_len,
            None,
            slo_rejection=cfg.slo_rejection,
            slo_headroom=cfg.slo_headroom,
            pace_headroom=cfg.pace_headroom,
            clock=lambda: loop.now,
        )
        self.prefill_rate = PrefillRate(cfg.initial_prefill_tokens_per_s)
        self.signals = LoadSignals()  # as router.Router
        self.decode_steps = DecodeSteps()
        self.running: dict[str, Tracked] = {}  # dispatched, not finished
        self.queues = LaneQueues(self.policy.lanes)
        hold_at = hold_at_for(cfg.slo_headroom)
        self.pace_guard = PaceGuard(self.policy.lanes, hold_at=hold_at) if cfg.pace_guard else None
        self.lane_pressure = (
            LanePressure(
                self.policy.lanes,
                self.queues.depth,  # as Router
                lambda: [(t.lane, t.record.token_times) for t in self.running.values()],
                self.admission.pace_refusals,
                self.admission.ttft_refusals,
                hold_at=hold_at,
                clock=lambda: loop.now,
            )
            if cfg.lane_priority
            else None
        )
        self.capacity = Capacity(
            pool,
            local_prefill_threshold=cfg.local_prefill_threshold,
            prefill_backlog_s=PREFILL_BACKLOG_SHARE * cfg.transfer_timeout_s,
            prefill_rate=self.prefill_rate.tokens_per_s,
            clock=lambda: loop.now,
        )
        self.index = LocalPrefixIndex()
        self.dispatcher: SimDispatcher | None = None  # wired by the simulation
        self.records: list[RequestRecord] = []
        self.in_flight = 0
        self._retry_at: float | None = None

    # -- arrivals ------------------------------------------------------------------------------
    def arrive(self, req: SimRequest) -> None:
        now = self.loop.now
        rec = RequestRecord(req.index, req.lane, req.prompt_len, req.output_len, now)
        self.records.append(rec)
        ids = prompt_token_ids(req, self.cost.model.vocab_size, self.seed)
        try:
            lane = classify(
                self.policy,
                self.tenant,
                explicit_lane=req.lane,
                num_prompt_tokens=len(ids),
                stream=req.stream,
                max_tokens=req.output_len,
                max_tokens_given=True,
            )
            rec.lane = lane
            lane_cfg = self.policy.lane(lane)
            local = prompt_stays_local(
                self.pool, len(ids), self.cfg.local_prefill_threshold, self.cfg.short_prompts_to_idle_prefill
            )
            queued, rate = prefill_queue(
                self.pool,
                len(ids),
                self.cfg.local_prefill_threshold,
                self.prefill_rate.tokens_per_s,
                self.cfg.short_prompts_to_idle_prefill,
            )
            if self.pace_guard is not None:
                self.pace_guard.arrived(lane, now)
            pace_in = pace_inputs(
                self.pool, self.decode_steps, lane_cfg.priority, len(ids), local, self.prefill_rate.tokens_per_s, now
            )
            if local and self.pool.live("prefill"):  # as Router: beside the decodes, its prompt budget a step
                rate = local_prompt_rate(rate, pace_in.steps)
            freeable = 0
            if self.lane_pressure is not None:
                freeable = (
                    self.lane_pressure.freeable(lane)
                    if pace_in.running_by_priority is None
                    else self.lane_pressure.freeable_on(lane, pace_in.running_by_priority)
                )
            run_sync(
                self.admission.admit(
                    AdmissionInput(
                        lane=lane_cfg,
                        tenant=self.tenant,
                        prompt_tokens=len(ids),
                        max_tokens=req.output_len,
                        lane_depth=self.queues.depth(lane),
                        tokens_ahead=self.queues.tokens_ahead(lane),
                        pool_queued_tokens=queued,
                        prefill_tokens_per_s=rate,
                        requests_ahead=self.queues.requests_ahead(lane),
                        free_seq_slots=self.capacity.free_places(len(ids), req.output_len),
                        completions_per_s=self.signals.completion_rate.per_s(now),
                        service_s=self.signals.service_s(len(ids), rate, now, lane=lane),
                        decode_pace_s=(
                            self.lane_pressure.pace(lambda: self._pace(now)) if self.lane_pressure else self._pace(now)
                        ),
                        running=self.signals.running(
                            (len(t.record.token_times), t.record.output_len) for t in self.running.values()
                        ),
                        expected_output_tokens=self.signals.expected_output(req.output_len),
                        freeable_seqs=freeable,
                        decode_steps=pace_in.steps,
                        prompt_token_s=pace_in.prompt_token_s,
                        decode_backlog_tokens=pace_in.backlog_tokens,
                        recent_tpot_s=self.signals.recent_tpot_s(lane, now),
                        yielding_tokens=yielding_tokens(
                            self.pool,
                            lane_cfg.priority,
                            len(ids),
                            self.cfg.local_prefill_threshold,
                            self.cfg.short_prompts_to_idle_prefill,
                            (
                                LaneSteps(self.lane_pressure.floors, self.prefill_rate.tokens_per_s, now)
                                if self.lane_pressure is not None
                                else None
                            ),
                        ),
                    )
                )
            )
        except RouterError as e:
            rec.rejected = e.code or e.kind.type
            return
        salt = self.tenant.name
        # Outputs are token ids counted by the client; EOS never ends them early (the workload sets lengths).
        params = SamplingParams(max_tokens=req.output_len, ignore_eos=True, detokenize=False)
        spec = RequestSpec(
            f"r{req.index}",
            tuple(ids),
            params,
            priority=lane_cfg.priority,
            cache_salt=salt,
            origin="sim-router",
            preemptible=lane_cfg.preemptible,
        )
        hashes = hash_blocks(ids, self.block_size, salt)
        hint = NO_HINT
        if hashes:
            workers = [w.worker_id for w in self.pool.all() if w.alive]
            blocks = run_sync(self.index.longest_prefix(hashes, workers))
            hint = PlacementHint({w: n * self.block_size for w, n in blocks.items() if n})
        t = Tracked(rec, spec, hint, lane)
        self.in_flight += 1
        self.queues.push(
            Pending(
                spec.request_id,
                lane,
                len(ids) + min(req.output_len, 64),
                hashes[0] if hashes else None,
                enqueued=now,
                payload=t,
            )
        )
        self.dispatch()

    # -- the dispatch loop -----------------------------------------------------------------------
    def dispatch(self) -> None:
        if not len(self.queues):
            return
        now = self.loop.now
        batch = self.queues.take(self._has_room, idle=self.capacity.idle(), now=now, held=self._held_lanes(now))
        for p in batch:
            t: Tracked = p.payload
            t.dispatched = t.record.dispatched_s = now
            self.running[t.spec.request_id] = t
            assert self.dispatcher is not None  # wired before the simulation runs
            self.dispatcher.submit(t)
        if len(self.queues):
            nxt = self.queues.next_deadline(now)
            wait = self.cfg.dispatch_retry_s if nxt is None else min(self.cfg.dispatch_retry_s, max(0.0, nxt - now))
            at = now + max(wait, 0.002)
            if self._retry_at is None or self._retry_at <= now or at < self._retry_at:
                self._retry_at = at
                self.loop.at(at, self._retry)

    def _retry(self) -> None:
        if self._retry_at is not None and self.loop.now >= self._retry_at:
            self._retry_at = None
            self.dispatch()

    def _held_lanes(self, now: float) -> dict[str, float]:
        """``router.lane_dispatch.LaneDispatcher._held_lanes``."""
        backlog = (
            backlogged_lanes(self.policy.lanes, [w.load for w in self.pool.live("decode")])
            if self.lane_pressure is not None
            else {}
        )
        guard = self.pace_guard
        if guard is None or not any(self.queues.depth(n) for n in guard.holdable):
            return backlog
        running = self.running.values()
        pace = self.signals.decode_pace_s([t.record.token_times[-9:] for t in running], now)
        active = {t.lane for t in running} | {n for n, q in self.queues.queues.items() if q}
        return merge_holds(backlog, guard.held(pace, active, now))

    def _pace(self, now: float) -> float | None:
        return self.signals.decode_pace_s([t.record.token_times[-9:] for t in self.running.values()], now)

    def _has_room(self, p: Pending) -> Room:
        t: Tracked = p.payload
        return self.capacity.reserve(t.record.prompt_len, t.record.output_len, self.block_size)

    # -- feedback from the workers -----------------------------------------------------------------
    def on_load(self, handle: WorkerHandle, load, events: list) -> None:
        handle.update_load(load, self.loop.now)
        if events:
            run_sync(self.index.apply(handle.worker_id, events))
        self.dispatch()  # fresh credits may let queued requests go

    def on_finished(self, t: Tracked) -> None:
        self.in_flight -= 1
        self.running.pop(t.spec.request_id, None)
        self.capacity.release()
        now = self.loop.now
        self.signals.completion_rate.tick(now)
        rec = t.record
        to_first = rec.token_times[0] - t.dispatched if rec.token_times and t.dispatched is not None else None
        self.signals.finished(
            now,
            rec.token_times[-17:],
            len(rec.token_times),
            to_first,
            t.prefill_queue_s,
            t.prefill_compute_s,
            lane=t.lane,
            first_token_time=rec.token_times[0] if rec.token_times else None,
        )
        self.dispatch()

    def housekeeping(self) -> None:
        for w in self.pool.all():
            if w.load is not None:
                self.prefill_rate.observe(w.worker_id, w.load.prompt_tokens_computed, w.load.busy_seconds)
        if self.lane_pressure is not None:
            self.lane_pressure.report()
        self.loop.after(self.cfg.housekeeping_s, self.housekeeping)

    def monitor(self) -> None:
        """``Dispatcher._monitor_loop``: ask each prefill worker for its load and cache events, one after
        the other (each answer waits for that worker's step boundary), then sleep the interval."""
        workers = list(self.pool.live("prefill"))

        def ask(i: int) -> None:
            if i == len(workers):
                self.loop.after(self.cfg.monitor_interval_s, self.monitor)
                return
            h = workers[i]

            def answered(result) -> None:
                self.on_load(h, *result)
                ask(i + 1)

            h.actor.call(lambda w: (w.load(), w.block_manager.take_events()), answered)

        ask(0)
