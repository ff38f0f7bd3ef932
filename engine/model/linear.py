"""A projection's weight held in the form the device multiplies fastest, and the kernel that multiplies it.

Three ways, one per model (``LlamaModel.set_projections``), all computing ``x @ weight.T + bias``:

- ``packed`` (CPU fp32 with oneDNN): the weight is packed once at load into oneDNN's blocked layout
  and multiplied with ``torch.ops.mkldnn._linear_pointwise`` -- what torch.compile's CPU freezing path
  does. MKL's sgemm (``F.linear``) against the ``[out, in]`` weight runs one matrix-vector pass per
  row for a few rows (a decode step of 3 sequences reads every weight 3 times) and, on the AMD
  hosts measured, ran prefill at half oneDNN's rate. Packing replaces the dense weight (no copy).
- ``skinny`` (CPU fp32 on Intel with AVX-512): the weight stays dense; up to 64 rows (decode steps)
  go to the compiled kernel ``engine/native/skinny_linear.c``, which streams the weight once at
  memory speed, and larger products (prefill) to MKL, which on Intel runs them as fast as the
  packed weight. SmolLM2's decode steps against packed (docs/BENCHMARKS.md, "skinny projections"):
  1.19x faster at 1 row, 1.34x at 8, 1.16x at 32, 1.05x at 64; prefill the same.
- ``quantized`` (skinny, for a model imported from GGUF): up to 64 rows multiply the file's own
  blocks (Q4_1, Q8_0: ``engine/native/quant_linear.c``), dequantized in L1 to exactly the floats the
  dense weight holds, so the results are the skinny kernel's bit for bit while the weight stream is
  5-8.5 bits a weight instead of 32 (SmolLM2's decode projections 2.3x faster at 1 row, 1.14x at 64).
  Projections without blocks, and larger products, go the skinny way -- except where MKL is not the
  fast large product (AMD: ``packs_large_products``): there a projection with blocks keeps oneDNN's
  packed weight instead of the dense one for its larger products (prefill); one without blocks
  still goes the skinny way (MKL for its larger products). On the Zen 5 host measured, SmolLM2's
  decode steps are 3.02x faster at 1 row and 1.15x at 64 than packed, prefill the same
  (docs/BENCHMARKS.md, "Engine: offline throughput", the Zen 5 host); 3.9-4.2x at 1 row since a
  single row skips the L1 buffer ("One row straight from the registers").
- ``dense``: ``F.linear`` (CUDA, other dtypes, a torch without oneDNN, A/B runs).

Beside any of the CPU modes, where the CPU has AMX (Intel Xeon, Sapphire Rapids on) larger products
(prefill) can take ``engine/native/amx_linear.c`` instead (``use_amx``): the weight split once into three
bfloat16 pieces in the tiles' layout, six exact tile products a pair of tiles, fp32-class results
(the C file says why), 1.1-1.6x MKL's fp32 rate on the 2-core Xeon measured (docs/BENCHMARKS.md,
"Engine: AMX for prefill"). Decode-sized products keep their kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.cpu_info import cpuinfo_field
from engine.native.amx_linear import AmxWeight, NativeAmxLinear
from engine.native.quant_linear import MAX_ROWS as QUANT_MAX_ROWS
from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight
from engine.native.skinny_linear import MAX_ROWS as SKINNY_MAX_ROWS

assert QUANT_MAX_ROWS == SKINNY_MAX_ROWS  # one row limit decides "decode-sized" for both kernels
from engine.native.skinny_linear import NativeSkinnyLinear, bias_fits

PROJECTION_MODES = ("dense", "packed", "skinny", "quantized")


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def default_projections(device: torch.device, dtype: torch.dtype, skinny: NativeSkinnyLinear | None) -> str:
    """``skinny`` where its AVX-512 kernel loaded and MKL is the fast large product (Intel), else
    ``packed`` where oneDNN can pack, else ``dense``. Elsewhere the skinny kernel would need another
    large-product path: MKL was slow on the AMD hosts, and oneDNN multiplies its own packed copy, so
    skinny decode with packed prefill would hold two fp32 copies of every weight. (On an AVX2 Zen 3
    host the AVX2 tile beat oneDNN's packed weights in SmolLM2's decode steps, 1.74x at 1 row to
    1.23x at 64: docs/BENCHMARKS.md. GGUF models get that gain from their blocks, the compact
    second copy, in the quantized mode.)"""
    if (device.type == "cpu" and dtype == torch.float32 and skinny is not None and skinny.lanes == 16
            and cpu_vendor() == "GenuineIntel"):
        return "skinny"
    return "packed" if can_pack(device, dtype) else "dense"


def packs_large_products(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the quantized mode multiplies larger products (prefill) with oneDNN's packed weight
    rather than MKL's ``F.linear``: where oneDNN packs and the CPU is not Intel's (on the AMD hosts
    measured, MKL ran 2,048-row products at 0.43-0.5x oneDNN's rate)."""
    return can_pack(device, dtype) and cpu_vendor() != "GenuineIntel"


