"""A decode worker's load report counts the prompt tokens placed on it, by router, on its engine
thread: what lets a router tell which of its placements a report already includes
(router/worker_pool.py ``placed_tokens``)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from decode_worker.worker import DecodeWorker
from engine.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from kv_transfer.peer import StoreAddress
from tests.decode_worker.polling import outputs_until_finished
from tests.decode_worker.test_worker_timing import worker  # noqa: F401 - the fixture


def test_the_load_report_counts_placed_prompt_tokens_by_router(worker) -> None:  # noqa: F811
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    assert worker.loop.call(worker._load).prompt_tokens_placed == {}
    assert worker.generate_local(RequestSpec("a1", tuple(range(5, 25)), params, origin="router-a"))
    assert worker.generate_local(RequestSpec("a2", tuple(range(5, 15)), params, origin="router-a"))
    assert worker.generate_local(RequestSpec("b1", tuple(range(5, 12)), params, origin="router-b"))
    load = worker.loop.call(worker._load)
    assert load.prompt_tokens_placed == {"router-a": 30, "router-b": 7}


@pytest.fixture
def drafting_worker(tiny_model_dir):
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20)
    )
    config = EngineConfig(
        model=str(tiny_model_dir),
        cache=CacheConfig(num_blocks=64),
        scheduler=SchedulerConfig(speculative=SpeculativeConfig(num_tokens=3)),
    )
    w = DecodeWorker("decode-s", config, StoreAddress("127.0.0.1", store.port))
    yield w
    w.shutdown()


def test_the_load_report_counts_drafted_and_kept_tokens(drafting_worker) -> None:
    """A decode worker with speculative decoding on reports its drafts (the router exports them as
    baton_spec_draft_tokens_total and baton_spec_accepted_tokens_total)."""
    w = drafting_worker
    assert w.loop.call(w._load).draft_tokens == 0
    prompt = tuple(range(5, 15)) * 4  # its last tokens occurred before: drafts from the first step
    assert w.generate_local(RequestSpec("s1", prompt, SamplingParams(max_tokens=24, ignore_eos=True), origin="r"))
    outputs_until_finished(w, "r", timeout_s=30)
    load = w.loop.call(w._load)
    assert load.draft_tokens > 0 and 0 <= load.accepted_draft_tokens <= load.draft_tokens
    assert (load.draft_tokens, load.accepted_draft_tokens) == (
        w.engine.scheduler.num_draft_tokens,
        w.engine.scheduler.num_accepted_tokens,
    )
