"""Chooses the attention implementation for a device: Triton kernels on CUDA, the CPU path on CPU
(``cpu.py``: a compiled decode kernel where a C compiler is at hand, else the reference's math with
reused buffers; the plain reference elsewhere)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import reference
from engine.attention.cpu import CpuPagedAttention
from engine.native.paged_decode import NativePagedDecode
from engine.native.paged_prefill import NativePagedPrefill

T = torch.Tensor
# (k_cache, v_cache, k, v, slot_block, slot_offset)
WriteKv = Callable[[T, T, T, T, T, T], None]
# (q, k_cache, v_cache, block_tables, seq_lens, scale) -> out
Decode = Callable[[T, T, T, T, T, float], T]
# (q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale) -> out
Prefill = Callable[[T, T, T, T, T, T, float], T]


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    write_kv: WriteKv
    decode: Decode
    prefill: Prefill
    # The compiled decode kernel ``decode`` uses now (CPU), for callers that run it themselves
    # (engine/native/decode_layers.py); None where there is none.
    decode_kernel: Callable[[], NativePagedDecode | None] = lambda: None


def select_backend(device: torch.device, requested: str = "auto") -> AttentionBackend:
    use_triton = requested == "triton" or (requested == "auto" and device.type == "cuda")
    if not use_triton:
        if device.type == "cpu":
            cpu = CpuPagedAttention(
                NativePagedDecode.load(), NativePagedPrefill.load()
            )  # owns reused buffers: one per runner
            return AttentionBackend("torch", cpu.write_kv, cpu.decode, cpu.prefill, lambda: cpu.native_decode)
        return AttentionBackend(
            "torch", reference.write_kv, reference.paged_decode_attention, reference.paged_prefill_attention
        )
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":  # triton's own error: "0 active drivers"
        raise ValueError(
            "attention_backend=triton runs on CUDA; on a CPU only under TRITON_INTERPRET=1 (the "
            "interpreter, for tests): use auto or torch here"
        )
    try:
        from engine.attention import triton_decode, triton_prefill
    except ImportError as e:  # triton missing: say so rather than silently running the slow path
        raise RuntimeError(f"attention_backend=triton needs the triton package: {e}") from e
    write_kv = reference.write_kv
    try:
        from engine.attention import triton_kv_write

        write_kv = triton_kv_write.write_kv
    except ImportError:
        pass
    return AttentionBackend(
        "triton", write_kv, triton_decode.paged_decode_attention, triton_prefill.paged_prefill_attention
    )
