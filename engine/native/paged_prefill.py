"""ctypes binding of ``paged_prefill.c``: every prefill chunk of a step attended in one call, reading
the paged cache in place (CPU, fp32).

Same signature and result as ``paged_prefill_attention`` (engine/attention/__init__.py). Inputs the
kernel does not take (another dtype, head_dim not a multiple of 16 or over 128, more than 8 query
heads per KV head, blocks over 64 tokens, rows whose heads are not contiguous, int64 tables) are
refused by ``supports``; the CPU attention path then uses its torch path for that call.
"""

from __future__ import annotations

import ctypes

import torch

from engine.native.build import NativeLibrary, bind, build_and_load
from engine.native.paged_decode import kernel_takes


class NativePagedPrefill:
    def __init__(self, library: NativeLibrary) -> None:
        if library.lib is None:
            raise ValueError(f"native paged prefill unavailable: {library.error}")
        self.library = library
        self._fn = bind(library.lib, "baton_paged_prefill_f32", "plppllplppiiiiifpi", ctypes.c_int)

    @classmethod
    def load(cls, require_tuned: bool = True) -> NativePagedPrefill | None:
        """The kernel, compiled or taken from the cache; None (with nothing raised) when it cannot be
        had, or, with ``require_tuned``, where it is slower than the torch path (a build with neither
        AVX-512 nor AVX2 and FMA: ``baton_paged_prefill_tuned``). Tests take it anyway, for its results."""
        library = build_and_load("paged_prefill.c", extra_flags=("-mprefer-vector-width=512",))
        if library.lib is None:
            return None
        if require_tuned and not bind(library.lib, "baton_paged_prefill_tuned", "", ctypes.c_int)():
            return None
        return cls(library)

    @staticmethod
    def supports(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> bool:
        return (
            kernel_takes(q, k_cache, v_cache, block_tables)
            and cu_seqlens_q.dtype == torch.int32
            and cu_seqlens_q.is_contiguous()
            and seq_lens.dtype == torch.int32
            and seq_lens.is_contiguous()
        )

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype)
        num_seqs = seq_lens.shape[0]
        if num_tokens == 0 or num_seqs == 0:
            return out
        failed = self._fn(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.stride(0),
            k_cache.stride(1),
            block_tables.data_ptr(),
            block_tables.stride(0),
            cu_seqlens_q.data_ptr(),
            seq_lens.data_ptr(),
            num_seqs,
            num_heads,
            k_cache.shape[2],
            head_dim,
            k_cache.shape[1],
            scale,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if failed == 3:
            raise ValueError("prefill chunks longer than their contexts (cu_seqlens_q against seq_lens)")
        if failed:  # supports() admits only the shapes the kernel takes: a mismatch is a bug here
            raise ValueError(
                f"native paged prefill refused q {tuple(q.shape)}, cache {tuple(k_cache.shape)} (code {failed})"
            )
        return out
