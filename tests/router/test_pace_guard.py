"""The pace guard: looser lanes wait in the router while tight streams run slow (pure Python)."""

import pytest

from router.lane_queues import LaneQueues, Pending
from router.lanes import default_lanes
from router.pace_guard import PaceGuard


def _guard(**kw) -> PaceGuard:
    return PaceGuard(default_lanes(), **kw)  # interactive TPOT 0.25 s, long_context 0.5 s, batch 5 s


def test_nothing_is_held_while_the_pace_is_within_the_tightest_objective():
    g = _guard()
    assert g.held(None, {"interactive"}, now=0.0) == {}  # nothing streaming
    assert g.held(0.15, {"interactive", "batch"}, now=0.0) == {}  # 0.15 <= 0.6 x 0.25


def test_slow_interactive_streams_hold_the_looser_lanes_for_a_quarter_of_their_ttft_objective():
    held = _guard().held(0.16, {"interactive", "batch"}, now=0.0)
    assert held == {"batch": pytest.approx(150.0), "long_context": pytest.approx(15.0)}


def test_a_slow_pace_with_only_loose_lanes_in_use_holds_nothing_tighter_than_them():
    g = _guard()
    assert g.held(0.4, {"batch"}, now=100.0) == {}  # batch is the tightest in use: its own pace is fine
    assert g.held(0.4, {"long_context", "batch"}, now=100.0) == {"batch": pytest.approx(150.0)}


def test_a_recent_interactive_arrival_keeps_its_objective_in_force():
    g = _guard(recent_s=30.0)
    g.arrived("interactive", 10.0)  # it was rejected or finished: nothing of it runs now
    assert "batch" in g.held(0.3, {"batch"}, now=35.0)
    assert g.held(0.3, {"batch"}, now=41.0) == {}  # 31 s later it no longer counts


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="hold_at"):
        _guard(hold_at=0.0)
    with pytest.raises(ValueError, match="max_hold_fraction"):
        _guard(max_hold_fraction=2.0)


def test_lane_queues_skip_a_held_lane_until_its_head_waited_the_longest_hold():
    q = LaneQueues(default_lanes())
    q.push(Pending("b1", "batch", 100, None, enqueued=0.0))
    q.push(Pending("i1", "interactive", 100, None, enqueued=0.0))
    got = q.take(lambda p: True, idle=False, now=1.0, held={"batch": 10.0})
    assert [p.request_id for p in got] == ["i1"]  # the interactive request goes, batch waits
    assert q.take(lambda p: True, idle=False, now=9.0, held={"batch": 10.0}) == []
    assert [p.request_id for p in q.take(lambda p: True, idle=False, now=10.5, held={"batch": 10.0})] == ["b1"]
    q.push(Pending("b2", "batch", 100, None, enqueued=11.0))
    assert [p.request_id for p in q.take(lambda p: True, idle=False, now=12.0)] == ["b2"]  # released: not held


def test_only_lanes_looser_than_the_tightest_can_ever_be_held():
    assert _guard().holdable == {"batch", "long_context"}
