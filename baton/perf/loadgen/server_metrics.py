"""Sampling the server's Prometheus ``/metrics`` during a run: queue depth, running requests and
KV usage over time (the names of ``router/metrics.py``).

A failed scrape is not fatal: the sample then holds only the client's own in-flight count, so a
server without ``/metrics`` (or a gRPC-only target) still gets a time series.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from baton.perf.loadgen.outgoing import Clock

log = logging.getLogger(__name__)

WAITING = "baton_requests_waiting"  # {lane, role="router"}: the router's lane queues
RUNNING = "baton_requests_running"  # {lane, role="cluster"}: dispatched, not finished
KV_USAGE = "baton_kv_cache_usage_ratio"  # {role, worker}
WORKER_WAITING = "baton_worker_requests_waiting"  # {role, worker}
WORKER_RUNNING = "baton_worker_requests_running"  # {role, worker}
WORKER_STEPS = "baton_worker_steps_total"  # {role, worker}: cumulative counters
WORKER_BUSY = "baton_worker_busy_seconds_total"
WORKER_BUSY_CPU = "baton_worker_busy_cpu_seconds_total"
# {lane, worker}: sequences in decode steps summed over steps (a decode token each), with lane shares on
LANE_DECODE_TOKENS = "baton_lane_decode_tokens"


@dataclass
class MetricsSample:
    t: float
    in_flight: int  # client side: sent, not finished
    scraped: bool = False
    waiting: dict[str, float] = field(default_factory=dict)  # lane -> router queue depth
    running: dict[str, float] = field(default_factory=dict)  # lane -> running in the pools
    kv_usage: dict[str, float] = field(default_factory=dict)  # "role/worker" -> fraction of blocks
    worker_waiting: dict[str, float] = field(default_factory=dict)
    worker_running: dict[str, float] = field(default_factory=dict)
    # cumulative per worker: steps, wall seconds in steps, the stepping thread's CPU seconds in them
    worker_steps: dict[str, float] = field(default_factory=dict)
    worker_busy_s: dict[str, float] = field(default_factory=dict)
    worker_busy_cpu_s: dict[str, float] = field(default_factory=dict)
    lane_decode_tokens: dict[str, float] = field(default_factory=dict)  # lane -> cumulative, all workers

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "in_flight": self.in_flight,
            "scraped": self.scraped,
            "waiting": self.waiting,
            "running": self.running,
            "kv_usage": self.kv_usage,
            "worker_waiting": self.worker_waiting,
            "worker_running": self.worker_running,
            "worker_steps": self.worker_steps,
            "worker_busy_s": self.worker_busy_s,
            "worker_busy_cpu_s": self.worker_busy_cpu_s,
            "lane_decode_tokens": self.lane_decode_tokens,
        }


def parse_metrics(text: str, sample: MetricsSample) -> MetricsSample:
    """Fill ``sample`` from a Prometheus text exposition."""
    per_worker = {
        KV_USAGE: sample.kv_usage,
        WORKER_WAITING: sample.worker_waiting,
        WORKER_RUNNING: sample.worker_running,
        WORKER_STEPS: sample.worker_steps,
        WORKER_BUSY: sample.worker_busy_s,
        WORKER_BUSY_CPU: sample.worker_busy_cpu_s,
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == WAITING and s.labels.get("role", "router") == "router":
                sample.waiting[s.labels.get("lane", "")] = s.value
            elif s.name == RUNNING:
                lane = s.labels.get("lane", "")
                sample.running[lane] = sample.running.get(lane, 0.0) + s.value
            elif s.name in (LANE_DECODE_TOKENS, LANE_DECODE_TOKENS + "_total"):
                lane = s.labels.get("lane", "")
                sample.lane_decode_tokens[lane] = sample.lane_decode_tokens.get(lane, 0.0) + s.value
            elif s.name in per_worker:
                worker = f"{s.labels.get('role', '?')}/{s.labels.get('worker', '?')}"
                per_worker[s.name][worker] = s.value
    sample.scraped = True
    return sample


async def poll(
    url: str | None,
    interval_s: float,
    clock: Clock,
    in_flight: Callable[[], int],
    out: list[MetricsSample],
    stop: asyncio.Event,
) -> None:
    """Append a sample every ``interval_s`` until ``stop`` is set (and one last one then)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(max(interval_s * 4, 2.0))) if url else None
    warned = False
    try:
        while True:
            sample = MetricsSample(t=clock(), in_flight=in_flight())
            if client is not None and url is not None:  # (both or neither)
                try:
                    resp = await client.get(url)
                    resp.raise_for_status()
                    parse_metrics(resp.text, sample)
                except (httpx.HTTPError, ValueError) as e:
                    if not warned:
                        log.warning("scraping %s failed (%s); the time series holds client-side counts only", url, e)
                        warned = True
            out.append(sample)
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval_s - (clock() - sample.t)))
            except TimeoutError:
                pass
    finally:
        if client is not None:
            await client.aclose()


