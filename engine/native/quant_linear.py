"""ctypes binding of ``quant_linear.c``: ``x @ w.T + b`` for up to ``MAX_ROWS`` rows against a weight
held as GGUF blocks (Q4_1 or Q8_0), dequantized to exactly the fp32 values the file's import gives.

``QuantizedWeight`` is such a weight: the blocks as bytes, one row of blocks per output feature.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from engine.native.build import bind, build_and_load

QK = 32  # weights per block, both types
GGML_TYPES = {"Q4_1": (3, 20), "Q8_0": (8, 34)}  # name -> (ggml type id, bytes per block)
# What the kernel reads: the file's types, and Q4_1 regrouped by 8 rows (``regroup``; not a ggml type).
STORED_TYPES = {**GGML_TYPES, "Q4_1x8": (1003, 20)}
GROUP_ROWS = 8

# The skinny kernel's limit: at every row count up to it the blocks beat the dense weight (each weight
# read as 5-8.5 bits instead of 32; the dequantization, once per weight per call, costs less than the
# memory it saves even at 64 rows, where the multiplies dominate: docs/BENCHMARKS.md, "quantized
# projections").
MAX_ROWS = 64


@dataclass(frozen=True)
class QuantizedWeight:
    """A ``[out, in]`` weight as ``blocks`` (uint8 ``[out, in / 32 * block bytes]``) of ``qtype``."""

    blocks: torch.Tensor
    qtype: str

    def __post_init__(self) -> None:
        if self.qtype not in STORED_TYPES:
            raise ValueError(f"quantized weights must be one of {', '.join(STORED_TYPES)}, got {self.qtype!r}")
        b, size = self.blocks, STORED_TYPES[self.qtype][1]
        if b.dtype != torch.uint8 or b.dim() != 2 or b.shape[1] % size or not b.is_contiguous():
            raise ValueError(
                f"{self.qtype} blocks must be a contiguous uint8 [rows, blocks * "
                f"{size}] tensor, got {b.dtype} {tuple(b.shape)}"
            )
        if self.qtype == "Q4_1x8" and b.shape[0] % GROUP_ROWS:
            raise ValueError(f"Q4_1x8 blocks come in groups of {GROUP_ROWS} rows, got {b.shape[0]} rows")

    @property
    def shape(self) -> tuple[int, int]:
        _, size = STORED_TYPES[self.qtype]
        return self.blocks.shape[0], self.blocks.shape[1] // size * QK

    @staticmethod
    def cat(parts: list[QuantizedWeight]) -> QuantizedWeight | None:
        """Rows of ``parts`` one after another (fused projections); None unless all share a type and width."""
        if not parts or len({(p.qtype, p.blocks.shape[1]) for p in parts}) != 1 or parts[0].qtype == "Q4_1x8":
            return None
        return QuantizedWeight(torch.cat([p.blocks for p in parts]), parts[0].qtype)

    def regroup(self) -> QuantizedWeight:
        """Q4_1 in the kernel's faster layout, Q4_1x8 (same bytes, same floats; quant_linear.c): for each
        8 rows and block column, their 8 d, their 8 m, then their nibbles. Other types, and Q4_1 with
        rows not a multiple of 8, come back as they are. The result's byte rows are not weight rows."""
        if self.qtype != "Q4_1" or self.blocks.shape[0] % GROUP_ROWS:
            return self
        n, row_bytes = self.blocks.shape
        cols = row_bytes // GGML_TYPES["Q4_1"][1]
        b = self.blocks.view(n // GROUP_ROWS, GROUP_ROWS, cols, 20).transpose(1, 2)  # [groups, cols, 8, 20]
        # Nibble byte i of a row goes to 4 * (i % 4) + i // 4: where the kernel's shifts find it.
        nibbles = b[..., 4:20].reshape(*b.shape[:3], 4, 4).transpose(3, 4)
        parts = [b[..., 0:2], b[..., 2:4], nibbles]  # d, m, nibbles of the 8 rows
        grouped = torch.cat([p.reshape(n // GROUP_ROWS, cols, -1) for p in parts], dim=2)
        return QuantizedWeight(grouped.reshape(n, row_bytes).contiguous(), "Q4_1x8")


class NativeQuantLinear:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = bind(lib, "baton_quant_linear_f32", "plpippliiii", ctypes.c_int)
        self._dequantize = bind(lib, "baton_quant_dequantize", "pipii", ctypes.c_int)

    @classmethod
    def load(cls, extra_flags: tuple[str, ...] = ()) -> NativeQuantLinear | None:
        """The kernel where it builds with a tuned tile (AVX-512, or AVX2 with FMA) and F16C; None (nothing
        raised) elsewhere. ``extra_flags``: more compiler flags (another ISA's build, in tests)."""
        library = build_and_load("quant_linear.c", extra_flags=extra_flags)
        if library.lib is None or not bind(library.lib, "baton_quant_linear_tuned", "", ctypes.c_int)():
            return None
        return cls(library.lib)

    def dequantize(self, weight: QuantizedWeight) -> torch.Tensor:
        """The fp32 ``[out, in]`` values the kernel multiplies."""
        n, k = weight.shape
        out = torch.empty((n, k), dtype=torch.float32)
        if self._dequantize(weight.blocks.data_ptr(), STORED_TYPES[weight.qtype][0], out.data_ptr(), n, k):
            raise ValueError(f"native dequantization refused {weight.qtype} {tuple(weight.blocks.shape)}")
        return out

    def __call__(self, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [rows, in] fp32 with unit column stride, 0 < rows <= MAX_ROWS."""
        rows, k = x.shape
        n, k_w = weight.shape
        if k != k_w:
            raise ValueError(f"x has {k} features but the {weight.qtype} weight takes {k_w}")
        out = torch.empty((rows, n), dtype=torch.float32)
        failed = self._fn(
            x.data_ptr(),
            x.stride(0),
            weight.blocks.data_ptr(),
            STORED_TYPES[weight.qtype][0],
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            n,
            rows,
            n,
            k,
            torch.get_num_threads(),
        )
        if failed:
            raise ValueError(f"native quantized linear refused x {tuple(x.shape)}, {weight.qtype} weight {(n, k)}")
        return out
