"""Where the machine's CPU went during a run: the workers, the router, Ray's daemons, Redis and the
load generator, in CPU seconds and in cores (CPU seconds per wall second).

On a small host these all share the cores: the colocated setup's two busy workers plus the router
and the client can ask for more than two cores, and then every step is slower than the profile
measured alone. The simulator takes the non-worker demand as an input (``baton.perf.sim`` host load);
this is how an experiment measures it.

Processes are grouped by what they are, not by pid, because Ray starts and reaps worker processes
during a run: ``worker`` (a Ray actor process of PrefillWorker or DecodeWorker), ``router`` (the
server's own process: router, HTTP and gRPC frontends), ``redis``, ``ray`` (GCS, raylet, agents,
idle Ray workers) and ``client`` (this process: the load generator).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

GROUPS = ("prefill_worker", "decode_worker", "router", "redis", "ray", "client")


def _group(proc, server_pid: int) -> str:
    if proc.pid == os.getpid():
        return "client"
    if proc.pid == server_pid:
        return "router"
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except Exception:  # noqa: BLE001 - gone or not ours: psutil raises several kinds
        return "ray"
    if "PrefillWorker" in title:
        return "prefill_worker"
    if "DecodeWorker" in title:
        return "decode_worker"
    if "redis-server" in title:
        return "redis"
    return "ray"


@dataclass
class CpuMeter:
    """``start()`` before a run, ``stop()`` after: CPU seconds per group over the run.

    A process's CPU time is counted from the first sample in which it is seen (a process born
    mid-run counts all of its time, which it spent inside the run); one that exits between two
    samples (a background thread takes one every ``interval_s``) loses its last interval.
    """

    server_pid: int
    interval_s: float = 1.0
    _thread: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _last: dict[int, tuple[str, float]] = field(default_factory=dict)
    _seconds: dict[str, float] = field(default_factory=dict)
    _t0: float | None = None
    _seen_before: set[int] = field(default_factory=set)

    @staticmethod
    def available() -> bool:
        """psutil is installed (``ray[default]`` brings it; without it runs carry no ``cpu``)."""
        try:
            import psutil  # noqa: F401
        except ImportError:
            return False
        return True

    def _procs(self):
        import psutil

        procs = [psutil.Process()]
        try:
            server = psutil.Process(self.server_pid)
            procs += [server, *server.children(recursive=True)]
        except psutil.Error:
            pass
        return procs

    def sample(self) -> None:
        for proc in self._procs():
            try:
                t = proc.cpu_times()
                total = t.user + t.system
            except Exception:  # noqa: BLE001 - exited between listing and reading
                continue
            prev = self._last.get(proc.pid)
            if prev is None:
                group = _group(proc, self.server_pid)
                # Seen at start(): count from now. Born during the run: all of its time is in it.
                base = total if self._t0 is None or proc.pid in self._seen_before else 0.0
            else:
                group, base = prev
            self._seconds[group] = self._seconds.get(group, 0.0) + (total - base)
            self._last[proc.pid] = (group, total)

    def start(self) -> None:
        self._last.clear()
        self._seconds.clear()
        self._t0 = None
        self.sample()
        self._seen_before = set(self._last)
        self._seconds.clear()
        self._t0 = time.monotonic()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.sample()

    def stop(self) -> dict:
        """``{"wall_s", "cpu_s": {group: s}, "cores": {group: cores}, "cpu_count", "workers_cores",
        "host_cores"}`` (host: everything but the workers)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()
        wall = time.monotonic() - (self._t0 or time.monotonic())
        cpu = {g: round(self._seconds.get(g, 0.0), 3) for g in GROUPS}
        cores = {g: round(s / wall, 4) if wall > 0 else None for g, s in cpu.items()}
        return {
            "wall_s": round(wall, 3),
            "cpu_s": cpu,
            "cores": cores,
            "cpu_count": os.cpu_count(),
            "workers_cores": round(sum(cores[g] or 0 for g in ("prefill_worker", "decode_worker")), 4),
            "host_cores": round(sum(cores[g] or 0 for g in ("router", "redis", "ray", "client")), 4),
        }
