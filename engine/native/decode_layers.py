"""ctypes binding of ``decode_layers.c``: a decode step's decoder layers in one call, not ~300.

``NativeDecodeLayers.plan(model)`` describes the model to the C loop once: every projection's
kernel and weight, the norms, the rotary tables and the KV cache's strides. A plan exists only where
every call the Python forward would make is a compiled kernel: projections on the skinny or
quantized kernel, the compiled layer ops, fp32 on CPU. ``run`` then takes a step of at most
``MAX_ROWS`` decode tokens, provided the attention backend's decode kernel is the compiled one and
takes the shapes. The results equal the Python forward's bit for bit (the same kernels in the same
order: tests/engine/native/test_decode_layers.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.linear import Linear
from engine.native.build import bind, build_and_load
from engine.native.layer_ops import NativeLayerOps
from engine.native.paged_decode import NativePagedDecode, kernel_takes
from engine.native.quant_linear import MAX_ROWS as QUANT_MAX_ROWS
from engine.native.quant_linear import STORED_TYPES
from engine.native.skinny_linear import MAX_ROWS

assert QUANT_MAX_ROWS == MAX_ROWS  # a step's rows take one kernel per projection, as Linear.__call__ picks

_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Kernels(ctypes.Structure):
    _fields_ = [
        ("quant_linear", _P),
        ("skinny_linear", _P),
        ("add_rms_norm", _P),
        ("rope", _P),
        ("silu_mul", _P),
        ("paged_decode", _P),
    ]


class _Projection(ctypes.Structure):
    _fields_ = [("weight", _P), ("bias", _P), ("qtype", _I64), ("n", _I64), ("k", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", _Projection),
        ("o", _Projection),
        ("gate_up", _Projection),
        ("down", _Projection),
        ("ln1", _P),
        ("ln2", _P),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", _I64),
        ("hidden", _I64),
        ("heads", _I64),
        ("kv_heads", _I64),
        ("head_dim", _I64),
        ("intermediate", _I64),
        ("block_size", _I64),
        ("eps", _F),
        ("scale", _F),
        ("final_norm", _P),
        ("cos_table", _P),
        ("sin_table", _P),
        ("kv_cache", _P),
        ("block_stride", _I64),
        ("layer_stride", _I64),
        ("kv_stride", _I64),
        ("token_stride", _I64),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("rows", _I64),
        ("h", _P),
        ("out", _P),
        ("work", _P),
        ("positions", _P),
        ("slot_block", _P),
        ("slot_offset", _P),
        ("block_tables", _P),
        ("seq_lens", _P),
        ("bt_stride", _I64),
        ("num_threads", _I64),
    ]


def _address(fn: Any) -> int:  # Any: a C function from ``bind``
    address = ctypes.cast(fn, ctypes.c_void_p).value
    assert address is not None  # (a loaded C function)
    return address


@dataclass
class DecodePlan:
    """The C loop's view of one model with one KV cache; valid while neither changes (the model
    drops it whenever its projections or weights do)."""

    layers: ctypes.Array[_Layer]
    model: _Model
    kernels: _Kernels
    keepalive: list[object]  # the tensors the structs point into and the kernels' libraries
    work: torch.Tensor  # scratch for MAX_ROWS rows


class NativeDecodeLayers:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = bind(lib, "baton_decode_layers_f32", "pppp", ctypes.c_int)

    @classmethod
    def load(cls) -> NativeDecodeLayers | None:
        library = build_and_load("decode_layers.c")
        return cls(library.lib) if library.lib is not None else None

    def plan(self, model: Any, kv_cache: torch.Tensor, decode_kernel: NativePagedDecode | None) -> DecodePlan | None:
        """The plan for ``model`` (a LlamaModel) over ``kv_cache``, or None where some call of its
        decode forward is not a compiled kernel (that forward then runs in Python, as before). (Any:
        engine/model/llama.py imports this module.)"""
        ops, cfg = model.kernels.layer_ops, model.cfg
        if (
            decode_kernel is None
            or not isinstance(ops, NativeLayerOps)
            or model.dtype != torch.float32
            or model.device.type != "cpu"
            or kv_cache.dtype != torch.float32
            or kv_cache.dim() != 6
            or kv_cache.stride(-1) != 1
            or model.head_dim % 2
            or not model.rope.cos.is_contiguous()
            or not model.rope.sin.is_contiguous()
            or model.rope.cos.dtype != torch.float32
        ):
            return None
        keepalive: list[object] = []

        def projection(linear: Linear) -> _Projection | None:
            if linear.skinny is None:  # MKL (or oneDNN) would multiply it: not here
                return None
            bias = linear.bias
            if linear.quant is not None:
                q = linear.quantized
                assert q is not None  # (quant is set only with blocks)
                keepalive.append(q.blocks)
                weight, qtype = q.blocks.data_ptr(), STORED_TYPES[q.qtype][0]
            else:
                keepalive.append(linear.weight)
                weight, qtype = linear.weight.data_ptr(), 0
            if bias is not None:
                keepalive.append(bias)
            n, k = linear.weight.shape
            return _Projection(weight, None if bias is None else bias.data_ptr(), qtype, n, k)

        layers = (_Layer * len(model.layers))()
        for i, layer in enumerate(model.layers):
            parts = [projection(p) for p in layer.projections()]
            if any(p is None for p in parts):
                return None
            for norm in (layer.ln1, layer.ln2):
                if not (norm.is_contiguous() and norm.dtype == torch.float32):
                    return None
                keepalive.append(norm)
            layers[i] = _Layer(*parts, layer.ln1.data_ptr(), layer.ln2.data_ptr())
        keepalive += [model.norm, model.rope.cos, model.rope.sin]
        # The attention kernel's static requirements, on a q laid out as the loop lays it (heads of a
        # fused qkv row) and a layer's K view; per step only the block tables' dtype is checked.
        q_size, kv_size = model.q_size, model.kv_size
        q = torch.empty((1, q_size + 2 * kv_size))[:, :q_size].view(1, model.num_heads, model.head_dim)
        if not kernel_takes(q, kv_cache[:, 0, 0], kv_cache[:, 0, 1], torch.zeros((1, 1), dtype=torch.int32)):
            return None
        m = _Model(
            len(model.layers),
            cfg.hidden_size,
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
            cfg.intermediate_size,
            kv_cache.shape[3],
            cfg.rms_norm_eps,
            model.scale,
            model.norm.data_ptr(),
            model.rope.cos.data_ptr(),
            model.rope.sin.data_ptr(),
            kv_cache.data_ptr(),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
        )
        quant = next((p.quant for layer in model.layers for p in layer.projections() if p.quant is not None), None)
        skinny = model.kernels.skinny
        kernels = _Kernels(
            _address(quant._fn) if quant else None,
            _address(skinny._fn),
            _address(ops._norm),
            _address(ops._rope),
            _address(ops._silu_mul),
            _address(decode_kernel._fn),
        )
        keepalive += [kv_cache, quant, skinny, ops, decode_kernel]
        # x, qkv, attention out, delta, gate|up, SiLU * up: the C loop's scratch rows
        per_row = cfg.hidden_size * 2 + q_size + 2 * kv_size + q_size + 3 * cfg.intermediate_size
        return DecodePlan(layers, m, kernels, keepalive, torch.empty(MAX_ROWS * per_row, dtype=torch.float32))

    def run(
        self,
        plan: DecodePlan,
        h: torch.Tensor,
        positions: torch.Tensor,
        slot_block: torch.Tensor,
        slot_offset: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor | None:
        """The final-normed hidden states of a decode step's rows (h, the embedded tokens, is updated in
        place as the residual stream), or None where this step is not the plan's to run."""
        rows = h.shape[0]
        if not (
            0 < rows <= MAX_ROWS
            and block_tables.dtype == torch.int32
            and block_tables.stride(-1) == 1
            and seq_lens.dtype == torch.int32
            and seq_lens.is_contiguous()
            and all(t.dtype == torch.int64 and t.is_contiguous() for t in (positions, slot_block, slot_offset))
        ):
            return None
        out = torch.empty_like(h)
        step = _Step(
            rows,
            h.data_ptr(),
            out.data_ptr(),
            plan.work.data_ptr(),
            positions.data_ptr(),
            slot_block.data_ptr(),
            slot_offset.data_ptr(),
            block_tables.data_ptr(),
            seq_lens.data_ptr(),
            block_tables.stride(0),
            torch.get_num_threads(),
        )
        failed = self._fn(ctypes.byref(plan.kernels), plan.layers, ctypes.byref(plan.model), ctypes.byref(step))
        if failed:
            raise ValueError(f"native decode layers: layer {failed - 1}'s kernel refused a {rows}-row step")
        return out
