"""A decode worker's load report counts the prompt tokens placed on it, by router, on its engine
thread: what lets a router tell which of its placements a report already includes
(router/worker_pool.py ``placed_tokens``)."""

from __future__ import annotations

from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from tests.decode_worker.test_worker_timing import worker  # noqa: F401 - the fixture


def test_the_load_report_counts_placed_prompt_tokens_by_router(worker) -> None:  # noqa: F811
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    assert worker.loop.call(worker._load).prompt_tokens_placed == {}
    assert worker.generate_local(RequestSpec("a1", tuple(range(5, 25)), params, origin="router-a"))
    assert worker.generate_local(RequestSpec("a2", tuple(range(5, 15)), params, origin="router-a"))
    assert worker.generate_local(RequestSpec("b1", tuple(range(5, 12)), params, origin="router-b"))
    load = worker.loop.call(worker._load)
    assert load.prompt_tokens_placed == {"router-a": 30, "router-b": 7}
