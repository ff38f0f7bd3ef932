"""The engine is the model-execution core shared by both pools: it imports no Ray (a pool worker
injects its Ray rank starter, baton/ray_ranks.py)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import engine


def test_no_engine_module_imports_ray():
    names = [m.name for m in pkgutil.walk_packages([str(Path(engine.__file__).parent)], "engine.")]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        pass  # an optional backend (triton, a native build) this machine lacks\n"
        "assert 'ray' not in sys.modules, [m for m in sys.modules if m.startswith('ray')][:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
