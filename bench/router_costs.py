"""Kept for router changes: what the router's event loop pays per request at scale.

What the router's event loop pays per request at scale: admission with R requests running, and
a request's end with L output tokens (with the loop's lag while 16 such streams run and end).

    python -m bench.router_costs [--running 10,1000,4000] [--lengths 100,2000,8000] [--json PATH]

An in-process ``Router`` (no Ray, no Redis) over a dispatcher whose thread gives every running
stream one token per step, as the real dispatcher's pollers do. The baseline is in the same run:
the smallest R and L. Everything measured runs on the loop, so its cost is a stall for every other
stream the router serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.api import GenerateRequest
from router.lanes import LanePolicy, TenantConfig, default_lanes
from router.router import Router, RouterConfig
from router.worker_pool import WorkerHandle, WorkerPool


class _StreamingDispatcher:
    """One token per ``step_s`` to every running stream; ``hold``: they never finish."""

    def __init__(self, pool: WorkerPool, step_s: float) -> None:
        self.pool, self.router_id, self.origin = pool, "router-a", "router-a"
        self.local_prefill_threshold, self.short_prompts_to_idle_prefill = 0, True
        self.on_kv_events = self.on_worker_reset = None
        self.step_s, self.hold, self._stop = step_s, False, False
        self.active: dict[str, list] = {}
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop giving tokens (before the loop the streams deliver to closes)."""
        self._stop = True
        await asyncio.to_thread(self._thread.join)

    def submit(self, spec, stream, hint) -> None:
        with self.lock:
            self.active[spec.request_id] = [stream, spec.sampling_params.max_tokens]

    def abort(self, rid: str) -> None:
        with self.lock:
            e = self.active.pop(rid, None)
        if e:
            e[0].put(RequestOutput(rid, [], "", finished=True, finish_reason=FinishReason.ABORT))

    def _run(self) -> None:
        while not self._stop:
            time.sleep(self.step_s)
            with self.lock:
                items = list(self.active.items())
            for rid, e in items:
                e[1] -= 1
                done = e[1] <= 0 and not self.hold
                e[0].put(
                    RequestOutput(rid, [11], "ab", finished=done, finish_reason=FinishReason.LENGTH if done else None)
                )
                if done:
                    with self.lock:
                        self.active.pop(rid, None)


def _router(step_s: float, pace_guard: bool) -> tuple[Router, _StreamingDispatcher]:
    info = WorkerInfo(
        PeerInfo("d0", "inc", "decode"),
        num_blocks=10**7,
        block_size=16,
        max_model_len=65536,
        vocab_size=1000,
        model="m",
        max_num_seqs=100_000,
    )
    pool = WorkerPool([], [WorkerHandle("d0", "decode", None, info=info, alive=True)])
    d = _StreamingDispatcher(pool, step_s)
    config = RouterConfig(
        model_name="m",
        model_dir=Path(tempfile.mkdtemp()),
        slo_rejection=False,
        pace_guard=pace_guard,
        lanes=LanePolicy(lanes=default_lanes(), tenants=(TenantConfig("default"),)),
    )
    return Router(config, pool, d), d  # type: ignore[arg-type]  # a stand-in with the calls Router makes


def _request(max_tokens: int, lane: str = "interactive") -> GenerateRequest:
    return GenerateRequest(
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        prompt_token_ids=tuple(range(10, 30)),
        stream=True,
        lane=lane,
    )


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


async def admission(running: int) -> dict:
    """``generate()`` (admission up to the lane queue) with ``running`` streams running."""
    router, d = _router(0.05, pace_guard=True)
    d.hold = True
    await router.start()
    try:
        held = []
        for i in range(running):  # in groups, so the dispatch loop drains the lane queue meanwhile
            held.append(await router.generate(_request(10_000)))
            if i % 64 == 63:
                await asyncio.sleep(0.01)
        while sum(c.dispatched is not None for c in router.requests.values()) < running:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # a few tokens each
        times = []
        for _ in range(100):
            t0 = time.perf_counter()
            held.append(await router.generate(_request(10_000)))
            times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.002)
        return {"running": running, "generate_ms": round(_median(times) * 1e3, 4)}
    finally:
        await d.close()
        await router.stop()


async def request_end(length: int, streams: int = 16) -> dict:
    """16 streams of ``length`` tokens: the loop's lag (a 1 ms probe) while they run and end."""
    router, d = _router(0.001, pace_guard=False)
    await router.start()
    lags: list[float] = []

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    async def one() -> int:
        n = 0
        async for ev in await router.generate(_request(length)):
            n += len(ev.token_ids)
        return n

    task = asyncio.create_task(probe())
    try:
        got = await asyncio.gather(*(one() for _ in range(streams)))
    finally:
        task.cancel()
        await d.close()
        await router.stop()
    assert all(g == length for g in got), got
    lags.sort()
    return {
        "length": length,
        "loop_lag_p99_ms": round(lags[int(len(lags) * 0.99)] * 1e3, 3),
        "loop_lag_max_ms": round(lags[-1] * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", default="10,1000,4000")
    ap.add_argument("--lengths", default="100,2000,8000")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out = {
        "admission": [asyncio.run(admission(int(r))) for r in args.running.split(",")],
        "request_end": [asyncio.run(request_end(int(n))) for n in args.lengths.split(",")],
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
