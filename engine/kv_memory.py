"""KV cache sizing on a GPU: a profiling forward pass at the largest batch the config allows, then
vLLM's rule. The cache gets ``gpu_memory_utilization`` x the device's *total* memory, times this
worker's ``gpu_fraction`` where workers share the GPU, minus what the process already holds (the
weights, torch's cached buffers) and the forward's profiled peak. Taken from the total, not from
what is free, workers that share a GPU and start together each get their own share; the (1 -
utilization) left over covers what torch does not count (the CUDA context, NCCL and cuBLAS buffers).

The arithmetic (``gpu_kv_blocks``) is pure and takes a ``MemoryReport``, so it is tested on CPU;
``measure_gpu_memory`` fills one on CUDA around a forward ``profile_forward`` builds. On CPU the
cache keeps its ``kv_cache_memory_gb`` budget (engine/model_loader.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.config import SchedulerConfig
from engine.model.llama import LlamaModel

_GIB = 2**30


@dataclass(frozen=True)
class MemoryReport:
    """A device's memory as the sizing sees it, in bytes."""

    total: int  # the device's whole memory
    held: int  # this process's before the KV cache: weights, buffers, torch's cache after the profile
    peak: int  # the profiled forward's peak above what was allocated when it started


def gpu_kv_blocks(
    report: MemoryReport,
    *,
    utilization: float,
    gpu_fraction: float,
    block_bytes: int,
    min_blocks: int,
    max_useful_blocks: int,
) -> int:
    """Blocks of ``block_bytes`` the cache gets: ``utilization x gpu_fraction x total - held - peak``,
    at most ``max_useful_blocks`` (more can never be used). ValueError naming every number where
    that is fewer than ``min_blocks`` (one sequence of the longest context)."""
    share = report.total * utilization * gpu_fraction
    budget = int(share) - report.held - report.peak
    blocks = max(0, budget // block_bytes)
    if blocks < min_blocks:
        raise ValueError(
            f"the KV cache cannot hold one sequence of the longest context ({min_blocks} blocks of "
            f"{block_bytes / 2**20:.2f} MiB = {min_blocks * block_bytes / _GIB:.2f} GiB): this worker's share of the "
            f"GPU is gpu_memory_utilization {utilization:g} x gpus {gpu_fraction:g} x {report.total / _GIB:.2f} GiB "
            f"= {share / _GIB:.2f} GiB, of which the process already holds {report.held / _GIB:.2f} GiB and a "
            f"forward at the largest batch peaks at {report.peak / _GIB:.2f} GiB more, leaving "
            f"{max(budget, 0) / _GIB:.2f} GiB; raise gpu_memory_utilization or the worker's gpus, or lower "
            "max_model_len or max_num_batched_tokens"
        )
    return min(blocks, max_useful_blocks)


def profile_shape(scheduler: SchedulerConfig, max_len: int) -> list[int]:
    """The largest step the config allows as prompt chunks (tokens per sequence): the whole
    ``max_num_batched_tokens`` over as many sequences as ``max_num_seqs`` lets, none longer than the context."""
    tokens = max(1, scheduler.max_num_batched_tokens)
    seqs = min(scheduler.max_num_seqs, tokens)
    seqs = max(seqs, -(-tokens // max_len))  # no chunk longer than the context
    base, extra = divmod(tokens, seqs)
    return [base + (i < extra) for i in range(seqs) if base + (i < extra) > 0]


def profile_forward(
    model: LlamaModel,
    attn: AttentionBackend,
    q_lens: list[int],
    block_size: int,
    new_cache: Callable[[int], torch.Tensor],
) -> Callable[[], None]:
    """One forward of prompt chunks ``q_lens`` (each a whole prompt) and the logits of every chunk's
    last row: what a step of that shape allocates. Its scratch KV cache (``new_cache(blocks)``, the
    longest chunk's blocks, shared by every chunk: the values do not matter) is allocated inside,
    so it counts in the peak and is gone after."""
    blocks_each = [-(-q // block_size) for q in q_lens]
    width = max(blocks_each)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.cat([torch.arange(q, dtype=torch.int32) for q in q_lens])

    def run() -> None:
        kv_cache = new_cache(width)
        device = kv_cache.device
        meta = AttentionMetadata(
            num_decode_tokens=0,
            num_prefill_tokens=sum(q_lens),
            slot_block=(slots // block_size).to(device),
            slot_offset=(slots % block_size).to(device),
            decode_block_tables=None,
            decode_seq_lens=None,
            prefill_block_tables=torch.arange(width, dtype=torch.int32).repeat(len(q_lens), 1).to(device),
            prefill_cu_seqlens_q=cu.to(device),
            prefill_seq_lens=torch.tensor(q_lens, dtype=torch.int32, device=device),
        )
        input_ids = torch.zeros(sum(q_lens), dtype=torch.long, device=device)
        hidden = model.forward(input_ids, slots.long().to(device), kv_cache, meta, attn, keep=(cu[1:] - 1).to(device))
        model.compute_logits(hidden)

    return run


def measure_gpu_memory(device: torch.device, forward: Callable[[], None]) -> MemoryReport:
    """Run ``forward`` once on ``device`` and report the memory around it (CUDA only)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()  # the profile's activations go back: the peak is counted on its own
    _, total = torch.cuda.mem_get_info(device)
    return MemoryReport(total=total, held=held, peak=peak)
