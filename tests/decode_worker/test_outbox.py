"""Per-router outboxes: outputs go to the router that sent the request; a request re-sent by another
router moves to it and the first one is told; silent routers' requests are orphans."""

import time

from decode_worker.outbox import Outbox
from engine.outputs import RequestOutput
from engine.request import FinishReason


def out(rid: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(rid, [1], "x", finished=finished, finish_reason=FinishReason.LENGTH if finished else None)


def test_outputs_go_to_the_sending_router():
    box = Outbox()
    assert box.register("a", "router-0") is None and box.register("b", "router-1") is None
    box.put([out("a"), out("b", finished=True)])
    assert [o.request_id for o in box.poll("router-0", 0)] == ["a"]
    assert [o.request_id for o in box.poll("router-1", 0)] == ["b"]
    assert box.poll("router-0", 0) == []


def test_a_request_re_sent_by_another_router_moves_to_it():
    box = Outbox()
    box.register("job-1", "router-0")
    assert box.register("job-1", "router-0") is None  # the same router again: nothing taken over
    assert box.register("job-1", "router-1") == "router-0"
    box.put_for("router-0", RequestOutput("job-1", [], "", finished=True, finish_reason=FinishReason.ABORT))
    box.put([out("job-1")])
    assert [o.finish_reason for o in box.poll("router-0", 0)] == ["abort"]
    assert [o.new_token_ids for o in box.poll("router-1", 0)] == [[1]]


def test_requests_of_a_silent_router_are_orphans():
    box = Outbox()
    box.register("a", "router-0")
    box.register("b", "router-1")
    box.poll("router-1", 0)
    assert box.orphans(60.0) == []
    assert sorted(box.orphans(0.0)) == ["a", "b"]


def test_a_router_that_polls_again_is_told_which_requests_were_dropped():
    box = Outbox()
    box.register("a", "router-0")
    box.register("b", "router-0")
    assert sorted(box.orphans(0.0)) == ["a", "b"]  # router-0 stalled past the timeout
    assert sorted(box.take_dropped("router-0")) == ["a", "b"]  # it polls again: it places them anew
    assert box.take_dropped("router-0") == []


def test_after_the_worker_itself_was_away_no_router_is_an_orphan():
    box = Outbox()
    box.register("a", "router-0")
    time.sleep(0.05)  # no event to wait for: the clock must pass the 0.04 s timeout below
    assert box.orphans(60.0) == []
    box.touch_all()  # what the worker does when its own loop was stopped (SIGSTOP) for a while
    assert box.orphans(0.04) == []
