"""The local path: a peer on the same device reads the sender's KV cache directly.

NCCL refuses two ranks on one GPU, so a single GPU hosting both roles cannot use a pair group for
the payload. Instead each side exports its KV cache once (CUDA: an IPC handle from
``torch.multiprocessing.reductions.reduce_tensor``; CPU: the name of the POSIX shared-memory
segment the cache was allocated in, ``CacheConfig.shared_memory``) and the receiver maps the
sender's cache. The pair's control plane (gloo over CPU tensors) still carries the FIFO of
messages, and there is no data plane: a KV chunk's header is followed by the sender's block ids,
and the receiver copies those rows of the mapped cache into its reserved blocks (one
device-local gather, on the channel's receive stream).

Safety: the sender's blocks must hold their data until the receiver has copied them. The prefill
side keeps a request's blocks until the transfer is acknowledged, and re-ships a request's
blocks from the start after a preemption (recompute gives it fresh block ids; FIFO order makes the
later copies win). Device work is fenced by events on both sides: the sender's channel thread
waits for the event recorded after the step that wrote the blocks before it sends their ids, the
receiver's for the event after its copy before it acknowledges.

``locality`` says which peers can do this: equal non-empty strings mean the same GPU (by UUID) or
the same host with shared-memory caches (by boot id and hostname).
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path

import torch


def locality(kv_cache: torch.Tensor, segment_name: str | None) -> str:
    """Where a worker's KV cache can be mapped from; "" when it cannot be shared."""
    if kv_cache.device.type == "cuda":
        props = torch.cuda.get_device_properties(kv_cache.device)
        return f"cuda:{props.uuid}"
    if segment_name:
        return f"shm:{_boot_id()}:{socket.gethostname()}"
    return ""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


@dataclass(frozen=True)
class _ShmDescriptor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32"


def export_kv(kv_cache: torch.Tensor, segment_name: str | None) -> bytes:
    """A handle the peer turns back into a view of this cache (see ``open_peer_kv``)."""
    if kv_cache.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(kv_cache)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return pickle.dumps(("cuda", rebuild, args))
    if not segment_name:
        raise ValueError("a CPU KV cache can be exported only when allocated in shared memory")
    return pickle.dumps(
        ("shm", _ShmDescriptor(segment_name, tuple(kv_cache.shape), str(kv_cache.dtype).removeprefix("torch.")))
    )


class PeerKV:
    """The peer's KV cache, mapped into this process."""

    def __init__(self, handle: bytes) -> None:
        kind, *rest = pickle.loads(handle)
        self._map: mmap.mmap | None = None
        if kind == "cuda":
            rebuild, args = rest
            self.tensor: torch.Tensor = rebuild(*args)
        elif kind == "shm":
            (desc,) = rest
            # mmap the segment ourselves: opening it through multiprocessing.shared_memory would
            # register it with this process's resource tracker, which unlinks it when we exit.
            fd = os.open(f"/dev/shm/{desc.name.lstrip('/')}", os.O_RDWR)
            try:
                self._map = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            dtype = getattr(torch, desc.dtype)
            self.tensor = torch.frombuffer(self._map, dtype=dtype).view(desc.shape)
        else:
            raise ValueError(f"unknown KV export kind {kind!r}")

    def rows(self, block_ids: torch.Tensor) -> LocalRows:
        """A chunk's payload on the local path: these rows of the peer's cache, copied on arrival."""
        return LocalRows(self, block_ids)

    def close(self) -> None:
        if hasattr(self, "tensor"):  # (closed once already)
            del self.tensor  # our view goes before the mapping it holds open
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
            self._map = None


@dataclass(frozen=True)
class LocalRows:
    """Rows (blocks) of a peer's mapped cache, to be copied into ours: the local path's payload."""

    peer: PeerKV
    block_ids: torch.Tensor  # the sender's block ids, int64 on the CPU

    @property
    def num_bytes(self) -> int:
        src = self.peer.tensor
        return len(self.block_ids) * src[0].numel() * src.element_size()

    def take(self) -> torch.Tensor:
        """The rows, copied out of the peer's cache."""
        src = self.peer.tensor
        return src.index_select(0, self.block_ids.to(src.device))

    def copy_into(self, cache: torch.Tensor, dst_block_ids: list[int]) -> None:
        """Copy the rows into ``cache``'s blocks ``dst_block_ids`` (same order)."""
        src = self.peer.tensor
        if cache.device.type == "cuda":
            # One gather and one scatter on the device: launches, not bytes, are what cost here.
            rows = src.index_select(0, self.block_ids.to(src.device))
            cache.index_copy_(0, torch.tensor(dst_block_ids, dtype=torch.long, device=cache.device), rows)
            return
        # CPU: straight from the mapping into our blocks, one slice copy per run of consecutive ids
        # on both sides. A gathered temporary would be a fresh allocation every chunk, and faulting
        # its pages in cost ~5x the copy itself (180 MiB: 40 ms against 8).
        for src_start, dst_start, n in consecutive_runs(self.block_ids.tolist(), dst_block_ids):
            cache[dst_start : dst_start + n].copy_(src[src_start : src_start + n])


def consecutive_runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) for the maximal runs where both id lists count up by one."""
    if len(src) != len(dst):
        raise ValueError(f"{len(src)} source blocks for {len(dst)} destination blocks")
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and s == runs[-1][0] + runs[-1][2] and d == runs[-1][1] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs
