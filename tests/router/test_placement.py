"""Placement helpers in isolation (pure Python)."""

from router.placement import prefill_queue
from router.worker_pool import WorkerPool
from tests.router.test_capacity import _handle, _load


def _rates(per_worker: dict[str, float]):
    return lambda ids: sum(per_worker[i] for i in ids)


def test_a_short_prompt_waits_on_its_decode_worker_not_behind_the_prefill_pool():
    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(p0, queued_prefill=3000)  # long batch prompts queued on the prefill worker
    _load(d0, queued_prefill=100)
    pool = WorkerPool([p0], [d0])
    rates = _rates({"p0": 200.0, "d0": 50.0})  # a decode worker's own rate mixes in its decodes
    assert prefill_queue(pool, 80, 256, rates) == (100, 200.0)  # kept local: one prefill worker's speed
    assert prefill_queue(pool, 900, 256, rates) == (3000, 200.0)  # disaggregated: the pool's queue


def test_colocated_and_no_live_prefill_worker_use_the_decode_pool():
    d0, d1 = _handle("d0", "decode"), _handle("d1", "decode")
    _load(d0, queued_prefill=100)
    _load(d1, queued_prefill=300)
    d0.dispatched_tokens = 50  # placed since its last report
    assert prefill_queue(WorkerPool([], [d0, d1]), 900, 256, _rates({"d0": 60.0, "d1": 40.0})) == (450, 100.0)
    p0 = _handle("p0", "prefill")
    p0.alive = False
    assert prefill_queue(WorkerPool([p0], [d0, d1]), 900, 256, _rates({"d0": 60.0, "d1": 40.0})) == (450, 100.0)
