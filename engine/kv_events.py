"""Typed events a block manager emits when blocks enter or leave its prefix cache.

Workers forward them (batched per step) so the router's cluster prefix index knows which worker
holds which block hashes. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlocksStored:
    block_hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlocksStored | BlocksRemoved | AllBlocksCleared
