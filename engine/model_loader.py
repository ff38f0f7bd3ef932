"""Builds everything an engine needs from an ``EngineConfig``: the model directory, weights on the
device, the tokenizer, the attention backend and the KV cache."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Callable

import torch

from engine.attention.backend import AttentionBackend, select_backend
from engine.config import EngineConfig
from engine.host_memory import available_bytes
from engine.kernels import kernels_for
from engine.kv_cache import allocate_kv_cache, allocate_shared_kv_cache, kv_block_bytes
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.registry import resolve_model
from engine.model.tokenizer import Tokenizer
from engine.model.weights import BLOCKS_FILE, iter_safetensors, read_ggml_blocks
from engine.native.quant_linear import QuantizedWeight

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_KV_GB = 2.0
_GPU_KV_FRACTION = 0.8


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
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "no GPU is visible to this process (CUDA_VISIBLE_DEVICES, the driver)")
        raise ValueError(f"device={name} was requested (or the worker was given GPUs) but CUDA is not "
                         f"available: {why}; torch {torch.__version__}")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _DTYPES[name]


def load_model(config: EngineConfig, progress: Callable[[str], None] | None = None) -> LoadedModel:
    say = progress or (lambda msg: log.info(msg))
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    model_dir = resolve_model(config.model, progress=say)
    model_cfg = ModelConfig.from_file(model_dir / "config.json")
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    max_len = model_cfg.max_context_len
    if config.max_model_len is not None:
        if config.max_model_len > max_len:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's context length {max_len}")
        max_len = config.max_model_len

    say(f"loading {model_cfg.architecture} weights from {model_dir} ({dtype}, {device})")
    model = LlamaModel(model_cfg, device, dtype, max_positions=max_len, kernels=kernels_for(device, dtype))
    model.load_weights(iter_safetensors(model_dir))
    if model.takes_blocks:  # CPU fp32 decode: multiply a GGUF import's own blocks
        blocks = {name: QuantizedWeight(b, qtype) for name, (b, qtype) in read_ggml_blocks(model_dir).items()}
        if model.attach_quantized(blocks, str(model_dir / BLOCKS_FILE)):
            say(f"decode projections multiply the GGUF blocks ({', '.join(sorted({q.qtype for q in blocks.values()}))})")
    tokenizer = _load_tokenizer(model_dir)

    cc = config.cache
    block_bytes = kv_block_bytes(model_cfg, cc.block_size, dtype)
    if cc.num_blocks is not None:
        num_blocks = cc.num_blocks
    else:
        budget = _kv_budget_bytes(cc.kv_cache_memory_gb, device)
        useful = config.scheduler.max_num_seqs * (-(-max_len // cc.block_size))  # more can never be used
        num_blocks = max(1, min(int(budget // block_bytes), useful))
    kv_segment = None
    what = (f"the KV cache ({num_blocks} blocks of {cc.block_size} tokens, "
            f"{num_blocks * block_bytes / 2**30:.2f} GiB; set by "
            f"{'num_blocks (--num-kv-blocks)' if cc.num_blocks is not None else 'kv_cache_memory_gb (--kv-cache-gb)'}"
            " and block_size (--block-size))")
    available = available_bytes() if device.type == "cpu" else None
    if available is not None and num_blocks * block_bytes > available:
        # Refused here: zero-filling more than the host has gets the process OOM-killed, no message.
        raise ValueError(f"{what} does not fit in this host's available memory ({available / 2**30:.2f} GiB)")
    try:
        if cc.shared_memory and device.type == "cpu":
            kv_cache, kv_segment = allocate_shared_kv_cache(model_cfg, num_blocks, cc.block_size, dtype)
        else:
            kv_cache = allocate_kv_cache(model_cfg, num_blocks, cc.block_size, dtype, device)
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
        attention=select_backend(device, config.attention_backend),
        kv_cache=kv_cache,
        num_blocks=num_blocks,
        kv_segment=kv_segment,
    )


def _kv_budget_bytes(gb: float | None, device: torch.device) -> float:
    if gb is not None:
        return gb * 2**30
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free * _GPU_KV_FRACTION
    return _CPU_KV_GB * 2**30


def _load_tokenizer(model_dir: Path) -> Tokenizer | None:
    if not (model_dir / "tokenizer.json").exists():
        log.warning("%s has no tokenizer.json: only token-id prompts are accepted", model_dir)
        return None
    return Tokenizer.from_dir(model_dir)
