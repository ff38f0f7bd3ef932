"""A projection's weight held in the form the device multiplies fastest.

On CPU (fp32) the weight is packed once at load into oneDNN's blocked layout and multiplied with
``torch.ops.mkldnn._linear_pointwise`` -- what torch.compile's CPU freezing path does. ``F.linear``
against the ``[out, in]`` weight as stored goes through MKL's sgemm, which for a few rows runs one
matrix-vector pass per row (a decode step of 3 sequences reads every weight 3 times) and for many
rows repacks the weight on every call. Measured on the 2-core CPU with SmolLM2's 30 layers out of
cache (docs/BENCHMARKS.md, "packed weights"): 2.2x faster for 1 row, 2.5-3.4x for 2-8, 2.2-2.4x
for 32-512. Packing replaces the dense weight (no second copy); ``unpack`` restores it.

Elsewhere (CUDA, other dtypes, a torch without oneDNN) the weight stays dense and ``F.linear`` runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear:
    """``y = x @ weight.T + bias`` for x ``[rows, in]``, weight ``[out, in]``."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False) -> None:
        self.bias = bias
        self.packed = False
        self.weight = weight
        if pack:
            self.pack()

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def pack(self) -> None:
        if not self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.contiguous())
            self.packed = True

    def unpack(self) -> None:
        if self.packed:
            self.weight = self.weight.to_dense()
            self.packed = False

    def dense_weight(self) -> torch.Tensor:
        return self.weight.to_dense() if self.packed else self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
