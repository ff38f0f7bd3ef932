"""A pair's data plane: the second two-rank group, which carries KV payloads and nothing else.

NCCL between GPUs, gloo on the CPU. It is used only in the order the control plane sets
(kv_transfer/channel.py): the receiver posts a payload receive once the header announced it and
answers READY; the sender issues the matching send on READY. So no operation is ever pending
without its peer committed to the match, and an idle pair has none pending at all (no NCCL
watchdog fires on an idle pair, and a receive never holds a stream).

``DataPlaneFactory`` is the seam: the default builds the real group, tests pass
``kv_transfer.nccl_double.NcclSemantics`` to run gloo under NCCL's rules. It is a constructor
argument carried down from the cluster config, never a module-level switch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from kv_transfer.pair_group import OP_TIMEOUT, PairGroup, as_pair_group, tear_down_group
from kv_transfer.streams import PayloadStreams, streams_for


class PayloadWork(Protocol):
    def wait(self) -> object:
        """NCCL: order the current stream after the operation (the host does not wait); gloo: the
        host waits."""


class PayloadGroup(Protocol):
    """What the data plane uses of a process group (positional: torch names them dstRank, srcRank)."""

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int, /) -> PayloadWork: ...

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int, /) -> PayloadWork: ...


@dataclass(frozen=True)
class DataPlane:
    group: PayloadGroup
    streams: PayloadStreams  # where payload operations run, and their events
    close: Callable[[], None]  # ends a pending operation (the peer failed) and the group


class DataPlaneFactory(Protocol):
    def __call__(self, store: dist.Store, prefix: str, rank: int, device: torch.device) -> DataPlane:
        """Form the data group of the pair whose keys live under ``prefix`` in ``store`` (both
        sides call it once the control plane formed). ``rank`` is this side's."""


def default_data_plane(store: dist.Store, prefix: str, rank: int, device: torch.device) -> DataPlane:
    prefixed = dist.PrefixStore(prefix, store)
    group: PairGroup
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = OP_TIMEOUT
        group = as_pair_group(dist.ProcessGroupNCCL(prefixed, rank, 2, opts))
    else:
        group = as_pair_group(dist.ProcessGroupGloo(prefixed, rank, 2, OP_TIMEOUT))
    return DataPlane(group, streams_for(device), lambda: tear_down_group(group, 1 - rank, device))
