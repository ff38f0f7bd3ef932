"""``python -m baton cluster``: Baton on an existing Ray cluster (what ``ray job submit`` runs).

(Over 400 lines as one concept: the supervision round and the start and stop around it; the fleet,
placement watch, Redis and router replicas are their own modules.)

The supervisor is the job's driver. It connects to ``RAY_ADDRESS``, starts Redis if no URL is
configured (on this node, with a generated password), places the prefill and decode actors on
nodes offering ``baton_prefill`` / ``baton_decode`` and the router replicas on ``baton_router``,
then supervises:

- a worker whose actor is gone for good (Ray's own ``max_restarts`` spent, or killed) is replaced
  under the same worker id; the replicas get the new handle and migrate its requests;
- a router replica that Ray restarted (empty) is started again; one that is gone is respawned;
- an actor Ray has not placed within ``cluster.pending_report_s`` is named in the job log with
  the resources it needs and why no node fits it (baton/placement_watch.py);
- its own record in the Redis registry (role ``supervisor``: replicas, endpoints, replacements,
  unplaced actors) is refreshed, so operators and replicas see the layout; worker records are kept
  by the replicas' heartbeats and expire on their own when a worker dies.

A round fires every probe (worker pings, replica statuses) at once and waits for them against one
deadline (``cluster.round_timeout_s``); what has not answered by then is looked at next round. A
stop signal ends the wait at once, so a round never holds a stop past Ray's stop wait.

SIGTERM / SIGINT (``ray job stop``, a pod's termination) drain: every replica stops admitting and
finishes what is in flight (``router.drain_timeout_s``), then the actors are stopped and the
process exits 0. The actors are not detached: if the driver dies, Ray removes them with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from baton.config import BatonConfig, ConfigError
from baton.fleet import FleetOptions, PoolSpec, WorkerFleet, driver_ip, kill_actor
from baton.frontend import with_password
from baton.placement_watch import PlacementWatch, WatchedActor
from baton.redis_server import EmbeddedRedis, RedisServerError
from baton.router_replica import ReplicaStatus, RouterReplica, WorkerRef
from router.state.connection import RedisState
from router.state.registry import WorkerRegistry
from router.worker_pool import WorkerHandle

log = logging.getLogger(__name__)

SUPERVISOR_ID = "supervisor"


@dataclass(frozen=True)
class RoundClock:
    """One supervision round's time: its probes are waited for against one deadline, and a stop
    request ends every wait at once."""

    deadline: float
    stopping: threading.Event
    slice_s: float = 0.2  # how often a wait looks at ``stopping``

    @property
    def over(self) -> bool:
        return self.stopping.is_set() or time.monotonic() >= self.deadline

    def wait(self, refs: list[Any]) -> Collection[Any]:
        """The refs that are ready by the deadline (or by a stop, whichever comes first)."""
        ready: list[Any] = []
        pending = list(refs)
        while pending and not self.stopping.is_set():
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=min(self.slice_s, left))
            ready.extend(done)
        return ready


class ClusterSupervisor:
    def __init__(self, cfg: BatonConfig, progress: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.say = progress or (lambda m: log.info(m))
        self.redis: EmbeddedRedis | None = None
        self.redis_url = ""
        self.fleet: WorkerFleet | None = None
        self.replicas: list = []  # RouterReplica actor handles, index = replica number
        self.endpoints: dict[str, str] = {}
        self._registry: WorkerRegistry | None = None
        # Replacements loading: worker id -> (its handle, its info() call, when to give up on it).
        self._pending: dict[str, tuple[WorkerHandle, ray.ObjectRef, float]] = {}
        self.stopping = threading.Event()  # a stop signal: a round in progress stops waiting at once
        self.placement = PlacementWatch(self.say, cfg.cluster.pending_report_s)

    # -- start --------------------------------------------------------------------------------
    def connect(self) -> None:
        """Join the Ray cluster (on the main thread: Ray sets its signal handlers there)."""
        cc = self.cfg.cluster
        self.cfg.lane_policy()  # secrets resolve here: a missing key fails before anything is placed
        address = cc.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
        self.say(f"connecting to the Ray cluster at {address}")
        if not ray.is_initialized():
            check_reachable(address)
            try:
                ray.init(address=address, namespace=cc.namespace, log_to_driver=True, configure_logging=False)
            except ConnectionError as e:
                raise RuntimeError(f"cluster.ray_address / RAY_ADDRESS {address!r}: {e}") from None

    def start(self) -> None:
        cfg, cc = self.cfg, self.cfg.cluster
        if not ray.is_initialized():
            self.connect()
        self._check_resources()
        self.placement.start(interval_s=min(5.0, cc.pending_report_s / 4))
        if cfg.redis.url is None:
            # Replicas on other nodes must reach it: bind this node's address, with a password.
            self.redis = EmbeddedRedis(bind=driver_ip(), password=secrets.token_urlsafe(18)).start()
            self.redis_url = self.redis.url
            self.say(f"started redis-server on {driver_ip()}:{self.redis.port} (set redis.url to use your own)")
        else:
            self.redis_url = with_password(cfg.redis.url, cfg.redis_password())
        p, d = cfg.pools.prefill, cfg.pools.decode
        self.fleet = WorkerFleet(
            cfg.engine_config(),  # model path unresolved: each worker resolves it on its own node
            PoolSpec(
                "prefill",
                p.workers,
                p.cpus,
                p.gpus,
                p.threads,
                {cc.prefill_resource: 1.0},
                cfg.pool_tensor_parallel_size("prefill"),
            ),
            PoolSpec(
                "decode",
                d.workers,
                d.cpus,
                d.gpus,
                d.threads,
                {cc.decode_resource: 1.0},
                cfg.pool_tensor_parallel_size("decode"),
            ),
            FleetOptions(
                cfg.pools.transfer_timeout_s,
                cfg.pools.max_restarts,
                cc.start_timeout_s,
                decode_prefill_token_budget=cfg.pools.decode_prefill_token_budget,
                actor_name_prefix=cfg.redis.cluster_name,
            ),
            self.say,
            on_spawn=lambda worker_id, name, demand: self.placement.watch(WatchedActor(worker_id, name, demand)),
        )
        self._registry = WorkerRegistry(RedisState(self.redis_url, cfg.redis.cluster_name))
        self.say(f"starting {p.workers} prefill and {d.workers} decode workers ({cfg.model.path})")
        self.fleet.start()
        self.say(f"starting {cfg.router.replicas} router replica(s)")
        self.replicas = [self._spawn_replica(i) for i in range(cfg.router.replicas)]
        try:
            endpoints = ray.get([r.start.remote(self.worker_refs()) for r in self.replicas], timeout=cc.start_timeout_s)
        except GetTimeoutError:
            raise RuntimeError(
                f"the router replicas did not start within {cc.start_timeout_s:.0f}s; the Ray "
                f"cluster needs {cfg.router.replicas} node(s) offering {cc.router_resource}=1 "
                f"and {cc.router_cpus:g} CPU"
            ) from None
        for i, e in enumerate(endpoints):
            self.endpoints[f"router-{i}"] = e.http_url
            self.say(f"router-{i}: OpenAI API at {e.http_url}/v1, gRPC at {e.grpc_target}")

    def _check_resources(self) -> None:
        """Say early which custom resource the cluster lacks (an autoscaler may still add it)."""
        cc, pools = self.cfg.cluster, self.cfg.pools
        have = ray.cluster_resources()
        need = {
            cc.router_resource: self.cfg.router.replicas,
            cc.prefill_resource: pools.prefill.workers,
            cc.decode_resource: pools.decode.workers,
        }
        for name, n in need.items():
            if n and have.get(name, 0) < n:
                self.say(
                    f"warning: the Ray cluster offers {have.get(name, 0):g} {name}, {n} needed; waiting for "
                    f"nodes with it (start them with --resources='{{\"{name}\": 1}}')"
                )

    def _spawn_replica(self, i: int):
        cc = self.cfg.cluster
        name = f"{self.cfg.redis.cluster_name}-router-{i}"
        cls = ray.remote(RouterReplica).options(
            name=name,
            num_cpus=cc.router_cpus,
            resources={cc.router_resource: 1.0},
            max_restarts=-1,
            max_concurrency=32,
            # Its dispatcher blocks in ray.get on threads of its own, never on the event loop.
            runtime_env={"env_vars": {"RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}},
        )
        self.placement.watch(WatchedActor(f"router-{i}", name, {"CPU": cc.router_cpus, cc.router_resource: 1.0}))
        return cls.remote(f"router-{i}", self.cfg, self.redis_url)

    def worker_refs(self) -> list[WorkerRef]:
        return [WorkerRef(w.worker_id, w.role, w.actor) for w in self._fleet().pool.all()]

    def _fleet(self) -> WorkerFleet:
        if self.fleet is None:
            raise RuntimeError("the supervisor has not started its workers")
        return self.fleet

    # -- supervision --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """A stop signal: the round in progress returns within a fraction of a second."""
        self.stopping.set()

    def supervise_once(self) -> None:
        """One round, bounded by ``cluster.round_timeout_s`` and ended early by ``request_stop``.
        Never blocks on a replacement that is still loading (it is checked again each round) and
        never raises: one replica or worker failing must not stop the others' care."""
        clock = RoundClock(time.monotonic() + self.cfg.cluster.round_timeout_s, self.stopping)
        statuses: list[Any] = []
        try:  # fired first, so that they run while the workers are probed
            statuses = [r.status.remote() for r in self.replicas]
        except Exception as e:  # noqa: BLE001 - logged; the next round tries again
            log.warning("supervision could not ask the replicas: %s", e)
        steps: list[Callable[[], None]] = [
            self._keep_redis,
            lambda: self._replace_dead_workers(clock),
            lambda: self._restart_replicas(clock, statuses),
        ]
        for name, step in zip(("keep_redis", "replace_dead_workers", "restart_replicas"), steps):
            if self.stopping.is_set():
                return
            try:
                step()
            except Exception as e:  # noqa: BLE001 - logged; the next round tries again
                log.warning("supervision step %s failed: %s", name, e)

    def _keep_redis(self) -> None:
        if self.redis is None:  # only the embedded one is ours to keep
            return
        try:
            code = self.redis.revive()
        except RedisServerError as e:
            self.say(f"the embedded redis-server is down and did not restart: {e}; retrying next round")
            return
        if code is not None:
            self.say(f"the embedded redis-server exited (code {code}); restarted it on port {self.redis.port}")

    def _replace_dead_workers(self, clock: RoundClock) -> None:
        # Replacements started in earlier rounds: handed to the routers once loaded; one that failed
        # or outran start_timeout_s is killed, so the next round sees it dead and starts another.
        for worker_id, (w, loaded, deadline) in list(self._pending.items()):
            if ray.wait([loaded], timeout=0)[0]:
                del self._pending[worker_id]
                try:
                    w.info = ray.get(loaded)
                except RayError as e:
                    self.say(f"replacement for {worker_id} failed to start: {type(e).__name__}; retrying next round")
                    kill_actor(w.actor)
                    continue
                self._tell_replicas(WorkerRef(w.worker_id, w.role, w.actor), clock)
                self.say(f"worker {worker_id} replaced")
            elif time.monotonic() > deadline:
                del self._pending[worker_id]
                self.say(
                    f"replacement for {worker_id} did not start within {self.cfg.cluster.start_timeout_s:.0f}s; "
                    "retrying next round"
                )
                kill_actor(w.actor)
        fleet = self._fleet()
        for w in fleet.dead_workers(skip=set(self._pending), wait=clock.wait):
            if self.stopping.is_set():
                return  # no replacement now: the cluster is stopping
            actor = fleet.replace(w)
            self._pending[w.worker_id] = (w, actor.info.remote(), time.monotonic() + self.cfg.cluster.start_timeout_s)

    def _tell_replicas(self, ref: WorkerRef, clock: RoundClock) -> None:
        """Each replica on its own: one that is gone or restarting misses it (a restarted replica is
        started with every current handle anyway), the others still get it. Waited for within the
        round; a call still running then lands on its own."""
        calls = [(i, r.replace_worker.remote(ref)) for i, r in enumerate(self.replicas)]
        answered = set(clock.wait([call for _, call in calls]))
        for i, call in calls:
            try:
                if call not in answered:
                    raise GetTimeoutError("no answer within the round")
                ray.get(call, timeout=0)
            except (RayError, GetTimeoutError) as e:
                log.warning("router-%d did not take the new %s (yet): %s", i, ref.worker_id, type(e).__name__)

    def _restart_replicas(self, clock: RoundClock, statuses: list[Any]) -> None:
        answered = set(clock.wait(statuses))
        for i, (r, call) in enumerate(zip(list(self.replicas), statuses)):
            if self.stopping.is_set():
                return
            if call not in answered:
                continue  # slow or unreachable this round: asked again next round
            try:
                status: ReplicaStatus = ray.get(call, timeout=0)
            except RayActorError as e:
                if type(e).__name__ == "ActorUnavailableError":
                    continue  # Ray is restarting it
                self.say(f"router-{i} is gone: starting a new one")
                self.replicas[i] = self._spawn_replica(i)
                self.replicas[i].start.remote(self.worker_refs())
                continue
            except (GetTimeoutError, RayError):
                continue
            if not status.started:
                self.say(f"router-{i} restarted: starting its servers again")
                r.start.remote(self.worker_refs())

    async def heartbeat(self) -> None:
        if self._registry is None:
            return
        fleet = self.fleet
        payload = {
            "routers": self.endpoints,
            "workers": [w.worker_id for w in fleet.pool.all()] if fleet else [],
            "replacements": fleet.replacements if fleet else 0,
            "model": self.cfg.model.path,
            "unplaced": self.placement.unplaced,
        }
        try:
            await self._registry.heartbeat(
                SUPERVISOR_ID, "supervisor", payload, 3 * self.cfg.cluster.supervise_interval_s
            )
        except Exception as e:  # noqa: BLE001 - Redis down: the cluster keeps serving; the record comes back with it
            log.warning("supervisor heartbeat failed: %s", e)

    async def remove_record(self) -> None:
        """The cluster is stopped: its registry record goes now, not when its TTL runs out."""
        if self._registry is not None:
            try:
                await self._registry.remove(SUPERVISOR_ID)
            except Exception as e:  # noqa: BLE001 - Redis away (or stopped with us): the TTL ends it
                log.warning("could not remove the supervisor's record: %s", e)

    # -- stop ---------------------------------------------------------------------------------
    def drain_and_stop(self) -> int:
        """Drain every started replica, then stop everything. Returns the requests aborted at the
        deadline. Each replica is waited for on its own: one that is dead does not cut the others'
        drain short, and one never placed (stopped during startup) is not waited for at all."""
        self.placement.stop()
        aborted = 0
        started = [(i, r) for i, r in enumerate(self.replicas) if f"router-{i}" in self.endpoints]
        if started:
            self.say("draining: the routers stop admitting and finish what is in flight")
            for method, allowed_s in (("drain", self.cfg.router.drain_timeout_s + 30), ("stop", 30.0)):
                deadline = time.monotonic() + allowed_s
                calls = [(i, getattr(r, method).remote()) for i, r in started]
                for i, call in calls:
                    try:
                        got = ray.get(call, timeout=max(1.0, deadline - time.monotonic()))
                        aborted += got if method == "drain" and isinstance(got, int) else 0
                    except (RayError, GetTimeoutError) as e:
                        log.warning("router-%d did not %s cleanly: %s", i, method, type(e).__name__)
        for r in self.replicas:
            kill_actor(r)
        if self.fleet is not None:
            self.fleet.kill_all()
        if self.redis is not None:
            self.redis.stop()
        if aborted:
            self.say(f"drain timeout: aborted {aborted} request(s)")
        return aborted


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) Ray address answers TCP within ``timeout_s``: else a
    clear error now. (``ray.init`` retried a dead address forever, logging a timeout every 41 s.)"""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto", "local" and the like: Ray resolves them itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise RuntimeError(
            f"cluster.ray_address / RAY_ADDRESS {address!r}: nothing answers at {host}:{port} "
            f"({reason}); is the Ray head running?"
        ) from None


def run_cluster(cfg: BatonConfig, progress: Callable[[str], None]) -> int:
    """Start, supervise until SIGTERM/SIGINT, drain, exit 0."""
    sup = ClusterSupervisor(cfg, progress)
    sup.connect()

    async def main() -> int:
        stop = asyncio.Event()
        # Before anything starts (ray.init, which installs Ray's own SIGTERM handler, ran in
        # connect): a signal during startup stops it cleanly too, not with Ray's abort.
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            stop.set()
            sup.request_stop()  # a round in progress (on its thread) stops waiting now

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        starting = asyncio.ensure_future(asyncio.to_thread(sup.start))
        stopped = asyncio.ensure_future(stop.wait())
        while not (starting.done() or stopped.done()):
            await asyncio.wait(
                {starting, stopped}, timeout=cfg.cluster.supervise_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
            await sup.heartbeat()  # while starting too: the record names the actors not placed yet
        if not starting.done():  # a signal while starting: stop what is up; the start then fails
            progress("shutting down during startup (signal received)")
            await asyncio.to_thread(sup.drain_and_stop)
            await asyncio.wait({starting}, timeout=30)
            progress("stopped")
            return 0
        stopped.cancel()
        try:
            starting.result()
        except BaseException:
            await asyncio.to_thread(sup.drain_and_stop)
            raise  # (baton.cli stops Ray's log stream before it prints the error)
        progress(
            f"ready: {len(sup.replicas)} router replica(s), "
            f"{cfg.pools.prefill.workers} prefill + {cfg.pools.decode.workers} decode workers"
        )
        interval = cfg.cluster.supervise_interval_s
        while not stop.is_set():
            await sup.heartbeat()
            t0 = time.monotonic()
            await asyncio.to_thread(sup.supervise_once)
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - t0)))
            except TimeoutError:
                pass
        progress("shutting down (signal received)")
        await asyncio.to_thread(sup.drain_and_stop)
        await sup.remove_record()
        progress("stopped")
        return 0

    try:
        return asyncio.run(main())
    except ConfigError:
        raise
    except KeyboardInterrupt:
        return 130
