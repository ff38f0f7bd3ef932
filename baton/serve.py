"""``baton up``: one process runs it all — an embedded redis-server (unless a URL is given), a Ray
local cluster with the prefill and decode pools, and the router serving OpenAI-compatible HTTP and
gRPC on one event loop. SIGINT/SIGTERM drain: stop admitting (503 + Retry-After, /ready 503), let
in-flight requests finish up to ``router.drain_timeout_s``, then exit."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from baton.cluster import ClusterConfig, LocalCluster
from baton.config import BatonConfig
from baton.frontend import Endpoints, RouterFrontend, served_name, with_password
from baton.redis_server import EmbeddedRedis
from router.dispatcher import Dispatcher

log = logging.getLogger(__name__)

__all__ = ["BatonServer", "Endpoints", "serve_forever"]


class BatonServer:
    def __init__(
        self, cfg: BatonConfig, progress: Callable[[str], None] | None = None, router_id: str = "router-0"
    ) -> None:
        self.cfg = cfg
        self.say = progress or (lambda m: log.info(m))
        self.router_id = router_id
        self.redis: EmbeddedRedis | None = None
        self.cluster: LocalCluster | None = None
        self.frontend: RouterFrontend | None = None
        self.redis_url = ""
        self._redis_watch: asyncio.Task | None = None

    # The frontend's parts, for tests and benchmarks.
    @property
    def router(self):
        return self.frontend.router if self.frontend else None

    @property
    def http(self):
        return self.frontend.http if self.frontend else None

    @property
    def grpc(self):
        return self.frontend.grpc if self.frontend else None

    @property
    def endpoints(self) -> Endpoints | None:
        return self.frontend.endpoints if self.frontend else None

    @property
    def served_name(self) -> str:
        return served_name(self.cfg)

    async def start(self) -> Endpoints:
        cfg = self.cfg
        cfg.lane_policy()  # resolves secrets now: a missing key fails before anything starts
        if not self.frontend:  # what would fail only after the cluster loaded: checked first
            preflight(cfg)
        for note in local_notes(cfg):
            self.say(note)
        t0 = time.monotonic()
        url = cfg.redis.url
        if url is None:
            self.say("starting the embedded redis-server")
            self.redis = redis = await asyncio.to_thread(lambda: EmbeddedRedis().start())
            url = redis.url
            self._redis_watch = asyncio.create_task(self._keep_redis_up(redis), name="redis-watch")
        self.redis_url = with_password(url, cfg.redis_password())
        self.say(
            f"loading {cfg.model.path} into {cfg.pools.prefill.workers} prefill + "
            f"{cfg.pools.decode.workers} decode workers (Ray local)"
        )
        cluster_cfg = ClusterConfig(
            prefill_workers=cfg.pools.prefill.workers,
            decode_workers=cfg.pools.decode.workers,
            engine=cfg.engine_config(),
            gpus_per_worker=cfg.pools.decode.gpus,
            cpus_per_worker=cfg.pools.decode.cpus,
            torch_threads_per_worker=cfg.pools.decode.threads,
            prefill_gpus_per_worker=cfg.pools.prefill.gpus,
            prefill_cpus_per_worker=cfg.pools.prefill.cpus,
            prefill_torch_threads_per_worker=cfg.pools.prefill.threads,
            local_prefill_threshold=cfg.pools.local_prefill_threshold,
            short_prompts_to_idle_prefill=cfg.pools.short_prompts_to_idle_prefill,
            decode_prefill_token_budget=cfg.pools.decode_prefill_token_budget,
            transfer_timeout_s=cfg.pools.transfer_timeout_s,
            max_restarts=cfg.pools.max_restarts,
            prefill_tensor_parallel_size=cfg.pool_tensor_parallel_size("prefill"),
            decode_tensor_parallel_size=cfg.pool_tensor_parallel_size("decode"),
        )
        # On the main thread, blocking: Ray installs its handlers there, and nothing else runs yet.
        self.cluster = LocalCluster(cluster_cfg, self.say, self.router_id)
        endpoints = await self._start_frontend(self.cluster, self.cluster.dispatcher)
        self.say(
            f"ready in {time.monotonic() - t0:.0f}s: serving {self.served_name} — OpenAI API at "
            f"{endpoints.http_url}/v1, gRPC at {endpoints.grpc_target}"
        )
        return endpoints

    async def _start_frontend(
        self, cluster: LocalCluster, dispatcher: Dispatcher, job_idle_ms: int = 15_000
    ) -> Endpoints:
        # A restarted router keeps the ports the first one bound (tests ask for port 0).
        old = self.endpoints
        ports = (self.http.port, int(old.grpc_target.rsplit(":", 1)[1])) if old else (None, None)
        self.frontend = RouterFrontend(self.cfg, dispatcher, cluster.model_dir, self.redis_url, job_idle_ms=job_idle_ms)
        return await self.frontend.start(*ports)

    async def crash_router(self) -> None:
        """Tests: the router process dies — no drain, nothing acknowledged, its streams cut."""
        assert self.frontend is not None, "the server is not started"
        await self.frontend.stop(drain=False)
        await asyncio.to_thread(self.router.dispatcher.stop)

    async def restart_router(self, router_id: str, job_idle_ms: int = 15_000) -> None:
        """Tests: a new router replica (same ports) over the same pools and Redis."""
        cluster = self.cluster
        assert cluster is not None, "the server is not started"
        for w in cluster.pool.all():
            w.requests.clear()
            w.forget_dispatched()
        dispatcher = Dispatcher(
            cluster.pool,
            router_id=router_id,
            local_prefill_threshold=cluster.config.local_prefill_threshold,
            short_prompts_to_idle_prefill=cluster.config.short_prompts_to_idle_prefill,
        )
        dispatcher.start()
        await self._start_frontend(cluster, dispatcher, job_idle_ms)

    async def _keep_redis_up(self, redis: EmbeddedRedis, interval_s: float = 1.0) -> None:
        """The embedded redis-server is ours to keep: one that exits (killed, out of memory) is started
        again on the same port. Its state is gone (idempotency records, the batch journal) unless
        persistent; the routers ride it out in degraded mode and reconnect."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                code = await asyncio.to_thread(redis.revive)
            except Exception as e:  # noqa: BLE001 - try again next time; the routers stay degraded meanwhile
                log.warning("the embedded redis-server is down and did not restart: %s", e)
                continue
            if code is not None:
                self.say(f"the embedded redis-server exited (code {code}); restarted it on port {redis.port}")

    async def stop(self, drain: bool = True) -> None:
        if self._redis_watch is not None:
            self._redis_watch.cancel()
            await asyncio.gather(self._redis_watch, return_exceptions=True)
        if self.frontend is not None:
            if drain:
                self.say("draining: no new requests; finishing the ones in flight")
            aborted = await self.frontend.stop(drain=drain)
            if aborted:
                self.say(f"drain timeout: aborted {aborted} request(s)")
        if self.cluster is not None:
            if self.router is not None and self.router.dispatcher is not self.cluster.dispatcher:
                await asyncio.to_thread(self.router.dispatcher.stop)
            await asyncio.to_thread(self.cluster.shutdown)
        if self.redis is not None:
            await asyncio.to_thread(self.redis.stop)
        self.say("stopped")


