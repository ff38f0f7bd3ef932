"""Safetensors weight files of a Hugging Face model directory: lazy reading, streaming writing.

Every model source (HF directory, GGUF import, the tiny test model) ends up as an HF-format
directory, so this is the one place that touches weight files on disk. Reading is lazy (one tensor
in memory at a time) because the engine copies each tensor to its device and drops it; writing is
streamed for the same reason, so a GGUF import never holds the whole dequantized model at once.
Errors are ``ModelLoadError``s naming the file and the problem, because a half-downloaded shard
otherwise surfaces as an opaque Rust panic deep inside ``safe_open``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from engine.errors import ModelLoadError
from engine.parallel.layout import TensorPart, part_ranges

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# A GGUF import's quantized blocks, next to the fp32 weights they dequantize to: uint8 tensors named
# like the weights, their GGML types in the metadata key ``ggml_types`` (a JSON object).
BLOCKS_FILE = "ggml-blocks.safetensors"

# torch dtype -> safetensors dtype tag (only what the writers here need).
_ST_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
}


def weight_files(model_dir: Path) -> list[tuple[Path, set[str] | None]]:
    """The safetensors files of ``model_dir`` in load order, each with the tensor names the index
    expects in it (``None`` when there is no index to check against)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: model directory not found")
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{index_path}: invalid JSON ({e})") from None
        except (KeyError, TypeError) as e:
            raise ModelLoadError(f"{index_path}: malformed index ({e})") from None
        expected: dict[str, set[str]] = {}
        for name, file_name in weight_map.items():
            expected.setdefault(str(file_name), set()).add(name)
        files: list[tuple[Path, set[str] | None]] = []
        for file_name in sorted(expected):
            path = model_dir / file_name
            if not path.is_file():
                raise ModelLoadError(f"{index_path}: names shard {file_name!r}, which does not exist in {model_dir}")
            files.append((path, expected[file_name]))
        if not files:
            raise ModelLoadError(f"{index_path}: the index lists no tensors")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [(single, None)]
    found = sorted(p for p in model_dir.glob("*.safetensors") if p.is_file() and p.name != BLOCKS_FILE)
    if not found:
        raise ModelLoadError(f"{model_dir}: no weights files (expected {SINGLE_FILE}, {INDEX_FILE} or *.safetensors)")
    return [(p, None) for p in found]


def iter_safetensors(
    model_dir: Path, part: Callable[[str], TensorPart | None] | None = None
) -> Iterator[tuple[str, torch.Tensor, str]]:
    """Yield ``(tensor name, tensor, file name)`` for every tensor of the model, one at a time.
    ``part(name)``: the part of the tensor to read ((dimension, start, stop), or several ranges
    concatenated), None for all of it; only that part is read from the file (a tensor-parallel
    rank's shard: engine/parallel/layout.py).

    Files are validated before the first tensor is yielded for that file (header readable, every
    tensor the index assigns to it present), so a broken download fails early with a useful message.
    """
    for path, expected in weight_files(Path(model_dir)):
        _check_header(path)
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{path}: cannot open safetensors file ({e})") from None
        with handle as f:
            names = list(f.keys())
            if expected is not None:
                missing = sorted(expected - set(names))
                if missing:
                    raise ModelLoadError(
                        f"{path}: tensor(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} are listed in "
                        f"{INDEX_FILE} but missing from this shard"
                    )
            for name in names:
                try:
                    where = part(name) if part is not None else None
                    tensor = f.get_tensor(name) if where is None else _read_part(f.get_slice(name), where)
                except (SafetensorError, OSError, RuntimeError, ValueError) as e:
                    raise ModelLoadError(f"{path}: cannot read tensor {name!r} ({e})") from None
                yield name, tensor, path.name


def _read_part(view: Any, part: TensorPart) -> torch.Tensor:
    """The ranges ``part`` names of a safetensors slice view, concatenated (each read alone)."""
    dim, ranges = part_ranges(part, tuple(view.get_shape()))
    pieces = [view[(slice(None),) * dim + (slice(lo, hi),)] for lo, hi in ranges]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


