"""What the router's long polls bring back from the decode workers: each step's outputs, the
worker's load snapshot and its prefix-cache events (``decode_worker.worker.DecodeWorker.poll``).

The details that matter for placement and admission are reproduced: the load snapshot is taken by
the engine loop's ticker *before* each step, so a poll answered by a step's outputs carries the
load from before that step (finished requests still hold their blocks in it); and an idle worker's
poll returns only when it times out (every ``poll_timeout_s``), so the router learns that a worker
went idle up to that long afterwards. ``WorkerHooks`` for the decode role.
"""

from __future__ import annotations

from collections.abc import Callable

from baton.perf.sim.clock import EventLoop
from baton.perf.sim.worker import SimWorker
from engine.lane_shares import LaneDemand
from engine.request import Request
from engine.scheduler_output import SchedulerOutput
from engine.worker_stats import WorkerLoad
from router.worker_pool import WorkerHandle, WorkerPool


class DecodePolls:
    def __init__(
        self,
        loop: EventLoop,
        pool: WorkerPool,
        deliver: Callable[[SimWorker, list[Request]], None],
        on_load: Callable[[WorkerHandle, WorkerLoad, list], None],
        poll_timeout_s: float = 0.5,
        pressure: Callable[[], tuple[LaneDemand, ...]] | None = None,
    ) -> None:
        self.loop = loop
        self.pool = pool
        self.deliver = deliver  # tokens to the clients
        self.on_load = on_load  # (handle, load, kv events) reaching the router
        self.poll_timeout_s = poll_timeout_s
        self.pressure = pressure  # the router's lanes' demand, sent with each poll (router.lane_pressure)
        self._snapshot: dict[str, WorkerLoad] = {}
        self._events: dict[str, list] = {}
        self._generation: dict[str, int] = {}  # bumped by every poll answer; stale timeouts are ignored

    def start(self, worker: SimWorker) -> None:
        self.tick(worker)
        self._answer(worker)

    # -- WorkerHooks -----------------------------------------------------------------------------
    def tick(self, worker: SimWorker) -> None:
        """``DecodeWorker._snapshot_load``: every loop iteration, before the step."""
        self._snapshot[worker.worker_id] = worker.load()
        self._events.setdefault(worker.worker_id, []).extend(worker.block_manager.take_events())

    def after_step(self, worker: SimWorker, so: SchedulerOutput, updated: list[Request]) -> None:
        if updated:
            self.emit(worker, updated)

    # -- outputs ---------------------------------------------------------------------------------
    def emit(self, worker: SimWorker, reqs: list[Request]) -> None:
        """Outputs in the outbox: the waiting poll returns with them (the router re-polls at once, a
        round trip being far shorter than a step)."""
        self.deliver(worker, reqs)
        self._answer(worker)

    def kv_arrived(self, decode: SimWorker, request_id: str, first_token: int) -> None:
        """The last KV chunk is in the decode worker's blocks: it joins at its next boundary and the
        first token goes out at once (``DecodeWorker._on_received``)."""

        def arrived(w: SimWorker) -> None:
            req = w.scheduler.kv_arrived(request_id, first_token)
            if req is not None:
                self.emit(w, [req])

        decode.post(arrived)

    def _answer(self, worker: SimWorker) -> None:
        wid = worker.worker_id
        events, self._events[wid] = self._events.get(wid, []), []
        out = worker.cost.overheads.output_s
        self.loop.after(out, self.on_load, self.pool.get(wid), self._snapshot[wid], events)
        gen = self._generation[wid] = self._generation.get(wid, 0) + 1
        # The router's next poll reaches the worker a round trip later and waits for outputs.
        if self.pressure is not None:
            self.loop.after(out + worker.cost.overheads.rpc_s / 2, self._press, worker)
        self.loop.after(out + worker.cost.overheads.rpc_s / 2 + self.poll_timeout_s, self._timeout, worker, gen)

    def _press(self, worker: SimWorker) -> None:
        """A poll reached the worker: its lanes' pressure with it (``DecodeWorker.poll``)."""
        shares = worker.scheduler.lane_shares
        if shares is not None and self.pressure is not None:
            shares.set_pressure("sim-router", self.pressure())

    def _timeout(self, worker: SimWorker, gen: int) -> None:
        if self._generation.get(worker.worker_id) == gen:
            self._answer(worker)
