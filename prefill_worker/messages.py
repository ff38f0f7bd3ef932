"""Messages between the router and prefill workers (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.request_spec import RequestSpec
from kv_transfer.peer import PeerInfo


@dataclass(frozen=True)
class PrefillTask:
    """Prefill ``spec`` and ship its KV to ``decode``, whose reserved blocks start at block
    ``skip_blocks`` (the decode worker already caches the blocks before it)."""

    spec: RequestSpec
    decode: PeerInfo
    transfer_id: int
    skip_blocks: int
