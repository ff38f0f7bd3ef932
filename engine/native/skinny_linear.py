"""ctypes binding of ``skinny_linear.c``: ``x @ w.T + b`` for up to ``MAX_ROWS`` rows (a decode step's
batch) against the dense fp32 weight, streaming it from memory once.

Loaded only where the build has a tile it was tuned for (``baton_skinny_linear_tuned``: 16 lanes with
AVX-512, 8 with AVX2 and FMA); elsewhere ``load`` returns None and the projections keep oneDNN's packed
weights (engine/model/linear.py).
"""

from __future__ import annotations

import ctypes

import torch

from engine.native.build import bind, build_and_load

# Past ~64 rows the product is bound by multiplies, not by the weight stream, and MKL's sgemm catches
# up.
MAX_ROWS = 64


def bias_fits(bias: torch.Tensor | None, out_features: int) -> bool:
    """A bias the compiled projection kernels add (fp32, contiguous, one per output), or none."""
    return bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (out_features,))


class NativeSkinnyLinear:
    def __init__(self, lib: ctypes.CDLL, lanes: int) -> None:
        self._fn = bind(lib, "baton_skinny_linear_f32", "plpppliiii", ctypes.c_int)
        self.lanes = lanes  # of the tile's accumulators: 16 (AVX-512) or 8 (AVX2)

    @classmethod
    def load(cls) -> NativeSkinnyLinear | None:
        """The kernel where it builds and has its tuned tile; None (nothing raised) elsewhere."""
        library = build_and_load("skinny_linear.c")
        lib = library.lib
        lanes = 0 if lib is None else int(bind(lib, "baton_skinny_linear_tuned", "", ctypes.c_int)())
        return cls(lib, lanes) if lib is not None and lanes else None

    @staticmethod
    def supports_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Checked once when a projection takes the kernel; per call only the rows are checked."""
        return (
            weight.dim() == 2
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.layout == torch.strided
            and weight.is_contiguous()
            and weight.shape[1] % 16 == 0
            and bias_fits(bias, weight.shape[0])
        )

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [rows, in] fp32 with unit column stride, 0 < rows <= MAX_ROWS; weight as ``supports_weight`` says."""
        rows, k = x.shape
        n = weight.shape[0]
        out = torch.empty((rows, n), dtype=torch.float32)
        failed = self._fn(
            x.data_ptr(),
            x.stride(0),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            n,
            rows,
            n,
            k,
            torch.get_num_threads(),
        )
        if failed:  # supports() admits only the shapes the kernel takes: a mismatch is a bug here
            raise ValueError(f"native skinny linear refused x {tuple(x.shape)}, weight {tuple(weight.shape)}")
        return out
