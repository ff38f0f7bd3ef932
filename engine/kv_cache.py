"""The paged KV cache tensor (block-major) and its sizing."""

from __future__ import annotations

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
