"""A projection's weight held in the form the device multiplies fastest, and the kernel that multiplies it.

Four modes (``ProjectionMode``), one per model (``LlamaModel.set_projections``), all computing
``x @ weight.T + bias``:

- ``PACKED`` (CPU fp32 with oneDNN): the weight is packed once at load into oneDNN's blocked layout
  and multiplied with ``torch.ops.mkldnn._linear_pointwise`` -- what torch.compile's CPU freezing path
  does. MKL's sgemm (``F.linear``) against the ``[out, in]`` weight runs one matrix-vector pass per
  row for a few rows (a decode step of 3 sequences reads every weight 3 times), and on AMD CPUs runs
  prefill slower than oneDNN. Packing replaces the dense weight (no copy).
- ``SKINNY`` (CPU fp32 on Intel with AVX-512): the weight stays dense; up to 64 rows (decode steps)
  go to the compiled kernel ``engine/native/skinny_linear.c``, which streams the weight once at
  memory speed, and larger products (prefill) to MKL, which on Intel runs them as fast as the
  packed weight.
- ``QUANTIZED`` (skinny, for a model imported from GGUF): up to 64 rows multiply the file's own
  blocks (Q4_1, Q8_0: ``engine/native/quant_linear.c``), dequantized in L1 to exactly the floats the
  dense weight holds, so the results are the skinny kernel's bit for bit while the weight stream is
  5-8.5 bits a weight instead of 32. Projections without blocks, and larger products, go the skinny
  way -- except where MKL is not the fast large product (AMD: ``packs_large_products``): there a
  projection with blocks keeps oneDNN's packed weight instead of the dense one for its larger
  products (prefill); one without blocks still goes the skinny way (MKL for its larger products).
- ``DENSE``: ``F.linear`` (CUDA, other dtypes, a torch without oneDNN).

Beside any of the CPU modes, where the CPU has AMX (Intel Xeon, Sapphire Rapids on) larger products
(prefill) can take ``engine/native/amx_linear.c`` instead (``use_amx``): the weight split once into three
bfloat16 pieces in the tiles' layout, six exact tile products a pair of tiles, fp32-class results
(the C file says why). Decode-sized products keep their kernel. The measured rates of each mode are
in docs/BENCHMARKS.md ("Engine: offline throughput", "Engine: AMX for prefill").
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F

from engine.cpu_info import cpuinfo_field
from engine.native.amx_linear import AmxWeight, NativeAmxLinear
from engine.native.quant_linear import MAX_ROWS as QUANT_MAX_ROWS
from engine.native.quant_linear import NativeQuantLinear, QuantizedWeight
from engine.native.skinny_linear import MAX_ROWS as SKINNY_MAX_ROWS
from engine.native.skinny_linear import NativeSkinnyLinear, bias_fits

assert QUANT_MAX_ROWS == SKINNY_MAX_ROWS  # one row limit decides "decode-sized" for both kernels


class ProjectionMode(enum.Enum):
    DENSE = "dense"
    PACKED = "packed"
    SKINNY = "skinny"
    QUANTIZED = "quantized"

    @classmethod
    def of(cls, mode: ProjectionMode | str) -> ProjectionMode:
        """``mode`` itself, or the mode its name (``"packed"``, ...) names."""
        try:
            return cls(mode)
        except ValueError:
            raise ValueError(f"projection mode must be one of {[m.value for m in cls]}, got {mode!r}") from None


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]  # (torch leaves it unannotated)
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def default_projections(device: torch.device, dtype: torch.dtype, skinny: NativeSkinnyLinear | None) -> ProjectionMode:
    """``SKINNY`` where its AVX-512 kernel loaded and MKL is the fast large product (Intel), else
    ``PACKED`` where oneDNN can pack, else ``DENSE``. Elsewhere the skinny kernel would need another
    large-product path: MKL is slow on AMD CPUs, and oneDNN multiplies its own packed copy, so
    skinny decode with packed prefill would hold two fp32 copies of every weight. (GGUF models get
    the skinny kernel's decode speed on those CPUs from their blocks, the compact second copy, in
    the quantized mode.)"""
    if (
        device.type == "cpu"
        and dtype == torch.float32
        and skinny is not None
        and skinny.lanes == 16
        and cpu_vendor() == "GenuineIntel"
    ):
        return ProjectionMode.SKINNY
    return ProjectionMode.PACKED if can_pack(device, dtype) else ProjectionMode.DENSE


def packs_large_products(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the quantized mode multiplies larger products (prefill) with oneDNN's packed weight
    rather than MKL's ``F.linear``: where oneDNN packs and the CPU is not Intel's (MKL runs large
    products well below oneDNN's rate on AMD CPUs)."""
    return can_pack(device, dtype) and cpu_vendor() != "GenuineIntel"


class Linear:
    """``y = x @ weight.T + bias`` for x ``[rows, in]``, weight ``[out, in]``."""

    __slots__ = ("amx", "amx_weight", "bias", "packed", "quant", "quantized", "skinny", "weight")

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

    def use(
        self,
        mode: ProjectionMode | str,
        skinny: NativeSkinnyLinear | None = None,
        quant: NativeQuantLinear | None = None,
        pack_large: bool = False,
    ) -> None:
        """Switch to ``mode``; same products, another kernel. A weight the skinny kernel does not take
        (in-features not a multiple of 16) stays with MKL; in the quantized mode, one without blocks
        goes the skinny way (so a decode step's layers can still run in C), and with ``pack_large``
        (where MKL is slow) one with blocks holds the packed weight instead of the dense one for its
        larger products."""
        mode = ProjectionMode.of(mode)
        takes = mode in (ProjectionMode.SKINNY, ProjectionMode.QUANTIZED)
        if takes and skinny is None:
            raise ValueError(f"{mode.value} projections need the compiled kernel (engine/native/skinny_linear.c)")
        if mode is ProjectionMode.QUANTIZED and quant is None:
            raise ValueError("quantized projections need the compiled kernel (engine/native/quant_linear.c)")
        blocks = (
            mode is ProjectionMode.QUANTIZED and self.quantized is not None and bias_fits(self.bias, self.out_features)
        )
        self.pack() if mode is ProjectionMode.PACKED or (blocks and pack_large) else self.unpack()
        if blocks:  # decode-sized products multiply the blocks, whatever form the weight is in
            self.skinny, self.quant = skinny, quant
        else:
            fits = takes and skinny is not None and skinny.supports_weight(self.weight, self.bias)
            self.skinny = skinny if fits else None
            self.quant = None

    def use_amx(self, amx: NativeAmxLinear | None) -> None:
        """Larger products (more rows than a decode step's) on AMX, or (None) back to the mode's own path.
        The weight's pieces are made on the first call and kept, so switching back and forth costs
        nothing after it; a weight the kernel does not take stays on the mode's path."""
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
            assert self.quantized is not None  # (use sets quant only with blocks)
            return self.quant(x, self.quantized, self.bias)
        if self.amx is not None and x.shape[0] > SKINNY_MAX_ROWS and x.dim() == 2 and x.stride(1) == 1:
            assert self.amx_weight is not None  # (use_amx sets amx only with the pieces)
            return self.amx(x, self.amx_weight, self.bias)
        if self.packed:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
            return out
        if small and self.skinny is not None:
            return self.skinny(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ...; empty where /proc/cpuinfo is absent."""
    return cpuinfo_field("vendor_id")
