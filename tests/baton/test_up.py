"""``baton up`` as a user runs it: a subprocess that loads, says where it serves, serves, and on
SIGTERM drains — /ready and new requests get 503 + Retry-After, the request in flight finishes —
then exits cleanly."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_baton_up_serves_then_drains_on_sigterm(tiny_model_dir):
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "baton",
            "up",
            "--model",
            str(tiny_model_dir),
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--decode-workers",
            "1",
            "--prefill-workers",
            "1",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    base = f"http://127.0.0.1:{http_port}"
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stderr:
            lines.append(line)
            if "ready in" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert f"{base}/v1" in lines[-1] and f"127.0.0.1:{grpc_port}" in lines[-1]
        threading.Thread(target=lambda: [lines.append(x) for x in proc.stderr], daemon=True).start()
        assert httpx.get(f"{base}/ready").status_code == 200

        got: list[str] = []
        with httpx.stream(
            "POST",
            f"{base}/v1/completions",
            timeout=120,
            json={"prompt": "drain me", "max_tokens": 300, "ignore_eos": True, "stream": True},
        ) as r:
            it = r.iter_lines()
            got += [next(it) for _ in range(3)]
            proc.send_signal(signal.SIGTERM)
            wait_until(
                lambda: httpx.get(f"{base}/ready").status_code == 503,
                timeout_s=10,
                interval_s=0.05,
                message="/ready to answer 503 once draining",
            )
            refused = httpx.post(f"{base}/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            got += list(it)
        got = [x for x in got if x]  # blank lines separate SSE events
        assert got[-1] == "data: [DONE]"
        assert any('"finish_reason":"length"' in x for x in got)  # the request in flight finished
        assert proc.wait(timeout=60) == 0
        assert any("stopped" in x for x in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
