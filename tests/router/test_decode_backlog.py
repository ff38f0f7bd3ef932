from engine.worker_stats import WorkerLoad
from router.decode_backlog import backlogged_lanes, merge_holds
from router.lanes import LaneConfig

LANES = (
    LaneConfig("interactive", ttft_slo_s=2.0, tpot_slo_s=0.25, weight=8.0, priority=0),
    LaneConfig("batch", ttft_slo_s=600.0, tpot_slo_s=5.0, weight=1.0, priority=2, preemptible=True),
    LaneConfig("bulk", ttft_slo_s=1200.0, tpot_slo_s=5.0, weight=1.0, priority=3, preemptible=True),
)


def decode_load(worker_id: str, waiting: dict[int, int]) -> WorkerLoad:
    return WorkerLoad(
        worker_id,
        "i0",
        "decode",
        num_running=4,
        num_waiting=sum(1 for n in waiting.values() if n),
        num_free_blocks=100,
        num_total_blocks=200,
        queued_prefill_tokens=sum(waiting.values()),
        waiting_tokens_by_priority=waiting,
    )


def test_a_preemptible_lane_waiting_on_every_decode_worker_is_held_for_at_most_a_quarter_of_its_ttft_objective():
    loads = [decode_load("d0", {2: 900, 3: 50}), decode_load("d1", {0: 30, 2: 400})]
    assert backlogged_lanes(LANES, loads) == {"batch": 150.0}
    assert backlogged_lanes(LANES, loads, max_hold_fraction=0.5) == {"batch": 300.0}


def test_a_lane_is_not_held_while_some_decode_worker_holds_none_of_it():
    """That worker may take the lane's next request, so its prompt is not computed in vain."""
    assert backlogged_lanes(LANES, [decode_load("d0", {2: 900}), decode_load("d1", {})]) == {}
    assert backlogged_lanes(LANES, [decode_load("d0", {2: 900}), decode_load("d1", {2: 0})]) == {}


def test_a_lane_that_is_not_preemptible_is_never_held():
    """Its waiting requests are not held back by a more important lane's pace: they wait for a place."""
    assert backlogged_lanes(LANES, [decode_load("d0", {0: 500, 2: 10})]) == {"batch": 150.0}


def test_without_reports_nothing_is_held():
    assert backlogged_lanes(LANES, []) == {}
    assert backlogged_lanes(LANES, [decode_load("d0", {2: 900}), None]) == {}


def test_merged_holds_keep_each_lanes_shortest_hold():
    assert merge_holds({"batch": 150.0}, {"batch": 60.0, "bulk": 300.0}, {}) == {"batch": 60.0, "bulk": 300.0}
    assert merge_holds() == {}
