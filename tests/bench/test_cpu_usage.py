"""The experiments' CPU meter: CPU seconds per process group over a run (real processes)."""

import subprocess
import sys
import time

import pytest

from bench.experiments.cpu_usage import CpuMeter

pytestmark = pytest.mark.skipif(not CpuMeter.available(), reason="psutil not installed")


def test_the_server_process_counts_as_router_and_this_one_as_client():
    burn = "import time\nt = time.time()\nwhile time.time() - t < 0.8:\n    pass\ntime.sleep(30)\n"
    server = subprocess.Popen([sys.executable, "-c", burn])
    try:
        meter = CpuMeter(server.pid, interval_s=0.1)
        meter.start()
        t = time.time()
        while time.time() - t < 0.3:  # the "load generator" works too
            pass
        time.sleep(0.9)
        out = meter.stop()
    finally:
        server.kill()
        server.wait()
    assert out["cpu_s"]["router"] > 0.3
    assert out["cpu_s"]["client"] > 0.15
    assert out["workers_cores"] == 0
    assert out["host_cores"] == pytest.approx(sum(out["cores"][g] for g in ("router", "redis", "ray", "client")),
                                              abs=1e-3)
    assert 1.0 < out["wall_s"] < 5.0
