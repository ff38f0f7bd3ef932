"""The kernel seam: the one place that picks, for a (device, dtype) and this CPU's features, the
kernels a model computes with, and hands them to it as a ``KernelSet``.

CPU fp32 gets the compiled kernels of engine/native wherever they build (each ``load`` returns None
where the compiler or the CPU's features do not allow it, and the model then takes its torch path
for that part); CUDA gets the Triton layer ops where they compile and pass their self-check; every
other case, and every part without a kernel, the torch arithmetic. On CUDA the families' Triton
kernels too: windowed / soft-capped attention (engine/attention/triton_decode.py, triton_prefill.py)
and the fused MoE experts (engine/model/moe_fused.py). ``BATON_NATIVE_KERNELS=0``, ``BATON_AMX=0``,
``BATON_TRITON_LAYER_OPS=0`` and ``BATON_TRITON_FAMILY_KERNELS=0`` leave the corresponding kernels out. A different
set for a loaded model (a kernel left out, to compare) is ``dataclasses.replace`` of its set,
given to ``LlamaModel.use_kernels``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import reference
from engine.model.linear import ProjectionMode, default_projections, packs_large_products
from engine.model.moe import FusedExperts
from engine.model.reference_ops import LayerOps, TorchLayerOps
from engine.native.amx_linear import NativeAmxLinear
from engine.native.decode_layers import NativeDecodeLayers
from engine.native.greedy_head import NativeGreedyHead
from engine.native.layer_ops import NativeLayerOps
from engine.native.quant_linear import NativeQuantLinear
from engine.native.skinny_linear import NativeSkinnyLinear

TRITON_LAYER_OPS_ENV = "BATON_TRITON_LAYER_OPS"
TRITON_FAMILY_KERNELS_ENV = "BATON_TRITON_FAMILY_KERNELS"

T = torch.Tensor
# (q, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap) -> out
WindowedDecode = Callable[[T, T, T, T, T, float, int | None, float | None], T]
# (q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, window, softcap) -> out
WindowedPrefill = Callable[[T, T, T, T, T, T, float, int | None, float | None], T]


@dataclass(frozen=True)
class WindowedAttention:
    """Attention for a layer with a sliding window or soft-capped scores (Gemma 2/3, Mistral): the
    paged decode and prefill of engine/attention, with the window and the cap (None: off)."""

    name: str
    decode: WindowedDecode
    prefill: WindowedPrefill


def _reference_windowed_decode(
    q: T, k_cache: T, v_cache: T, block_tables: T, seq_lens: T, scale: float, window: int | None, softcap: float | None
) -> T:
    cu = torch.arange(q.shape[0] + 1, device=q.device)  # one query row per sequence
    return reference.paged_windowed_attention(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, window, softcap)


TORCH_WINDOWED = WindowedAttention("torch", _reference_windowed_decode, reference.paged_windowed_attention)


@dataclass(frozen=True)
class KernelSet:
    layer_ops: LayerOps  # residual add + RMSNorm, the rotary embedding, SiLU * up
    projection_mode: ProjectionMode  # how the projections multiply unless GGUF blocks switch them
    pack_large: bool = False  # the quantized mode keeps oneDNN's packed weights for prefill (MKL is slow)
    skinny: NativeSkinnyLinear | None = None  # decode-sized products (engine/native/skinny_linear.c)
    quant: NativeQuantLinear | None = None  # decode-sized products of GGUF blocks (quant_linear.c)
    amx: NativeAmxLinear | None = None  # the layers' larger products on AMX (amx_linear.c)
    decode_layers: NativeDecodeLayers | None = None  # a decode step's layer loop in one C call
    greedy_head: NativeGreedyHead | None = None  # greedy tokens from a Q8_0 head without every logit
    # Layers with windows or soft-capping, under the Triton attention backend (the torch backend
    # always takes the reference's; engine/model/family_forward.py).
    windowed_attention: WindowedAttention = TORCH_WINDOWED
    fused_moe: FusedExperts | None = None  # a MoE layer's routed experts (None: engine/model/moe.py's torch loop)


def kernels_for(device: torch.device, dtype: torch.dtype) -> KernelSet:
    if device.type != "cpu" or dtype != torch.float32:
        windowed, fused_moe = family_kernels_for(device)
        return KernelSet(
            layer_ops_for(device, dtype),
            default_projections(device, dtype, None),
            packs_large_products(device, dtype),
            windowed_attention=windowed,
            fused_moe=fused_moe,
        )
    skinny = NativeSkinnyLinear.load()
    # The quantized kernel and the greedy head serve only beside the skinny kernel (the quantized mode).
    return KernelSet(
        layer_ops=layer_ops_for(device, dtype),
        projection_mode=default_projections(device, dtype, skinny),
        pack_large=packs_large_products(device, dtype),
        skinny=skinny,
        quant=NativeQuantLinear.load() if skinny is not None else None,
        amx=NativeAmxLinear.load(),
        decode_layers=NativeDecodeLayers.load(),
        greedy_head=NativeGreedyHead.load() if skinny is not None else None,
    )


def layer_ops_for(device: torch.device, dtype: torch.dtype) -> LayerOps:
    """The compiled kernels for CPU fp32 where they build; on CUDA the Triton kernels where they
    compile and pass their self-check (engine/model/triton_layer_ops.py); the torch arithmetic
    everywhere else."""
    if device.type == "cpu" and dtype == torch.float32:
        native = NativeLayerOps.load()
        if native is not None:
            return native
    if device.type == "cuda" and os.environ.get(TRITON_LAYER_OPS_ENV, "1") != "0":
        try:
            from engine.model.triton_layer_ops import checked_triton_layer_ops  # (imports triton)
        except ImportError:  # no triton: the torch ops
            return TorchLayerOps()
        fused = checked_triton_layer_ops(device, dtype)
        if fused is not None:
            return fused
    return TorchLayerOps()


def family_kernels_for(device: torch.device) -> tuple[WindowedAttention, FusedExperts | None]:
    """On CUDA the Triton kernels for windowed / soft-capped attention and for MoE experts (where
    triton imports); the torch reference and the torch MoE path everywhere else (CPU: unchanged)."""
    if device.type != "cuda" or os.environ.get(TRITON_FAMILY_KERNELS_ENV, "1") == "0":
        return TORCH_WINDOWED, None
    try:
        return triton_family_kernels()
    except ImportError:  # no triton: the torch paths
        return TORCH_WINDOWED, None


def triton_family_kernels() -> tuple[WindowedAttention, FusedExperts]:
    """The Triton windowed attention and fused MoE experts (imports triton: on a CPU, only under
    ``TRITON_INTERPRET=1``, for tests)."""
    from engine.attention import triton_decode, triton_prefill
    from engine.model.moe_fused import fused_experts

    windowed = WindowedAttention("triton", triton_decode.paged_decode_attention, triton_prefill.paged_prefill_attention)
    return windowed, fused_experts
