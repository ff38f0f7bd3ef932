"""The decode worker's step split from its load reports, and admission's pace prediction from it
(pure Python)."""

import asyncio
from dataclasses import replace

import pytest

from engine.lane_shares import LaneCounters
from engine.worker_stats import WorkerLoad
from router.admission import Admission, AdmissionInput, predict_pace
from router.api import RouterError
from router.decode_pace import DecodeSteps, StepSplit, pace_inputs
from router.lanes import TenantConfig, default_lanes
from router.worker_pool import WorkerPool
from tests.router.test_capacity import _handle, _load

LANES = {lane.name: lane for lane in default_lanes()}


def _report(steps: int, busy_s: float, prompt_tokens: int, running: int = 10, budget: int = 256) -> WorkerLoad:
    return WorkerLoad(
        "d0",
        "i0",
        "decode",
        num_running=running,
        num_waiting=0,
        num_free_blocks=100,
        num_total_blocks=100,
        queued_prefill_tokens=0,
        steps=steps,
        busy_seconds=busy_s,
        prompt_tokens_computed=prompt_tokens,
        step_prompt_budget=budget,
    )


def test_the_split_is_the_mean_step_and_prompt_tokens_over_the_window():
    d = DecodeSteps(window_s=2.0)
    assert d.split(_report(100, 10.0, 1000), now=0.0) is None  # one report: nothing to difference
    d.observe(_report(110, 11.0, 1000), now=1.0)
    # 20 steps in 2 s of busy time, 500 prompt tokens computed in them
    assert d.split(_report(120, 12.0, 1500, running=7), now=2.0) == StepSplit(0.1, 25.0, 7, 256)
    d.observe(_report(130, 12.5, 1500), now=3.0)  # the reports older than the window go, one is kept
    later = d.split(_report(130, 12.5, 1500), now=4.0)
    assert later is not None and later.step_s == pytest.approx(1.5 / 20) and later.prompt_tokens_per_step == 25.0
    # a restarted worker's counters begin again: its old reports are not differenced with the new
    assert d.split(_report(3, 0.3, 0), now=5.0) is None


def _input(**kw) -> AdmissionInput:
    base = dict(
        lane=LANES["interactive"],
        tenant=TenantConfig("default"),
        prompt_tokens=100,
        max_tokens=64,
        lane_depth=0,
        tokens_ahead=0,
        pool_queued_tokens=0,
        prefill_tokens_per_s=1000.0,
        service_s=0.2,
        num_running=10,
        decode_pace_s=0.1,
        expected_output_tokens=50.0,
        prompt_token_s=0.002,
    )
    return AdmissionInput(**{**base, **kw})


def test_the_pace_counts_the_prompt_work_the_decode_worker_will_carry():
    # Steps of 0.1 s, 20 prompt tokens each (0.04 s of it): the decode part is 0.06 s for 10 sequences.
    steps = StepSplit(0.1, 20.0, 10, 256)
    assert predict_pace(_input(decode_steps=steps)) == pytest.approx(0.06 * 11 / 10 + 0.002 * 20)
    # 1000 prompt tokens queued there for this lane or more important ones, spread over its 50 tokens
    assert predict_pace(_input(decode_steps=steps, decode_backlog_tokens=1000)) == pytest.approx(
        0.066 + 0.002 * (20 + 20)
    )
    # ... but a step carries at most its prompt budget
    assert predict_pace(_input(decode_steps=steps, decode_backlog_tokens=100_000)) == pytest.approx(0.066 + 0.512)
    # Preempting 6 less important sequences leaves 4 with it: the decode part shrinks, the prompt work not.
    assert predict_pace(_input(decode_steps=steps, freeable_seqs=6)) == pytest.approx(0.06 * 5 / 10 + 0.04)
    # Without the split: the measured pace, scaled by what preemption frees (as before).
    assert predict_pace(_input(freeable_seqs=6)) == pytest.approx(0.1 * 5 / 10)


def test_admission_refuses_for_the_prompt_work_a_streams_pace_does_not_show_yet():
    adm = Admission(4096, None)
    quick = StepSplit(0.12, 0.0, 10, 256)  # pure decode steps: 0.132 s a token with one more stream
    asyncio.run(adm.admit(_input(decode_steps=quick)))
    with pytest.raises(RouterError) as e:  # 4000 recompute tokens queued there: a chunk rides most steps
        asyncio.run(adm.admit(_input(decode_steps=quick, decode_backlog_tokens=4000)))
    assert e.value.code == "slo_predicted_violation" and "would take" in e.value.message
    assert adm.rejections == {("interactive", "slo_tpot"): 1}


def test_pace_inputs_count_the_lanes_as_important_or_more_and_the_prompt_if_prefilled_there():
    d0 = _handle("d0", "decode")
    _load(d0)
    assert d0.load is not None
    counters = LaneCounters({}, {}, {}, queued_tokens={0: 300, 2: 5000}, running={0: 3, 2: 9})
    d0.update_load(replace(d0.load, lane_counters=counters, steps=5, busy_seconds=1.0))
    pool = WorkerPool([], [d0])
    steps = DecodeSteps()
    got = pace_inputs(pool, steps, 0, 120, True, lambda ids: 500.0 * len(ids), now=1.0)
    assert (got.backlog_tokens, got.running_by_priority, got.prompt_token_s) == (420, {0: 3, 2: 9}, 1 / 500)
    assert pace_inputs(pool, steps, 0, 120, False, lambda ids: 500.0, now=1.0).backlog_tokens == 300
    assert pace_inputs(pool, steps, 2, 120, False, lambda ids: 500.0, now=1.0).backlog_tokens == 5300
