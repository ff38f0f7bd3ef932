"""Token sampling: greedy, temperature, top-k, top-p, min-p, per-request seeds.

A sampled row draws one uniform number u and takes the token where u falls in the cumulative
distribution (inverse transform sampling, the cumulative sums in float64): one number a row
instead of one per vocabulary entry, as an exponential race would draw (the sampler's largest
cost on a CPU). A seeded request's u for output position p is a hash of (seed, p)
(splitmix64), so its tokens do not depend on what it is batched with, nor on being preempted and
recomputed, nor on speculative decoding; unseeded requests draw from the engine's generator.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.device_sampling import apply_top_k, apply_top_p, seeded_uniforms, to_device
from engine.native.argmax import NativeArgmax
from engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
_TOP_P_CANDIDATES = (256, 4096)  # top-p looks for its cut among these first (a full sort if they fall short)


def _splitmix64(x: int) -> int:
    """splitmix64's step: every output bit depends on every input bit."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_seed(seed: int, position: int) -> int:
    """A seeded request's 64 random bits for output ``position``: splitmix64 of its seed (all 64
    bits of it; a negative seed is its two's-complement value), stepped ``position`` times."""
    return _splitmix64((_splitmix64(seed & _MASK64) + position) & _MASK64)


def row_uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) a seeded request samples its output ``position`` with (53 bits)."""
    return (row_seed(seed, position) >> 11) * 2.0**-53


class Sampler:
    def __init__(self, seed: int, device: torch.device, sync_free: bool | None = None) -> None:
        self.device = device
        # On a GPU no step may wait for the device (engine/device_sampling.py); on a CPU top-p's
        # candidate search is the cheaper one. ``sync_free`` overrides the choice (tests).
        self.sync_free = device.type == "cuda" if sync_free is None else sync_free
        self.generator = torch.Generator(device="cpu").manual_seed(seed)  # (the uniforms are drawn on the host)
        # torch's CPU argmax is a scalar reduction: a compiled one, same indices.
        native = NativeArgmax.load() if device.type == "cpu" else None
        self._argmax = native if native is not None else (lambda x: x.argmax(dim=-1))

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, params: list[SamplingParams], output_positions: list[int]) -> torch.Tensor:
        """logits [N, V] float32 -> token ids [N] (int64, on the logits' device)."""
        greedy = [p.greedy for p in params]
        if all(greedy):
            return self._argmax(logits)
        if self.sync_free:
            return self._sample_whole_batch(logits, params, greedy, output_positions)
        rows = [i for i, g in enumerate(greedy) if not g]
        if len(rows) == len(logits):  # no greedy row: no argmax over the batch
            out = torch.empty(len(logits), dtype=torch.int64, device=logits.device)
        else:
            out = self._argmax(logits)
        sub = logits if len(rows) == len(logits) else logits[rows]  # (a list index copies)
        sp = [params[i] for i in rows]
        temps = torch.tensor([p.temperature for p in sp], device=logits.device, dtype=logits.dtype)
        sub = sub / temps[:, None]
        if any(p.top_k for p in sp):
            sub = _apply_top_k(sub, [p.top_k for p in sp])
        if any(p.top_p < 1.0 for p in sp):
            sub = _apply_top_p(sub, [p.top_p for p in sp])
        probs = torch.softmax(sub, dim=-1)
        if any(p.min_p for p in sp):  # drop tokens less likely than min_p x the most likely one
            min_p = torch.tensor([p.min_p for p in sp], device=logits.device, dtype=probs.dtype)
            probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        uniforms = self._uniforms(sp, [output_positions[i] for i in rows])
        out[rows] = _inverse_cdf(probs, uniforms.to(probs.device, non_blocking=True))
        return out

    def _sample_whole_batch(
        self, logits: torch.Tensor, params: list[SamplingParams], greedy: list[bool], output_positions: list[int]
    ) -> torch.Tensor:
        """``sample`` with no host synchronization: every row goes through the sampling ops (a
        greedy row with neutral settings, its argmax taken at the end), so no tensor is indexed by
        a list and no shape depends on the device's values; the settings arrive by asynchronous
        copies from pinned memory. The same tokens as the row-subset path: every op is per row,
        and the generator draws one number per sampled row, as there."""
        device, dtype = logits.device, logits.dtype
        sampled = [i for i, g in enumerate(greedy) if not g]
        sp = [params[i] for i in sampled]
        u = np.zeros(len(params), dtype=np.float64)
        u[sampled] = self._uniforms(sp, [output_positions[i] for i in sampled]).numpy()
        temps = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        sub = logits / to_device(temps, dtype, device)[:, None]
        if any(p.top_k for p in sp):
            ks = [0 if g else p.top_k for p, g in zip(params, greedy)]
            sub = apply_top_k(sub, to_device(ks, torch.int64, device), max(ks))
        if any(p.top_p < 1.0 for p in sp):
            sub = apply_top_p(sub, to_device([1.0 if g else p.top_p for p, g in zip(params, greedy)], dtype, device))
        probs = torch.softmax(sub, dim=-1)
        if any(p.min_p for p in sp):
            min_p = to_device([0.0 if g else p.min_p for p, g in zip(params, greedy)], dtype, device)
            probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
        out = _inverse_cdf(probs, to_device(u, torch.float64, device))
        if len(sampled) < len(params):
            out = torch.where(to_device(greedy, torch.bool, device), self._argmax(logits), out)
        return out

    def _uniforms(self, params: list[SamplingParams], positions: list[int]) -> torch.Tensor:
        """One uniform number in [0, 1) a row (float64, on the host): a seeded row's from its seed
        and output position, the others' from the engine's generator."""
        u = torch.rand(len(params), dtype=torch.float64, generator=self.generator)
        seeded = [j for j, p in enumerate(params) if p.seed is not None]
        if seeded:
            values = seeded_uniforms([params[j].seed or 0 for j in seeded], [positions[j] for j in seeded])
            u[seeded] = torch.from_numpy(values)
        return u


_CDF_BLOCK = 256  # the inverse CDF finds a row's block of this many tokens first, then the token in it


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first whose cumulative probability exceeds ``uniforms[i]`` x the row's
    total, found in two levels (the blocks' sums, accumulated in float64, then the cumulative sums
    inside the one block the target falls in): a read of the row and a few hundred sums instead of
    a float64 copy and a sequential scan of the whole vocabulary. A token of probability 0 is never
    taken (its cumulative sum equals the one before it), nor is a block whose sum is 0, and each
    target is kept below its total, where u x total would round up to it."""
    n, vocab = probs.shape
    b = _CDF_BLOCK
    if vocab % b:
        probs = torch.nn.functional.pad(probs, (0, b - vocab % b))
    blocks = probs.view(n, -1, b)
    block_cdf = blocks.sum(dim=-1, dtype=torch.float64).cumsum_(dim=-1)
    total = block_cdf[:, -1]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))[:, None]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inside = blocks.gather(1, block[:, :, None].expand(n, 1, b)).squeeze(1).to(torch.float64).cumsum_(dim=-1)
    # (The block's sum and its cumulative sums may differ in the last bits: the target stays in it.)
    local = torch.minimum(target - before, torch.nextafter(inside[:, -1:], torch.zeros_like(inside[:, -1:])))
    token = torch.searchsorted(inside, local.clamp_(min=0.0), right=True).squeeze(1)
    # (Only NaN probabilities, a broken model's, search past the end: a token id still in range.)
    return (block.squeeze(1) * b + token).clamp_(max=vocab - 1)


def _apply_top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    k_max = min(max(ks), vocab)
    kth_values = torch.topk(logits, k_max, dim=-1).values
    idx = torch.tensor([min(k, vocab) - 1 if k else k_max - 1 for k in ks], device=logits.device)
    thresholds = kth_values.gather(1, idx[:, None])
    disabled = torch.tensor([k == 0 for k in ks], device=logits.device)
    thresholds = thresholds.masked_fill(disabled[:, None], float("-inf"))
    return logits.masked_fill(logits < thresholds, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """Keep, by descending probability, the tokens before the mass reaches ``top_p``: a token is
    dropped when the mass strictly before it already reaches it (the first always stays, even where
    top_p rounds to 0 in float32). The cut is looked for among the most likely tokens first (a
    top-k of 256, then of 4,096: ~50x and ~5x cheaper than sorting 49,152 logits); rows whose
    candidates do not reach top_p are sorted whole. The same additions in the same order either
    way, so the same tokens kept."""
    p = torch.tensor(top_p, device=logits.device, dtype=logits.dtype)
    probs = torch.softmax(logits, dim=-1)
    out = torch.full_like(logits, float("-inf"))
    rows = torch.arange(len(logits), device=logits.device)
    for k in (*_TOP_P_CANDIDATES, logits.shape[1]):
        k = min(k, logits.shape[1])
        sub = logits if len(rows) == len(logits) else logits[rows]
        top, idx = torch.topk(sub, k, dim=-1) if k < logits.shape[1] else torch.sort(sub, dim=-1, descending=True)
        cand = probs[rows].gather(1, idx)
        mass_before = cand.cumsum(dim=-1) - cand
        keep = mass_before < p[rows, None]
        keep[:, 0] = True
        reached = (mass_before[:, -1] + cand[:, -1]) >= p[rows]  # these candidates hold the cut
        if k == logits.shape[1]:
            reached[:] = True
        done = reached.nonzero().squeeze(1)
        out[rows[done]] = torch.full_like(sub[done], float("-inf")).scatter_(
            1, idx[done], top[done].masked_fill(~keep[done], float("-inf"))
        )
        rows = rows[~reached]
        if not len(rows):
            break
    return out
