"""What a KV transfer benchmark run (baton/perf/kv_transfer_bench.py) moves and needs: the models'
cache geometries, the bytes a run allocates, and the check of its flags before any peer starts."""

from __future__ import annotations

import shutil

import torch

from baton.perf.random_model import PUBLISHED
from engine.host_memory import available_bytes as _available_memory  # (a module global: tests patch it)


def _kv_geometry(cfg: dict, block_size: int = 16) -> dict:
    """A model configuration's KV cache shape per token (what a transfer moves)."""
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return dict(
        layers=cfg["num_hidden_layers"], kv_heads=cfg["num_key_value_heads"], head_dim=head_dim, block_size=block_size
    )


GEOMETRIES = {
    "smollm2-135m": dict(layers=30, kv_heads=3, head_dim=64, block_size=16),  # the default model
    **{name: _kv_geometry(cfg) for name, cfg in PUBLISHED.items()},  # the GPU measurements' models
}


# The longest prompt a run may ship: the longest context of the geometries' models (Llama-3.2-1B).
MAX_LENGTH = 131072
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _block_bytes(g: dict, dtype: str) -> int:
    return g["layers"] * 2 * g["block_size"] * g["kv_heads"] * g["head_dim"] * _ITEMSIZE[dtype]


def run_bytes(lengths: list[int], geometry: dict, dtype: str) -> int:
    """About how much memory a run allocates: four caches of the longest prompt's blocks (a wire pair
    and a local pair), the copy baseline's two buffers, and the raw send/recv buffers of every length."""
    bs = geometry["block_size"]
    longest = max(lengths)
    blocks = 4 * (longest // bs + 1) + 2 * -(-longest // bs) + 2 * sum(-(-n // bs) for n in lengths)
    return _block_bytes(geometry, dtype) * blocks


def check_args(
    lengths: str, repeats: int, chunk_tokens: int, device: str, geometry: str, dtype: str | None
) -> list[int]:
    """The prompt lengths; ValueError naming the flag that is not valid, before any peer starts."""
    try:
        out = [int(x) for x in str(lengths).split(",")]
    except ValueError:
        raise ValueError(f"--lengths must be comma-separated token counts, got {lengths!r}") from None
    if not out or min(out) <= 0:
        raise ValueError(f"--lengths must be positive token counts, got {lengths!r}")
    if max(out) > MAX_LENGTH:
        raise ValueError(
            f"--lengths must be at most {MAX_LENGTH} tokens (the longest context of the "
            f"geometries' models), got {max(out)}"
        )
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if chunk_tokens < 1:
        raise ValueError(f"--chunk-tokens must be >= 1, got {chunk_tokens}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if geometry not in GEOMETRIES:
        raise ValueError(f"--geometry must be one of {', '.join(sorted(GEOMETRIES))}, got {geometry!r}")
    if dtype is not None and dtype not in _ITEMSIZE:
        raise ValueError(f"--dtype must be one of {', '.join(_ITEMSIZE)}, got {dtype!r}")
    if device == "cpu":
        g, dt = GEOMETRIES[geometry], dtype or "float32"
        need = run_bytes(out, g, dt)
        have = _available_memory()
        if have is not None and need > have:
            raise ValueError(
                f"--lengths {lengths}: the run needs about {need / 2**30:.1f} GiB of memory "
                f"({geometry}, {dt}) but {have / 2**30:.1f} GiB is available: "
                "shorter lengths, or fewer of them"
            )
        shm = 2 * (max(out) // g["block_size"] + 1) * _block_bytes(g, dt)  # the local pair's caches live there
        try:
            shm_free = shutil.disk_usage("/dev/shm").free
        except OSError:
            shm_free = None
        if shm_free is not None and shm > shm_free:
            raise ValueError(
                f"--lengths {lengths}: the local path's caches need about {shm / 2**30:.1f} GiB of "
                f"/dev/shm but {shm_free / 2**30:.1f} GiB is free: shorter lengths"
            )
    return out
