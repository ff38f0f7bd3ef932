"""``n`` choices against the tenant's rate limits, through a real ``Router`` (local buckets, a
dispatcher that answers in process): the ``n`` are charged at once or not at all."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from kv_transfer.peer import PeerInfo, WorkerInfo
from router.api import ErrorKind, GenerateRequest, RouterError
from router.choices import Choices
from router.lanes import LaneConfig, LanePolicy, TenantConfig
from router.router import Router, RouterConfig
from router.worker_pool import WorkerHandle, WorkerPool


class InProcessDispatcher:
    """Finishes each request with two tokens at once."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool, self.router_id, self.origin = pool, "router-a", "router-a"
        self.local_prefill_threshold = 0
        self.short_prompts_to_idle_prefill = True
        self.on_kv_events = self.on_worker_reset = None
        self.submitted: list[str] = []

    def submit(self, spec, stream, hint) -> None:
        self.submitted.append(spec.request_id)
        stream.put(RequestOutput(spec.request_id, [7, 8], "xy", finished=True, finish_reason=FinishReason.LENGTH))

    def abort(self, request_id: str) -> None:
        pass


def _router(requests_per_min: float, queue_bound: int = 128) -> tuple[Router, InProcessDispatcher]:
    info = WorkerInfo(
        PeerInfo("d0", "inc", "decode"), num_blocks=1000, block_size=16, max_model_len=2048, vocab_size=1000, model="m"
    )
    pool = WorkerPool([], [WorkerHandle("d0", "decode", None, info=info, alive=True)])
    dispatcher = InProcessDispatcher(pool)
    lanes = (LaneConfig("interactive", ttft_slo_s=60.0, tpot_slo_s=1.0, queue_bound=queue_bound),)
    tenants = (TenantConfig("alice", api_key="ka", requests_per_min=requests_per_min),)
    config = RouterConfig(
        model_name="m",
        model_dir=Path(tempfile.mkdtemp()),
        slo_rejection=False,
        pace_guard=False,
        lanes=LanePolicy(lanes=lanes, tenants=tenants),
    )
    return Router(config, pool, dispatcher), dispatcher


def _request(**kw) -> GenerateRequest:
    return GenerateRequest(SamplingParams(max_tokens=2), prompt_token_ids=(1, 2, 3), tenant="alice", **kw)


def test_more_choices_than_the_bucket_is_a_400_and_starts_nothing() -> None:
    """n=16 against a bucket of 12 was a 429 (Retry-After 5) every time, after starting 12 generations."""

    async def main() -> None:
        router, dispatcher = _router(requests_per_min=12)
        await router.start()
        try:
            for _ in range(2):
                with pytest.raises(RouterError) as e:
                    await Choices.start(router, _request(), 16)
                assert (e.value.kind, e.value.code, e.value.param) == (
                    ErrorKind.INVALID_REQUEST,
                    "rate_limit_too_large",
                    "n",
                )
                assert dispatcher.submitted == []
            choices = await Choices.start(router, _request(), 12)  # the budget is whole: all 12 at once
            assert [r.text for r in await choices.results()] == ["xy"] * 12
            with pytest.raises(RouterError) as e:  # and then it is spent
                await Choices.start(router, _request(), 2)
            assert e.value.code == "rate_limit_exceeded" and len(dispatcher.submitted) == 12
        finally:
            await router.stop()

    asyncio.run(main())


def test_a_choice_refused_after_the_charge_gives_the_whole_charge_back() -> None:
    async def main() -> None:
        router, _dispatcher = _router(requests_per_min=4, queue_bound=2)  # not started: requests stay queued
        with pytest.raises(RouterError) as e:
            await Choices.start(router, _request(), 3)  # the third choice finds the lane full
        assert e.value.code == "queue_full"
        bucket = router.state.rate_limiter.local._buckets[("alice", 0)]
        assert bucket.level() == pytest.approx(4, abs=0.01)  # the three choices' charge came back
        assert router.admission.rejections == {("interactive", "queue_full"): 1}

    asyncio.run(main())
