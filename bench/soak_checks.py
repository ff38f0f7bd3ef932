"""The soak's checks once its load stopped (bench/soak.py): batch jobs lost, streams that span a
worker's death rerun fault-free and compared, KV blocks still held, and the endings counted."""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.soak_load import Ending, Record, payload


async def lost_batch_jobs(client: httpx.AsyncClient, records: list[Record], wait_s: float = 120.0) -> list[str]:
    """Batch jobs neither answered nor refused whose result ``GET /v1/batches/{id}`` does not hold
    (asked until ``wait_s``: a job re-run after a fault may still be finishing)."""
    unsure = [r for r in records if r.kind == "batch" and r.ending not in (Ending.FINISHED, Ending.REFUSED)]
    deadline = time.monotonic() + wait_s
    lost: list[str] = []
    for rec in unsure:
        while True:
            r = await client.get(f"/v1/batches/{rec.request_id}")
            status = r.json().get("status") if r.status_code == 200 else None
            if status == "done":
                break
            if time.monotonic() > deadline or status in ("failed", "cancelled") or r.status_code == 404:
                lost.append(
                    f"{rec.request_id}: {rec.ending.value} ({rec.detail}); batches says {status or r.status_code}"
                )
                break
            await asyncio.sleep(1.0)
    return lost


async def rerun_mismatches(
    client: httpx.AsyncClient, records: list[Record], kills: list[float], limit: int
) -> tuple[int, list[str]]:
    """The finished streams in flight at a worker's death (``kills``: its monotonic times), each rerun
    fault-free (non-streaming, same greedy request): their text must be the same, token for token."""
    spanned = [
        r
        for r in records
        if r.kind == "stream" and r.ending is Ending.FINISHED and any(r.start < k < r.end for k in kills)
    ][:limit]
    bad = []
    for rec in spanned:
        r = await client.post(
            "/v1/completions", json=payload(rec.prompt, rec.max_tokens, "interactive", False), timeout=120
        )
        want = r.json()["choices"][0]["text"] if r.status_code == 200 else None
        if want != rec.text:
            bad.append(f"{rec.request_id}: streamed {rec.text!r}, rerun {want!r}")
    return len(spanned), bad


def worker_gauges(text: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    names = {
        "baton_kv_cache_usage_ratio": "kv_usage",
        "baton_worker_requests_running": "running",
        "baton_worker_requests_waiting": "waiting",
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                out.setdefault(s.labels["worker"], {})[names[s.name]] = s.value
    return out


async def kv_held(client: httpx.AsyncClient, workers: int = 3, wait_s: float = 90.0) -> dict[str, dict[str, float]]:
    """Workers still holding KV blocks or requests once nothing is sent ({} when none, within ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        gauges = worker_gauges((await client.get("/metrics")).text)
        held = {w: g for w, g in gauges.items() if any(g.values())}
        if (not held and len(gauges) >= workers) or time.monotonic() > deadline:
            return held if len(gauges) >= workers else {**held, "(workers reporting)": {"count": len(gauges)}}
        await asyncio.sleep(1.0)


def counts_by_ending(records: list[Record]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for r in records:
        by = counts.setdefault(r.kind, {})
        by[r.ending.value] = by.get(r.ending.value, 0) + 1
    return counts


def refusals(records: list[Record]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if r.ending is Ending.REFUSED:
            out[r.detail[:120]] = out.get(r.detail[:120], 0) + 1
    return out
