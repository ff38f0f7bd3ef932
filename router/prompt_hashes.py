"""The block hashes of a prompt as the workers compute them (engine/block_hash.py), for the
router's prefix-affinity placement and batch grouping.

A worker roots a sequence's hashes at its tenant's cache salt and, for a longrope model (Phi-3), at
its rotary state: a prompt longer than the original length is computed and cached with the long
factors (engine/scheduler_long_rope.py), under hashes a short prompt never has. The router roots a
prompt's hashes the same way, or such a prompt would find no worker caching its prefix. The original
length comes from the model's ``config.json``, parsed without torch (engine/model/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.block_hash import BlockHash, hash_blocks
from engine.model.config import ModelConfig


@dataclass(frozen=True)
class PromptHasher:
    block_size: int
    long_rope_from: int | None = None  # longrope's original length, where a sequence can pass it

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.long_rope_from is not None and self.long_rope_from <= 0:
            raise ValueError(f"long_rope_from must be positive, got {self.long_rope_from}")

    @classmethod
    def for_model(cls, model_dir: Path, block_size: int, max_model_len: int) -> PromptHasher:
        """The hasher for the model in ``model_dir`` served at ``max_model_len``: long states only
        where a sequence can pass the original length, as the workers' rotary tables decide
        (engine/model/rope.py). A directory without ``config.json`` (a router under test) has none."""
        path = model_dir / "config.json"
        original = ModelConfig.from_file(path).long_rope_from if path.exists() else None
        return cls(block_size, original if original is not None and max_model_len > original else None)

    def long_rope(self, num_tokens: int) -> bool:
        """Whether a worker computes a prompt of ``num_tokens`` with longrope's long factors."""
        return self.long_rope_from is not None and num_tokens > self.long_rope_from

    def hashes(self, token_ids: list[int], cache_salt: str | None) -> list[BlockHash]:
        """The hashes of every full block of the prompt ``token_ids``."""
        return hash_blocks(token_ids, self.block_size, cache_salt, long_rope=self.long_rope(len(token_ids)))

    def first_block(self, token_ids: list[int], cache_salt: str | None) -> BlockHash | None:
        """The hash of the prompt's first block; None for a prompt shorter than a block."""
        if len(token_ids) < self.block_size:
            return None
        head = token_ids[: self.block_size]
        return hash_blocks(head, self.block_size, cache_salt, long_rope=self.long_rope(len(token_ids)))[0]
