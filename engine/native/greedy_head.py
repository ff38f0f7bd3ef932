"""ctypes binding of ``greedy_head.c``: a greedy row's token from a Q8_0 head (the default model's tied
embedding) by an int8 screen of the vocabulary with a proven error bound and the exact fp32 logits of
the tokens it cannot rule out: the token the fp32 head's argmax gives, bit for bit, for a fraction of
the multiplies.

Loaded only where the build has AVX-512 VNNI; elsewhere ``load`` returns None and greedy rows take the
full head (engine/runner.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from engine.native.build import bind, build_and_load
from engine.native.quant_linear import MAX_ROWS, QK, QuantizedWeight


@dataclass(frozen=True)
class GreedyHeadWeights:
    """A Q8_0 head in the screen's layouts (greedy_head.c), beside its blocks for the exact logits."""

    wu8: torch.Tensor  # uint8 [N/16, K/4, 16, 4]: q + 128
    scales: torch.Tensor  # float32 [N/16, K/32, 16]: d
    abs_sums: torch.Tensor  # float32 [N/16, K/32, 16]: |d| * sum |q|, a block's share of the bound
    abs_total: torch.Tensor  # float32 [N]: the sum of a token's abs_sums
    blocks: torch.Tensor  # uint8 [N, K/32 * 34]: the file's Q8_0 rows
    shape: tuple[int, int]

    @classmethod
    def of(cls, weight: QuantizedWeight) -> GreedyHeadWeights | None:
        """None where the screen does not take the weight: not Q8_0, or N or K not a multiple of 32."""
        n, k = weight.shape
        if weight.qtype != "Q8_0" or n % 32 or k % QK or n == 0:
            return None
        b = weight.blocks.view(n, k // QK, 34)
        d = b[..., 0:2].contiguous().view(torch.float16).float().view(n, k // QK)
        q = b[..., 2:].contiguous().view(torch.int8)
        wu8 = (q.to(torch.int16) + 128).to(torch.uint8).view(n // 16, 16, k // 4, 4).transpose(1, 2).contiguous()
        abs_sums = d.double().abs() * q.to(torch.int32).abs().sum(dim=-1).double()

        def by_vector(t: torch.Tensor) -> torch.Tensor:
            return t.float().view(n // 16, 16, k // QK).transpose(1, 2).contiguous()

        return cls(wu8, by_vector(d), by_vector(abs_sums), abs_sums.sum(dim=-1).float(), weight.blocks, (n, k))


class NativeGreedyHead:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = bind(lib, "baton_greedy_head_q8_0", "pliiippppppppi", ctypes.c_int)
        self._bounds = torch.empty(0)  # the kernel's room for each row's screened bounds, kept between calls

    @classmethod
    def load(cls) -> NativeGreedyHead | None:
        """The kernel where it builds with AVX-512 VNNI; None (nothing raised) elsewhere."""
        library = build_and_load("greedy_head.c")
        if library.lib is None or not bind(library.lib, "baton_greedy_head_tuned", "", ctypes.c_int)():
            return None
        return cls(library.lib)

    def __call__(self, x: torch.Tensor, head: GreedyHeadWeights) -> tuple[torch.Tensor, int] | None:
        """x: [rows, K] fp32, unit column stride, 0 < rows <= MAX_ROWS (the rows the fp32 head multiplies
        as GGUF blocks). The argmax token of each row's logits (int64) and how many exact logits were
        computed; None where a row is not finite (the caller then computes every logit)."""
        rows, k = x.shape
        if not 0 < rows <= MAX_ROWS or k != head.shape[1] or x.dtype != torch.float32 or x.stride(1) != 1:
            raise ValueError(
                f"the greedy head takes 1 to {MAX_ROWS} fp32 rows of {head.shape[1]}, got {tuple(x.shape)} {x.dtype}"
            )
        tokens = torch.empty(rows, dtype=torch.int64)
        if self._bounds.numel() < rows * head.shape[0]:
            self._bounds = torch.empty(MAX_ROWS * head.shape[0])
        candidates = ctypes.c_int64(0)
        status = self._fn(
            x.data_ptr(),
            x.stride(0),
            rows,
            head.shape[0],
            k,
            head.wu8.data_ptr(),
            head.scales.data_ptr(),
            head.abs_sums.data_ptr(),
            head.abs_total.data_ptr(),
            head.blocks.data_ptr(),
            self._bounds.data_ptr(),
            tokens.data_ptr(),
            ctypes.addressof(candidates),
            torch.get_num_threads(),
        )
        if status == 2:
            return None
        if status:
            raise ValueError(f"native greedy head refused x {tuple(x.shape)} (status {status}), head {head.shape}")
        return tokens, candidates.value
