"""ctypes binding of ``paged_decode.c``: decode attention reading the paged cache in place (CPU, fp32).

Same signature and result as ``paged_decode_attention`` (engine/attention/__init__.py). Inputs the
kernel does not take (another dtype, head_dim not a multiple of 16 or over 128, more than 8 query
heads per KV head, blocks over 64 tokens, rows whose heads are not contiguous, int64 tables)
are refused by ``supports``; the CPU attention path then uses its torch path for that call.
"""

from __future__ import annotations

import ctypes

import torch

from engine.native.build import NativeLibrary, bind, build_and_load


class NativePagedDecode:
    def __init__(self, library: NativeLibrary) -> None:
        if library.lib is None:
            raise ValueError(f"native paged decode unavailable: {library.error}")
        self.library = library
        self._fn = bind(library.lib, "baton_paged_decode_f32", "plppllplpiiiiifpi", ctypes.c_int)

    @classmethod
    def load(cls, split_tokens: int | None = None, read_ahead: bool = True) -> NativePagedDecode | None:
        """The kernel, compiled or taken from the cache; None (with nothing raised) when it cannot be had.
        ``split_tokens`` overrides the length past which a context is attended in pieces, and
        ``read_ahead=False`` turns off the reading of a piece's rows ahead."""
        flags: tuple[str, ...] = () if split_tokens is None else (f"-DSPLIT_TOKENS={int(split_tokens)}",)
        flags += () if read_ahead else ("-DTOUCH_BYTES=0",)
        library = build_and_load("paged_decode.c", extra_flags=flags)
        return cls(library) if library.lib is not None else None

    @staticmethod
    def supports(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> bool:
        return (
            kernel_takes(q, k_cache, v_cache, block_tables)
            and seq_lens.dtype == torch.int32
            and seq_lens.is_contiguous()
        )

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        num_seqs, num_heads, head_dim = q.shape
        block_size = k_cache.shape[1]
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype)
        if num_seqs == 0:
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
            seq_lens.data_ptr(),
            num_seqs,
            num_heads,
            k_cache.shape[2],
            head_dim,
            block_size,
            scale,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if failed:  # supports() admits only the shapes the kernel takes: a mismatch is a bug here
            raise ValueError(f"native paged decode refused q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
        return out


def kernel_takes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor) -> bool:
    """What the compiled attention kernels (decode and prefill) require of the queries, the cache and
    the block tables: fp32 on CPU, head_dim a multiple of 16 up to 128, blocks of at most 64 tokens,
    at most 8 query heads per KV head, heads contiguous within a row, int32 tables."""
    head_dim, heads, kv_heads, block_size = q.shape[-1], q.shape[1], k_cache.shape[2], k_cache.shape[1]
    return (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and k_cache.dtype == torch.float32
        and head_dim % 16 == 0
        and head_dim <= 128
        and block_size <= 64
        and heads % kv_heads == 0
        and heads // kv_heads <= 8
        and q.stride(2) == 1
        and q.stride(1) == head_dim
        and k_cache.stride() == v_cache.stride()
        and k_cache.stride(3) == 1
        and k_cache.stride(2) == head_dim
        and block_tables.dtype == torch.int32
        and block_tables.stride(-1) == 1
    )
