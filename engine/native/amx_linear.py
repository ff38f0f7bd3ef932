"""ctypes binding of ``amx_linear.c``: ``x @ w.T + b`` for prefill-sized products on Intel AMX, to fp32
accuracy (each float split into three bfloat16s, six exact tile products a pair of tiles: the C file's
docstring).

``AmxWeight`` is a weight split and laid out for the tiles once, at load. Loaded only where the build
has AMX-BF16 and the kernel grants the process the tile state; elsewhere ``load`` returns None and
larger products keep their other path (engine/model/linear.py).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from engine.native.build import bind, build_and_load
from engine.native.skinny_linear import bias_fits

DISABLE_ENV = "BATON_AMX"  # 0: larger products keep their other path


@dataclass(frozen=True)
class AmxWeight:
    """A ``[out, in]`` fp32 weight as its three bf16 pieces in AMX's tile layout (uint16, 1.5x the fp32 bytes)."""

    tiles: torch.Tensor
    shape: tuple[int, int]


class NativeAmxLinear:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = bind(lib, "baton_amx_linear", "plpppllllpi", ctypes.c_int)
        self._pack = bind(lib, "baton_amx_pack_weight", "plllpi", ctypes.c_int)
        self._packed_elems = bind(lib, "baton_amx_packed_weight_elems", "ll", ctypes.c_int64)
        self._scratch_elems = bind(lib, "baton_amx_scratch_elems", "ll", ctypes.c_int64)

    @classmethod
    def load(cls) -> NativeAmxLinear | None:
        """The kernel where it builds with AMX-BF16 and Linux grants the tile state; None (nothing raised)
        elsewhere, and where ``BATON_AMX=0``."""
        if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            return None
        library = build_and_load("amx_linear.c")
        if library.lib is None or not bind(library.lib, "baton_amx_available", "", ctypes.c_int)():
            return None
        return cls(library.lib)

    @staticmethod
    def supports_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        return (
            weight.dim() == 2
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.layout == torch.strided
            and weight.stride(1) == 1
            and min(weight.shape) > 0
            and bias_fits(bias, weight.shape[0])
        )

    def pack(self, weight: torch.Tensor) -> AmxWeight:
        """``weight`` split and laid out for the tiles (a new tensor; the weight itself is untouched)."""
        if not self.supports_weight(weight, None):
            raise ValueError(
                f"AMX projections take a 2-D fp32 CPU weight with unit column stride, got "
                f"{weight.dtype} {tuple(weight.shape)} on {weight.device}"
            )
        n, k = weight.shape
        tiles = torch.empty(self._packed_elems(n, k), dtype=torch.uint16)
        if self._pack(weight.data_ptr(), weight.stride(0), n, k, tiles.data_ptr(), torch.get_num_threads()):
            raise ValueError(f"AMX packing refused weight {tuple(weight.shape)}")
        return AmxWeight(tiles, (n, k))

    def __call__(self, x: torch.Tensor, weight: AmxWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [rows, in] fp32 with unit column stride."""
        rows, k = x.shape
        n, k_w = weight.shape
        if k != k_w or x.dtype != torch.float32 or x.stride(1) != 1:
            raise ValueError(
                f"AMX linear takes fp32 x [rows, {k_w}] with unit column stride, got {x.dtype} {tuple(x.shape)}"
            )
        out = torch.empty((rows, n), dtype=torch.float32)
        scratch = torch.empty(self._scratch_elems(rows, k), dtype=torch.uint16)
        failed = self._fn(
            x.data_ptr(),
            x.stride(0),
            weight.tiles.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            n,
            rows,
            n,
            k,
            scratch.data_ptr(),
            torch.get_num_threads(),
        )
        if failed == 2:
            raise MemoryError(f"AMX linear: no memory for the sums of x {tuple(x.shape)} against weight {weight.shape}")
        if failed:
            raise ValueError(f"AMX linear refused x {tuple(x.shape)}, weight {weight.shape}")
        return out
