"""``RouterReplica``: the Ray actor (async) that is one router replica of ``baton cluster``.

It serves OpenAI HTTP and gRPC on its node (one replica per unit of ``baton_router``), with its own
dispatcher over the cluster's worker actors: decode workers file its requests' outputs under its
router id, so replicas never see each other's tokens. The supervisor hands it the worker handles
at start and any replacement later; Redis is the state the replicas share (prefix index, rate
limits, idempotency, the durable batch journal).

If the actor dies Ray restarts it (``max_restarts=-1``) with empty state; the supervisor sees
``status().started`` false and calls ``start`` again. A worker that does not answer ``info()``
within ``info_timeout_s`` then (down, restarting, not placed) does not hold the start: the replica
serves with the workers that answered, and its dispatcher's monitor takes the others in when they
answer its pings.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import ray

from baton.config import BatonConfig
from baton.drain_socket import DrainSocket
from baton.frontend import Endpoints, RouterFrontend
from engine.model.registry import resolve_model
from router.dispatcher import Dispatcher
from router.worker_pool import WorkerHandle, WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerRef:
    """A worker as the supervisor hands it to replicas."""

    worker_id: str
    role: str
    actor: Any  # ray.actor.ActorHandle


@dataclass(frozen=True)
class ReplicaStatus:
    replica_id: str
    started: bool
    ready: bool
    node_ip: str
    endpoints: Endpoints | None
    in_flight: int


class RouterReplica:
    def __init__(self, replica_id: str, cfg: BatonConfig, redis_url: str, info_timeout_s: float = 30.0) -> None:
        self.replica_id = replica_id
        self.info_timeout_s = info_timeout_s
        self.cfg = cfg
        self.redis_url = redis_url
        self.node_ip = ray.util.get_node_ip_address()
        self.frontend: RouterFrontend | None = None
        self.dispatcher: Dispatcher | None = None
        self.drain_socket: DrainSocket | None = None
        self._starting = asyncio.Lock()

    async def start(self, workers: list[WorkerRef]) -> Endpoints:
        async with self._starting:
            if self.frontend is not None and self.frontend.endpoints is not None:  # started already
                return self.frontend.endpoints
            model_dir = await asyncio.to_thread(resolve_model, self.cfg.model.path)  # the tokenizer
            pool = WorkerPool(
                [WorkerHandle(w.worker_id, w.role, w.actor) for w in workers if w.role == "prefill"],
                [WorkerHandle(w.worker_id, w.role, w.actor) for w in workers if w.role == "decode"],
            )
            await self._gather_infos(pool)
            dispatcher = Dispatcher(
                pool,
                router_id=self.replica_id,
                local_prefill_threshold=self.cfg.pools.local_prefill_threshold,
                short_prompts_to_idle_prefill=self.cfg.pools.short_prompts_to_idle_prefill,
            )
            dispatcher.start()
            frontend = RouterFrontend(
                self.cfg,
                dispatcher,
                model_dir,
                self.redis_url,
                advertise_host=self.node_ip if self.cfg.router.host == "0.0.0.0" else None,
            )
            try:
                endpoints = await frontend.start()
            except OSError as e:
                await asyncio.to_thread(dispatcher.stop)
                raise RuntimeError(
                    f"router replica {self.replica_id} on {self.node_ip}: cannot bind {self.cfg.router.host}:"
                    f"{self.cfg.router.http_port}/{self.cfg.router.grpc_port} ({e.strerror}); give each router "
                    f"node one unit of {self.cfg.cluster.router_resource}"
                ) from None
            self.dispatcher, self.frontend = dispatcher, frontend
            if os.environ.get("BATON_DRAIN_SOCKET"):  # the Helm chart's router pods: the preStop hook drains here
                self.drain_socket = DrainSocket(os.environ["BATON_DRAIN_SOCKET"], self.drain_for_pod_stop)
                await self.drain_socket.start()
            log.info("router replica %s serving at %s", self.replica_id, endpoints.http_url)
            return endpoints

    async def _gather_infos(self, pool: WorkerPool) -> None:
        """Every worker's info(), all under one timeout; the ones that answer are alive. Raises if
        no decode worker answered: nothing could be served (the supervisor starts it again)."""
        workers = pool.all()
        calls = [asyncio.ensure_future(asyncio.wrap_future(w.actor.info.remote().future())) for w in workers]
        done, waiting = await asyncio.wait(calls, timeout=self.info_timeout_s) if calls else (set(), set())
        for call in waiting:
            call.cancel()
        for w, call in zip(workers, calls):
            if call in done and call.exception() is None:
                w.info, w.alive = call.result(), True
            else:
                why = "no answer" if call in waiting else type(call.exception()).__name__
                log.warning(
                    "router replica %s: worker %s did not report (%s); serving without it until it does",
                    self.replica_id,
                    w.worker_id,
                    why,
                )
        if not any(w.alive for w in pool.decode):
            raise RuntimeError(
                f"router replica {self.replica_id}: no decode worker answered within {self.info_timeout_s:g}s"
            )

    async def status(self) -> ReplicaStatus:
        f = self.frontend
        ready = bool(f and f.router and f.router.readiness().ready)
        return ReplicaStatus(
            self.replica_id,
            f is not None,
            ready,
            self.node_ip,
            f.endpoints if f else None,
            self.dispatcher.num_in_flight if self.dispatcher else 0,
        )

    async def replace_worker(self, worker: WorkerRef) -> bool:
        """The supervisor started a new actor for a worker id whose actor died for good. The
        dispatcher's poller picks the new handle up, sees a new incarnation and migrates."""
        if self.dispatcher is None:
            return False
        w = self.dispatcher.pool.get(worker.worker_id)
        if w is None:
            return False
        with self.dispatcher.pool.lock:
            w.actor = worker.actor
        return True

    async def drain(self) -> int:
        return await self.frontend.drain() if self.frontend else 0

    async def drain_for_pod_stop(self) -> int:
        """The pod is going away: drain, and tell gRPC clients at once (GOAWAY) so they reconnect
        to another replica while their in-flight streams finish."""
        f = self.frontend
        if f is None:
            return 0
        goaway = f.grpc.stop(grace=self.cfg.router.drain_timeout_s) if f.grpc is not None else asyncio.sleep(0)
        aborted, _ = await asyncio.gather(f.drain(), goaway)
        return aborted

    async def stop(self) -> int:
        if self.drain_socket is not None:
            await self.drain_socket.stop()
            self.drain_socket = None
        if self.frontend is None:
            return 0
        aborted = await self.frontend.stop(drain=False)
        if self.dispatcher is not None:
            await asyncio.to_thread(self.dispatcher.stop)
        self.frontend = self.dispatcher = None
        return aborted
