"""Rotary position embeddings (rotate-half layout, as in Hugging Face Llama/Qwen2/Mistral).

The cos/sin table is precomputed for every position up to the context length, with the same float32
arithmetic as transformers (inv_freq * position, then cos/sin), so results match it bit for bit.
"""

from __future__ import annotations

import math

import torch

from engine.model.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.rope_scaling
    if rs.rope_type == "linear":
        inv_freq = inv_freq / rs.factor
    elif rs.rope_type == "llama3":
        low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
        high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
        smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding:
    def __init__(self, cfg: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq = inv_frequencies(cfg)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
        self.cos = freqs.cos().to(device=device, dtype=dtype)
        self.sin = freqs.sin().to(device=device, dtype=dtype)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim] -> rotated copy."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