def preflight(cfg: BatonConfig) -> None:
    """The router's ports are free and this machine has the GPUs the pools ask for (a local Ray has
    what the machine has); else an error naming the setting, before Redis, Ray and the workers start."""
    host = cfg.router.host
    for name, port in (("router.http_port", cfg.router.http_port), ("router.grpc_port", cfg.router.grpc_port)):
        if port:
            try:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                with socket.create_server((host, port), family=family):
                    pass
            except OSError as e:
                reason = (e.strerror or str(e)).split(" (while attempting")[0]
                raise OSError(f"{name} {port}: cannot listen on {host}:{port}: {reason}") from None
    # A worker's gpus are its whole group's (a tensor-parallel worker's ranks split them): no x TP here.
    need = sum(p.workers * p.gpus for p in (cfg.pools.prefill, cfg.pools.decode))
    if need:
        import torch

        have = torch.cuda.device_count()
        if need > have:
            raise ValueError(
                f"pools.*.gpus: the pools ask for {need:g} GPUs (workers x gpus) and this machine has {have}"
            )


def local_notes(cfg: BatonConfig) -> list[str]:
    """Settings ``baton up`` (one machine, one router) does not apply as written, said at start
    rather than silently."""
    notes = []
    if cfg.router.replicas > 1:
        notes.append(
            f"note: router.replicas is {cfg.router.replicas}; baton up runs one router (replicas are for baton cluster)"
        )
    cpus = sum(p.workers * p.cpus for p in (cfg.pools.prefill, cfg.pools.decode))
    have = os.cpu_count() or 1
    if cpus > have:
        notes.append(
            f"note: the pools ask for {cpus:g} CPUs (workers x cpus) and this machine has {have}: "
            "the workers will share them"
        )
    return notes


def serve_forever(cfg: BatonConfig, progress: Callable[[str], None]) -> int:
    """Run until SIGINT/SIGTERM, then drain and exit."""

    async def main() -> int:
        server = BatonServer(cfg, progress)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            await server.start()
        except BaseException:
            await server.stop(drain=False)
            raise
        # After start: Ray's core worker installs its own SIGTERM handler during ray.init.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        progress("shutting down (signal received; again to abort what is in flight)")
        forced = False

        def cut_drain() -> None:  # the second signal: stop waiting for the requests in flight
            nonlocal forced
            forced = True
            if server.router is not None:
                server.router.drain_cut = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, cut_drain)
        await server.stop(drain=True)
        return 130 if forced else 0

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
