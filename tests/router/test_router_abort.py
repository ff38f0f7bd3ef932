"""An abort never waits behind placements: with no decode worker live, a placement waits for one to
come back (Dispatcher.placement_wait_s), and an abort run on the same eight dispatch threads waited
as long, even the abort of a waiting request itself (found by a review)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from router.lane_dispatch import LaneDispatcher
from router.worker_pool import WorkerPool
from tests.router.test_dispatcher_placement import ScriptedDecode, ScriptedDispatcher, _handle
from tests.waiting import async_wait_until


def test_an_abort_does_not_wait_behind_placements_waiting_for_a_decode_worker():
    d0 = _handle("decode-0", ScriptedDecode())
    d0.alive = False  # the only decode worker is down
    disp = ScriptedDispatcher(WorkerPool([], [d0]), router_id="r", placement_wait_s=5.0)
    # Only what submit and abort use; the request's end (metrics and bookkeeping) is not what this tests.
    lanes = LaneDispatcher(
        SimpleNamespace(remove=lambda rid: None),
        None,
        disp,
        SimpleNamespace(finished=lambda ctx: None),
        None,
        None,
        None,
        16,
    )

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        ctxs = [
            SimpleNamespace(
                spec=RequestSpec(f"req-{i}", (1, 2, 3), SamplingParams(max_tokens=4)),
                stream=None,
                hint=None,
                request_id=f"req-{i}",
            )
            for i in range(9)
        ]
        for ctx in ctxs:
            loop.run_in_executor(lanes._executor, lanes.submit, ctx)  # as the dispatch loop does
        # the executor's eight threads each wait to place one (the ninth queues behind them)
        await async_wait_until(lambda: disp.num_in_flight == 8, message="eight placements waiting for a decode worker")
        t0 = time.monotonic()
        await lanes.abort(ctxs[0])  # the client goes away
        return time.monotonic() - t0

    try:
        assert asyncio.run(scenario()) < 2.5  # was the placement wait (5 s here, 30 by default)
        assert "req-0" not in disp._tracked
    finally:
        disp._stop.set()  # the other placements stop waiting
        lanes._executor.shutdown(wait=True)
        lanes._abort_executor.shutdown(wait=True)