def read_ggml_blocks(model_dir: Path) -> dict[str, tuple[torch.Tensor, str]]:
    """``{weight name: (uint8 blocks [rows, row bytes], GGML type name)}`` from ``BLOCKS_FILE``;
    empty when the directory has none (not a GGUF import, or one made before blocks were kept)."""
    path = Path(model_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    _check_header(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            types = json.loads((f.metadata() or {}).get("ggml_types", "{}"))
            if not isinstance(types, dict) or set(types) != set(f.keys()):
                raise ModelLoadError(f"{path}: the ggml_types metadata does not list the file's tensors")
            return {name: (f.get_tensor(name), str(types[name])) for name in f.keys()}  # noqa: SIM118 - a safetensors file, not a dict
    except (SafetensorError, OSError, RuntimeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read GGUF blocks ({e})") from None


def _check_header(path: Path) -> None:
    """Validate the header and that the data section is as long as the header says.

    ``safe_open`` does check this, but its errors do not name the file, and a truncated file is
    the common failure (interrupted download / copy), so it gets a precise message here.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{path}: corrupt safetensors file (truncated header, {size} bytes)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > size - 8 or header_len > 100_000_000:
                raise ModelLoadError(
                    f"{path}: corrupt safetensors header (declares {header_len} header bytes, file has {size})"
                )
            header = json.loads(fh.read(header_len))
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_end = max((_entry_end(path, k, v) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + data_end > size:
        raise ModelLoadError(
            f"{path}: truncated safetensors file ({size} bytes, header describes {8 + header_len + data_end})"
        )


def _entry_end(path: Path, name: str, entry: object) -> int:
    """Where one tensor's data ends, after checking its header entry has the fields safetensors needs
    (safe_open's own complaint would not name the file)."""

    def bad(what: str) -> ModelLoadError:
        return ModelLoadError(f"{path}: corrupt safetensors header (tensor {name!r}: {what})")

    def is_index(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not isinstance(entry, dict):
        raise bad("not a JSON object")
    if not isinstance(entry.get("dtype"), str):
        raise bad(f"dtype must be a string, got {entry.get('dtype')!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(is_index(d) for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r}")
    offsets = entry.get("data_offsets")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(is_index(o) for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise bad(f"data_offsets must be [begin, end] with integers 0 <= begin <= end, got {offsets!r}")
    end: int = offsets[1]
    return end


def write_safetensors(
    path: Path,
    specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
    tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Stream tensors into a safetensors file without holding them all in memory.

    ``specs`` (name, dtype, shape) must be known up front because the header precedes the data;
    ``tensors`` is then consumed lazily and must produce exactly those tensors in the same order.
    """
    specs = list(specs)
    header: dict[str, object] = {}
    offset = 0
    for name, dtype, shape in specs:
        if dtype not in _ST_DTYPES:
            raise ValueError(f"write_safetensors: unsupported dtype {dtype} for {name}")
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = dict(metadata)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with Path(path).open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for (name, tensor), (spec_name, dtype, shape) in zip(tensors, specs, strict=True):
            if name != spec_name or tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
                raise ValueError(
                    f"write_safetensors: got {name} {tensor.dtype} {tuple(tensor.shape)}, "
                    f"expected {spec_name} {dtype} {tuple(shape)}"
                )
            data = tensor.detach().cpu().contiguous().reshape(-1)
            if data.numel():
                fh.write(data.view(torch.uint8).numpy())  # type: ignore[arg-type]  # (numpy's stubs omit its buffer protocol)


@contextlib.contextmanager
def atomic_model_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a scratch directory next to ``out_dir``; on success it replaces ``out_dir`` by rename.

    Readers therefore see either no directory or a complete one, never a half-written import, even
    if the process is killed mid-write. An existing ``out_dir`` is replaced (moved aside first, then
    deleted) so a re-import works; on error the scratch directory is removed.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model cache is meant to be shared
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "d")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
