"""A simulated worker: a real scheduler and block manager, a fake runner, and the cost model's clock.

It behaves like ``engine.engine_loop.EngineLoop`` around an ``LLMEngine``: calls from the router
(and the KV-transfer channel) run only between two steps; each loop iteration drains the calls,
takes a load snapshot, then runs a step if there is work. A step is ``Scheduler.schedule()`` (the
real one), then simulated time passes — the cost model's prediction for exactly the batch the
scheduler chose, plus the loop's own overhead — then the ``FakeModelRunner`` (the real batch
preparation) "samples" tokens that go back through ``Scheduler.update_from_output``.

Role-specific behaviour (a decode worker's outputs, a prefill worker's KV shipping) is in the
``WorkerHooks`` the simulation plugs in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from baton.perf.profile.cost_model import CostModel
from baton.perf.profile.host import HostModel
from baton.perf.profile.step_shape import shape_of_schedule
from baton.perf.sim.clock import EventLoop
from engine.block_manager import BlockManager
from engine.config import LaneShareConfig, SchedulerConfig
from engine.fake_runner import FakeModelRunner
from engine.request import Request
from engine.request_spec import RequestSpec
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput
from engine.worker_stats import WorkerLoad, queued_prefill_tokens, queued_prefill_tokens_by_priority


class WorkerHooks(Protocol):
    def after_step(self, worker: SimWorker, so: SchedulerOutput, updated: list[Request]) -> None: ...

    def tick(self, worker: SimWorker) -> None: ...


@dataclass(frozen=True)
class ReserveResult:
    accepted: bool
    num_cached_blocks: int = 0
    reason: str = ""


class Host:
    """The machine the workers share: how many of them are computing right now and, with a
    ``HostModel``, the CPU the rest of the stack (router, streams, clients, Ray) wants at the
    rate tokens were streamed and requests arrived over the last ``window_s``."""

    def __init__(self, model: HostModel | None = None, window_s: float = 2.0) -> None:
        self.busy = 0
        self.model = model
        self.window_s = window_s
        self._tokens: deque[tuple[float, int]] = deque()
        self._window_tokens = 0  # the sum over _tokens
        self._requests: deque[float] = deque()

    def note_tokens(self, at: float, n: int) -> None:
        if self.model is not None and n:
            self._tokens.append((at, n))
            self._window_tokens += n

    def note_request(self, at: float) -> None:
        if self.model is not None:
            self._requests.append(at)

    def stretch(self, now: float, busy_workers: int) -> float:
        """A step's slowdown from sharing the cores (1.0 without a host model)."""
        if self.model is None:
            return 1.0
        horizon = now - self.window_s
        while self._tokens and self._tokens[0][0] <= horizon:
            self._window_tokens -= self._tokens.popleft()[1]
        while self._requests and self._requests[0] <= horizon:
            self._requests.popleft()
        demand = self.model.demand_cores(self._window_tokens / self.window_s, len(self._requests) / self.window_s)
        return self.model.stretch(busy_workers, demand)


