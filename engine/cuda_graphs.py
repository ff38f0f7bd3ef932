"""Decode steps as CUDA graphs: the forward pass of a decode batch, captured once per batch size.

Why: on a GPU a small model's decode step is bound by the host, not the device. The eager forward
launches ~45 kernels a layer from Python (norms, rotary embedding, projections, the Triton KV write
and attention), each a few microseconds of host time, so a 16-layer 1B model spends more time
launching than computing. A graph replays the whole forward as one launch.

How (as nano-vllm and vLLM do it): static input buffers sized for the largest captured batch:
token ids, positions, KV slots, block tables and sequence lengths. A step of ``n`` sequences takes
the smallest captured size ``>= n``, copies its inputs into the first ``n`` rows and pads the rest.
A padding row writes no KV (slot block -1, which the Triton write kernel skips) and attends to
nothing (length 0: the decode kernel's programs for it exit at once, and no one reads its output;
every op of the forward treats rows independently, so a padding row cannot touch a real one).
Block tables keep their full width (the context length in blocks), so the decode kernel's
partitioning is fixed at capture; its loops stop at each row's own length.

Steps that carry a prefill chunk, that score prompt positions, or that are larger than the
largest graph run eagerly. ``capture=False`` runs the same padded static-buffer forward without a
graph: the tests check the padding on CPU with the Triton interpreter.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import numpy as np
import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.input_batch import StepInputs


class DecodeModel(Protocol):
    """What the graphs capture of a model (engine/model/llama.py's LlamaModel)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attn: AttentionBackend,
    ) -> torch.Tensor: ...


log = logging.getLogger(__name__)

