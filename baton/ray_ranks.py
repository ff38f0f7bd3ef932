"""A pool worker's tensor-parallel group: ranks 1..N-1 as Ray actors, in the placement group the
worker (rank 0) was placed in, one bundle per rank (STRICT_PACK: one node, so the group meets at
a store on the loopback address). ``baton/fleet.py`` creates the placement group and removes it
when the worker is replaced or stopped.

The same interface as ``LocalRanks``. A rank that dies fails the whole worker: a watcher thread
sees its actor's ``run`` end and exits this process, so the fleet replaces the worker under the
same id and the router migrates its requests, exactly as for a one-process worker that died (a
group short of a rank can run no step). It lives beside the fleet, not in engine/: the engine
imports no Ray, and the fleet hands this class to a worker as its rank starter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.config import EngineConfig
from engine.model_loader import pick_device
from engine.parallel.group import GroupAddress, RankGroup, host_store, joined_key
from engine.parallel.local_ranks import RankLost, RankPlan, check_model
from engine.parallel.rank_loop import RankSetup, run_rank

log = logging.getLogger(__name__)

_JOIN_S = 30.0
_START_S = 600.0  # a rank's actor imports torch and loads its shard before it joins


class RankActor:
    """A Ray actor holding one rank: ``run`` returns when rank 0 sends the stop plan."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, config: EngineConfig, address: GroupAddress, rank: int) -> None:
        # Ray gives the actor its GPU as device 0 (CUDA_VISIBLE_DEVICES); on CPU, the CPU.
        run_rank(config, address, rank, device=pick_device(config.device))


def _started(pids: list[Any]) -> list[int]:
    try:
        return list(ray.get(pids, timeout=_START_S))
    except GetTimeoutError:
        raise RuntimeError(f"tensor-parallel ranks' actors did not start within {_START_S:.0f}s") from None


def _exit_process(reason: str) -> None:
    log.error("%s: this worker exits so that it is replaced", reason)
    logging.shutdown()
    os._exit(70)


class RayRanks:
    def __init__(self, config: EngineConfig, on_lost: Callable[[str], None] = _exit_process) -> None:
        size = config.tensor_parallel_size
        check_model(config)
        pg = get_current_placement_group()
        if pg is None or len(pg.bundle_specs) < size:
            raise RuntimeError(
                f"tensor_parallel_size={size}: a pool worker's ranks need a Ray placement group with "
                f"{size} bundles, the worker in the first (baton/fleet.py creates it)"
            )
        self._store = host_store()
        address = GroupAddress("127.0.0.1", self._store.port, f"tp-{uuid.uuid4().hex}")
        self._closing = threading.Event()
        remote: Any = ray.remote(RankActor)
        self.actors: list[Any] = []
        for rank in range(1, size):
            bundle = dict(pg.bundle_specs[rank])
            self.actors.append(
                remote.options(
                    num_cpus=bundle.pop("CPU", 0),
                    num_gpus=bundle.pop("GPU", 0),
                    resources={k: v for k, v in bundle.items() if not k.startswith(("memory", "object_store"))},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                    max_restarts=0,
                ).remote()
            )
        # Asked before ``run`` (an actor runs its calls in order): ``run`` holds the actor until the stop.
        pids = [a.pid.remote() for a in self.actors]
        self.runs = [a.run.remote(config, address, rank) for rank, a in enumerate(self.actors, start=1)]
        try:
            # The ranks' processes (ranks 1..N-1), for operators and for tests that kill one: Ray's
            # own actor listing needs the dashboard, which a cluster may run without.
            self.pids: list[int] = _started(pids)
            self._wait_for_ranks(address.key)
            self.group = RankGroup(self._store, address.key, 0, size, pick_device(config.device))
        except BaseException:
            self._kill()
            raise
        threading.Thread(target=self._watch, args=(on_lost,), name="tp-rank-watch", daemon=True).start()

    def _wait_for_ranks(self, key: str) -> None:
        deadline = time.monotonic() + _START_S
        waiting = set(range(1, len(self.actors) + 1))
        while waiting:
            waiting = {r for r in waiting if not self._store.check([joined_key(key, r)])}
            done, _ = ray.wait(self.runs, num_returns=1, timeout=0)
            if done:
                ray.get(done[0])  # raises the rank's own error
                raise RuntimeError("a tensor-parallel rank ended while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks {sorted(waiting)} did not start within {_START_S:.0f}s")
            if waiting:
                time.sleep(0.05)

    def _watch(self, on_lost: Callable[[str], None]) -> None:
        done, _ = ray.wait(self.runs, num_returns=1)
        if self._closing.is_set():
            return
        rank = self.runs.index(done[0]) + 1
        on_lost(f"tensor-parallel rank {rank} ended")

    def start_steps(self, eos_token_ids: tuple[int, ...]) -> None:
        self.group.broadcast_object(RankSetup(tuple(eos_token_ids)))

    def broadcast_plan(self, plan: RankPlan) -> None:
        try:
            self.group.broadcast_object(plan)
        except RuntimeError as e:  # gloo: a peer's connection reset
            raise RankLost(f"the tensor-parallel group failed: {str(e).splitlines()[0]}") from e

    def alive(self) -> bool:
        return not ray.wait(self.runs, num_returns=1, timeout=0)[0]

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        if self.alive():
            try:
                self.group.broadcast_object(None)
                ray.wait(self.runs, num_returns=len(self.runs), timeout=_JOIN_S)
            except RuntimeError:  # a rank is gone: the others are killed below
                pass
        self._kill()

    def _kill(self) -> None:
        self._closing.set()
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