def worker_utilisation(samples: list[MetricsSample]) -> dict[str, dict[str, float | None]]:
    """Per worker over the run (first to last scrape that saw it): steps, wall and CPU seconds in
    steps, the mean step, the share of the time it was stepping, and ``cpu_share`` = CPU / wall
    seconds in steps (below 1: its steps waited for a core)."""
    seen = [s for s in samples if s.scraped and s.worker_steps]
    out: dict[str, dict[str, float | None]] = {}
    if len(seen) < 2:
        return out
    for worker in seen[-1].worker_steps:
        mine = [s for s in seen if worker in s.worker_steps]
        a, b = mine[0], mine[-1]
        steps = b.worker_steps[worker] - a.worker_steps[worker]
        busy = b.worker_busy_s.get(worker, 0.0) - a.worker_busy_s.get(worker, 0.0)
        cpu = b.worker_busy_cpu_s.get(worker, 0.0) - a.worker_busy_cpu_s.get(worker, 0.0)
        span = b.t - a.t
        out[worker] = {
            "steps": steps,
            "busy_s": round(busy, 3),
            "busy_cpu_s": round(cpu, 3),
            "mean_step_ms": round(busy / steps * 1e3, 2) if steps else None,
            "busy_share": round(busy / span, 4) if span > 0 else None,
            "cpu_share": round(cpu / busy, 4) if busy > 0 else None,
        }
    return out


def lane_decode_shares(
    samples: list[MetricsSample],
    pace_refused_at: Mapping[str, Sequence[float]] | None = None,
    refused_at: Mapping[str, Sequence[float]] | None = None,
    window: tuple[float, float] | None = None,
) -> dict[str, dict[str, float | None]]:
    """Per lane over the scrape intervals inside ``window`` (the run's measured window; None: the
    whole run; scrapes with lane counters, none with lane shares off): its decode tokens, its share of
    all lanes' (``share``), and its share over the intervals in which it had demand, i.e. requests
    waiting in the router or running at either end (``share_with_demand``); over those in which it had
    demand it could not place, requests waiting in the router at either end or refused for pace in
    between (``share_with_unmet_demand``: issue 50's "demand"; ``pace_refused_at``: the client's send
    times of those refusals, on the samples' clock); and over those with requests waiting or refused
    for any reason (``share_while_refused``; ``refused_at``), a refusal for the prefill queue
    included, for which a decode worker has nothing to give. A lane whose every request runs takes
    one decode token a step each and lends the rest: only the last two say whether it got its share
    while it wanted more."""
    seen = [s for s in samples if s.scraped and s.lane_decode_tokens]
    if len(seen) < 2:
        return {}
    lanes = sorted({lane for s in seen for lane in s.lane_decode_tokens})

    def delta(a: MetricsSample, b: MetricsSample, lane: str) -> float:
        return max(0.0, b.lane_decode_tokens.get(lane, 0.0) - a.lane_decode_tokens.get(lane, 0.0))

    out: dict[str, dict[str, float | None]] = {}
    intervals = [(a, b) for a, b in pairwise(seen) if window is None or (a.t >= window[0] and b.t <= window[1])]
    if not intervals:
        return {}
    total = sum(delta(a, b, lane) for a, b in intervals for lane in lanes)

    def share(lane: str, wanted: list[bool]) -> float | None:
        """``lane``'s share of every lane's decode tokens over the intervals ``wanted`` marks."""
        mine = sum(delta(a, b, lane) for (a, b), w in zip(intervals, wanted, strict=True) if w)
        every = sum(delta(a, b, other) for (a, b), w in zip(intervals, wanted, strict=True) if w for other in lanes)
        return round(mine / every, 4) if every > 0 else None

    def refused_in(times: Sequence[float]) -> list[bool]:
        """Intervals (a.t, b.t] in which one of ``times`` falls."""
        ts = sorted(times)
        return [bisect.bisect_right(ts, b.t) > bisect.bisect_right(ts, a.t) for a, b in intervals]

    for lane in lanes:
        waiting = [any(x.waiting.get(lane, 0.0) > 0 for x in ab) for ab in intervals]
        running = [any(x.running.get(lane, 0.0) > 0 for x in ab) for ab in intervals]
        for_pace = refused_in((pace_refused_at or {}).get(lane, ()))
        any_refusal = refused_in((refused_at or {}).get(lane, ()))
        mine = sum(delta(a, b, lane) for a, b in intervals)
        out[lane] = {
            "decode_tokens": mine,
            "share": round(mine / total, 4) if total > 0 else None,
            "share_with_demand": share(lane, [w or r for w, r in zip(waiting, running, strict=True)]),
            "share_with_unmet_demand": share(lane, [w or r for w, r in zip(waiting, for_pace, strict=True)]),
            "share_while_refused": share(lane, [w or r for w, r in zip(waiting, any_refusal, strict=True)]),
        }
    return out
