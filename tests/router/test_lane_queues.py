"""The router's lane queues (pure Python): weighted deficit round robin, batch windows, prefix
groups, and how much work a new request would wait behind."""

import itertools
import time

from router.lane_queues import LaneQueues, Pending, Room
from router.lanes import LaneConfig

INTERACTIVE = LaneConfig("interactive", ttft_slo_s=2, tpot_slo_s=0.25, weight=8, priority=0)
BATCH = LaneConfig("batch", ttft_slo_s=600, tpot_slo_s=5, weight=1, priority=2, batch_window_s=0.5)


def _queues() -> LaneQueues:
    return LaneQueues((INTERACTIVE, BATCH), quantum=100)


def _push(q: LaneQueues, rid: str, lane: str, cost: int = 100, prefix: bytes | None = None, at: float = 0.0):
    q.push(Pending(rid, lane, cost, prefix, enqueued=at))


def test_dispatch_shares_by_weight_while_both_lanes_are_backlogged():
    q = _queues()
    for i in range(40):
        _push(q, f"i{i}", "interactive")
        _push(q, f"b{i}", "batch")
    budget = iter([True] * 18 + [False])
    out = q.take(lambda p: next(budget), idle=False, now=10.0)  # batch heads have waited their window
    lanes = [p.lane for p in out]
    assert len(out) == 18 and lanes.count("interactive") == 16 and lanes.count("batch") == 2


def test_a_batch_window_holds_requests_unless_the_pools_are_idle_and_nothing_else_waits():
    q = _queues()
    _push(q, "b0", "batch", at=0.0)
    assert q.take(lambda p: True, idle=False, now=0.1) == []
    assert q.next_deadline(now=0.1) == 0.5
    assert [p.request_id for p in q.take(lambda p: True, idle=True, now=0.1)] == ["b0"]
    _push(q, "b1", "batch", at=1.0)
    _push(q, "i0", "interactive", at=1.0)
    assert [p.request_id for p in q.take(lambda p: True, idle=False, now=1.1)] == ["i0"]
    assert [p.request_id for p in q.take(lambda p: True, idle=False, now=1.5)] == ["b1"]


def test_batch_requests_sharing_a_prefix_leave_together():
    q = _queues()
    _push(q, "a0", "batch", prefix=b"A", at=0.0)
    _push(q, "b0", "batch", prefix=b"B", at=0.0)
    _push(q, "a1", "batch", prefix=b"A", at=0.2)
    out = q.take(lambda p: True, idle=False, now=0.6, limit=2)
    assert [p.request_id for p in out] == ["a0", "a1"]


def test_capacity_running_out_stops_the_round_and_keeps_the_order():
    q = _queues()
    for i in range(3):
        _push(q, f"i{i}", "interactive")
    assert [p.request_id for p in q.take(lambda p: p.request_id != "i1", idle=False)] == ["i0"]
    assert [p.request_id for p in q.take(lambda p: True, idle=False)] == ["i1", "i2"] and len(q) == 0


def _prefill_full_for(long: set[str]):
    """Room for everything but the prompts in ``long``, which wait for the prefill pool."""
    return lambda p: Room.PREFILL_FULL if p.request_id in long else Room.YES


def test_short_prompts_pass_a_long_one_that_waits_for_the_prefill_pool():
    q = _queues()
    for rid in ("long0", "s0", "long1", "s1", "s2"):
        _push(q, rid, "interactive")
    out = q.take(_prefill_full_for({"long0", "long1"}), idle=False)
    assert [p.request_id for p in out] == ["s0", "s1", "s2"]
    # The long ones keep their places, in order, and go first once the prefill pool has room.
    assert [p.request_id for p in q.take(lambda p: Room.YES, idle=False)] == ["long0", "long1"]


def test_a_lane_waiting_for_the_prefill_pool_leaves_the_other_lanes_their_turns():
    q = _queues()
    _push(q, "long", "interactive")
    _push(q, "b0", "batch")
    out = q.take(_prefill_full_for({"long"}), idle=False, now=10.0)
    assert [p.request_id for p in out] == ["b0"] and len(q) == 1


def test_nothing_passes_a_head_that_waits_for_the_decode_pool():
    q = _queues()
    for rid in ("i0", "i1", "i2"):
        _push(q, rid, "interactive")
    _push(q, "b0", "batch")
    assert q.take(lambda p: Room.NO if p.request_id == "i0" else Room.YES, idle=False, now=10.0) == []
    # Behind a long head, a request the decode pool cannot take stops the scan too (no overtaking there).
    answers = {"i0": Room.PREFILL_FULL, "i1": Room.NO, "i2": Room.YES, "b0": Room.YES}
    out = q.take(lambda p: answers[p.request_id], idle=False, now=10.0)
    assert [p.request_id for p in out] == ["b0"]
    assert [p.request_id for p in q.take(lambda p: Room.YES, idle=False)] == ["i0", "i1", "i2"]


