"""The colocated engine's tensor-parallel group: ranks 1..N-1 as local processes (no Ray), rank 0
in the engine's own process, meeting at a rendezvous store rank 0 hosts.

Rank 0 owns the scheduler, the block manager and the step plan; ``broadcast_plan`` (the runner's
plan sink) sends each step's plan to the others before rank 0 runs it. ``close`` sends the plan
that stops them and waits for them; a rank still there after that is terminated.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
import weakref
from multiprocessing.process import BaseProcess

import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.model.registry import resolve_model
from engine.parallel.direct_kv import HandoffPlan
from engine.parallel.group import GroupAddress, RankGroup, host_store, joined_key
from engine.parallel.group_kv import KVExport, KVImport
from engine.parallel.layout import check_tensor_parallel
from engine.parallel.rank_loop import RankSetup, rank_device, run_rank
from engine.scheduler_output import SchedulerOutput

_JOIN_S = 30.0

# What rank 0 broadcasts: a step's plan, or a step of a pool worker's KV handoff (group_kv.py's
# interim one through rank 0, or direct_kv.py's rank to rank).
RankPlan = SchedulerOutput | KVExport | KVImport | HandoffPlan


class RankLost(RuntimeError):
    """A rank of the group died; the group (and its engine) is unusable."""


class LocalRanks:
    def __init__(self, config: EngineConfig) -> None:
        size = config.tensor_parallel_size
        check_model(config)  # before any rank starts: a size the model refuses fails here, alone
        self._store = host_store()
        address = GroupAddress("127.0.0.1", self._store.port, f"tp-{uuid.uuid4().hex}")
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads or locks
        self.processes: list[BaseProcess] = [
            ctx.Process(target=run_rank, args=(config, address, rank), name=f"baton-tp-rank-{rank}", daemon=True)
            for rank in range(1, size)
        ]
        for p in self.processes:
            p.start()
        self._finalizer = weakref.finalize(self, _terminate, self.processes)
        try:
            _wait_for_ranks(self._store, address.key, self.processes)
            self.group = RankGroup(self._store, address.key, 0, size, rank_device(config, 0))
        except BaseException:
            self._finalizer()
            raise

    def start_steps(self, eos_token_ids: tuple[int, ...]) -> None:
        """Once rank 0 has loaded: what the other ranks need before the first plan."""
        self.group.broadcast_object(RankSetup(tuple(eos_token_ids)))

    def broadcast_plan(self, plan: RankPlan) -> None:
        """Raises ``RankLost`` where a rank has died: a group short of a rank cannot run a step (its
        requests end with an error, engine.step's contract), nor any later one."""
        self._check_alive()
        try:
            self.group.broadcast_object(plan)
        except RuntimeError as e:  # gloo: a peer's connection reset
            self._check_alive()
            raise RankLost(f"the tensor-parallel group failed: {str(e).splitlines()[0]}") from e

    def alive(self) -> bool:
        """Whether every rank still runs (a group short of one runs no step again)."""
        return all(p.is_alive() for p in self.processes)

    def _check_alive(self) -> None:
        for rank, p in enumerate(self.processes, start=1):
            if not p.is_alive():
                raise RankLost(
                    f"tensor-parallel rank {rank} exited (exit code {p.exitcode}): the engine "
                    "cannot run steps; start a new one"
                )

    def close(self) -> None:
        if not self._finalizer.alive:
            return
        if all(p.is_alive() for p in self.processes):
            try:
                self.group.broadcast_object(None)
            except RuntimeError:  # a rank is gone: the others are terminated below
                pass
        for p in self.processes:
            p.join(_JOIN_S)
        self._finalizer()


def check_model(config: EngineConfig) -> None:
    model_cfg = ModelConfig.from_file(resolve_model(config.model) / "config.json")
    check_tensor_parallel(
        config.tensor_parallel_size,
        model_cfg.num_attention_heads,
        model_cfg.num_key_value_heads,
        model_cfg.intermediate_size,
    )


def _wait_for_ranks(store: dist.Store, key: str, processes: list[BaseProcess]) -> None:
    """Until every rank has reached the store (each says so before it forms the group, whose
    forming would otherwise wait for a rank that died starting up for as long as an idle step)."""
    waiting = {rank: p for rank, p in enumerate(processes, start=1)}
    delay = 0.005
    while waiting:
        for rank, p in list(waiting.items()):
            if store.check([joined_key(key, rank)]):
                del waiting[rank]
            elif not p.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} exited while starting (exit code {p.exitcode})")
        time.sleep(delay)  # (polling the store: a rank may take seconds to import torch)
        delay = min(0.1, delay * 2)


def _terminate(processes: list[BaseProcess]) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
        p.join(_JOIN_S)
