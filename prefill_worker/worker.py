"""The prefill worker (a Ray actor): continuous batching of chunked prefills; after every step it
ships the KV of each request's newly completed blocks to that request's decode worker, so the
transfer overlaps the next chunk's compute. The last chunk carries the first token. The request
then holds its blocks (TRANSFERRING) until the decode side acknowledges; afterwards the blocks stay
in this worker's prefix cache for later hits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from engine.config import EngineConfig
from engine.device import SetDevice, bind_config_device, cuda_set_device
from engine.engine import LLMEngine
from engine.engine_loop import EngineLoop
from engine.gc_freeze import freeze_startup_objects
from engine.kv_events import KVCacheEvent
from engine.parallel.group_kv import whole_row_shape
from engine.parallel.launcher import RankStarter
from engine.request import RequestState
from engine.scheduler_output import SchedulerOutput
from engine.worker_stats import WorkerLoad, engine_load
from kv_transfer.agent import TransferAgent
from kv_transfer.data_plane import DataPlaneFactory, default_data_plane
from kv_transfer.fault import FaultInjector, FaultSpec
from kv_transfer.group_handoff import GroupHandoff
from kv_transfer.identity import kv_segment_name, make_peer, release_kv, worker_info
from kv_transfer.peer import PeerInfo, StoreAddress, WorkerInfo
from prefill_worker.messages import PrefillTask

log = logging.getLogger(__name__)


@dataclass
class _Shipping:
    task: PrefillTask
    next_block: int  # first block not shipped yet
    chunks: int = 0
    preemptions: int = 0  # the request's count when its blocks were last shipped from the start


class PrefillWorker:
    def __init__(
        self,
        worker_id: str,
        engine_config: EngineConfig,
        store: StoreAddress,
        *,
        connect_timeout_s: float = 30.0,
        data_plane: DataPlaneFactory = default_data_plane,
        set_device: SetDevice = cuda_set_device,
        ranks: RankStarter | None = None,
        direct_kv: bool = True,
    ) -> None:
        """``ranks``: how a tensor-parallel worker's other ranks start (the fleet: Ray actors).
        ``direct_kv``: with a peer where either side is a tensor-parallel group, each rank ships its
        own heads (kv_transfer/group_handoff.py); False: rank 0 gathers every head and ships them
        (engine/parallel/group_kv.py; both sides must agree, the pair refuses to form otherwise)."""
        self.worker_id = worker_id
        bind_config_device(engine_config.device, set_device)  # before any CUDA work (engine/device.py)
        self.engine = LLMEngine(engine_config, record_kv_events=True, ranks=ranks)
        self.peer = make_peer(worker_id, "prefill", self.engine)
        self.loop = EngineLoop(self.engine, name=f"{worker_id}-engine")
        self.faults = FaultInjector()
        self.agent = TransferAgent(
            self.peer,
            store,
            self.engine.runner.kv_cache,
            connect_timeout_s=connect_timeout_s,
            faults=self.faults,
            on_acked=self._on_acked,
            kv_segment_name=kv_segment_name(self.engine),
            data_plane=data_plane,
            # A group's chunks are gathered from its ranks, every head (engine/parallel/group_kv.py).
            row_shape=whole_row_shape(self.engine.runner.kv_cache, self.engine.model_config.num_key_value_heads),
            direct=GroupHandoff(
                self.loop, store, self.peer, receive_timeout_s=connect_timeout_s, join_timeout_s=connect_timeout_s
            )
            if direct_kv
            else None,
        )
        self._shipping: dict[str, _Shipping] = {}  # engine thread only
        self._received: dict[str, int] = {}  # engine thread only: WorkerLoad.prompt_tokens_received
        self.loop.add_after_step(self._ship)
        self.loop.add_ticker(self._drop_ended)
        freeze_startup_objects()  # the engine is loaded: no full collections over it (engine/gc_freeze.py)
        self.loop.start()

    # -- Ray-facing API ---------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        return worker_info(self.peer, self.engine)

    def connect(self, decode: PeerInfo) -> None:
        self.agent.connect(decode)

    def forget_peer(self, peer: PeerInfo) -> None:
        """``peer`` (that incarnation) is dead: what is in flight with it fails now (kv_transfer/agent.py)."""
        self.agent.forget_peer(peer)

    def prefill(self, task: PrefillTask) -> None:
        """Queue the prompt; its KV goes to ``task.decode`` as chunks complete."""
        received = time.monotonic()  # queued from now: the step in flight is part of prefill_queue
        self.agent.connect(task.decode)  # form the pair group while the request waits
        spec = task.spec

        def add(engine: LLMEngine) -> None:
            # An earlier placement's copy (its decode worker died), running or still compiling its grammar
            if spec.request_id in engine.scheduler.requests or spec.request_id in engine.grammar_waits:
                self._abort(engine, spec.request_id)  # this one supersedes it: stop it and free its blocks
                log.info("%s: %s re-sent; its earlier prefill was aborted", self.worker_id, spec.request_id)
            engine.add_request(
                spec.request_id,
                list(spec.prompt_token_ids),
                spec.sampling_params,
                priority=spec.priority,
                cache_salt=spec.cache_salt,
                prefill_only=True,
                preemptible=spec.preemptible,
                arrival_time=received,
            )
            self._shipping[spec.request_id] = _Shipping(task, next_block=task.skip_blocks)
            # Counted on the loop's thread, with the queue the load report reads: consistent.
            self._received[spec.origin] = self._received.get(spec.origin, 0) + spec.num_prompt_tokens

        self.loop.call(add)

    def abort(self, request_id: str) -> bool:
        return self.loop.call(lambda engine: self._abort(engine, request_id))

    def _abort(self, engine: LLMEngine, request_id: str) -> bool:
        ship = self._shipping.pop(request_id, None)
        if ship is not None:
            self.agent.send_abort(ship.task.decode, ship.task.transfer_id)
        return engine.abort(request_id) is not None

    def load(self) -> WorkerLoad:
        return self.loop.call(self._load)

    def take_kv_events(self) -> list[KVCacheEvent]:
        """Prefix-cache events (BlocksStored/BlocksRemoved) since the last call, for the cluster index."""
        return self.loop.call(lambda engine: engine.take_kv_events())

    def set_faults(self, spec: FaultSpec) -> None:
        self.faults.set(spec)

    def ping(self) -> str:
        return self.peer.incarnation

    def shutdown(self) -> None:
        self.loop.stop()
        self.agent.close()
        release_kv(self.engine)
        if not self.loop.alive:  # (the group's broadcasts are the engine thread's while it runs)
            self.engine.close()  # a tensor-parallel worker's other ranks stop

    # -- engine thread ------------------------------------------------------------------------
    def _ship(self, engine: LLMEngine, so: SchedulerOutput) -> None:
        """After a step: send every newly completed block; on the last chunk, the rest and the first token."""
        sched = engine.scheduler
        bs = engine.block_manager.block_size
        for rid in so.request_ids:
            ship = self._shipping.get(rid)
            req = sched.requests.get(rid)
            if ship is None or req is None:
                continue
            if req.num_preemptions != ship.preemptions:
                # Recomputed into fresh blocks: ship them all again (a local-path peer may have
                # read the old ids after they were reused; FIFO order makes these copies win).
                ship.preemptions, ship.next_block = req.num_preemptions, ship.task.skip_blocks
            done = req.state is RequestState.TRANSFERRING
            end = -(-req.num_prompt_tokens // bs) if done else min(req.num_computed_tokens, req.num_prompt_tokens) // bs
            if end <= ship.next_block and not done:
                continue
            blocks = req.block_ids[ship.next_block : end]
            # A tensor-parallel group shipping through rank 0 gathers the blocks' heads from its ranks
            # (a plan every rank runs); rank to rank, each ships its own (in send_blocks).
            interim = engine.ranks is not None and blocks and not self.agent.ships_direct(ship.task.decode)
            rows = engine.export_kv(blocks) if interim else None
            first = req.all_token_ids[req.num_prompt_tokens] if done else -1
            first_logprob = req.pending_logprobs[-1] if done and req.pending_logprobs else None
            queue_s = compute_s = 0.0
            if done and req.first_scheduled_time is not None and req.first_token_time is not None:
                queue_s = req.first_scheduled_time - req.arrival_time
                compute_s = req.first_token_time - req.first_scheduled_time
            self.agent.send_blocks(
                ship.task.decode,
                ship.task.transfer_id,
                rid,
                ship.next_block,
                blocks,
                chunk_index=ship.chunks,
                last=done,
                first_token=first,
                prefill_queue_s=queue_s,
                prefill_compute_s=compute_s,
                first_logprob=first_logprob,
                rows=rows,
            )
            ship.chunks += 1
            ship.next_block = max(end, ship.next_block)
            if done:
                del self._shipping[rid]

    def _drop_ended(self, engine: LLMEngine) -> None:
        """Prefills the engine ended before their last chunk (a grammar that did not compile, a
        failed step): their shipments end, and the decode side is told now rather than at its
        transfer deadline (it falls back to computing the prompt itself)."""
        if not self._shipping:
            return
        live, held = engine.scheduler.requests, engine.grammar_waits
        for rid in [rid for rid in self._shipping if rid not in live and rid not in held]:
            ship = self._shipping.pop(rid)
            self.agent.send_abort(ship.task.decode, ship.task.transfer_id)

    def _on_acked(self, request_id: str, acked: bool) -> None:
        """Channel thread: the decode side has the KV (or the transfer failed); free the blocks."""
        if not acked:
            log.info("%s: transfer of %s not acknowledged; releasing its blocks", self.worker_id, request_id)
        self.loop.call_async(lambda engine: engine.release_transferred(request_id))

    def _load(self, engine: LLMEngine) -> WorkerLoad:
        s, st = engine.scheduler, self.agent.stats
        return replace(
            engine_load(self.worker_id, self.peer.incarnation, "prefill", s, engine.block_manager, self.loop),
            num_transferring=len(s.transferring),
            transfers_completed=st.completed,
            transfers_failed=st.failed,
            transfer_bytes=self.agent.bytes_sent(),
            prompt_tokens_received=dict(self._received),
        )
