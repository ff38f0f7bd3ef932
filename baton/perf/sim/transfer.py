"""KV transfer between a simulated prefill worker and decode worker, as ``prefill_worker.worker``
and ``kv_transfer`` do it.

After every prefill step the prefill worker ships the blocks each of its requests completed (the
transfer overlaps the next chunk's compute); the last chunk carries the first token. Per pair the
channel is FIFO: a chunk starts when the previous one is through and takes the cost model's
``latency + bytes / bandwidth`` (the gloo pair group, or the shared-memory path with
``engine.kv_shared_memory``). When the last chunk lands, the decode worker joins the request at
its next step boundary (``kv_arrived``), and the acknowledgement, one latency later, lets the
prefill worker free its blocks at its next boundary (they stay in its prefix cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from baton.perf.profile.cost_model import TransferModel
from baton.perf.sim.clock import EventLoop
from baton.perf.sim.worker import SimWorker
from engine.request import Request, RequestState
from engine.request_spec import RequestSpec
from engine.scheduler_output import SchedulerOutput


@dataclass
class _Shipping:
    spec: RequestSpec
    decode: SimWorker
    next_block: int  # first block not shipped yet (the decode worker caches the ones before)
    skip_blocks: int = 0
    preemptions: int = 0


class Channels:
    """FIFO pair channels: (prefill id, decode id) -> the time the channel is free again."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self._free_at: dict[tuple[str, str], float] = {}
        self.bytes_sent = 0
        self.chunks = 0

    def send(self, src: str, dst: str, num_bytes: int, seconds: float) -> float:
        """Queue a chunk; returns when it has landed."""
        key = (src, dst)
        start = max(self.loop.now, self._free_at.get(key, 0.0))
        done = start + seconds
        self._free_at[key] = done
        self.bytes_sent += num_bytes
        self.chunks += 1
        return done


class PrefillHooks:
    """The prefill role: ship KV after each step; report load only when asked (the monitor's call)."""

    def __init__(
        self, channels: Channels, on_kv_landed: Callable[[SimWorker, str, int], None], transfer: TransferModel
    ) -> None:
        self.channels = channels
        self.transfer = transfer
        self.on_kv_landed = on_kv_landed  # (decode worker, request id, first token) at landing time
        self.shipping: dict[str, dict[str, _Shipping]] = {}  # worker id -> request id -> state

    def start(self, worker: SimWorker, spec: RequestSpec, decode: SimWorker, skip_blocks: int) -> None:
        """``PrefillWorker.prefill``: queue the prompt (on the engine thread)."""
        worker.add_request(spec, prefill_only=True)
        mine = self.shipping.setdefault(worker.worker_id, {})
        mine[spec.request_id] = _Shipping(spec, decode, skip_blocks, skip_blocks)

    def tick(self, worker: SimWorker) -> None:
        pass

    def after_step(self, worker: SimWorker, so: SchedulerOutput, updated: list[Request]) -> None:
        mine = self.shipping.get(worker.worker_id, {})
        sched = worker.scheduler
        bs = worker.block_manager.block_size
        cost = worker.cost
        loop = worker.loop
        for rid in so.request_ids:
            ship = mine.get(rid)
            req = sched.requests.get(rid)
            if ship is None or req is None:
                continue
            if req.num_preemptions != ship.preemptions:  # recomputed into fresh blocks: ship them again
                ship.preemptions, ship.next_block = req.num_preemptions, ship.skip_blocks
            done = req.state is RequestState.TRANSFERRING
            end = -(-req.num_prompt_tokens // bs) if done else min(req.num_computed_tokens, req.num_prompt_tokens) // bs
            if end <= ship.next_block and not done:
                continue
            n_blocks = max(0, end - ship.next_block)
            num_bytes = n_blocks * bs * cost.model.kv_bytes_per_token
            landed = self.channels.send(
                worker.worker_id, ship.decode.worker_id, num_bytes, self.transfer.seconds(num_bytes)
            )
            ship.next_block = max(end, ship.next_block)
            if done:
                del mine[rid]
                first = req.all_token_ids[req.num_prompt_tokens]
                loop.at(landed, self.on_kv_landed, ship.decode, rid, first)
                # The acknowledgement travels back; the blocks are released at the next boundary.
                loop.at(
                    landed + self.transfer.latency_s,
                    worker.post,
                    lambda w, rid=rid: w.scheduler.release_transferred(rid),
                )
