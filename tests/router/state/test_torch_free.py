"""The shared-state modules are imported by the router, which never imports torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "router.state",
    "router.state.connection",
    "router.state.registry",
    "router.state.prefix_index",
    "router.state.rate_limit",
    "router.state.idempotency",
    "router.state.journal",
    "baton.redis_server",
]


def test_state_modules_do_not_import_torch() -> None:
    code = "import sys\n" + "".join(f"import {m}\n" for m in MODULES) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
