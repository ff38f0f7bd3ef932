"""The other-load probe: a window's CPU use by other processes, and the wait for a quiet machine."""

import os
import time

from baton.perf.other_load import OtherLoad, wait_until_idle


def test_this_process_busy_is_not_counted_as_other_load():
    load = OtherLoad()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # keep this process on a core
        pass
    cpus = load.cpus()
    # our own CPU is subtracted; what is left is other processes', at most the machine's cores
    assert cpus is None or 0 <= cpus <= (os.cpu_count() or 1)


def test_wait_until_idle_returns_within_its_bound():
    t = time.perf_counter()
    cpus = wait_until_idle(max_wait_s=0.2, window_s=0.1)
    assert time.perf_counter() - t < 2.0 and (cpus is None or cpus >= 0)
