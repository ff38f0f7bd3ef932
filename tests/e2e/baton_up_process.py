"""``baton up`` as a user starts it: a subprocess, its "ready in" line awaited, killed if a test leaves
it running. Shared by the tests that drive the command as a whole."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class BatonUp:
    proc: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    lines: list[str] = field(default_factory=list)  # its stderr, read on a thread once it is ready

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@contextmanager
def baton_up(*args: str, ready_timeout_s: float = 240.0, env: dict[str, str] | None = None) -> Iterator[BatonUp]:
    """Start ``python -m baton up ARGS`` on free ports; yield once it says it is ready."""
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "baton", "up", *args, "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    up = BatonUp(proc, http_port, grpc_port)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + ready_timeout_s
        for line in proc.stderr:
            up.lines.append(line)
            if "ready in" in line:
                break
            assert time.monotonic() < deadline, "".join(up.lines)
        else:
            raise AssertionError("baton up exited before it was ready:\n" + "".join(up.lines))
        stderr = proc.stderr
        threading.Thread(target=lambda: up.lines.extend(stderr), daemon=True).start()
        yield up
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
