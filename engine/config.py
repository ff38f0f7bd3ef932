"""Engine configuration, validated where it is built (pure Python)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

# The runner keeps per-sequence buffers of max_num_seqs rows (token ids: max_model_len + 1 each), so
# an absurd value fails far from the flag (a numpy allocation error); far above any real batch.
MAX_NUM_SEQS = 65536
# torch.set_num_threads(100000) crashes the process (libgomp fails, or a segfault). The bound is
# loose on purpose: a config built on a small head node may run on a bigger worker host.
_MIN_THREAD_LIMIT = 1024
# Far above any node's GPU count: a typo (a thread count given as the TP size) is caught here.
MAX_TENSOR_PARALLEL = 64


def _positive(name: str, value: int, at_most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if at_most is not None and value > at_most:
        raise ValueError(f"{name} must be at most {at_most}, got {value}")


def max_num_threads() -> int:
    """The most torch threads an engine may ask for: 4 per CPU of this machine, at least 1024."""
    return max(_MIN_THREAD_LIMIT, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class SpeculativeConfig:
    """N-gram (prompt lookup) speculative decoding (``engine/spec_decode.py``): each step a decoding
    request also computes up to ``num_tokens`` drafted tokens, taken from what followed the latest
    earlier occurrence of its last ``max_ngram`` (down to ``min_ngram``) tokens; the token the model
    samples at every drafted position decides how many are kept, so the output is the one plain
    decoding gives.

    ``min_keep_chance``: a request drafts only as many tokens as its recent keep rate gives at least
    this chance of being kept (the k-th draft is kept only if the k - 1 before it are), so requests
    whose drafts keep missing (a high temperature, text that does not repeat) stop paying for them;
    0 drafts ``num_tokens`` always."""

    num_tokens: int = 4
    max_ngram: int = 3
    min_ngram: int = 1
    min_keep_chance: float = 0.5

    def __post_init__(self) -> None:
        _positive("speculative num_tokens", self.num_tokens, 32)
        _positive("speculative max_ngram", self.max_ngram, 16)
        _positive("speculative min_ngram", self.min_ngram, self.max_ngram)
        c = self.min_keep_chance
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < 1:
            raise ValueError(f"speculative min_keep_chance must be in [0, 1), got {c!r}")

    @classmethod
    def from_num_tokens(
        cls, num_tokens: int, name: str = "speculative num_tokens", **kwargs: Any
    ) -> SpeculativeConfig | None:  # Any: the other fields, checked by the class
        """The config for a user's draft count, where 0 means speculation is off (None); ``name`` is
        the setting as the user wrote it, for the error a negative count gets; ``kwargs``, the other fields."""
        if num_tokens < 0:
            raise ValueError(f"{name} must be 0 (off) or positive, got {num_tokens}")
        return cls(num_tokens=num_tokens, **kwargs) if num_tokens else None


@dataclass(frozen=True)
class LaneShareConfig:
    """One traffic lane as a decode worker's scheduler sees it (``engine/lane_shares.py``): lanes reach
    the engine as their priority (lower is more important), so lanes of equal priority share one entry.

    ``weight``: its share of sequence slots and decode tokens among the lanes with demand; ``floor``:
    the fraction of them it keeps while it has demand, whatever the others want (no lane starves);
    ``preemptible``: whether its running sequences may be preempted for a more important lane's pace."""

    priority: int
    weight: float = 1.0
    floor: float = 0.05
    preemptible: bool = False

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"lane share weight must be > 0, got {self.weight!r}")
        if not 0 <= self.floor < 1:
            raise ValueError(f"lane share floor must be in [0, 1), got {self.floor!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Token-budget continuous batching limits.

    ``policy='static'`` is the static-batching baseline: a batch of ``static_batch_size`` requests
    is admitted only when the previous one has fully finished (its prompts start over as many steps
    as the token budget needs), and rows that finish early keep computing (as padding) until the
    batch's longest request ends.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # The most prompt tokens a step computes, all prefill chunks together (None: the whole
    # max_num_batched_tokens). Decodes are not counted: a disaggregated decode worker caps its local
    # prefills so that they never stall its decode steps for long.
    prefill_token_budget: int | None = None
    policy: Literal["continuous", "static"] = "continuous"
    static_batch_size: int = 16
    # Free blocks kept back when admitting new requests, so running ones can grow without preemption.
    admission_watermark: float = 0.01
    # A waiting request whose next prompt block a running request is still computing waits for it
    # (then hits the prefix cache) instead of computing the same prefix alongside it. Off: the
    # plain first-come admission, for comparison.
    defer_for_shared_prefix: bool = True
    # N-gram speculative decoding; None: off (one token a decode step).
    speculative: SpeculativeConfig | None = None
    # Decode capacity by lane (engine/lane_shares.py): sequence slots shared by lane weight with a
    # floor per lane, and preemption of preemptible lanes for a more important lane's pace. Empty: off.
    lane_shares: tuple[LaneShareConfig, ...] = ()

    def __post_init__(self) -> None:
        if len({s.priority for s in self.lane_shares}) != len(self.lane_shares):
            raise ValueError("lane_shares: one entry per priority")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise ValueError(f"speculative must be a SpeculativeConfig or None, got {self.speculative!r}")
        _positive("max_num_seqs", self.max_num_seqs, MAX_NUM_SEQS)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("static_batch_size", self.static_batch_size)
        if self.prefill_token_budget is not None:
            _positive("prefill_token_budget", self.prefill_token_budget)
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"scheduler policy must be 'continuous' or 'static', got {self.policy!r}")
        if not 0 <= self.admission_watermark < 1:
            raise ValueError(f"admission_watermark must be in [0, 1), got {self.admission_watermark!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache. ``num_blocks=None`` sizes the pool from ``kv_cache_memory_gb``, which defaults
    to 2 GiB on CPU; on CUDA without it, from a profiling forward pass (engine/kv_memory.py):
    ``gpu_memory_utilization`` x ``gpu_fraction`` x the device's total memory, less what the process
    holds and the forward's peak. ``gpu_fraction``: this worker's share of the GPU where workers share
    one (a pool's fractional ``gpus``)."""

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    gpu_fraction: float = 1.0
    enable_prefix_caching: bool = True
    # CPU: allocate the cache in a POSIX shared-memory segment, so a transfer peer on this host
    # copies KV straight out of it (kv_transfer/local_kv.py) instead of over a socket.
    shared_memory: bool = False

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None:
            _positive("num_blocks", self.num_blocks)
        if self.kv_cache_memory_gb is not None and not 0 < self.kv_cache_memory_gb < math.inf:
            raise ValueError(f"kv_cache_memory_gb must be a finite number > 0, got {self.kv_cache_memory_gb!r}")
        for name in ("gpu_memory_utilization", "gpu_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs besides the model weights.

    ``model`` is a path to a Hugging Face directory or a .gguf file, ``default`` (SmolLM2-135M-Instruct)
    or ``tiny`` (a seeded random 4-layer Llama). ``device='auto'`` picks CUDA when available.
    """

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    max_model_len: int | None = None  # default: the model's own context length
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    num_threads: int | None = None  # torch intra-op threads on CPU; None keeps torch's default
    seed: int = 0
    # CUDA with the Triton kernels: decode steps replay CUDA graphs captured at start (engine/cuda_graphs.py).
    cuda_graphs: bool = True
    # The host schedules step n+1 while step n runs on a device thread (engine/async_step.py); steps
    # that need step n's tokens first (prompt chunks, grammars, penalties, drafts) stay synchronous.
    async_scheduling: bool = False
    # Ranks the model is sharded over (engine/parallel/): each a local process holding 1/N of the
    # projections and its heads' KV. Checked against the model's heads when it loads.
    tensor_parallel_size: int = 1
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(self.device)):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be true or false, got {self.async_scheduling!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}")
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        _positive("tensor_parallel_size", self.tensor_parallel_size, MAX_TENSOR_PARALLEL)
        if self.num_threads is not None:
            _positive("num_threads", self.num_threads, max_num_threads())