def test_ahead_counts_more_important_lanes_whole_and_less_important_ones_not_at_all():
    q = _queues()
    for i in range(3):
        _push(q, f"i{i}", "interactive")
    for i in range(40):
        _push(q, f"b{i}", "batch")
    # An interactive request goes ahead of every batch request where the work runs: only its own 3.
    assert q.requests_ahead("interactive") == 3
    assert q.tokens_ahead("interactive") == 300
    # A batch request waits for its 40 and all of the more important lane's.
    assert q.requests_ahead("batch") == 43
    assert q.tokens_ahead("batch") == 4300


def test_lanes_of_one_priority_are_ahead_by_their_weight_share():
    chat = LaneConfig("chat", ttft_slo_s=2.0, tpot_slo_s=0.25, weight=2.0, priority=INTERACTIVE.priority)
    q = LaneQueues((INTERACTIVE, chat, BATCH), quantum=100)
    for i in range(3):
        _push(q, f"i{i}", "interactive")
    for i in range(40):
        _push(q, f"c{i}", "chat")
        _push(q, f"b{i}", "batch")
    # While 4 of ours (with us) go, the chat lane gets 4 x 2/8; the batch lane nothing.
    assert q.requests_ahead("interactive") == 3 + 1
    # In tokens: ours, and the chat lane's share of at least one full round of ours (8 quanta).
    assert q.tokens_ahead("interactive") == 300 + 800 * 2 // 8


def test_a_durable_job_on_its_way_through_the_journal_holds_its_place_for_admission_only():
    import router.lane_queues as lq

    q = lq.LaneQueues((LaneConfig("batch", ttft_slo_s=600.0, tpot_slo_s=5.0, queue_bound=3),))
    q.hold_place("job-1", "batch")
    assert q.admitted_depth("batch") == 1 and q.depth("batch") == 0  # the consumer's room is not taken
    q.push(Pending("job-1", "batch", 10, None))  # claimed here: counted once, as queued
    assert q.admitted_depth("batch") == 1 and q.depth("batch") == 1
    q.hold_place("job-2", "batch")  # claimed by another replica: its hold lapses
    assert q.admitted_depth("batch") == 2
    q._journaled["job-2"] = ("batch", time.monotonic() - lq.JOURNAL_GRACE_S - 1)  # (as if held long ago)
    assert q.admitted_depth("batch") == 1


def test_weights_hold_when_the_pools_free_one_place_per_round():
    """Saturated pools: each dispatch call had room for one request. The rotation started at the
    next lane every call and gave it credit, so the lanes alternated 1:1 whatever their weights."""
    for per_call in (1, 2, 4):
        q = _queues()
        for i in range(2000):  # both lanes backlogged throughout
            _push(q, f"i{i}", "interactive")
            _push(q, f"b{i}", "batch")
        counts = {"interactive": 0, "batch": 0}
        for _ in range(300):
            budget = iter([True] * per_call + [False])
            for p in q.take(lambda p: next(budget), idle=False, now=10.0):
                counts[p.lane] += 1
        assert 7.5 <= counts["interactive"] / counts["batch"] <= 8.5, (per_call, counts)
        assert max(q.deficit.values()) <= 8 * 100  # no credit banked beyond one turn


def test_a_prefix_group_is_charged_to_its_lane():
    """A batch head's same-prefix followers left with it free of the lane's credit: a weight-1
    lane took whole rounds from the weight-8 one."""
    q = _queues()
    for i in range(40):
        _push(q, f"i{i}", "interactive")
        _push(q, f"b{i}", "batch", prefix=b"SYS")
    q._cursor = q.order.index("batch")  # the round starts at the batch lane
    first = q.take(lambda p: True, idle=False, now=10.0, limit=18)
    assert [p.lane for p in first].count("batch") == 18 and q.deficit["batch"] < 0  # the group, in debt
    later = q.take(lambda p: True, idle=False, now=10.0, limit=36)
    assert [p.lane for p in later].count("interactive") >= 32  # the debt is paid in turns, not ignored


def test_a_head_too_big_for_what_frees_up_does_not_hold_the_other_lanes():
    """The batch lane's turn starts with a head the full pools refuse: the turn passes (without
    banking its credit), so the next call serves the interactive lane's small requests."""
    q = _queues()
    _push(q, "big", "batch", cost=100)
    for i in range(3):
        _push(q, f"i{i}", "interactive", cost=50)
    q._cursor = q.order.index("batch")
    fits = lambda p: p.request_id != "big"  # noqa: E731 - only small requests fit what is free
    assert q.take(fits, idle=False, now=10.0) == []  # the round stops at the refused head...
    assert [p.request_id for p in q.take(fits, idle=False, now=10.0)] == ["i0", "i1", "i2"]  # ...once
    assert q.deficit["batch"] <= 100  # at most the credit of the turn it now holds, never banked


