"""The per-pair wire format: the control plane's fixed-size int64 header tensor (CPU).

Each direction of a pair's control plane is a FIFO of headers (kv_transfer/channel.py). A KV
header announces its payload: the receiver posts the payload's receive on the data plane and
answers READY, and only then does the payload travel; or, on the local path, the sender's block
ids follow the header on the control plane. A message is self-describing, so a receiver can
always drain a payload it no longer wants (a transfer that missed its deadline) and stay in sync.

Header fields: magic/version, kind, transfer id, chunk index, first block index (within the
request's block list), number of blocks, flags, first token (last chunk only), and for the TTFT
breakdown on the last chunk: the prefill queue and compute times (µs, the sender's clock) and the
sender's wall-clock send time (µs since the epoch; the receiver derives the transfer time). Then,
when the request asked for logprobs, the first token's (last chunk only): the number of top
alternatives (-1: none sent), its logprob, and up to 20 (token id, logprob) pairs; logprobs travel
as the bit patterns of float64s. A fixed size keeps every message one header receive.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from dataclasses import dataclass

import torch

from engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprob

_BASE_LEN = 11
HEADER_LEN = _BASE_LEN + 2 + 2 * MAX_TOP_LOGPROBS
MAGIC = 0x42544E04  # "BTN" v4


class Kind(enum.IntEnum):
    KV = 1  # prefill -> decode: blocks of a transfer
    ABORT = 2  # prefill -> decode: the transfer will not complete
    ACK = 3  # decode -> prefill: the transfer is complete, the sender may free its blocks
    NACK = 4  # decode -> prefill: the receiver dropped the transfer (deadline passed, unknown id)
    READY = 5  # decode -> prefill: the payload's receive is posted; send it (transfer id, chunk index)


FLAG_LAST = 1
FLAG_DIRECT = 2  # the chunk's KV travels rank to rank (kv_transfer/group_handoff.py), not after this header


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
    first_logprob: TokenLogprob | None = None

    @property
    def is_last(self) -> bool:
        return bool(self.flags & FLAG_LAST)

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        values = [
            MAGIC,
            int(self.kind),
            self.transfer_id,
            self.chunk_index,
            self.block_offset,
            self.num_blocks,
            self.flags,
            self.first_token,
            self.prefill_queue_us,
            self.prefill_compute_us,
            self.sent_wall_us,
        ]
        values += _encode_logprob(self.first_logprob)
        return torch.tensor(values, dtype=torch.int64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Header:
        v = t.tolist()
        if v[0] != MAGIC:
            raise ValueError(f"bad KV transfer header magic {v[0]:#x}: the stream is out of sync")
        header = cls(Kind(v[1]), *v[2:_BASE_LEN])
        first_logprob = _decode_logprob(header.first_token, v[_BASE_LEN:])
        return header if first_logprob is None else dataclasses.replace(header, first_logprob=first_logprob)


def empty_header(device: torch.device) -> torch.Tensor:
    return torch.empty(HEADER_LEN, dtype=torch.int64, device=device)


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


def _encode_logprob(lp: TokenLogprob | None) -> list[int]:
    out = [0] * (HEADER_LEN - _BASE_LEN)
    if lp is None:
        out[0] = -1
        return out
    if lp.logprob is None:  # only a prompt's first token has none, and no transfer carries one
        raise ValueError(f"token {lp.token_id} has no logprob to send")
    out[0], out[1] = len(lp.top), _bits(lp.logprob)
    for i, (tok, value) in enumerate(lp.top):
        out[2 + 2 * i], out[3 + 2 * i] = tok, _bits(value)
    return out


def _decode_logprob(first_token: int, v: list[int]) -> TokenLogprob | None:
    n = v[0]
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        return None
    top = tuple((v[2 + 2 * i], _float(v[3 + 2 * i])) for i in range(n))
    return TokenLogprob(first_token, _float(v[1]), top)
