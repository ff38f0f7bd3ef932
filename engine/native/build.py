"""Build a C source of this package once per machine and load it with ctypes (no torch headers, no pybind: ~1 s).

The shared library is compiled with ``-O3 -march=native -fopenmp`` into a cache directory keyed by
the source, the compiler, the flags and this CPU's feature flags, so a second process (another
worker, the next start) loads it without compiling, and a cache shared between different hosts
never hands one host another's instructions. Compiling goes to a temporary file renamed into place,
so workers starting together cannot load a half-written library.

Loading must happen after ``import torch``: the library needs ``libgomp.so.1``, and the dynamic
loader then resolves it to the copy torch already loaded, so the kernel's OpenMP threads are torch's
own pool, not a second pool competing for the same cores.

Any failure (no compiler, a compile error, a load error) returns ``None`` with the reason in
``NativeLibrary.error``; callers fall back to the torch path. ``BATON_NATIVE_KERNELS=0`` turns the
kernels off (to compare against the torch path, or on a machine whose compiler misbehaves).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cpu_info import cpuinfo_field

CACHE_ENV = "BATON_KERNEL_CACHE"
DISABLE_ENV = "BATON_NATIVE_KERNELS"
# -fno-trapping-math: the kernels never read the FP exception flags, and without it GCC does not
# turn a float clamp (exp_poly's) into a blend where there are no mask registers (AVX2), so every
# loop calling exp_poly stayed scalar there (SiLU * up slower than torch's two ops). Each
# operation's result is the same; where a loop now vectorises, a reduction in it adds in another
# order (the AVX2 decode softmax's sum: last bits, within the tests' tolerance). The AVX-512 builds'
# vectorisation is unchanged by it, and so are the rotary kernel's instructions.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-trapping-math")
SOURCE_DIR = Path(__file__).resolve().parent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NativeLibrary:
    lib: ctypes.CDLL | None
    path: Path | None
    error: str | None  # why ``lib`` is None


# Any: a C function of ``lib``, whose Python signature ctypes takes from argtypes and restype at run time.
def bind(lib: ctypes.CDLL, symbol: str, argtypes: str, restype: type | None = None) -> Any:
    """``lib.symbol`` with its C signature; ``argtypes`` spells it one letter an argument:
    p pointer, l int64, i int, f float."""
    kinds = {"p": ctypes.c_void_p, "l": ctypes.c_int64, "i": ctypes.c_int, "f": ctypes.c_float}
    fn = getattr(lib, symbol)
    fn.argtypes = [kinds[c] for c in argtypes]
    fn.restype = restype
    return fn


def kernel_cache_dir() -> Path:
    """``$BATON_KERNEL_CACHE``, else ``~/.cache/baton/kernels``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "baton" / "kernels"


def native_kernels_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def build_and_load(
    source_name: str, cache_dir: Path | None = None, compiler: str | None = None, extra_flags: tuple[str, ...] = ()
) -> NativeLibrary:
    """Compile ``SOURCE_DIR/source_name`` with ``FLAGS + extra_flags`` (or reuse its cached build) and load it."""
    import torch  # noqa: F401  (loads torch's libgomp first: see the module docstring)

    if not native_kernels_enabled():
        return NativeLibrary(None, None, f"disabled by {DISABLE_ENV}={os.environ.get(DISABLE_ENV)}")
    library = _build_and_load(source_name, cache_dir, compiler or os.environ.get("CC") or "cc", extra_flags)
    if library.lib is None:
        log.warning("native CPU kernel %s unavailable, using the torch path: %s", source_name, library.error)
    return library


def _build_and_load(source_name: str, cache_dir: Path | None, cc: str, extra_flags: tuple[str, ...]) -> NativeLibrary:
    if shutil.which(cc) is None:
        return NativeLibrary(None, None, f"no C compiler ({cc!r} not found)")
    # The key covers the source and every header it may include (they live beside it).
    sources = [(SOURCE_DIR / source_name).read_bytes(), *(h.read_bytes() for h in sorted(SOURCE_DIR.glob("*.h")))]
    flags = (*FLAGS, *extra_flags)
    key = hashlib.sha256(
        b"\0".join([*sources, _compiler_version(cc).encode(), " ".join(flags).encode(), _cpu_flags().encode()])
    ).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else kernel_cache_dir()
    target = cache / f"{Path(source_name).stem}-{key}.so"
    if not target.is_file():
        try:
            _compile(cc, flags, SOURCE_DIR / source_name, target)
        except (OSError, subprocess.SubprocessError) as e:
            return NativeLibrary(None, None, f"compiling {source_name} failed: {e}")
    try:
        return NativeLibrary(ctypes.CDLL(str(target)), target, None)
    except OSError as e:
        return NativeLibrary(None, target, f"loading {target} failed: {e}")


def _compile(cc: str, flags: tuple[str, ...], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        command = [cc, *flags, f"-I{source.parent}", "-o", tmp, str(source), "-lm"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise subprocess.SubprocessError(f"{cc} exited {done.returncode}: {last}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` depends on them); empty where /proc is absent."""
    return cpuinfo_field("flags", "Features")
