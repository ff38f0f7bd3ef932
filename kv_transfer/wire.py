"""The per-pair wire format: a fixed-size int64 header tensor, then (for KV) the packed payload.

Each direction of a pair is a FIFO of messages; a message is self-describing, so a receiver can
always drain a payload it no longer wants (a transfer that missed its deadline) and stay in sync.

Header fields: magic/version, kind, transfer id, chunk index, first block index (within the
request's block list), number of blocks, flags, first token (last chunk only), and for the TTFT
breakdown on the last chunk: the prefill queue and compute times (µs, the sender's clock) and the
sender's wall-clock send time (µs since the epoch; the receiver derives the transfer time).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

HEADER_LEN = 11
MAGIC = 0x42544E02  # "BTN" v2


class Kind(enum.IntEnum):
    KV = 1  # prefill -> decode: blocks of a transfer
    ABORT = 2  # prefill -> decode: the transfer will not complete
    ACK = 3  # decode -> prefill: the transfer is complete, the sender may free its blocks
    NACK = 4  # decode -> prefill: the receiver dropped the transfer (deadline passed, unknown id)


FLAG_LAST = 1


@dataclass(frozen=True, slots=True)
class Header:
    kind: Kind
    transfer_id: int
    chunk_index: int = 0
    block_offset: int = 0
    num_blocks: int = 0
    flags: int = 0
    first_token: int = -1
    prefill_queue_us: int = 0
    prefill_compute_us: int = 0
    sent_wall_us: int = 0

    @property
    def is_last(self) -> bool:
        return bool(self.flags & FLAG_LAST)

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        values = [MAGIC, int(self.kind), self.transfer_id, self.chunk_index, self.block_offset, self.num_blocks,
                  self.flags, self.first_token, self.prefill_queue_us, self.prefill_compute_us, self.sent_wall_us]
        return torch.tensor(values, dtype=torch.int64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Header:
        v = t.tolist()
        if v[0] != MAGIC:
            raise ValueError(f"bad KV transfer header magic {v[0]:#x}: the stream is out of sync")
        return cls(Kind(v[1]), *v[2:HEADER_LEN])


def empty_header(device: torch.device) -> torch.Tensor:
    return torch.empty(HEADER_LEN, dtype=torch.int64, device=device)
