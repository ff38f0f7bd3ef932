"""Rotary position embeddings (rotate-half layout, as in Hugging Face Llama/Qwen2/Mistral).

The cos/sin table is precomputed for every position up to the context length, with the same float32
arithmetic as transformers (inv_freq * position, then cos/sin), so results match it bit for bit.
"""

from __future__ import annotations

import math

import torch

from engine.model.config import ModelConfig


def inv_frequencies(cfg: ModelConfig, long: bool = False) -> torch.Tensor:
    """The rotary frequencies; for longrope, its short factors' (or with ``long``, its long ones')."""
    dim = cfg.head_dim
    rs = cfg.rope_scaling
    if rs.rope_type == "longrope":  # transformers' arithmetic: 1 / (factor * base ** (i / dim))
        ext = torch.tensor(rs.long_factor if long else rs.short_factor, dtype=torch.float32)
        return 1.0 / (ext * cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
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
    """cos/sin rows by rotary index. A longrope model whose context reaches past its original length
    has two halves: rows ``[0, P)`` with the short factors, rows ``[P, 2P)`` with the long ones
    (``P = max_positions``, ``long_offset``). A token's rotary index is its position, plus ``P`` when
    its sequence is in the long state (``engine.input_batch``): transformers rotates every position
    of a sequence longer than the original length with the long factors, and the others with the
    short ones."""

    def __init__(self, cfg: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq = inv_frequencies(cfg)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
        rs = cfg.rope_scaling
        # The original length where a sequence can pass it (the table then has its long half), else None.
        self.long_from = (
            cfg.long_rope_from if cfg.long_rope_from is not None and max_positions > cfg.long_rope_from else None
        )
        self.long_offset = max_positions if self.long_from is not None else 0
        if self.long_from is not None:
            freqs = torch.cat((freqs, pos[:, None] * inv_frequencies(cfg, long=True)[None, :]))
        self.cos = freqs.cos()
        self.sin = freqs.sin()
        if rs.rope_type == "longrope" and rs.attention_factor != 1.0:
            self.cos, self.sin = self.cos * rs.attention_factor, self.sin * rs.attention_factor
        self.cos = self.cos.to(device=device, dtype=dtype)
        self.sin = self.sin.to(device=device, dtype=dtype)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim] -> rotated copy."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
