"""The running batch's slots (engine/scheduler_batch.py): a slot per running request, reused once
freed; the runner learns who joined (unseen) and who left."""

from __future__ import annotations

from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler_batch import RunningBatch


def _req(rid: str) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=4))


def test_slots_are_taken_freed_and_reused():
    batch = RunningBatch(2)
    a, b, c = _req("a"), _req("b"), _req("c")
    batch.join(a)
    batch.join(b)
    assert {a.slot, b.slot} == {0, 1} and batch.slot_req[a.slot] is a and len(batch) == 2
    assert batch.unseen == {"a", "b"}
    freed = a.slot
    batch.leave(a)
    assert a.slot == -1 and batch.slot_req[freed] is None and batch.unseen == {"b"}
    batch.join(c)
    assert c.slot == freed and batch.requests == [b, c]
    assert batch.take_left() == {"a"} and batch.take_left() == set()
