"""Sampling and logit processing without a host synchronization inside the step (the CUDA path).

The CPU path (engine/sampler.py's top-p, engine/logits_processing.py) is shaped for a CPU: top-p
looks for its cut among a few hundred candidates first and falls back row by row, penalties take
``torch.unique`` of each row's history. On a GPU each of those asks the device a question whose
answer sizes the next tensor (``nonzero``, ``unique``, a loop on ``len(rows)``): the host waits for
the GPU, and the step cannot be queued ahead of it. Here every shape is known on the host before
the step runs: the per-row settings travel as small tensors (host-to-device copies, which do not
wait), top-p sorts whole rows once, and penalties count tokens with one ``scatter_add`` over a
padded history matrix. The result is the same kept tokens and the same logits as the CPU path,
so a seeded request's tokens do not depend on the device it runs on (tests/engine/test_device_sampling.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.sampling_params import SamplingParams


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's step on uint64 arrays (numpy's uint64 arithmetic wraps modulo 2**64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def seeded_uniforms(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """engine/sampler.py's ``row_uniform`` for many rows at once (float64, bit for bit)."""
    s = np.array([x & ((1 << 64) - 1) for x in seeds], dtype=np.uint64)
    p = np.array(positions, dtype=np.uint64)
    bits = _splitmix64(_splitmix64(s) + p)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def to_device(
    values: Sequence[float] | Sequence[int] | Sequence[bool] | np.ndarray, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Host values as a tensor on ``device``: on CUDA through pinned memory, a copy the host does
    not wait for (a copy from pageable memory synchronizes the stream)."""
    t = torch.as_tensor(np.asarray(values)).to(dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
    """Keep each row's tokens at least as likely as its k-th (``top_k`` 0: the row is untouched).
    ``k_max`` (the batch's largest k, known on the host) bounds the one ``topk`` call."""
    vocab = logits.shape[1]
    k_max = min(k_max, vocab)
    kth_values = torch.topk(logits, k_max, dim=-1).values
    idx = torch.where(top_k > 0, top_k.clamp(max=vocab) - 1, k_max - 1)
    thresholds = kth_values.gather(1, idx[:, None]).masked_fill((top_k == 0)[:, None], float("-inf"))
    return logits.masked_fill(logits < thresholds, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """engine/sampler.py's top-p rule (a token is dropped when the mass strictly before it reaches
    ``top_p``; the first always stays) over whole sorted rows: the same additions in the same order
    as the CPU path's last resort, with no row-dependent control flow."""
    probs = torch.softmax(logits, dim=-1)
    top, idx = torch.sort(logits, dim=-1, descending=True)
    cand = probs.gather(1, idx)
    mass_before = cand.cumsum(dim=-1) - cand
    keep = mass_before < top_p[:, None]
    keep[:, 0] = True
    return torch.full_like(logits, float("-inf")).scatter_(1, idx, top.masked_fill(~keep, float("-inf")))


def _padded(rows: Sequence[Sequence[int] | np.ndarray], pad: int) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@torch.inference_mode()
def process_logits_on_device(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[np.ndarray | None],
    num_prompt_tokens: Sequence[int],
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """engine/logits_processing.py's ``process_logits`` (same arguments, same order of operations,
    same values) with the rows that ask processed together. Returns a new tensor."""
    out = logits.clone()
    rows = [i for i, sp in enumerate(params) if sp.processes_logits]
    if not rows:
        return out
    vocab, device, dtype = logits.shape[1], logits.device, logits.dtype
    sps = [params[i] for i in rows]
    index = to_device(rows, torch.int64, device)
    sub = out.index_select(0, index)
    pad = vocab  # a padding id scatters into a column that is dropped afterwards
    # min_tokens: the stop tokens of rows still short of their minimum.
    stops: list[list[int]] = []
    for i, sp in zip(rows, sps):
        hist = histories[i]
        assert hist is not None  # given for every row that processes its logits
        short = sp.min_tokens and len(hist) - num_prompt_tokens[i] < sp.min_tokens
        stops.append(list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos_token_ids)) if short else [])
    if any(stops):
        ids = to_device(_padded(stops, pad), torch.int64, device)
        wide = torch.nn.functional.pad(sub, (0, 1))
        sub = wide.scatter_(1, ids, float("-inf"))[:, :vocab]
    if any(sp.logit_bias for sp in sps):
        ids = to_device(_padded([[t for t, _ in sp.logit_bias] for sp in sps], pad), torch.int64, device)
        widths = ids.shape[1]
        bias = np.zeros((len(sps), widths), dtype=np.float64)
        for j, sp in enumerate(sps):
            bias[j, : len(sp.logit_bias)] = [b for _, b in sp.logit_bias]
        wide = torch.nn.functional.pad(sub, (0, 1))
        sub = wide.scatter_add_(1, ids, to_device(bias, dtype, device))[:, :vocab]
    rep = [sp.repetition_penalty != 1.0 for sp in sps]
    pen = [bool(sp.frequency_penalty or sp.presence_penalty) for sp in sps]
    if any(rep) or any(pen):
        whole = to_device(_padded([np.asarray(histories[i]) for i in rows], pad), torch.int64, device)
        starts = to_device([num_prompt_tokens[i] for i in rows], torch.int64, device)
        positions = torch.arange(whole.shape[1], device=device)[None, :]
        ones = torch.ones_like(whole, dtype=dtype)
        if any(rep):
            seen = torch.zeros(len(rows), vocab + 1, dtype=dtype, device=device).scatter_add_(1, whole, ones)
            r = to_device([sp.repetition_penalty for sp in sps], dtype, device)[:, None]
            hit = (seen[:, :vocab] > 0) & to_device(rep, torch.bool, device)[:, None]
            sub = torch.where(hit, torch.where(sub > 0, sub / r, sub * r), sub)
        if any(pen):
            output = whole.masked_fill(positions < starts[:, None], pad)
            counts = torch.zeros(len(rows), vocab + 1, dtype=dtype, device=device).scatter_add_(1, output, ones)
            counts = counts[:, :vocab]
            f = to_device([sp.frequency_penalty for sp in sps], dtype, device)[:, None]
            p = to_device([sp.presence_penalty for sp in sps], dtype, device)[:, None]
            hit = (counts > 0) & to_device(pen, torch.bool, device)[:, None]
            sub = torch.where(hit, sub - (f * counts + p), sub)
    return out.index_copy_(0, index, sub)
