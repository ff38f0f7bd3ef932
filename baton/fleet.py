"""``WorkerFleet``: the prefill and decode actors of one cluster, and the rendezvous store their
pair groups form from.

Shared by ``LocalCluster`` (``baton up``, tests: a Ray local instance, no custom resources) and the
``baton cluster`` supervisor (an existing Ray cluster, actors placed by the custom resources
``baton_prefill`` / ``baton_decode``). The store lives in this process, so a worker the fleet
replaces rejoins its peers without restarting them.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import torch.distributed as dist
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from baton.ray_ranks import RayRanks
from decode_worker.worker import DecodeWorker
from engine.config import EngineConfig
from kv_transfer.data_plane import DataPlaneFactory
from kv_transfer.peer import StoreAddress
from prefill_worker.worker import PrefillWorker
from router.worker_pool import WorkerHandle, WorkerPool

log = logging.getLogger(__name__)


# Ray keeps resource amounts to four decimals: a rank's share is rounded down to that.
_RAY_UNITS = 10_000


def rank_share(total: float, ranks: int) -> float:
    """One rank's even share of a worker's ``total``, rounded down to Ray's precision so that the
    ranks' bundles never sum above what the worker was given (1 over 3 ranks: 0.3333 each)."""
    return (round(total * _RAY_UNITS) // ranks) / _RAY_UNITS


@dataclass(frozen=True)
class PoolSpec:
    """One pool's size and what each of its workers asks of Ray. A worker's cpus, gpus and
    resources are its whole group's: split evenly across its ranks' bundles."""

    role: str  # "prefill" | "decode"
    workers: int
    cpus: float = 1.0
    gpus: float = 0.0
    threads: int = 1  # torch threads per worker on CPU
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    tensor_parallel_size: int = 1  # ranks a worker spans: each rank's bundle holds 1/N of the above

    def totals(self) -> dict[str, float]:
        """What one worker (all of its ranks, on one node) asks of Ray."""
        return {k: v for k, v in {"CPU": self.cpus, "GPU": self.gpus, **self.resources}.items() if v}

    def bundle(self) -> dict[str, float]:
        """What one rank asks of Ray (a bundle of the worker's placement group; the worker itself,
        rank 0, asks the first bundle's)."""
        return {k: rank_share(v, self.tensor_parallel_size) for k, v in self.totals().items()}

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError(f"unknown pool role {self.role!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"pools.{self.role}.tensor_parallel_size: {self.tensor_parallel_size} is too few")
        if self.workers < (1 if self.role == "decode" else 0):
            raise ValueError(f"pools.{self.role}.workers: {self.workers} is too few")
        for name, share in self.bundle().items():
            if not share:  # Ray would read a zero as "none of it": the rank would go unplaced by it
                raise ValueError(
                    f"pools.{self.role}: {name}={self.totals()[name]:g} split across "
                    f"{self.tensor_parallel_size} ranks leaves a rank none of it"
                )


@dataclass(frozen=True)
class FleetOptions:
    transfer_timeout_s: float = 10.0
    max_restarts: int = 0  # Ray's own restarts of a dead actor, before the fleet replaces it
    start_timeout_s: float = 300.0
    # Disaggregated (a prefill pool exists): the most prompt tokens a decode worker's step computes
    # for its local prefills (SchedulerConfig.prefill_token_budget). None: its whole step budget.
    decode_prefill_token_budget: int | None = None
    actor_name_prefix: str | None = None  # named actors (``baton cluster``): PREFIX-prefill-0, ...
    kv_data_plane: DataPlaneFactory | None = None  # tests: kv_transfer.nccl_double.NcclSemantics(); None: NCCL/gloo


class WorkerFleet:
    def __init__(
        self,
        engine: EngineConfig,
        prefill: PoolSpec,
        decode: PoolSpec,
        options: FleetOptions = FleetOptions(),
        progress: Callable[[str], None] | None = None,
        on_spawn: Callable[[str, str, dict[str, float]], None] | None = None,
    ) -> None:
        self.engine = engine
        # (worker id, Ray actor name, resource demand) of each named actor created: the placement watch
        self.on_spawn = on_spawn
        self.specs = {"prefill": prefill, "decode": decode}
        self.options = options
        self.say = progress or (lambda m: log.info(m))
        self._store = dist.TCPStore(
            "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
        )
        self.store = StoreAddress(driver_ip(), self._store.port)
        self.pool = WorkerPool([], [])
        self.replacements = 0
        # Worker id -> the placement group of its tensor-parallel ranks (TP > 1): removed with it.
        self._groups: dict[str, PlacementGroup] = {}

    # -- starting -----------------------------------------------------------------------------
    def start(self) -> WorkerPool:
        """Start every actor and wait for all of them to load. Raises RuntimeError naming what the
        cluster lacks if they do not start in time."""
        for role in ("prefill", "decode"):
            handles = [
                WorkerHandle(f"{role}-{i}", role, self._spawn(role, f"{role}-{i}"))
                for i in range(self.specs[role].workers)
            ]
            getattr(self.pool, role).extend(handles)
        try:
            infos = ray.get([w.actor.info.remote() for w in self.pool.all()], timeout=self.options.start_timeout_s)
        except GetTimeoutError:
            self.kill_all()
            raise RuntimeError(
                f"the workers did not start within {self.options.start_timeout_s:.0f}s; "
                f"the Ray cluster needs {self._demand()}"
            ) from None
        except RayActorError as e:  # its __init__ raised (a bad model, say): that error, not Ray's dump
            self.kill_all()
            raise RuntimeError(f"a worker failed to start: {_raised_in(e)}") from None
        for w, info in zip(self.pool.all(), infos):
            w.info, w.alive = info, True
        return self.pool

    def _demand(self) -> str:
        parts = []
        for role, spec in self.specs.items():
            if spec.workers:
                want = ", ".join(f"{k}={v:g}" for k, v in spec.totals().items())
                ranks = (
                    f" (split across its {spec.tensor_parallel_size} ranks, on one node)"
                    if spec.tensor_parallel_size > 1
                    else ""
                )
                parts.append(f"{spec.workers} {role} worker(s) with {want} each{ranks}")
        return " and ".join(parts) + " free"

    def _engine_for(self, role: str) -> EngineConfig:
        spec = self.specs[role]
        engine = replace(
            self.engine,
            num_threads=spec.threads if not spec.gpus else None,
            tensor_parallel_size=spec.tensor_parallel_size,
        )
        if spec.gpus and engine.device == "auto":
            # A worker given GPUs must use one: "auto" fell back to the CPU (a CPU image or torch
            # build on GPU nodes) and served on CPU while holding the GPUs. It fails to start instead.
            engine = replace(engine, device="cuda")
        if spec.tensor_parallel_size > 1 and engine.cache.shared_memory:
            # A group's caches are its ranks' heads each: no same-host peer maps them (kv_transfer/
            # identity.py), and a rank's segment would outlive a rank that is killed.
            engine = replace(engine, cache=replace(engine.cache, shared_memory=False))
        gpus = spec.bundle().get("GPU", 0.0)  # a rank's share
        if 0 < gpus < 1:  # workers sharing a GPU: each sizes its KV from its share (engine/kv_memory.py)
            engine = replace(engine, cache=replace(engine.cache, gpu_fraction=gpus))
        if role == "prefill":  # its requests stop at their first token: no decode step for CUDA graphs to replay
            engine = replace(engine, cuda_graphs=False)
        budget = self.options.decode_prefill_token_budget
        if role == "decode" and budget and self.specs["prefill"].workers:
            engine = replace(engine, scheduler=replace(engine.scheduler, prefill_token_budget=budget))
        return engine

    def _spawn(self, role: str, worker_id: str) -> Any:  # a Ray ActorHandle: its methods are typed at run time only
        opts = self._actor_options(role, worker_id)
        transfer: dict[str, Any] = (
            {} if self.options.kv_data_plane is None else {"data_plane": self.options.kv_data_plane}
        )
        if self.specs[role].tensor_parallel_size > 1:
            transfer["ranks"] = RayRanks  # the worker is rank 0: it starts ranks 1..N-1 (baton/ray_ranks.py)
        if role == "prefill":
            return (
                ray.remote(PrefillWorker)
                .options(**opts)
                .remote(worker_id, self._engine_for(role), self.store, **transfer)
            )
        return (
            ray.remote(DecodeWorker)
            .options(**opts)
            .remote(
                worker_id,
                self._engine_for(role),
                self.store,
                transfer_timeout_s=self.options.transfer_timeout_s,
                **transfer,
            )
        )

    def _actor_options(self, role: str, worker_id: str) -> dict[str, Any]:
        """What a worker's actor asks of Ray; at TP above 1 it also creates the worker's placement
        group (one bundle per rank, STRICT_PACK: a group meets on one node), removed with it."""
        spec = self.specs[role]
        own = spec.bundle()  # the worker is rank 0: it asks the first bundle's share (all of it at TP 1)
        opts: dict[str, Any] = dict(
            num_cpus=own.pop("CPU", 0.0),
            num_gpus=own.pop("GPU", 0.0),
            max_restarts=self.options.max_restarts,
            max_concurrency=16,
        )
        if own:
            opts["resources"] = own
        if self.options.actor_name_prefix:
            # A replacement reuses the name: the dead actor's name is free once Ray gives up on it.
            suffix = f"-r{self.replacements}" if self.replacements else ""
            opts["name"] = f"{self.options.actor_name_prefix}-{worker_id}{suffix}"
            if self.on_spawn is not None:
                # A group packs its ranks onto one node: that node must offer the worker's totals.
                self.on_spawn(worker_id, opts["name"], spec.totals())
        if spec.tensor_parallel_size > 1:
            group = placement_group([spec.bundle()] * spec.tensor_parallel_size, strategy="STRICT_PACK")
            self._groups[worker_id] = group
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        return opts

    # -- supervision --------------------------------------------------------------------------
    def dead_workers(
        self,
        timeout_s: float = 30.0,
        skip: Collection[str] = frozenset(),
        wait: Callable[[list[Any]], Collection[Any]] | None = None,
    ) -> list[WorkerHandle]:
        """Workers whose actor is gone for good (Ray will not restart it). A restarting actor or a
        slow one is not dead: Ray restarts within ``max_restarts``, and the routers notice the new
        incarnation themselves. ``skip``: worker ids not to ask (replacements still loading).
        ``wait``: returns the answered pings (the supervisor's round: one deadline shared by all its
        probes, cut short by a stop); by default they all share ``timeout_s``."""
        handles = [w for w in self.pool.all() if w.worker_id not in skip]
        refs = [w.actor.ping.remote() for w in handles]
        if not refs:
            return []
        answered = set(wait(refs) if wait is not None else ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0])
        dead = []
        for w, ref in zip(handles, refs):
            if ref not in answered:
                continue  # slow or unreachable now: not known dead
            try:
                ray.get(ref, timeout=0)
            except RayActorError as e:
                if not _is_restarting(e):
                    dead.append(w)
            except (GetTimeoutError, RayError):
                continue
        return dead

    def replace(self, w: WorkerHandle) -> Any:
        """Start a new actor under the same worker id (it rejoins its peers through the store) and
        return its handle; the caller hands it to the routers."""
        self.replacements += 1
        self.say(f"worker {w.worker_id} is dead: starting a replacement")
        kill_actor(w.actor)
        self._remove_group(w.worker_id)  # (its ranks' actors go with it)
        actor = self._spawn(w.role, w.worker_id)
        w.actor = actor
        return actor

    def kill_all(self, shutdown_timeout_s: float = 5.0) -> None:
        """Stop every worker: ``shutdown`` first (it frees what the process holds outside itself,
        such as a /dev/shm KV segment, which a kill would leave behind), then kill."""
        calls = []
        for w in self.pool.all():
            try:
                calls.append(w.actor.shutdown.remote())
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        if calls:
            ray.wait(calls, num_returns=len(calls), timeout=shutdown_timeout_s)
        for w in self.pool.all():
            kill_actor(w.actor)
            self._remove_group(w.worker_id)

    def _remove_group(self, worker_id: str) -> None:
        group = self._groups.pop(worker_id, None)
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - already removed (Ray shut down)
                pass


def kill_actor(actor) -> None:
    """Kill for good (no Ray restart); an actor that is already gone is fine."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _is_restarting(error: RayActorError) -> bool:
    # ActorUnavailableError: the actor is restarting (or unreachable for a moment), not dead.
    return type(error).__name__ == "ActorUnavailableError"


def driver_ip() -> str:
    return os.environ.get("BATON_NODE_IP") or ray.util.get_node_ip_address()


def _raised_in(error: BaseException) -> str:
    """The exception a Ray actor's constructor raised, from the traceback text Ray reports it in."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        m = re.match(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", line)
        if m:
            return f"{m.group(2)} ({m.group(1)})"
    return lines[-1] if lines else type(error).__name__
