"""A worker's identity on the transfer mesh, built the same way by both roles: its ``PeerInfo``
(with the locality of its KV cache), the ``WorkerInfo`` it reports, and the release of a
shared-memory cache at shutdown."""

from __future__ import annotations

import uuid

from engine.engine import LLMEngine
from engine.kv_cache import release_shared
from kv_transfer import local_kv
from kv_transfer.peer import PeerInfo, WorkerInfo


def kv_segment_name(engine: LLMEngine) -> str | None:
    return engine.kv_segment.name if engine.kv_segment is not None else None


def make_peer(worker_id: str, role: str, engine: LLMEngine) -> PeerInfo:
    """A fresh incarnation: a restarted worker forms new pair groups instead of reusing dead ones."""
    return PeerInfo(
        worker_id,
        uuid.uuid4().hex[:12],
        role,
        # A tensor-parallel worker's cache (rank 0's) holds some heads only: a same-device peer
        # reading it would miss the others, so such a worker ships over the pair group instead.
        locality=local_kv.locality(engine.runner.kv_cache, kv_segment_name(engine)) if engine.ranks is None else "",
        tensor_parallel_size=engine.config.tensor_parallel_size,
    )


def worker_info(peer: PeerInfo, engine: LLMEngine) -> WorkerInfo:
    sc = engine.config.scheduler
    return WorkerInfo(
        peer,
        engine.num_total_blocks,
        engine.block_manager.block_size,
        engine.max_model_len,
        engine.model_config.vocab_size,
        engine.config.model,
        sc.max_num_seqs,
        sc.max_num_batched_tokens,
    )


def release_kv(engine: LLMEngine) -> None:
    if engine.kv_segment is not None:
        release_shared(engine.kv_segment)
