"""Token sampling: greedy, temperature, top-k, top-p, min-p, per-request seeds.

A seeded request draws the noise for output position p from a generator seeded with (seed, p), so
its tokens do not depend on what it is batched with, nor on being preempted and recomputed.
Unseeded requests share the engine's generator.
"""

from __future__ import annotations

import torch

from engine.native.argmax import NativeArgmax
from engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """splitmix64's step: every output bit depends on every input bit."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded request's output ``position``: its 64 bits mixed, because
    torch's CPU generator keeps only a seed's low 32 bits (seeds 2**32 apart, and 2**63 apart when
    a seed was cut to 63 bits, drew the same noise). A negative seed is its two's-complement value."""
    return _splitmix64((_splitmix64(seed & _MASK64) + position) & _MASK64)


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._row_generator = torch.Generator(device=device)
        # torch's CPU argmax is a scalar reduction (~2% of a decode step): a compiled one, same indices.
        native = NativeArgmax.load() if device.type == "cpu" else None
        self._argmax = native if native is not None else (lambda x: x.argmax(dim=-1))

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, params: list[SamplingParams], output_positions: list[int]) -> torch.Tensor:
        """logits [N, V] float32 -> token ids [N] (int64, on the logits' device)."""
        greedy = [p.greedy for p in params]
        if all(greedy):
            return self._argmax(logits)
        out = self._argmax(logits)
        rows = [i for i, g in enumerate(greedy) if not g]
        sub = logits[rows]
        sp = [params[i] for i in rows]
        temps = torch.tensor([p.temperature for p in sp], device=logits.device, dtype=logits.dtype)
        sub = sub / temps[:, None]
        if any(p.top_k for p in sp):
            sub = _apply_top_k(sub, [p.top_k for p in sp])
        if any(p.top_p < 1.0 for p in sp):
            sub = _apply_top_p(sub, torch.tensor([p.top_p for p in sp], device=logits.device, dtype=sub.dtype))
        probs = torch.softmax(sub, dim=-1)
        if any(p.min_p for p in sp):  # drop tokens less likely than min_p x the most likely one
            min_p = torch.tensor([p.min_p for p in sp], device=logits.device, dtype=probs.dtype)
            probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        # Exponential race (Gumbel-max): argmax(p / E), E ~ Exp(1), samples from p.
        noise = torch.empty_like(probs)
        unseeded = [j for j, p in enumerate(sp) if p.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty((len(unseeded), probs.shape[1]), device=probs.device).exponential_(
                generator=self.generator
            )
        for j, p in enumerate(sp):
            if p.seed is not None:
                pos = output_positions[rows[j]]
                self._row_generator.manual_seed(row_seed(p.seed, pos))
                noise[j].exponential_(generator=self._row_generator)
        out[rows] = self._argmax(probs / noise)
        return out


def _apply_top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    k_max = min(max(ks), vocab)
    kth_values = torch.topk(logits, k_max, dim=-1).values
    idx = torch.tensor([min(k, vocab) - 1 if k else k_max - 1 for k in ks], device=logits.device)
    thresholds = kth_values.gather(1, idx[:, None])
    disabled = torch.tensor([k == 0 for k in ks], device=logits.device)
    thresholds = thresholds.masked_fill(disabled[:, None], float("-inf"))
    return logits.masked_fill(logits < thresholds, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p (the first always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p[:, None]
    drop_sorted[:, 0] = False  # even where top_p rounds to 0 in float32 (1e-46, say)
    drop = torch.zeros_like(drop_sorted).scatter(1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
