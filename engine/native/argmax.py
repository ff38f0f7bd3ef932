"""ctypes binding of ``argmax.c``: ``torch.argmax(logits, dim=-1)`` for CPU fp32 rows, the same
indices (first of the largest; NaN largest), vectorised where torch's is a scalar reduction."""

from __future__ import annotations

import ctypes

import torch

from engine.native.build import bind, build_and_load


class NativeArgmax:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = bind(lib, "baton_argmax_rows_f32", "plllpi")

    @classmethod
    def load(cls) -> NativeArgmax | None:
        library = build_and_load("argmax.c")
        return cls(library.lib) if library.lib is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Row indices of x [rows, cols]; inputs the kernel does not take (not CPU fp32 rows with unit
        column stride, or no columns) go to torch."""
        if not (
            x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(1) == 1 and x.shape[1] > 0
        ):
            return x.argmax(dim=-1)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._fn(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr(), torch.get_num_threads())
        return out
