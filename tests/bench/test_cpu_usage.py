"""The experiments' CPU meter: CPU seconds per process group over a run (real processes)."""

import subprocess
import sys
import time

import pytest

from bench.experiments.cpu_usage import CpuMeter

pytestmark = pytest.mark.skipif(not CpuMeter.available(), reason="psutil not installed")


def test_the_server_process_counts_as_router_and_this_one_as_client():
    # Both sides burn CPU time, not wall time: on a loaded host a wall-clock loop gets less CPU.
    burn = (
        "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        "while time.process_time() - t < 0.8:\n    pass\nprint('done', flush=True)\ntime.sleep(60)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter(server.pid, interval_s=0.1)
        meter.start()
        server.stdin.write("go\n")  # the server's 0.8 s start after start(): all of it is in the run
        server.stdin.flush()
        t = time.thread_time()
        while time.thread_time() - t < 0.3:  # the "load generator" works too
            pass
        assert server.stdout.readline().strip() == "done"
        out = meter.stop()
    finally:
        server.kill()
        server.wait()
    assert out["cpu_s"]["router"] > 0.7
    assert out["cpu_s"]["client"] > 0.25
    assert out["workers_cores"] == 0
    assert out["host_cores"] == pytest.approx(
        sum(out["cores"][g] for g in ("router", "redis", "ray", "client")), abs=1e-3
    )
    assert 0.8 <= out["wall_s"] < 60.0