# Graphs above this batch size cost capture time and memory for steps a GPU runs near its compute
# rate anyway (the launch overhead is a small share of them).
MAX_GRAPH_BATCH = 512


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then every multiple of 16, up to ``max_num_seqs``
    (at most ``MAX_GRAPH_BATCH``), the largest always included. A step pads to the next one, so
    padding stays under 16 rows (and under half the rows of a batch under 16)."""
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = {s for s in (1, 2, 4, 8) if s <= top} | set(range(16, top + 1, 16)) | {top}
    return sorted(sizes)


class DecodeGraphs:
    """The captured decode forwards of one model, KV cache and attention backend."""

    def __init__(
        self,
        model: DecodeModel,
        kv_cache: torch.Tensor,
        attn: AttentionBackend,
        *,
        max_num_seqs: int,
        max_blocks: int,
        capture: bool = True,
    ) -> None:
        if attn.name != "triton":
            # The padding relies on the Triton kernels: the torch reference wraps a -1 slot around.
            raise ValueError(f"decode graphs need the Triton attention kernels, not {attn.name!r}")
        self.model, self.kv_cache, self.attn = model, kv_cache, attn
        self.sizes = graph_batch_sizes(max_num_seqs)
        n, dev = self.sizes[-1], kv_cache.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_block = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.slot_offset = torch.zeros(n, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        # Pinned host copies of the small per-row inputs: one asynchronous copy each way up.
        pin = dev.type == "cuda"
        self._host_rows = torch.zeros((4, n), dtype=torch.int64, pin_memory=pin)  # ids, positions, block, offset
        self._host_lens = torch.zeros(n, dtype=torch.int32, pin_memory=pin)
        # Recorded after a step's copies from those pinned buffers; the next step waits for it before
        # writing them (the sampler's sync covers this today, but a step that samples nothing does not).
        self._copied = torch.cuda.Event() if pin else None  # type: ignore[no-untyped-call]  # (torch: unannotated)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.captured = False
        self.replays = 0  # steps that ran through this object (graph or, uncaptured, its padded forward)
        self.padded_rows = 0  # padding rows those steps computed, for the benchmarks
        self.capture_seconds = 0.0
        if capture:
            self._capture()

    # -- capture ----------------------------------------------------------------------------
    def _forward(self, bs: int) -> torch.Tensor:
        meta = AttentionMetadata(
            num_decode_tokens=bs,
            num_prefill_tokens=0,
            slot_block=self.slot_block[:bs],
            slot_offset=self.slot_offset[:bs],
            decode_block_tables=self.block_tables[:bs],
            decode_seq_lens=self.seq_lens[:bs],
            prefill_block_tables=None,
            prefill_cu_seqlens_q=None,
            prefill_seq_lens=None,
        )
        return self.model.forward(self.input_ids[:bs], self.positions[:bs], self.kv_cache, meta, self.attn)

    def _capture(self) -> None:
        """Largest first, all in one memory pool: the smaller graphs reuse the largest one's blocks
        (only one graph runs at a time)."""
        t0 = time.perf_counter()
        self.slot_block.fill_(-1)  # capture runs the forward for real: it must write no KV
        self.seq_lens.zero_()
        pool = None
        with torch.cuda.device(self.kv_cache.device):  # cuBLAS and Triton launch on the current device
            for bs in reversed(self.sizes):
                self._forward(bs)  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._forward(bs)
                pool = graph.pool() if pool is None else pool
                self._graphs[bs], self._outputs[bs] = graph, out
            torch.cuda.synchronize()
        self.captured = True
        self.capture_seconds = time.perf_counter() - t0
        log.info(
            "captured %d decode CUDA graphs (batch sizes %d to %d) in %.1f s",
            len(self.sizes),
            self.sizes[0],
            self.sizes[-1],
            self.capture_seconds,
        )

    # -- a step -----------------------------------------------------------------------------
    def size_for(self, n: int) -> int | None:
        """The captured batch size a step of ``n`` sequences runs at; None when it is too large."""
        if n < 1 or n > self.sizes[-1]:
            return None
        return self.sizes[int(np.searchsorted(self.sizes, n))]

    def takes(self, x: StepInputs) -> bool:
        """Whether this step can run here: every row a single token (no prefill chunk), no prompt
        positions to score, and a captured size that fits it."""
        n = len(x.input_ids)
        return x.num_decode_tokens == n and not x.prompt_logprob_rows and self.size_for(n) is not None

    def run(self, x: StepInputs) -> torch.Tensor:
        """The hidden states ``[n, hidden]`` of a step that ``takes`` says fits."""
        if self._copied is None:  # uncaptured, on CPU (tests)
            return self._run(x)
        with torch.cuda.device(self.kv_cache.device):  # the copies, their event and the replay on its streams
            return self._run(x)

    def _run(self, x: StepInputs) -> torch.Tensor:
        n = len(x.input_ids)
        bs = self.size_for(n)
        assert bs is not None  # (takes said it fits)
        rows, lens = self._host_rows, self._host_lens
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have read these buffers
        rows[0, :n] = torch.from_numpy(x.input_ids)
        rows[1, :n] = torch.from_numpy(x.positions)
        rows[2, :n] = torch.from_numpy(x.slot_block)
        rows[3, :n] = torch.from_numpy(x.slot_offset)
        rows[:, n:bs] = 0
        rows[2, n:bs] = -1  # padding rows write no KV ...
        lens[:n] = torch.from_numpy(x.decode_seq_lens)
        lens[n:bs] = 0  # ... and read none
        for dst, src in zip((self.input_ids, self.positions, self.slot_block, self.slot_offset), rows):
            dst[:bs].copy_(src[:bs], non_blocking=True)
        self.seq_lens[:bs].copy_(lens[:bs], non_blocking=True)
        tables = x.decode_block_tables  # [n, blocks the longest row needs]; later columns are never read
        self.block_tables[:n, : tables.shape[1]].copy_(torch.from_numpy(tables), non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.replays += 1
        self.padded_rows += bs - n
        if self.captured:
            self._graphs[bs].replay()
            return self._outputs[bs][:n]
        return self._forward(bs)[:n]
