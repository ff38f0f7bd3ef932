"""Streaming clients in a process of their own (asyncio + httpx; nothing else imported).

Load tests that measure the server's latency run their clients here rather than in threads of the
test process: the in-process server would otherwise share one GIL with every client thread, and
its own measurements would include waiting for them.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time


async def _one(client, url: str, key: str, i: int):
    t0 = time.monotonic()
    body = {"model": "tiny", "prompt": f"load {i} " * 20, "max_tokens": 48, "ignore_eos": True, "stream": True}
    async with client.stream(
        "POST", f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, json=body
    ) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.headers.get("retry-after"), None
        ttft = None
        async for line in r.aiter_lines():
            if line.startswith("data: {") and ttft is None:
                ttft = time.monotonic() - t0
        return 200, None, ttft


async def _run(url: str, key: str, n: int, concurrency: int):
    import httpx

    todo = iter(range(n))
    out: list = [None] * n
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def worker():
            for i in todo:
                out[i] = await _one(client, url, key, i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def _child(url: str, key: str, n: int, concurrency: int):
    return asyncio.run(_run(url, key, n, concurrency))


def completions_from_another_process(url: str, key: str, n: int, concurrency: int) -> list:
    """``n`` streaming completions, ``concurrency`` at a time, each resubmitted as soon as the last
    ends: ``[(status, retry_after, ttft_s | None)]`` in request order."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_child, (url, key, n, concurrency))
