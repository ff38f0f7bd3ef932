"""Builds everything an engine needs from an ``EngineConfig``: the model directory, weights on the
device, the tokenizer, the attention backend and the KV cache."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import torch

from engine.attention.backend import AttentionBackend, select_backend
from engine.config import EngineConfig
from engine.device import bind_device
from engine.host_memory import available_bytes
from engine.kernels import kernels_for
from engine.kv_cache import allocate_kv_cache, allocate_shared_kv_cache, kv_block_bytes
from engine.kv_memory import gpu_kv_blocks, measure_gpu_memory, profile_forward, profile_shape
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.registry import resolve_model
from engine.model.tokenizer import Tokenizer
from engine.model.weights import BLOCKS_FILE, iter_safetensors, read_ggml_blocks
from engine.native.quant_linear import QuantizedWeight
from engine.parallel.group import RankGroup
from engine.parallel.layout import ShardLayout, check_tensor_parallel

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_KV_GB = 2.0


@dataclass
class LoadedModel:
    model_dir: Path
    model_config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer | None
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    attention: AttentionBackend
    kv_cache: torch.Tensor
    num_blocks: int
    kv_segment: SharedMemory | None = None  # where the KV cache is shared with a same-host peer


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA"
            if torch.version.cuda is None
            else "no GPU is visible to this process (CUDA_VISIBLE_DEVICES, the driver)"
        )
        raise ValueError(
            f"device={name} was requested (or the worker was given GPUs) but CUDA is not "
            f"available: {why}; torch {torch.__version__}"
        )
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _DTYPES[name]


def load_model(
    config: EngineConfig, progress: Callable[[str], None] | None = None, group: RankGroup | None = None
) -> LoadedModel:
    """``group``: this rank's tensor-parallel group where ``config.tensor_parallel_size`` > 1 (the
    model is then this rank's shard, read alone from the files, and the KV cache holds its heads)."""
    say = progress or (lambda msg: log.info(msg))
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    model_dir = resolve_model(config.model, progress=say)
    model_cfg = ModelConfig.from_file(model_dir / "config.json")
    tp = config.tensor_parallel_size
    check_tensor_parallel(tp, model_cfg.num_attention_heads, model_cfg.num_key_value_heads, model_cfg.intermediate_size)
    if (tp > 1) != (group is not None) or (group is not None and group.size != tp):
        raise ValueError(f"tensor_parallel_size={tp} needs a group of {tp} ranks to load into")
    # Bound before any CUDA work (weights, the layer-ops self-check), which otherwise lands on device 0.
    device = bind_device(group.device if group is not None else pick_device(config.device))
    dtype = pick_dtype(config.dtype, device)
    max_len = model_cfg.max_context_len
    if config.max_model_len is not None:
        if config.max_model_len > max_len:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's context length {max_len}")
        max_len = config.max_model_len
    attention = select_backend(device, config.attention_backend)

    say(f"loading {model_cfg.architecture} weights from {model_dir} ({dtype}, {device})")
    kernels = kernels_for(device, dtype)
    shard = None
    if group is not None:
        shard = ShardLayout(
            group.rank,
            tp,
            model_cfg.num_attention_heads,
            model_cfg.num_key_value_heads,
            model_cfg.head_dim,
            model_cfg.intermediate_size,
            model_cfg.vocab_size,
        )
        # The kernels that assume the whole model (a decode step's layer loop in C, the greedy head
        # over the head's blocks, the GGUF blocks) are left out: a shard computes on the torch path
        # and the linear kernels, whose shapes are its own.
        kernels = replace(kernels, quant=None, decode_layers=None, greedy_head=None)
    model = LlamaModel(model_cfg, device, dtype, max_positions=max_len, kernels=kernels, shard=shard, collectives=group)
    model.load_weights(iter_safetensors(model_dir, shard.slice_for if shard is not None else None))
    if shard is None and model.takes_blocks:  # CPU fp32 decode: multiply a GGUF import's own blocks
        blocks = {name: QuantizedWeight(b, qtype) for name, (b, qtype) in read_ggml_blocks(model_dir).items()}
        if model.attach_quantized(blocks, str(model_dir / BLOCKS_FILE)):
            say(
                f"decode projections multiply the GGUF blocks ({', '.join(sorted({q.qtype for q in blocks.values()}))})"
            )
    tokenizer = _load_tokenizer(model_dir)

    cc = config.cache
    kv_cfg = model_cfg if shard is None else replace(model_cfg, num_key_value_heads=shard.kv_heads)  # its heads only
    block_bytes = kv_block_bytes(kv_cfg, cc.block_size, dtype)
    useful = config.scheduler.max_num_seqs * (-(-max_len // cc.block_size))  # more can never be used
    if cc.num_blocks is not None:
        num_blocks = cc.num_blocks
    elif device.type == "cuda" and cc.kv_cache_memory_gb is None:
        num_blocks = _profiled_kv_blocks(config, model, attention, kv_cfg, dtype, device, max_len, useful, say)
    else:
        budget = _kv_budget_bytes(cc.kv_cache_memory_gb, device)
        num_blocks = max(1, min(int(budget // block_bytes), useful))
    if group is not None:  # one block manager for the group: every rank holds as many blocks
        num_blocks = group.min_int(num_blocks)
    kv_segment = None
    what = (
        f"the KV cache ({num_blocks} blocks of {cc.block_size} tokens, "
        f"{num_blocks * block_bytes / 2**30:.2f} GiB; set by "
        f"{'num_blocks (--num-kv-blocks)' if cc.num_blocks is not None else 'kv_cache_memory_gb (--kv-cache-gb)'}"
        " and block_size (--block-size))"
    )
    available = available_bytes() if device.type == "cpu" else None
    if available is not None and num_blocks * block_bytes > available:
        # Refused here: zero-filling more than the host has gets the process OOM-killed, no message.
        raise ValueError(f"{what} does not fit in this host's available memory ({available / 2**30:.2f} GiB)")
    try:
        if cc.shared_memory and device.type == "cpu":
            kv_cache, kv_segment = allocate_shared_kv_cache(kv_cfg, num_blocks, cc.block_size, dtype)
        else:
            kv_cache = allocate_kv_cache(kv_cfg, num_blocks, cc.block_size, dtype, device)
    except (RuntimeError, OSError) as e:  # torch's OutOfMemoryError is a RuntimeError
        raise ValueError(f"cannot allocate {what}: {str(e).splitlines()[0]}") from None
    say(f"KV cache: {num_blocks} blocks of {cc.block_size} tokens ({num_blocks * block_bytes / 2**30:.2f} GiB)")
    return LoadedModel(
        model_dir=model_dir,
        model_config=model_cfg,
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        max_model_len=max_len,
        attention=attention,
        kv_cache=kv_cache,
        num_blocks=num_blocks,
        kv_segment=kv_segment,
    )


def _kv_budget_bytes(gb: float | None, device: torch.device) -> float:
    return gb * 2**30 if gb is not None else _CPU_KV_GB * 2**30


def _profiled_kv_blocks(
    config: EngineConfig,
    model: LlamaModel,
    attention: AttentionBackend,
    kv_cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_len: int,
    useful: int,
    say: Callable[[str], None],
) -> int:
    """CUDA: the blocks a profiling forward at the largest batch leaves room for (engine/kv_memory.py)."""
    cc = config.cache
    q_lens = profile_shape(config.scheduler, max_len)
    forward = profile_forward(
        model, attention, q_lens, cc.block_size, lambda n: allocate_kv_cache(kv_cfg, n, cc.block_size, dtype, device)
    )
    report = measure_gpu_memory(device, forward)
    blocks = gpu_kv_blocks(
        report,
        utilization=cc.gpu_memory_utilization,
        gpu_fraction=cc.gpu_fraction,
        block_bytes=kv_block_bytes(kv_cfg, cc.block_size, dtype),
        min_blocks=-(-max_len // cc.block_size),
        max_useful_blocks=useful,
    )
    say(
        f"KV sizing: {len(q_lens)} sequences, {sum(q_lens)} tokens peak at {report.peak / 2**30:.2f} GiB; the process "
        f"holds {report.held / 2**30:.2f} GiB of {report.total / 2**30:.2f} GiB (utilization "
        f"{cc.gpu_memory_utilization:g} x gpus {cc.gpu_fraction:g})"
    )
    return blocks


def _load_tokenizer(model_dir: Path) -> Tokenizer | None:
    if not (model_dir / "tokenizer.json").exists():
        log.warning("%s has no tokenizer.json: only token-id prompts are accepted", model_dir)
        return None
    return Tokenizer.from_dir(model_dir)