class Linear:
    """``y = x @ weight.T + bias`` for x ``[rows, in]``, weight ``[out, in]``."""

    __slots__ = ("weight", "bias", "packed", "skinny", "quantized", "quant", "amx", "amx_weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False) -> None:
        self.bias = bias
        self.packed = False
        self.skinny: NativeSkinnyLinear | None = None
        self.quantized: QuantizedWeight | None = None  # the GGUF blocks ``weight`` was dequantized from
        self.quant: NativeQuantLinear | None = None  # set while the quantized mode multiplies them
        self.amx: NativeAmxLinear | None = None  # set while larger products go to AMX (use_amx)
        self.amx_weight: AmxWeight | None = None  # the weight's pieces for it, kept once made
        self.weight = weight
        if pack:
            self.pack()

    def use(self, mode: str, skinny: NativeSkinnyLinear | None = None, quant: NativeQuantLinear | None = None,
            pack_large: bool = False) -> None:
        """Switch to ``mode`` (one of ``PROJECTION_MODES``); same products, another kernel. A weight
        the skinny kernel does not take (in-features not a multiple of 16) stays with MKL; in the
        quantized mode, one without blocks goes the skinny way (so a decode step's layers can still
        run in C), and with ``pack_large`` (where MKL is slow) one with blocks holds the packed
        weight instead of the dense one for its larger products."""
        if mode not in PROJECTION_MODES:
            raise ValueError(f"projection mode must be one of {PROJECTION_MODES}, got {mode!r}")
        if mode in ("skinny", "quantized") and skinny is None:
            raise ValueError(f"{mode} projections need the compiled kernel (engine/native/skinny_linear.c)")
        if mode == "quantized" and quant is None:
            raise ValueError("quantized projections need the compiled kernel (engine/native/quant_linear.c)")
        blocks = mode == "quantized" and self.quantized is not None and bias_fits(self.bias, self.out_features)
        self.pack() if mode == "packed" or (blocks and pack_large) else self.unpack()
        if blocks:  # decode-sized products multiply the blocks, whatever form the weight is in
            self.skinny, self.quant = skinny, quant
        else:
            takes = mode in ("skinny", "quantized")
            self.skinny = skinny if takes and skinny.supports_weight(self.weight, self.bias) else None
            self.quant = None

    def use_amx(self, amx: NativeAmxLinear | None) -> None:
        """Larger products (more rows than a decode step's) on AMX, or (None) back to the mode's own path.
        The weight's pieces are made on the first call and kept, so switching back and forth (A/B runs)
        costs nothing after it; a weight the kernel does not take stays on the mode's path."""
        if amx is not None and not self.packed and amx.supports_weight(self.weight, self.bias):
            if self.amx_weight is None or self.amx_weight.shape != tuple(self.weight.shape):
                self.amx_weight = amx.pack(self.weight)
            self.amx = amx
        else:
            self.amx = None

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
        small = 0 < x.shape[0] <= SKINNY_MAX_ROWS and x.dim() == 2 and x.stride(1) == 1
        if small and self.quant is not None:
            return self.quant(x, self.quantized, self.bias)
        if self.amx is not None and x.shape[0] > SKINNY_MAX_ROWS and x.dim() == 2 and x.stride(1) == 1:
            return self.amx(x, self.amx_weight, self.bias)
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if small and self.skinny is not None:
            return self.skinny(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ...; empty where /proc/cpuinfo is absent."""
    return cpuinfo_field("vendor_id")