class SimWorker:
    def __init__(
        self,
        worker_id: str,
        role: str,
        loop: EventLoop,
        cost: CostModel,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        num_blocks: int,
        enable_prefix_caching: bool = True,
        step_scale: float = 1.0,
        prefill_step_scale: float | None = None,
        host: Host | None = None,
        lane_shares: tuple[LaneShareConfig, ...] = (),
        prefill_token_budget: int | None = None,
    ) -> None:
        m = cost.model
        self.worker_id = worker_id
        self.role = role
        self.loop = loop
        self.cost = cost
        self.step_scale = step_scale
        self.prefill_step_scale = step_scale if prefill_step_scale is None else prefill_step_scale
        self.host = host or Host()
        self.block_manager = BlockManager(
            num_blocks, m.block_size, enable_prefix_caching=enable_prefix_caching, record_events=True
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                prefill_token_budget=prefill_token_budget,
                lane_shares=lane_shares,
            ),
            self.block_manager,
            m.max_model_len,
            clock=lambda: loop.now,
        )
        self.runner = FakeModelRunner(
            max_num_seqs=max_num_seqs, max_model_len=m.max_model_len, block_size=m.block_size, vocab_size=m.vocab_size
        )
        self.hooks: WorkerHooks | None = None
        self._calls: deque[tuple[Callable[[SimWorker], Any], Callable[[Any], None] | None]] = deque()
        self.busy = False
        self.steps = 0
        self.busy_seconds = 0.0
        self.max_step_s = 0.0
        self.max_features: dict[str, float] = {}  # the largest value of each step feature predicted here
        self.prompt_tokens_received: dict[str, int] = {}  # by router id
        self.prompt_tokens_placed: dict[str, int] = {}  # by router id (decode role)
        # Per request prefilled here: [arrival, first scheduled, prompt computed] in simulated time
        # (the engine's own timestamps are wall-clock); the TTFT breakdown the real workers report.
        self.prefill_timing: dict[str, list[float | None]] = {}

    # -- the router's side of a Ray call ---------------------------------------------------------
    def call(self, fn: Callable[[SimWorker], Any], reply: Callable[[Any], None] | None = None) -> None:
        """A Ray call: reaches the worker after half a round trip, runs between two steps, and its
        result reaches ``reply`` half a round trip later."""
        self.loop.after(self.cost.overheads.rpc_s / 2, self.post, fn, reply)

    def post(self, fn: Callable[[SimWorker], Any], reply: Callable[[Any], None] | None = None) -> None:
        """Queue ``fn`` for the next step boundary now (``EngineLoop.call_async`` from a local thread)."""
        self._calls.append((fn, reply))
        if not self.busy:
            self._iterate()

    # -- the engine loop -----------------------------------------------------------------------
    def _iterate(self) -> None:
        calls = self._calls
        half_rtt = self.cost.overheads.rpc_s / 2
        while calls:
            fn, reply = calls.popleft()
            result = fn(self)
            if reply is not None:
                self.loop.after(half_rtt, reply, result)
        if self.hooks is not None:
            self.hooks.tick(self)
        sched = self.scheduler
        if not sched.has_unfinished():
            return  # idle: the next call wakes the loop
        so = sched.schedule()
        if so.is_empty:  # nothing can run until a call changes something (KV arrives, blocks free)
            self.runner.execute(so)
            return
        for rid in so.request_ids:
            timing = self.prefill_timing.get(rid)
            if timing is not None and timing[1] is None:
                timing[1] = self.loop.now
        shape = shape_of_schedule(so, sched.requests, self.block_manager.block_size)
        dt = self.cost.step_seconds(shape)
        for name, v in shape.features().items():
            if v > self.max_features.get(name, 0.0):
                self.max_features[name] = v
        # Neighbours computing at the same time share the memory bus (measured by the profile),
        # and everyone shares the cores (the host model: the router and clients want CPU too).
        # A typical step, not the fastest repeat the fit describes.
        scale = self.prefill_step_scale if shape.num_tokens > shape.num_decode else self.step_scale
        dt *= scale * self.cost.typical_over_fastest
        dt *= 1.0 + self.cost.neighbour_slowdown * self.host.busy
        dt += self.cost.overheads.step_s
        dt *= self.host.stretch(self.loop.now, self.host.busy + 1)
        self.busy = True
        self.host.busy += 1
        self.loop.after(dt, self._end_step, so, dt)

    def _end_step(self, so: SchedulerOutput, dt: float) -> None:
        updated = self.scheduler.update_from_output(self.runner.execute(so))
        for rid in so.request_ids:
            timing = self.prefill_timing.get(rid)
            req = self.scheduler.requests.get(rid)
            if (
                timing is not None
                and timing[2] is None
                and (req is None or req.num_computed_tokens >= req.num_prompt_tokens)
            ):
                timing[2] = self.loop.now
        self.steps += 1
        self.busy_seconds += dt
        self.max_step_s = max(self.max_step_s, dt)
        self.busy = False
        self.host.busy -= 1
        if self.hooks is not None:
            self.hooks.after_step(self, so, updated)
        self._iterate()

    # -- engine API (run on the engine "thread", i.e. between steps) ---------------------------
    def _request(self, spec: RequestSpec, prefill_only: bool = False) -> Request:
        return Request(
            spec.request_id,
            list(spec.prompt_token_ids),
            spec.sampling_params,
            priority=spec.priority,
            cache_salt=spec.cache_salt,
            arrival_time=self.loop.now,
            prefill_only=prefill_only,
            preemptible=spec.preemptible,
        )

    def add_request(self, spec: RequestSpec, prefill_only: bool = False) -> Request:
        req = self._request(spec, prefill_only)
        self.scheduler.add_request(req)
        if prefill_only:  # a prefill task: WorkerLoad.prompt_tokens_received
            self.prompt_tokens_received[spec.origin] = (
                self.prompt_tokens_received.get(spec.origin, 0) + spec.num_prompt_tokens
            )
        else:  # placed here to decode: WorkerLoad.prompt_tokens_placed
            self._count_placed(spec)
        self.prefill_timing[spec.request_id] = [self.loop.now, None, None]
        return req

    def take_prefill_timing(self, request_id: str) -> tuple[float, float]:
        """(prefill queue, prefill compute) seconds of a request prefilled here; (0, 0) if unknown."""
        timing = self.prefill_timing.pop(request_id, None)
        if timing is None:
            return 0.0, 0.0
        arrived, started, computed = timing
        if arrived is None or started is None or computed is None:
            return 0.0, 0.0
        return started - arrived, computed - started

    def reserve(self, spec: RequestSpec) -> ReserveResult:
        req = self._request(spec)
        if not self.scheduler.reserve(req):
            return ReserveResult(False, reason="no free KV blocks")
        self._count_placed(spec)
        return ReserveResult(True, req.num_cached_tokens // self.block_manager.block_size)

    def _count_placed(self, spec: RequestSpec) -> None:
        self.prompt_tokens_placed[spec.origin] = self.prompt_tokens_placed.get(spec.origin, 0) + spec.num_prompt_tokens

    def load(self) -> WorkerLoad:
        s, bm = self.scheduler, self.block_manager
        return WorkerLoad(
            worker_id=self.worker_id,
            incarnation="sim",
            role=self.role,
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            queued_prefill_tokens=queued_prefill_tokens(s),
            num_reserved=len(s.reserved),
            num_transferring=len(s.transferring),
            prefix_queries=bm.num_prefix_queries,
            prefix_hits=bm.num_prefix_hits,
            steps=self.steps,
            busy_seconds=self.busy_seconds,
            prompt_tokens_computed=s.prompt_tokens_computed,
            prompt_tokens_received=dict(self.prompt_tokens_received),
            prompt_tokens_placed=dict(self.prompt_tokens_placed),
            step_prompt_budget=s.config.prefill_token_budget or s.config.max_num_batched_tokens,
            waiting_tokens_by_priority=s.waiting.tokens_by_priority(),
            lane_counters=(  # decode role only, as the real workers report them
                s.lane_shares.counters(queued_prefill_tokens_by_priority(s))
                if s.lane_shares is not None and self.role == "decode"
                else None
            ),
        )

    @property
    def idle(self) -> bool:
        s = self.scheduler
        return not self.busy and not s.has_unfinished() and not s.reserved and not s.transferring and not self._calls
