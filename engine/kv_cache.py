"""The paged KV cache tensor (block-major) and its sizing."""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import NamedTuple

import torch

from engine.model.config import ModelConfig


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block: its K and V for every layer."""
    return cfg.kv_bytes_per_token * block_size * torch.empty((), dtype=dtype).element_size()


def num_blocks_for_memory(cfg: ModelConfig, block_size: int, dtype: torch.dtype, memory_bytes: float) -> int:
    return max(1, int(memory_bytes // kv_block_bytes(cfg, block_size, dtype)))


def allocate_kv_cache(
    cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``[num_blocks, layers, 2, block_size, kv_heads, head_dim]``: one block = one contiguous row."""
    shape = (num_blocks, cfg.num_hidden_layers, 2, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


class SharedKVCache(NamedTuple):
    tensor: torch.Tensor
    segment: shared_memory.SharedMemory  # owned: unlinked by ``release_shared`` (or when the process dies)


def allocate_shared_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype) -> SharedKVCache:
    """A CPU KV cache in a POSIX shared-memory segment (zero-filled by the kernel)."""
    shape = (num_blocks, cfg.num_hidden_layers, 2, block_size, cfg.num_key_value_heads, cfg.head_dim)
    nbytes = num_blocks * kv_block_bytes(cfg, block_size, dtype)
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    return SharedKVCache(torch.frombuffer(segment.buf, dtype=dtype).view(shape), segment)


def release_shared(segment: shared_memory.SharedMemory) -> None:
    try:
        segment.unlink()
    except FileNotFoundError:
        pass
