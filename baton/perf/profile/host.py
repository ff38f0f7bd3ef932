"""The host around the workers: how much CPU the rest of the serving stack takes, and what that does
to the workers' steps when the machine has few cores (pure Python).

A worker's step takes what the profile measured only while it has a core to itself. On a small CPU
host the router (HTTP, streaming, detokenizing), Ray's daemons, Redis and the load generator run
on the same cores; when the busy workers plus that demand ask for more cores than there are, the
scheduler shares them out and every step stretches by ``demand / cores``.

The demand is modelled as ``base_cores + cpu_s_per_token x tokens/s + cpu_s_per_request x
requests/s`` (streamed output tokens and arriving requests over a short window) and fitted from
what an experiment measured (``bench.experiments.cpu_usage``: each run's CPU seconds per process
group), so the simulator's host is this machine's, measured, not a knob. In the cost-model file::

    host {cores, base_cores, cpu_s_per_token, cpu_s_per_request, source}     | null: not modelled

``python -m baton.perf.profile.fit_host`` fits it from experiment reports into a cost-model file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HostModel:
    cores: int
    base_cores: float = 0.0  # with no traffic: Ray's daemons, idle polls
    cpu_s_per_token: float = 0.0  # per streamed output token: router, stream, client
    cpu_s_per_request: float = 0.0
    source: str = "default"

    def __post_init__(self) -> None:
        if not (isinstance(self.cores, int) and self.cores >= 1):
            raise ValueError(f"host.cores must be a positive integer, got {self.cores!r}")
        for name in ("base_cores", "cpu_s_per_token", "cpu_s_per_request"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"host.{name} must be a finite number >= 0, got {v!r}")

    def demand_cores(self, tokens_per_s: float, requests_per_s: float) -> float:
        return self.base_cores + self.cpu_s_per_token * tokens_per_s + self.cpu_s_per_request * requests_per_s

    def stretch(self, busy_workers: int, host_cores: float) -> float:
        """How much longer a step takes with ``busy_workers`` computing (itself included) next to
        ``host_cores`` of other demand: fair sharing once demand exceeds the cores."""
        return max(1.0, (busy_workers + host_cores) / self.cores)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict) -> HostModel:
        return cls(
            int(d["cores"]),
            float(d.get("base_cores", 0.0)),
            float(d.get("cpu_s_per_token", 0.0)),
            float(d.get("cpu_s_per_request", 0.0)),
            str(d.get("source", "file")),
        )


@dataclass(frozen=True)
class HostSample:
    """One run: wall seconds, CPU seconds outside the workers, output tokens and requests served."""

    wall_s: float
    host_cpu_s: float
    tokens: int
    requests: int


def samples_from_experiment(doc: dict) -> list[HostSample]:
    """Every run of a ``baton.bench.experiment/1`` report that carries ``cpu`` (its meter). The
    workers' own CPU outside their steps (Ray's threads, load reports, output polls) competes for
    the cores like the router's does: when the run scraped the workers' step counters
    (``workers``: CPU seconds in steps), it counts as host demand too."""
    out = []
    for setup in (doc.get("setups") or {}).values():
        for run in setup.get("runs", []):
            cpu = run.get("cpu")
            if not cpu or not cpu.get("wall_s"):
                continue
            recs = run.get("requests", [])
            tokens = sum(int(r.get("output_tokens") or 0) for r in recs)
            host = sum(float(cpu["cpu_s"].get(g, 0.0)) for g in ("router", "redis", "ray", "client"))
            stepping = [w.get("busy_cpu_s") for w in (run.get("workers") or {}).values()]
            if stepping and all(isinstance(x, (int, float)) for x in stepping):
                workers = sum(float(cpu["cpu_s"].get(g, 0.0)) for g in ("prefill_worker", "decode_worker"))
                host += max(0.0, workers - sum(stepping))
            out.append(HostSample(float(cpu["wall_s"]), host, tokens, len(recs)))
    return out


def fit_host(samples: list[HostSample], cores: int, source: str = "fit") -> HostModel:
    """Least squares ``host_cpu_s = base x wall + c_token x tokens`` over the runs (non-negative).

    Requests are not fitted separately: with one workload their count is proportional to the
    tokens and the two cannot be told apart; their cost is folded into the per-token one."""
    if not samples:
        raise ValueError("no run with CPU measurements (experiments record them since bench.experiments.cpu_usage)")
    sww = sum(s.wall_s**2 for s in samples)
    swt = sum(s.wall_s * s.tokens for s in samples)
    stt = sum(s.tokens**2 for s in samples)
    swy = sum(s.wall_s * s.host_cpu_s for s in samples)
    sty = sum(s.tokens * s.host_cpu_s for s in samples)
    det = sww * stt - swt * swt
    base: float | None = None
    c_tok: float | None = None
    if len(samples) >= 2 and det > 1e-9 * sww * max(stt, 1.0):
        base, c_tok = (swy * stt - sty * swt) / det, (sww * sty - swt * swy) / det
    if (
        base is None or c_tok is None or base < 0 or c_tok < 0
    ):  # (both or neither are None)  # one parameter at a time, whichever explains more
        only_tok = (sty / stt) if stt > 0 else 0.0
        only_base = swy / sww
        rss_tok = sum((s.host_cpu_s - only_tok * s.tokens) ** 2 for s in samples)
        rss_base = sum((s.host_cpu_s - only_base * s.wall_s) ** 2 for s in samples)
        base, c_tok = (0.0, max(0.0, only_tok)) if rss_tok <= rss_base else (max(0.0, only_base), 0.0)
    return HostModel(cores, base, c_tok, 0.0, source)
