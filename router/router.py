"""The router: authenticate → validate → tokenize → classify (lane) → admit → lane queue → dispatch.

(Over 400 lines as one concept: the ``RouterAPI`` implementation that wires the parts below and
walks a request through them in order; its parts already live in their own files, and splitting
this path further would scatter one request's steps or bring back a mixin.)

Implements ``router.api.RouterAPI`` for the HTTP and gRPC frontends. Runs on one asyncio event
loop; blocking Ray calls (placing a request on the pools) run on a small thread pool, and outputs
come back from the dispatcher's poller threads into each request's stream. Redis (``ClusterState``)
is optional: without it, or while it is away, rate limits, idempotency and the prefix index are
local to this router (degraded mode) and the batch lane is not durable.

The router wires its parts, each given what it needs: the registry of requests in flight and their
endings (``RequestRegistry``), the lane dispatcher (``LaneDispatcher``), the streams (given
``on_end``/``abort`` callables), the durable batch lane (given this router as its ``JobRunner``)
and the cluster state.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.kv_events import KVCacheEvent
from engine.model.tokenizer import Tokenizer
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from engine.worker_stats import WorkerLoad
from router.admission import PACE_HEADROOM, SLO_HEADROOM, Admission, AdmissionInput
from router.api import ErrorKind, GenerateRequest, GenerationResult, ModelInfo, Readiness, RouterError
from router.capacity import PREFILL_BACKLOG_SHARE, Capacity
from router.classify import classify
from router.cluster_state import ClusterState
from router.decode_backlog import backlogged_lanes
from router.decode_pace import DecodeSteps, local_prompt_rate, pace_inputs
from router.dispatcher import Dispatcher
from router.durable_batch import DurableBatch, JobWaitStream, job_payload
from router.grammar_check import GrammarCheck
from router.lane_dispatch import LaneDispatcher
from router.lane_pressure import LanePressure
from router.lane_queues import LaneQueues, Pending
from router.lanes import LanePolicy, TenantConfig
from router.load_signals import LoadSignals, PrefillRate
from router.metrics import RouterMetrics
from router.pace_guard import PaceGuard, hold_at_for
from router.placement import NO_HINT, LaneSteps, PlacementHint, prefill_queue, prompt_stays_local, yielding_tokens
from router.prompt_hashes import PromptHasher
from router.prompt_input import detokenize, request_fingerprint, token_bytes, tokenize_off_loop, tokenize_request
from router.request_context import RequestContext
from router.request_ids import MAX_CHOICE_ID_LEN, names_a_request, scoped_request_id
from router.request_registry import RequestRegistry
from router.request_trace import RequestTrace
from router.router_stream import ReplayStream, RouterStream, with_deadline
from router.state.connection import StateUnavailable
from router.stream import RequestStream
from router.task_stop import stop_tasks
from router.tracing import Tracing
from router.worker_pool import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterConfig:
    model_name: str
    model_dir: Path
    lanes: LanePolicy = field(default_factory=LanePolicy)
    slo_rejection: bool = True
    slo_headroom: float = SLO_HEADROOM  # queue-wait estimates are divided by this before the TTFT check
    pace_headroom: float = (
        PACE_HEADROOM  # the most the pace check's headroom loosens to (Admission.pace_check_headroom)
    )
    pace_guard: bool = True  # router.pace_guard: looser lanes wait while tight streams are slow
    lane_priority: bool = True  # router.lane_pressure: decode workers share slots by lane, preempt for pace
    tenant_cache_isolation: bool = True  # each tenant's prompts hash into its own prefix-cache space
    initial_prefill_tokens_per_s: float = 1000.0
    drain_timeout_s: float = 30.0
    # The decode workers' KV transfer deadline (pools.transfer_timeout_s): the prefill backlog a
    # prompt may queue behind is kept to PREFILL_BACKLOG_SHARE of it (router.capacity).
    transfer_timeout_s: float = 10.0


class Router:
    def __init__(
        self,
        config: RouterConfig,
        pool: WorkerPool,
        dispatcher: Dispatcher,
        state: ClusterState | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.tracing = tracing  # None: off (router/tracing.py)
        self.pool = pool
        self.dispatcher = dispatcher
        self.state = state or ClusterState.local(dispatcher.router_id)
        self.policy = config.lanes
        has_tokenizer = (config.model_dir / "tokenizer.json").exists()
        self.tokenizer = Tokenizer.from_dir(config.model_dir) if has_tokenizer else None
        first = next(w.info for w in pool.all() if w.info is not None)
        self.max_model_len = min(w.info.max_model_len for w in pool.all() if w.info)
        self.vocab_size = first.vocab_size
        self.grammar_check = GrammarCheck(self.tokenizer, self.vocab_size)  # structured outputs' 400s
        self.block_size = first.block_size
        self.prompt_hashes = PromptHasher.for_model(config.model_dir, self.block_size, self.max_model_len)
        self.prom = RouterMetrics(
            config.model_name,
            loads=self._loads,
            slos={lane.name: (lane.ttft_slo_s, lane.tpot_slo_s) for lane in self.policy.lanes},
            workers=[(w.role, w.worker_id) for w in pool.all()],
            lane_names={lane.priority: lane.name for lane in self.policy.lanes},
        )
        self.admission = Admission(
            self.max_model_len,
            self.state.rate_limiter,
            self.prom,
            slo_rejection=config.slo_rejection,
            slo_headroom=config.slo_headroom,
            pace_headroom=config.pace_headroom,
        )
        self.prefill_rate = PrefillRate(config.initial_prefill_tokens_per_s)
        self.signals = LoadSignals()
        self.decode_steps = DecodeSteps()  # admission's pace prediction (router.decode_pace)
        self.queues = LaneQueues(self.policy.lanes)
        hold_at = hold_at_for(config.slo_headroom)
        self.pace_guard = PaceGuard(self.policy.lanes, hold_at=hold_at) if config.pace_guard else None
        self.capacity = Capacity(
            pool,
            local_prefill_threshold=dispatcher.local_prefill_threshold,
            prefill_backlog_s=PREFILL_BACKLOG_SHARE * config.transfer_timeout_s,
            prefill_rate=self.prefill_rate.tokens_per_s,
        )
        self.created = int(time.time())
        self.requests = RequestRegistry(self.capacity, self.signals, self.prom, self.state.idempotency_finish)
        self.lane_dispatch = LaneDispatcher(
            self.queues,
            self.capacity,
            dispatcher,
            self.requests,
            self.policy,
            self.prom,
            self.pace_guard,
            self.block_size,
            self._decode_backlog if config.lane_priority else None,
        )
        self.lane_pressure = (
            LanePressure(
                self.policy.lanes,
                self.queues.depth,
                lambda: [(c.lane, c.stream.token_times) for c in self.requests.running()],
                self.admission.pace_refusals,
                self.admission.ttft_refusals,
                hold_at=hold_at,
            )
            if config.lane_priority
            else None
        )
        if self.lane_pressure is not None:  # sent to the decode workers with each poll
            dispatcher.lane_pressure = self.lane_pressure.latest
        self.drain_cut = False  # set (a second Ctrl-C): a drain in progress stops waiting and aborts the rest
        self._tasks: list[asyncio.Task[object]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.draining = False
        dispatcher.on_kv_events = self._on_kv_events
        dispatcher.on_worker_reset = self._on_worker_reset
        self.batch = (
            DurableBatch(
                self, self.state, self.state.journal, self.dispatcher.router_id, idle_ms=self.state.job_idle_ms
            )
            if self.state.journal is not None
            else None
        )

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self.lane_dispatch.run(), name="lane-dispatch"))
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="router-housekeeping"))
        if self.batch is not None:
            self._tasks.append(asyncio.create_task(self.batch.run(), name="durable-batch"))
        await self.state.start(self.heartbeat_payload, self.pool)

    async def drain(self, timeout_s: float | None = None) -> int:
        """Stop admitting, let in-flight requests finish (up to the timeout), abort the rest.
        Returns how many had to be aborted."""
        self.draining = True
        deadline = time.monotonic() + (self.config.drain_timeout_s if timeout_s is None else timeout_s)
        while len(self.requests) and time.monotonic() < deadline and not self.drain_cut:
            await asyncio.sleep(0.05)
        if self.batch is not None:
            await self.batch.stop()  # its jobs still here stay journaled for another replica
        left = self.requests.values()
        for ctx in left:
            await self.lane_dispatch.abort(ctx)
        return len(left)

    async def stop(self) -> None:
        if self.batch is not None:
            await self.batch.stop()
        await stop_tasks(self._tasks, "router")
        await self.state.stop()
        self.lane_dispatch.stop()
        if self.tracing is not None:
            self.tracing.shutdown()

    async def _housekeeping(self) -> None:
        """The prefill rate admission predicts with, and the lane gauges."""
        while True:
            await asyncio.sleep(0.25)
            for w in self.pool.all():
                if w.load is not None:
                    self.prefill_rate.observe(w.worker_id, w.load.prompt_tokens_computed, w.load.busy_seconds)
            waiting = {lane.name: self.queues.depth(lane.name) for lane in self.policy.lanes}
            running: dict[str, int] = {lane.name: 0 for lane in self.policy.lanes}
            for ctx in self.requests.dispatched_contexts():
                running[ctx.lane] += 1
            self.prom.set_lane_gauges(waiting, running)
            if self.lane_pressure is not None:
                self.lane_pressure.report()

    # -- RouterAPI ------------------------------------------------------------------------------
    def authenticate(self, api_key: str | None) -> str:
        tenant = self.policy.tenant_for_key(api_key)
        if tenant is None or (self.policy.auth_required and tenant.api_key is None):
            if api_key is None:
                raise RouterError(
                    ErrorKind.UNAUTHENTICATED,
                    "Missing API key: send 'Authorization: Bearer <key>'.",
                    code="missing_api_key",
                )
            raise RouterError(ErrorKind.UNAUTHENTICATED, "Incorrect API key provided.", code="invalid_api_key")
        return tenant.name

    async def generate(self, req: GenerateRequest) -> RouterStream | ReplayStream | JobWaitStream:
        if self.tracing is None:
            return await self._generate(req, None)
        trace = self.tracing.begin(req.traceparent, req.tracestate)
        try:
            return await self._generate(req, trace)
        except RouterError as err:
            self.tracing.rejected(trace, err)
            raise

    async def _generate(
        self, req: GenerateRequest, trace: RequestTrace | None
    ) -> RouterStream | ReplayStream | JobWaitStream:
        known = req.lane is not None and any(lane.name == req.lane for lane in self.policy.lanes)
        lane_hint = req.lane if known and req.lane is not None else "none"  # a metrics label
        if self.draining:
            raise self.admission.reject(
                lane_hint,
                "draining",
                RouterError(
                    ErrorKind.OVERLOADED,
                    "The server is shutting down; retry on another replica.",
                    code="draining",
                    retry_after_s=5.0,
                ),
            )
        tenant = self._tenant(req.tenant)
        ids, prompt_text = await tokenize_off_loop(req, self.tokenizer, self.vocab_size)
        await self.grammar_check.check(req.sampling, req.tools)
        if not req.max_tokens_given:  # "up to the context length", as OpenAI's chat API means it
            room = self.max_model_len - len(ids)
            if room >= 1 and req.sampling.max_tokens > room:
                req = replace(req, sampling=replace(req.sampling, max_tokens=room))
        lane = classify(
            self.policy,
            tenant,
            explicit_lane=req.lane,
            num_prompt_tokens=len(ids),
            stream=req.stream,
            max_tokens=req.sampling.max_tokens,
            max_tokens_given=req.max_tokens_given,
        )
        self.admission.check_context(
            len(ids),
            req.sampling.max_tokens,
            lane,
            max_tokens_given=req.max_tokens_given,
            prompt_param="messages" if req.messages is not None else "prompt",
            max_tokens_param=req.max_tokens_param,
        )
        if not self.pool.live("decode"):
            raise self.admission.reject(
                lane,
                "no_workers",
                RouterError(
                    ErrorKind.OVERLOADED, "No decode worker is available.", code="no_workers", retry_after_s=5.0
                ),
            )

        shown = req.request_id or f"cmpl-{uuid.uuid4().hex[:24]}"
        rid = scoped_request_id(tenant.name, shown)  # another tenant's id is not this one's
        idem = None
        if req.idempotency_key:  # first: a retry that repeats its X-Request-Id too gets the first result
            idem = (tenant.name, req.idempotency_key)
            replay = await self.state.idempotency_begin(tenant.name, req.idempotency_key, request_fingerprint(req, ids))
            if replay is not None:
                return ReplayStream(replay)
        if self.requests.taken(rid) or (self.batch is not None and self.batch.holds(rid)):
            if idem:  # (a queued batch job's id too)
                await self.state.idempotency_release(*idem)
            raise RouterError(ErrorKind.CONFLICT, f"request id {shown!r} is already in flight", param="request_id")
        # Held from this check until the request is registered: the awaits in between (placement,
        # rate limits, the journal) let a concurrent request with the same id through otherwise.
        self.requests.hold(rid)
        try:
            return await self._admit(req, rid, tenant, lane, ids, prompt_text, idem, trace)
        except BaseException:
            if idem:
                await self.state.idempotency_release(*idem)
            raise
        finally:
            self.requests.unhold(rid)

    async def _admit(
        self,
        req: GenerateRequest,
        rid: str,
        tenant: TenantConfig,
        lane: str,
        ids: list[int],
        prompt_text: str | None,
        idem: tuple[str, str] | None,
        trace: RequestTrace | None = None,
    ) -> RouterStream | JobWaitStream:
        """Admission, then the lane queue (or the batch journal): the rest of ``generate``."""
        lane_cfg = self.policy.lane(lane)
        if self.pace_guard is not None:
            self.pace_guard.arrived(lane, time.monotonic())
        durable = lane_cfg.durable and self.batch is not None
        # Everything that awaits comes before the admission decision, and the request joins its
        # lane queue right after it with no await in between: concurrent arrivals then each see
        # the ones admitted before them (an await here let a burst all see an empty queue).
        hint = NO_HINT if durable else await self._placement_hint(ids, self._salt(tenant.name))
        ahead = self.queues.requests_ahead(lane)
        free_slots = self.capacity.free_places(len(ids), req.sampling.max_tokens)  # slots, or KV if fewer
        threshold = self.dispatcher.local_prefill_threshold
        local = prompt_stays_local(self.pool, len(ids), threshold, self.dispatcher.short_prompts_to_idle_prefill)
        pace_in = pace_inputs(
            self.pool,
            self.decode_steps,
            lane_cfg.priority,
            len(ids),
            local,
            self.prefill_rate.tokens_per_s,
            time.monotonic(),
        )
        queued, rate = prefill_queue(
            self.pool,
            len(ids),
            threshold,
            self.prefill_rate.tokens_per_s,
            self.dispatcher.short_prompts_to_idle_prefill,
        )
        if local and self.pool.live("prefill"):  # beside the decodes, at most its prompt budget a step
            rate = local_prompt_rate(rate, pace_in.steps)
        freeable = 0
        if self.lane_pressure is not None:  # what preempting less important lanes frees on the worker
            freeable = (
                self.lane_pressure.freeable(lane)
                if pace_in.running_by_priority is None
                else self.lane_pressure.freeable_on(lane, pace_in.running_by_priority)
            )
        predicted = await self.admission.admit(
            AdmissionInput(
                lane=lane_cfg,
                tenant=tenant,
                prompt_tokens=len(ids),
                max_tokens=req.sampling.max_tokens,
                lane_depth=self.queues.admitted_depth(lane),
                tokens_ahead=self.queues.tokens_ahead(lane),
                pool_queued_tokens=queued,
                prefill_tokens_per_s=rate,
                requests_ahead=ahead,
                free_seq_slots=free_slots,
                completions_per_s=self.signals.completion_rate.per_s(),
                service_s=self.signals.service_s(len(ids), rate, lane=lane),
                decode_pace_s=(
                    self.lane_pressure.pace(self.requests.decode_pace)
                    if self.lane_pressure
                    else self.requests.decode_pace()
                ),
                running=self.signals.running((len(c.stream.token_times), c.max_tokens) for c in self.requests.running())
                if ahead + 1 > free_slots
                else (),
                num_running=self.requests.num_dispatched,  # (built only when read)
                expected_output_tokens=self.signals.expected_output(req.sampling.max_tokens),
                freeable_seqs=freeable,
                decode_steps=pace_in.steps,
                prompt_token_s=pace_in.prompt_token_s,
                decode_backlog_tokens=pace_in.backlog_tokens,
                recent_tpot_s=self.signals.recent_tpot_s(lane),
                yielding_tokens=yielding_tokens(
                    self.pool,
                    lane_cfg.priority,
                    len(ids),
                    threshold,
                    self.dispatcher.short_prompts_to_idle_prefill,
                    (
                        LaneSteps(self.lane_pressure.floors, self.prefill_rate.tokens_per_s, time.monotonic())
                        if self.lane_pressure is not None
                        else None
                    ),
                ),
                lane_depth_now=lambda: self.queues.admitted_depth(lane),
                choice_charge=req.charge,
            )
        )

        if durable and self.batch is not None:  # (durable implies a batch)
            self.queues.hold_place(rid, lane)  # before the journal's await: the bound holds for a burst
            try:  # journaled first: it survives this router; its key gets the result where it ends
                return await self.batch.submit(
                    job_payload(rid, tenant.name, lane, ids, req.sampling, prompt_text, req.idempotency_key), lane
                )
            except StateUnavailable:
                log.warning("Redis unavailable: batch request %s runs without the journal", rid)

        ctx = self._enqueue(rid, tenant.name, lane, ids, req.sampling, prompt_text, hint, idem, trace)
        ctx.predicted_ttft_s = predicted
        out = self._stream(ctx)
        if req.deadline_s is not None:  # cancelled when the request ends (RequestRegistry.finished)
            ctx.deadline_task = asyncio.get_running_loop().create_task(with_deadline(out, req.deadline_s))
        return out

    def _salt(self, tenant: str) -> str | None:
        return tenant if self.config.tenant_cache_isolation else None

    def _enqueue(
        self,
        rid: str,
        tenant: str,
        lane: str,
        ids: list[int],
        sampling: SamplingParams,
        prompt_text: str | None,
        hint: PlacementHint,
        idem: tuple[str, str] | None = None,
        trace: RequestTrace | None = None,
    ) -> RequestContext:
        lane_cfg = self.policy.lane(lane)
        salt = self._salt(tenant)
        spec = RequestSpec(
            rid,
            tuple(ids),
            sampling,
            priority=lane_cfg.priority,
            cache_salt=salt,
            origin=self.dispatcher.origin,
            preemptible=lane_cfg.preemptible,
        )
        stream = RequestStream(rid, len(ids))
        stream.bind(asyncio.get_running_loop())
        ctx = RequestContext(
            rid, tenant, lane, len(ids), sampling.max_tokens, stream, spec, prompt_text=prompt_text, idempotency=idem
        )
        ctx.hint = hint
        ctx.trace = trace
        # Its end is recorded when the stream ends, not when a reader reaches the end: a choice of n
        # whose client left (or whose sibling was refused) was never read to its end, and stayed in
        # flight for good, holding a sequence slot (at ~256 of them dispatch stopped).
        tracing = self.tracing if trace is not None else None
        if tracing is None:
            stream.when_finished(lambda: self.requests.finished(ctx))
        else:

            def ended() -> None:
                self.requests.finished(ctx)
                tracing.finished(ctx)

            stream.when_finished(ended)
        self.requests.add(ctx)
        first_block = self.prompt_hashes.first_block(ids, salt)
        self.lane_dispatch.enqueue(
            Pending(rid, lane, len(ids) + min(sampling.max_tokens, 64), first_block, payload=ctx)
        )
        return ctx

    def _stream(self, ctx: RequestContext) -> RouterStream:
        return RouterStream(
            ctx, on_end=self.requests.finished, abort=self.lane_dispatch.abort, token_gaps=self.prom.token_gaps
        )

    async def run_durable(
        self, job_id: str, tenant: str, lane: str, ids: list[int], sampling: SamplingParams, prompt_text: str | None
    ) -> GenerationResult:
        """Run a journaled batch job through the lane queues (called by the durable-batch consumer)."""
        while (other := self.requests.get(job_id)) is not None and not other.durable:  # another request's id (another
            await asyncio.sleep(0.05)  # replica queued the job): it must end first, never share its stream
        ctx = self.requests.get(job_id)  # already running here: a re-claim of our own job
        if ctx is None:
            hint = await self._placement_hint(ids, self._salt(tenant))
            ctx = self.requests.get(job_id) or self._enqueue(job_id, tenant, lane, ids, sampling, prompt_text, hint)
        ctx.durable = True
        return await self._stream(ctx).result()

    def lane_room(self, durable: bool = True) -> int:
        """How many more requests the (durable) lanes' queues take before reaching their bounds."""
        lanes = [lane for lane in self.policy.lanes if lane.durable or not durable]
        return min((lane.queue_bound - self.queues.depth(lane.name) for lane in lanes), default=0)

    async def abort(self, request_id: str, tenant: str) -> bool:
        """The client's abort (``POST /v1/abort/{id}``, gRPC ``Abort``) of its request; a durable
        batch job is cancelled wherever it is (``DurableBatch.cancel``). False: nothing of the
        tenant's in flight under that id (an id outside the id rule names nothing: no Redis lookup)."""
        if not names_a_request(request_id):
            return False
        rid = scoped_request_id(tenant, request_id)
        ctx = self.requests.get(rid)
        if ctx is None or ctx.tenant != tenant or ctx.stream.finished or ctx.durable:
            return self.batch is not None and await self.batch.cancel(rid, tenant)
        await self.lane_dispatch.abort(ctx)
        return True

    async def stop_durable(self, job_id: str) -> None:
        """End this replica's run of a durable job (its client cancelled it)."""
        ctx = self.requests.get(job_id)
        if ctx is not None and ctx.durable and not ctx.stream.finished:
            await self.lane_dispatch.abort(ctx)

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            self.config.model_name,
            self.max_model_len,
            self.vocab_size,
            self.created,
            tuple(lane.name for lane in self.policy.lanes),
        )

    def readiness(self) -> Readiness:
        if self.draining:
            return Readiness(False, "draining")
        if not self.pool.live("decode"):
            return Readiness(False, "no live decode worker")
        if self.pool.prefill and not self.pool.live("prefill"):
            return Readiness(False, "no live prefill worker")
        return Readiness(True, "ok", {"in_flight": len(self.requests), "queued": len(self.queues)})

    def metrics(self) -> tuple[bytes, str]:
        return self.prom.exposition()

    async def batch_result(self, job_id: str, tenant: str) -> dict[str, Any]:
        valid = names_a_request(job_id)
        job = await self.state.batch_get(scoped_request_id(tenant, job_id), tenant) if valid else None
        if job is None:
            shown = job_id[:MAX_CHOICE_ID_LEN]
            raise RouterError(ErrorKind.NOT_FOUND, f"No batch job {shown!r}.", param="id", code="not_found")
        return {**job, "id": job_id}

    def tokenize(self, request: GenerateRequest) -> list[int]:
        return tokenize_request(request, self.tokenizer, self.vocab_size)[0]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return detokenize(token_ids, self.tokenizer, self.vocab_size)

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        return token_bytes(token_ids, self.tokenizer)

    # -- request preparation -----------------------------------------------------------------------
    def _tenant(self, name: str) -> TenantConfig:
        for t in self.policy.tenants:
            if t.name == name:
                return t
        raise RouterError(ErrorKind.UNAUTHENTICATED, f"unknown tenant {name!r}")

    async def _placement_hint(self, ids: list[int], salt: str | None) -> PlacementHint:
        hashes = self.prompt_hashes.hashes(ids, salt)
        if not hashes:
            return NO_HINT
        workers = [w.worker_id for w in self.pool.all() if w.alive]
        blocks = await self.state.prefix_lookup(hashes, workers)
        return PlacementHint({w: n * self.block_size for w, n in blocks.items() if n})

    def heartbeat_payload(self) -> dict[str, Any]:
        """What this router publishes in the Redis registry."""
        return {
            "in_flight": len(self.requests),
            "queued": len(self.queues),
            "draining": self.draining,
            "lanes": {lane.name: self.queues.depth(lane.name) for lane in self.policy.lanes},
        }

    def _decode_backlog(self) -> dict[str, float]:
        return backlogged_lanes(self.policy.lanes, [w.load for w in self.pool.live("decode")])

    def _loads(self) -> list[WorkerLoad]:
        return [w.load for w in self.pool.all() if w.alive and w.load is not None]

    def _on_worker_reset(self, worker_id: str) -> None:
        """From a dispatcher thread: a worker died or restarted; its prefix cache is gone."""
        w = self.pool.get(worker_id)
        self.prom.worker_reset(w.role if w is not None else "unknown", worker_id)
        if (loop := self._loop) is not None:
            loop.call_soon_threadsafe(lambda: loop.create_task(self.state.forget_worker(worker_id)))

    def _on_kv_events(self, worker_id: str, events: list[KVCacheEvent]) -> None:
        """From a poller thread: feed the cluster prefix index on the event loop."""
        if (loop := self._loop) is not None and events:
            loop.call_soon_threadsafe(lambda: loop.create_task(self.state.prefix_apply(worker_id, events)))