LONG = LaneConfig("long_context", ttft_slo_s=60, tpot_slo_s=1, weight=1, priority=1)
BACKGROUND = LaneConfig("background", ttft_slo_s=600, tpot_slo_s=5, weight=4, priority=2)  # no batch window


def _starving_pool(q: LaneQueues, busy_from: str = "background", until: float = 120.0, held_blocks: int = 0):
    """A 65-block pool: the big long_context head needs 60, a small request 6 and runs 3 s; two small
    requests of ``busy_from`` arrive a second (~36 blocks busy), one interactive request every 5 s.
    ``held_blocks``: blocks another router holds for good. Returns the dispatches, with times."""
    free, running, got, t = 65 - held_blocks, [], [], 0.0
    _push(q, "big", "long_context", cost=100)
    _push(q, "small-behind", "long_context", cost=10)

    def fits(p: Pending) -> bool:
        nonlocal free
        need = 60 if p.request_id == "big" else 6
        if need > free:
            return False
        free -= need
        running.append((t + 3.0, need))
        return True

    while t < until:
        for k in range(2):
            _push(q, f"{busy_from[0]}{t:g}-{k}", busy_from, cost=10, at=t)
        if t % 5 == 0:
            _push(q, f"i{t:g}", "interactive", cost=10, at=t)
        got += [(t, p.request_id) for p in q.take(fits, idle=False, now=t)]
        free += sum(n for end, n in running if end <= t + 1.0)
        running = [(end, n) for end, n in running if end > t + 1.0]
        t += 1.0
    return got


def test_a_head_refused_for_half_its_ttft_objective_is_drained_for():
    """A prompt needing most of the KV cache waited as long as other requests kept taking what freed
    up (73 s with a 60 s objective, in a cluster audit), its lane behind it. Once refused for half its
    lane's objective, its lane and the less important ones dispatch nothing until it fits: what they
    hold drains and it goes. A more important lane keeps going meanwhile."""
    q = LaneQueues((INTERACTIVE, LONG, BACKGROUND), quantum=100)
    got = _starving_pool(q, until=60)
    when = {rid: t for t, rid in got}
    assert 30 <= when["big"] <= 30 + 5  # drained for from 30 s, out once what the others held ended
    assert when["small-behind"] > when["big"]  # its lane moves on after it
    assert not any(rid.startswith("b") and 30 < t < when["big"] for t, rid in got)  # the less important waited
    assert any(rid.startswith("b") and t > when["big"] for t, rid in got)  # and go again
    assert q.draining_for is None


def test_a_drain_that_cannot_empty_the_pools_is_given_up():
    """Another router holding blocks for good: the pool never empties for the head. A drain without a
    bound stopped this router's dispatch for good (a review found it); it is given up after the
    lane's TTFT objective, the other lanes go again, and it counts afresh."""
    q = LaneQueues((INTERACTIVE, LONG, BACKGROUND), quantum=100)
    got = _starving_pool(q, until=200, held_blocks=10)
    assert "big" not in {rid for _, rid in got}  # it cannot fit at all here
    background = [t for t, rid in got if rid.startswith("b")]
    stalled = max(b - a for a, b in itertools.pairwise(background))
    assert stalled <= 60 + 3 and max(background) > 150  # a bounded pause, then dispatch goes on
    assert any(rid.startswith("i") and 35 <= t <= 85 for t, rid in got)  # the more important lane never paused


def test_a_starved_head_that_is_aborted_ends_the_drain():
    long_lane = LaneConfig("long_context", ttft_slo_s=2, tpot_slo_s=1, weight=1, priority=1)
    q = LaneQueues((INTERACTIVE, long_lane), quantum=100)
    _push(q, "big", "long_context", cost=100)
    _push(q, "i0", "interactive", cost=10)
    q.take(lambda p: p.request_id != "big", idle=False, now=0.0)
    q.take(lambda p: p.request_id != "big", idle=False, now=5.0)
    q.take(lambda p: p.request_id != "big", idle=False, now=6.0)
    assert q.draining_for is not None and q.draining_for.request_id == "big"
    q.remove("big")
    _push(q, "i1", "interactive", cost=10)
    assert [p.request_id for p in q.take(lambda p: True, idle=False, now=7.0)][-1] == "i1"
    assert q.draining_for is None
