"""The lanes' pressure the router reports to decode workers, and admission counting what preempting
less important lanes frees (pure Python)."""

import asyncio

import pytest

from engine.lane_shares import LaneDemand
from router.admission import Admission, AdmissionInput
from router.api import RouterError
from router.lane_pressure import LanePressure
from router.lanes import LaneConfig, TenantConfig, default_lanes

LANES = {lane.name: lane for lane in default_lanes()}
TENANT = TenantConfig("default")


def _input(**kw) -> AdmissionInput:
    base = dict(
        lane=LANES["interactive"],
        tenant=TENANT,
        prompt_tokens=100,
        max_tokens=16,
        lane_depth=0,
        tokens_ahead=0,
        pool_queued_tokens=0,
        prefill_tokens_per_s=1000.0,
        service_s=0.2,
    )
    return AdmissionInput(**{**base, **kw})


def _admit(adm: Admission, x: AdmissionInput) -> float:
    return asyncio.run(adm.admit(x))


def _pressure(depths=None, running=(), refusals=lambda lane, since: 0, ttft=lambda lane, since: 0, now=100.0):
    return LanePressure(
        default_lanes(),
        lambda lane: (depths or {}).get(lane, 0),
        lambda: running,
        refusals,
        ttft,
        hold_at=0.6,
        clock=lambda: now,
    )


def test_freeable_counts_less_important_preemptible_lanes_above_their_floor():
    p = _pressure()
    # 20 running: the batch lane's floor is ceil(0.05 x 20) = 1, so 15 of its 16 may go
    assert p.freeable("interactive", {"interactive": 4, "batch": 16}) == 15
    assert p.freeable("interactive", {"interactive": 19, "batch": 1}) == 0  # at its floor
    assert p.freeable("batch", {"interactive": 4, "batch": 16}) == 0  # nothing less important
    assert p.freeable("long_context", {"long_context": 2, "batch": 5}) == 4
    assert p.freeable("interactive", {"interactive": 4, "long_context": 9}) == 0  # not preemptible


def test_interactive_is_refused_for_pace_only_when_batch_is_at_its_floor():
    adm = Admission(4096, None)
    running = tuple((10, 200) for _ in range(20))  # 4 interactive + 16 batch streams at 0.4 s a token
    slow = dict(decode_pace_s=0.4, running=running)
    # Preempting 15 batch sequences leaves 6 with the new one: 0.4 x 6 / 20 = 0.12 s a token, in the objective.
    _admit(adm, _input(freeable_seqs=15, **slow))
    with pytest.raises(RouterError) as e:  # the batch lane at its floor: nothing to free, refused as before
        _admit(adm, _input(freeable_seqs=0, **slow))
    assert e.value.code == "slo_predicted_violation"
    assert adm.rejections == {("interactive", "slo_tpot"): 1}
    assert adm.pace_refusals("interactive", 0.0) == 1 and adm.pace_refusals("batch", 0.0) == 0


def test_freeable_slots_count_as_free_for_the_ttft_prediction():
    adm = Admission(4096, None)
    full = dict(free_seq_slots=0, running=tuple((1, 4000) for _ in range(8)), decode_pace_s=0.05, requests_ahead=2)
    with pytest.raises(RouterError):  # three slots must free up, and the running requests are long
        _admit(adm, _input(**full))
    assert _admit(adm, _input(freeable_seqs=3, **full)) < LANES["interactive"].ttft_slo_s


def test_the_report_carries_router_waiting_refusals_and_pace():
    slow_stream = [100.0 - 0.5 * i for i in range(9)][::-1]  # a token every 0.5 s (objective 0.25 s)
    fast_stream = [100.0 - 0.05 * i for i in range(9)][::-1]
    p = _pressure(depths={"batch": 7}, running=[("interactive", slow_stream), ("batch", fast_stream)])
    assert p.report() == (LaneDemand(0, 0, True), LaneDemand(2, 7, False))
    refused = _pressure(
        refusals=lambda lane, since: 3 if lane == "interactive" else 0, running=[("interactive", fast_stream)]
    )
    assert refused.report() == (LaneDemand(0, 3, True),)
    # refused for its predicted TTFT: demand the worker cannot see, but its streams are not slow
    late = _pressure(ttft=lambda lane, since: 2 if lane == "interactive" else 0, running=[("interactive", fast_stream)])
    assert late.report() == (LaneDemand(0, 2, False),)
    assert _pressure().report() == ()  # nothing waits, nothing is slow: no pressure


def test_decode_floor_is_validated():
    with pytest.raises(ValueError):
        LaneConfig("x", ttft_slo_s=1, tpot_slo_s=1, decode_floor=1.0)


def test_the_pace_is_read_from_streams_no_preemption_stalls():
    steady = [100.0 - 0.1 * i for i in range(9)][::-1]  # a token every 0.1 s, the last just now
    stalled = [90.0 - 0.1 * i for i in range(9)][::-1]  # preempted 10 s ago: waiting to resume
    resumed = [80.0 + 0.1 * i for i in range(4)] + [95.0 + 0.1 * i for i in range(5)]  # one gap across it
    p = _pressure(running=[("interactive", steady), ("batch", stalled)])
    assert p.pace(lambda: 99.0) == pytest.approx(0.1)  # the interactive stream's: the batch one is stalled
    only_batch = _pressure(running=[("batch", resumed), ("batch", steady)])
    assert only_batch.pace(lambda: 99.0) == pytest.approx(0.1)  # median gaps: the gap across the preemption is not it
    assert _pressure().pace(lambda: 0.3) == 0.3  # nothing streams: recently finished requests' pace


def test_freeable_on_a_worker_counts_its_batch_not_the_routers_dispatched_requests():
    p = _pressure()
    # The worker runs 4 interactive and 6 batch (priority 2) sequences; preempted ones wait there, not counted.
    assert p.freeable_on("interactive", {0: 4, 2: 6}) == 5  # floor: ceil(0.05 x 10) = 1
    assert p.freeable_on("interactive", {0: 9, 2: 1}) == 0
    assert p.freeable_on("batch", {0: 4, 2: 6}) == 0
    assert p.freeable_on("interactive", {0: 4, 1: 6}) == 0  # long_context: not preemptible
