"""The decode worker (a Ray actor): reserves blocks for prompts a prefill worker computes, receives
their KV, joins them to its decode batch, and hands outputs back in per-step batches (``poll``).

It can also prefill locally: short or mostly cached prompts (conditional disaggregation), migrated
requests (recomputing prompt + tokens generated so far), and any reservation whose KV missed its
deadline or whose prefill worker died (fallback, counted as a failed transfer).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace

from decode_worker.messages import OutputBatch, ReserveResult
from decode_worker.outbox import Outbox
from engine.config import EngineConfig
from engine.device import SetDevice, bind_config_device, cuda_set_device
from engine.engine import LLMEngine
from engine.engine_loop import EngineLoop
from engine.errors import InvalidParameterError
from engine.gc_freeze import freeze_startup_objects
from engine.kv_events import KVCacheEvent
from engine.lane_shares import LaneDemand
from engine.logprobs import TokenLogprob
from engine.parallel.group_kv import whole_row_shape
from engine.parallel.launcher import RankStarter
from engine.request_spec import RequestSpec
from engine.worker_stats import WorkerLoad, engine_load, queued_prefill_tokens_by_priority
from kv_transfer.agent import TransferAgent, TransferTiming
from kv_transfer.data_plane import DataPlaneFactory, default_data_plane
from kv_transfer.group_handoff import GroupHandoff
from kv_transfer.identity import kv_segment_name, make_peer, release_kv, worker_info
from kv_transfer.peer import PeerInfo, StoreAddress, WorkerInfo

log = logging.getLogger(__name__)


class DecodeWorker:
    def __init__(
        self,
        worker_id: str,
        engine_config: EngineConfig,
        store: StoreAddress,
        *,
        transfer_timeout_s: float = 10.0,
        connect_timeout_s: float = 30.0,
        orphan_timeout_s: float = 10.0,
        data_plane: DataPlaneFactory = default_data_plane,
        set_device: SetDevice = cuda_set_device,
        ranks: RankStarter | None = None,
        direct_kv: bool = True,
    ) -> None:
        """``ranks``: how a tensor-parallel worker's other ranks start (the fleet: Ray actors).
        ``direct_kv``: as the prefill worker's (prefill_worker/worker.py)."""
        self.worker_id = worker_id
        self.transfer_timeout_s = transfer_timeout_s
        bind_config_device(engine_config.device, set_device)  # before any CUDA work (engine/device.py)
        self.engine = LLMEngine(engine_config, record_kv_events=True, ranks=ranks)
        self.peer = make_peer(worker_id, "decode", self.engine)
        self.outbox = Outbox()
        self.loop = EngineLoop(self.engine, name=f"{worker_id}-engine", output_sink=self.outbox.put)
        self._kv_events: list[KVCacheEvent] = []  # engine thread appends, poll drains (swap under the GIL)
        self.agent = TransferAgent(
            self.peer,
            store,
            self.engine.runner.kv_cache,
            connect_timeout_s=connect_timeout_s,
            on_received=self._on_received,
            on_receive_failed=self._on_receive_failed,
            kv_segment_name=kv_segment_name(self.engine),
            data_plane=data_plane,
            # A group's ranks each take their heads of the received chunks, on the engine thread
            # (``_on_received``; engine/parallel/group_kv.py).
            row_shape=whole_row_shape(self.engine.runner.kv_cache, self.engine.model_config.num_key_value_heads),
            stage_received=self.engine.ranks is not None,
            # Each rank receives its heads from the prefill ranks holding them, on the engine thread.
            direct=GroupHandoff(
                self.loop, store, self.peer, receive_timeout_s=transfer_timeout_s, join_timeout_s=connect_timeout_s
            )
            if direct_kv
            else None,
        )
        self._transfer_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._transfer_of: dict[str, int] = {}  # request id -> transfer id, while reserved
        self._placed: dict[str, int] = {}  # engine thread only: WorkerLoad.prompt_tokens_placed
        self._placed_at: dict[str, float] = {}  # when each router last placed a request here
        self.num_fallbacks = 0
        self.orphan_timeout_s = orphan_timeout_s
        self.num_orphans_aborted = 0
        self.num_taken_over = 0  # requests re-sent by another router while the first one's copy ran
        self._next_orphan_check = 0.0
        self._last_tick = time.monotonic()  # the orphan ticker's previous run
        self._load_snapshot = self._load(self.engine)
        self.loop.add_ticker(self._expire_transfers)
        self.loop.add_ticker(self._abort_orphans)
        self.loop.add_ticker(self._snapshot_load)
        freeze_startup_objects()  # the engine is loaded: no full collections over it (engine/gc_freeze.py)
        self.loop.start()

    # -- Ray-facing API ---------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        return worker_info(self.peer, self.engine)

    def connect(self, prefill: PeerInfo) -> None:
        self.agent.connect(prefill)

    def forget_peer(self, peer: PeerInfo) -> None:
        """``peer`` (that incarnation) is dead: what is in flight with it fails now (kv_transfer/agent.py)."""
        self.agent.forget_peer(peer)

    def reserve(self, spec: RequestSpec, prefill: PeerInfo) -> ReserveResult:
        """Reserve blocks for ``spec``'s prompt; its KV will come from ``prefill``."""
        tid = next(self._transfer_ids)

        def do(engine: LLMEngine) -> ReserveResult:
            self._register(engine, spec)
            req = engine.reserve(
                spec.request_id,
                list(spec.prompt_token_ids),
                spec.sampling_params,
                priority=spec.priority,
                cache_salt=spec.cache_salt,
                preemptible=spec.preemptible,
            )
            if req is None:
                return ReserveResult(False, reason="no free KV blocks")
            self._count_placed(spec)
            # Expect before returning: the first chunk may arrive as soon as the caller hears back.
            # Recorded first: an expect that fails at once (the prefill worker is gone) clears it.
            with self._lock:
                self._transfer_of[spec.request_id] = tid
            self.agent.expect(prefill, tid, spec.request_id, req.block_ids)
            return ReserveResult(True, tid, req.num_cached_tokens // engine.block_manager.block_size)

        try:
            return self.loop.call(do)
        except InvalidParameterError as e:
            return ReserveResult(False, reason=str(e))

    def generate_local(self, spec: RequestSpec) -> bool:
        """Prefill and decode here (short or cached prompts, migrated requests)."""
        # Queued from now: the wait for the step in flight belongs to the prefill_queue stage.
        received = time.monotonic()

        def do(engine: LLMEngine) -> bool:
            self._register(engine, spec)
            engine.add_request(
                spec.request_id,
                list(spec.prompt_token_ids),
                spec.sampling_params,
                priority=spec.priority,
                cache_salt=spec.cache_salt,
                preemptible=spec.preemptible,
                resume_token_ids=list(spec.resume_token_ids),
                resume_text_chars=spec.resume_text_chars,
                arrival_time=received,
            )
            self._count_placed(spec)
            return True

        return self.loop.call(do)

    def prefill_locally(self, request_id: str, failed: bool = True) -> bool:
        """Give up on the transfer for a reserved request and prefill here: its prefill worker is gone
        or refused (``failed``: counted as a fallback), or the router chose to before starting it."""

        def do(engine: LLMEngine) -> bool:
            self._cancel_transfer(request_id)
            if failed:
                return self._fallback(engine, request_id)
            return engine.fallback_to_local_prefill(request_id)

        return self.loop.call(do)

    def abort(self, request_id: str) -> bool:
        def do(engine: LLMEngine) -> bool:
            self._cancel_transfer(request_id)
            out = engine.abort(request_id)
            self.outbox.forget(request_id)
            return out is not None

        return self.loop.call(do)

    def poll(
        self, timeout_s: float = 0.5, origin: str = "", pressure: tuple[LaneDemand, ...] | None = None
    ) -> OutputBatch:
        """Every output for ``origin``'s requests since its last poll (a long poll), with the latest load
        report and the prefix-cache events since any router's last poll. ``pressure``: the router's
        lanes' demand (router/lane_pressure.py), for the scheduler's lane shares (engine/lane_shares.py)."""
        shares = self.engine.scheduler.lane_shares
        if pressure is not None and shares is not None:
            shares.set_pressure(origin, pressure)  # (a whole new mapping: safe beside the step reading it)
        outputs = self.outbox.poll(origin, timeout_s)
        events, self._kv_events = self._kv_events, []
        return OutputBatch(
            self.worker_id,
            self.peer.incarnation,
            outputs,
            self._load_snapshot,
            events,
            dropped=self.outbox.take_dropped(origin),
        )

    def load(self) -> WorkerLoad:
        return self._load_snapshot

    def ping(self) -> str:
        return self.peer.incarnation

    def shutdown(self) -> None:
        self.loop.stop()
        self.outbox.close()
        self.agent.close()
        release_kv(self.engine)
        if not self.loop.alive:  # (the group's broadcasts are the engine thread's while it runs)
            self.engine.close()  # a tensor-parallel worker's other ranks stop

    # -- transfer callbacks (channel threads) ------------------------------------------------
    def _on_received(
        self, request_id: str, first_token: int, timing: TransferTiming, first_logprob: TokenLogprob | None = None
    ) -> None:
        with self._lock:
            self._transfer_of.pop(request_id, None)

        def arrived(engine: LLMEngine) -> None:
            timing.kv_ready.wait()  # the next step, the first to read the blocks, runs after their scatter
            if timing.staged:
                req = engine.scheduler.reserved.get(request_id)
                if req is None or any(not set(st.block_ids) <= set(req.block_ids) for st in timing.staged):
                    return  # aborted (or reserved anew) meanwhile: these blocks are no longer this transfer's
                for st in timing.staged:
                    engine.import_kv(st.block_ids, st.rows)
            breakdown = {
                "prefill_queue": timing.prefill_queue_s,
                "prefill_compute": timing.prefill_compute_s,
                "transfer": timing.transfer_s,
                "decode_queue": time.monotonic() - timing.landed,
            }
            self.loop.push_outputs(engine.kv_arrived(request_id, first_token, breakdown, first_logprob))

        self.loop.call_async(arrived)

    def _on_receive_failed(self, request_id: str, reason: str) -> None:
        with self._lock:
            self._transfer_of.pop(request_id, None)
        log.warning("%s: KV for %s failed (%s); prefilling locally", self.worker_id, request_id, reason)
        self.loop.call_async(lambda engine: self._fallback(engine, request_id))

    # -- engine thread ------------------------------------------------------------------------
    def _register(self, engine: LLMEngine, spec: RequestSpec) -> None:
        """Make ``spec``'s router the reader of its request. The same id still held here for another
        router is that router's lost copy (it restarted, or its durable batch job was re-claimed by
        another replica before this worker noticed it gone): it is aborted first, freeing the id and
        its blocks. Done on the engine thread, so no step files the old copy's tokens for the new router."""
        previous = self.outbox.register(spec.request_id, spec.origin)
        if previous is not None:
            self._cancel_transfer(spec.request_id)
            lost = engine.abort(spec.request_id)
            if lost is not None:  # the router that lost it, if still alive, sees its stream end
                self.outbox.put_for(previous, lost)
            self.num_taken_over += 1
            log.info("%s: %s taken over from router %s by %s", self.worker_id, spec.request_id, previous, spec.origin)

    def _expire_transfers(self, engine: LLMEngine) -> None:
        now = time.monotonic()
        for tid, rid, last_progress in self.agent.pending_transfers():
            if now - last_progress > self.transfer_timeout_s and self.agent.cancel(tid):
                with self._lock:
                    self._transfer_of.pop(rid, None)
                self.agent.stats.failed += 1
                log.warning(
                    "%s: KV for %s made no progress for %.1fs; prefilling locally",
                    self.worker_id,
                    rid,
                    self.transfer_timeout_s,
                )
                self._fallback(engine, rid)

    def _abort_orphans(self, engine: LLMEngine) -> None:
        """Requests of a router that stopped polling (it died) are aborted: nobody reads them. A router
        that polls again after all is told which of its requests went (``OutputBatch.dropped``)."""
        now = time.monotonic()
        if now - self._last_tick > self.orphan_timeout_s / 2:  # this worker was away (SIGSTOP, a paused VM):
            self.outbox.touch_all()  # the routers' silence meanwhile was not theirs
        self._last_tick = now
        if now < self._next_orphan_check:
            return
        self._next_orphan_check = now + 1.0
        for rid in self.outbox.orphans(self.orphan_timeout_s):
            self._cancel_transfer(rid)
            engine.abort(rid)
            self.outbox.forget(rid)
            self.num_orphans_aborted += 1
        if self.num_orphans_aborted:
            log.debug("%s: %d orphaned requests aborted so far", self.worker_id, self.num_orphans_aborted)
        self._forget_gone_routers(now)

    def _forget_gone_routers(self, now: float, after_s: float = 600.0) -> None:
        """Drop the placed-token counts of routers gone for ``after_s`` (each router start is a new
        origin: they piled up in every load report). Long after the orphan timeout, so a router that
        was only stalled never sees its count restart from zero (it would read as phantom load)."""
        live = self.outbox.known_origins()
        for origin in [o for o, t in self._placed_at.items() if o not in live and now - t > after_s]:
            del self._placed_at[origin]
            self._placed.pop(origin, None)

    def _snapshot_load(self, engine: LLMEngine) -> None:
        self._load_snapshot = self._load(engine)  # read by poll() without waiting for the step
        events = engine.take_kv_events()
        if events:
            self._kv_events += events

    def _fallback(self, engine: LLMEngine, request_id: str) -> bool:
        if engine.fallback_to_local_prefill(request_id):
            self.num_fallbacks += 1
            return True
        return False

    def _cancel_transfer(self, request_id: str) -> None:
        with self._lock:
            tid = self._transfer_of.pop(request_id, None)
        if tid is not None:
            self.agent.cancel(tid)

    def _count_placed(self, spec: RequestSpec) -> None:
        # On the loop's thread, like the block counts the load report reads: consistent with them.
        self._placed[spec.origin] = self._placed.get(spec.origin, 0) + spec.num_prompt_tokens
        self._placed_at[spec.origin] = time.monotonic()

    def _load(self, engine: LLMEngine) -> WorkerLoad:
        s, st = engine.scheduler, self.agent.stats
        return replace(
            engine_load(self.worker_id, self.peer.incarnation, "decode", s, engine.block_manager, self.loop),
            num_reserved=len(s.reserved),
            transfers_completed=st.completed,
            transfers_failed=st.failed,
            transfer_bytes=st.bytes_received,
            transfer_seconds=st.seconds,
            prompt_tokens_placed=dict(self._placed),
            draft_tokens=s.num_draft_tokens,
            accepted_draft_tokens=s.num_accepted_tokens,
            lane_counters=(
                s.lane_shares.counters(queued_prefill_tokens_by_priority(s)) if s.lane_shares is not None else None
            ),
        )
