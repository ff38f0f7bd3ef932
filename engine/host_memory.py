"""Process-wide memory settings for a CPU engine: glibc's malloc keeps freed activation memory;
and how much memory the host has available (``available_bytes``).

A CPU step allocates its activations fresh (a 2,048-row prefill step of SmolLM2 touches ~400 MB,
in tensors of up to 25 MB). By default glibc serves large sizes with ``mmap`` and unmaps them on
free, and trims the heap's free top back to the kernel, so large steps fault their pages in again,
one 4 KiB page at a time. A fixed mmap threshold of 32 MiB (the most glibc accepts) and a 1 GiB
trim threshold keep that memory in the heap, reused from the next step on, so only the first step
faults it in (docs/BENCHMARKS.md, "Engine: freed memory kept").
Only glibc is touched; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20  # the most glibc accepts (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20


def keep_freed_memory() -> bool:
    """Apply the settings (idempotent); False where the C library is not glibc or refused them."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - the lookup raises AttributeError where the C library is not glibc
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(
        mallopt(option, value) == 1
        for option, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (_M_TOP_PAD, TOP_PAD),
        )
    )


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
