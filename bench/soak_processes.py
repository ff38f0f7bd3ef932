"""The processes of a ``baton up`` as an operator's chaos tool sees them, from outside: the router
(the ``baton up`` process itself), its Ray workers by role (their process titles, ``ray::PrefillWorker``
and ``ray::DecodeWorker``) and its embedded ``redis-server``; and their resident memory over time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psutil

ROLES = {"ray::PrefillWorker": "prefill", "ray::DecodeWorker": "decode"}


@dataclass(frozen=True)
class Proc:
    pid: int
    role: str  # "router" | "prefill" | "decode" | "redis"
    started: float  # its creation time (epoch seconds): a restarted worker is a new Proc


def _role(p: psutil.Process) -> str | None:
    try:
        title = " ".join(p.cmdline())
        name = p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    for prefix, role in ROLES.items():
        if title.startswith(prefix):
            return role
    return "redis" if "redis-server" in name or "redis-server" in title else None


def cluster_processes(root_pid: int) -> list[Proc]:
    """The router (``root_pid``) and every worker and redis-server below it."""
    try:
        root = psutil.Process(root_pid)
        found = [Proc(root_pid, "router", root.create_time())]
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for p in children:
        role = _role(p)
        if role is not None:
            try:
                found.append(Proc(p.pid, role, p.create_time()))
            except psutil.NoSuchProcess:
                continue
    return found


def rss_bytes(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass
class RssTrack:
    """Each process's resident memory, sampled over the run; growth is measured per process from
    its first sample at least ``warmup_s`` into the load and into its life (a restarted worker warms
    up again)."""

    warmup_s: float
    load_start: float  # epoch seconds
    samples: dict[Proc, list[tuple[float, int]]] = field(default_factory=dict)  # (warm-up age s, rss)

    def sample(self, procs: list[Proc], now: float | None = None) -> None:
        now = time.time() if now is None else now
        for p in procs:
            rss = rss_bytes(p.pid)
            if rss is not None:
                self.samples.setdefault(p, []).append((now - max(p.started, self.load_start), rss))

    def growth(self) -> dict[str, float]:
        """role/pid -> (last - after-warm-up) / after-warm-up, for the router and worker processes
        sampled after warm-up (redis-server's memory is its data: not a leak of Baton's)."""
        out = {}
        for p, points in self.samples.items():
            if p.role == "redis":
                continue
            warm = [rss for age, rss in points if age >= self.warmup_s]
            if len(warm) >= 2:
                out[f"{p.role}/{p.pid}"] = (warm[-1] - warm[0]) / warm[0]
        return out
