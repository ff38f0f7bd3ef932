"""Running a test module's Triton work in a child process: Triton's interpreter must be switched on
before Triton is imported, so on a CPU the kernels run in a fresh interpreter with
``TRITON_INTERPRET=1``. The child prints one line, ``marker`` followed by its results as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

_ROOT = Path(__file__).resolve().parents[2]


def run_triton_child(module: str, marker: str, arg: str, what: str, timeout_s: float = 600) -> dict[str, Any]:
    """``module._child_main()`` in a child process given ``arg`` (its argv[1]); its results."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    code = f"from {module} import _child_main; _child_main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, arg], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
    if proc.returncode != 0 or not lines:
        tail = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        pytest.fail(f"{what} child process failed (rc={proc.returncode}):\n{tail}")
    out: dict[str, Any] = json.loads(lines[-1][len(marker) :])
    return out
