"""Who a transfer agent talks to (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeerInfo:
    """A worker as seen by the transfer mesh. ``incarnation`` changes every time the worker process
    (re)starts, so a restarted worker forms fresh pair groups instead of reusing dead ones."""

    worker_id: str
    incarnation: str
    role: str  # "prefill" | "decode"
    # Equal non-empty values: the two can use the local path (same GPU, or same host with
    # shared-memory KV caches); see kv_transfer/local_kv.py.
    locality: str = ""
    # Its ranks: a pair where either side has several hands its KV off rank to rank
    # (kv_transfer/group_handoff.py).
    tensor_parallel_size: int = 1

    @property
    def key(self) -> str:
        return f"{self.worker_id}@{self.incarnation}"


def pair_key(prefill: PeerInfo, decode: PeerInfo, epoch: int = 0) -> str:
    """The rendezvous prefix of a prefill/decode pair's ``epoch``-th group (the pair forms again,
    at the next epoch, after its group failed while both processes live); prefill is rank 0."""
    return f"baton/pair/{prefill.key}/{decode.key}/{epoch}"


@dataclass(frozen=True)
class StoreAddress:
    """The rendezvous TCPStore every worker connects to (hosted by the cluster driver)."""

    host: str
    port: int


@dataclass(frozen=True)
class WorkerInfo:
    peer: PeerInfo
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    model: str
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
