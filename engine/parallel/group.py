"""A tensor-parallel group's collectives: its own ``torch.distributed`` process group over a
rendezvous store (no global world: a group formed again, after a rank died, simply uses a new key).

Two process groups where the device is CUDA: NCCL for the activations (all-reduce, the logits'
gather) and gloo for the step plans, which are bytes on the CPU; on CPU gloo carries both. The
model calls only ``all_reduce_`` and ``gather_vocab`` (the ``ShardCollectives`` protocol). A
``CollectiveTimer`` set on a rank's group (``timer``, off by default) adds up the wall time those
two take on that rank (bench/tp_allreduce_share.py).
"""

from __future__ import annotations

import datetime
import pickle
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

# A rank waits for its next plan as long as the engine idles: no timeout worth naming.
_OP_TIMEOUT = datetime.timedelta(hours=24)


class ShardCollectives(Protocol):
    """What a sharded model needs from its group."""

    rank: int
    size: int

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor: ...

    def gather_vocab(self, t: torch.Tensor, vocab_size: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class GroupAddress:
    """Where a group meets: the rendezvous store and the group's key in it."""

    host: str
    port: int
    key: str


@dataclass
class CollectiveTimer:
    """Wall seconds and calls of a rank's all-reduces and logit gathers while it is set. On CUDA
    each timed call synchronizes the device before and after (NCCL's wait returns before the sum is
    done): a measuring aid, not for serving."""

    all_reduce_s: float = 0.0
    all_reduce_calls: int = 0
    gather_s: float = 0.0
    gather_calls: int = 0


def host_store(host: str = "127.0.0.1", timeout_s: float = 60.0) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free port (``store.port``)."""
    return dist.TCPStore(host, 0, is_master=True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def joined_key(key: str, rank: int) -> str:
    """The store key a rank sets as it starts forming its group."""
    return f"{key}/joined/{rank}"


class RankGroup:
    """One rank's view of its group."""

    def __init__(self, store: dist.Store, key: str, rank: int, size: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.timer: CollectiveTimer | None = None
        self._store = store  # kept alive: the groups use it
        # (Any: torch's stubs omit the process groups' collective methods.)
        self.cpu: Any = dist.ProcessGroupGloo(dist.PrefixStore(f"{key}/cpu", store), rank, size, _OP_TIMEOUT)
        self.dev: Any = self.cpu
        if device.type == "cuda":
            nccl: Any = dist.ProcessGroupNCCL
            self.dev = nccl(dist.PrefixStore(f"{key}/dev", store), rank, size)

    @classmethod
    def join(
        cls, address: GroupAddress, rank: int, size: int, device: torch.device, timeout_s: float = 60.0
    ) -> RankGroup:
        store = dist.TCPStore(
            address.host,
            address.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        store.set(joined_key(address.key, rank), "1")
        return cls(store, address.key, rank, size, device)

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place; returns it."""
        if self.size > 1:
            timer, start = self.timer, self._started()
            self.dev.allreduce([t]).wait()
            if timer is not None:
                timer.all_reduce_s += self._since(start)
                timer.all_reduce_calls += 1
        return t

    def _started(self) -> float:
        if self.timer is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _since(self, start: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def gather_vocab(self, t: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Every rank's ``[rows, its vocabulary range]`` logits -> ``[rows, vocab_size]`` on every rank
        (ranges padded to one length for the gather, then cut)."""
        if self.size == 1:
            return t
        width = -(-vocab_size // self.size)
        if t.shape[-1] != width:
            t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        timer, start = self.timer, self._started()
        self.dev.allgather([parts], [t]).wait()
        if timer is not None:
            timer.gather_s += self._since(start)
            timer.gather_calls += 1
        return torch.cat(parts, dim=-1)[..., :vocab_size]

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled: the step plans are small)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
            n = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            n = torch.zeros(1, dtype=torch.int64)
        self.cpu.broadcast([n], opts).wait()
        if self.rank != 0:
            data = torch.empty(int(n.item()), dtype=torch.uint8)
        self.cpu.broadcast([data], opts).wait()
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())

    def min_int(self, value: int) -> int:
        """The smallest ``value`` of all ranks (e.g. how many KV blocks every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MIN)
        self.cpu.allreduce([t], opts).wait()
        return int(t.item())
