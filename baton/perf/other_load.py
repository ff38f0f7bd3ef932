"""How much CPU *other* processes use during a benchmark's window (Linux ``/proc/stat``).

On a shared machine a throughput number means little without it: on 2 cores, one busy neighbour
halves the compute and stalls every OpenMP barrier. The HF baselines record it with their timings.
"""

from __future__ import annotations

import os
import time
from time import perf_counter


def _cpu_counters() -> tuple[float, float] | None:
    """(CPU seconds the whole machine spent busy, CPU seconds this process used); None where /proc is missing."""
    try:
        import resource

        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        usage = resource.getrusage(resource.RUSAGE_SELF)
    except (ImportError, OSError, ValueError):
        return None
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return busy, usage.ru_utime + usage.ru_stime


class OtherLoad:
    """How many CPUs' worth *other* processes used during a window. On a shared machine a throughput number means
    little without it: on 2 cores, one busy neighbour halves the compute and stalls every OpenMP barrier."""

    def __init__(self) -> None:
        self._start = _cpu_counters()
        self._t0 = perf_counter()

    def cpus(self) -> float | None:
        end, wall = _cpu_counters(), perf_counter() - self._t0
        if self._start is None or end is None or wall <= 0:
            return None
        other = (end[0] - self._start[0]) - (end[1] - self._start[1])
        return round(max(other, 0.0) / wall, 2)


def wait_until_idle(max_wait_s: float, window_s: float = 3.0, threshold_cpus: float = 0.25) -> float | None:
    """Wait (at most ``max_wait_s``) for a ``window_s`` window in which other processes use < ``threshold_cpus``
    CPUs; returns the last window's load. A benchmark on a shared box should at least start on a quiet machine."""
    deadline = perf_counter() + max_wait_s
    while True:
        load = OtherLoad()
        time.sleep(window_s)
        cpus = load.cpus()
        if cpus is None or cpus < threshold_cpus or perf_counter() >= deadline:
            return cpus
