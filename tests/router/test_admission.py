"""Admission rules in isolation (pure Python): context length, queue bound, SLO prediction."""

import asyncio

import pytest

from router.admission import Admission, AdmissionInput, predict_ttft, slot_free_after
from router.api import ErrorKind, RouterError
from router.lanes import LaneConfig, TenantConfig

LANE = LaneConfig("interactive", ttft_slo_s=2.0, tpot_slo_s=0.25, queue_bound=4)
TENANT = TenantConfig("default")


def _input(**kw) -> AdmissionInput:
    base = dict(
        lane=LANE,
        tenant=TENANT,
        prompt_tokens=100,
        max_tokens=16,
        lane_depth=0,
        tokens_ahead=0,
        pool_queued_tokens=0,
        prefill_tokens_per_s=1000.0,
    )
    return AdmissionInput(**{**base, **kw})


def _admit(adm: Admission, x: AdmissionInput) -> float:
    return asyncio.run(adm.admit(x))


def test_prediction_is_wait_plus_service_plus_window():
    p = predict_ttft(_input(tokens_ahead=500, pool_queued_tokens=500, service_s=0.3))
    assert p.wait_s == pytest.approx(1.0) and p.service_s == 0.3 and p.total_s == pytest.approx(1.3)
    # Before any measurement, the service time is the request's own prompt at the prefill rate.
    assert predict_ttft(_input(prompt_tokens=200)).service_s == pytest.approx(0.2)
    # A full decode pool: the wait is for enough completions to free a slot, if that is later.
    p = predict_ttft(_input(requests_ahead=5, free_seq_slots=0, completions_per_s=2.0, service_s=0.1))
    assert p.wait_s == pytest.approx(3.0)


def test_measured_service_near_the_slo_is_admitted_on_an_idle_cluster():
    # A slow machine: TTFT is 1.8 s with nothing queued. 1.8 s < 2 s: admit (the headroom guards the
    # queue-wait estimate, not a measured service time).
    assert _admit(Admission(4096, None), _input(service_s=1.8)) == pytest.approx(1.8)


def test_queue_wait_is_guarded_by_the_headroom():
    adm = Admission(4096, None, slo_headroom=0.75)
    # 1.2 s of queued work + 0.4 s service = 1.6 s < 2 s, but 1.2 / 0.75 + 0.4 = 2.0 s: too close.
    with pytest.raises(RouterError) as e:
        _admit(adm, _input(tokens_ahead=1300, service_s=0.4))
    assert e.value.kind is ErrorKind.OVERLOADED and e.value.code == "slo_predicted_violation"
    assert e.value.retry_after_s is not None and e.value.retry_after_s >= 1
    assert adm.rejections == {("interactive", "slo_predicted"): 1}
    _admit(adm, _input(tokens_ahead=1000, service_s=0.4))  # 1.0 / 0.75 + 0.4 = 1.73 s: admitted
    # With SLO rejection off, the same request is admitted (experiments compare the two).
    _admit(Admission(4096, None, slo_rejection=False), _input(tokens_ahead=1300, service_s=0.4))


def test_context_length_and_queue_bound():
    adm = Admission(128, None)
    with pytest.raises(RouterError) as e:
        _admit(adm, _input(prompt_tokens=120, max_tokens=16))
    assert e.value.kind is ErrorKind.INVALID_REQUEST and e.value.param == "max_tokens"
    with pytest.raises(RouterError) as e:
        _admit(Admission(4096, None), _input(lane_depth=4))
    assert e.value.code == "queue_full"


@pytest.mark.parametrize(
    "prompt, max_tokens, given, bound_name, param, words",
    [
        (120, 16, True, "max_tokens", "max_tokens", "120 in the messages, 16 in the completion"),
        (120, 16, True, "max_completion_tokens", "max_completion_tokens", "or max_completion_tokens"),
        # a bound the client did not set (the server's default) is never named as the client's fault
        (120, 4096, False, "max_tokens", "messages", "the messages resulted in 120 tokens"),
        (128, 1, True, "max_tokens", "messages", "leaves no room"),  # the prompt alone fills the context
    ],
)
def test_a_context_length_error_names_the_field_at_fault(prompt, max_tokens, given, bound_name, param, words):
    """It always named max_tokens, with the server's default counted as what 'you requested'."""
    with pytest.raises(RouterError) as e:
        Admission(128, None).check_context(prompt, max_tokens, max_tokens_given=given, max_tokens_param=bound_name)
    assert e.value.param == param and e.value.code == "context_length_exceeded" and words in e.value.message
    with pytest.raises(RouterError) as e:
        Admission(128, None).check_context(200, 4, prompt_param="prompt")
    assert e.value.param == "prompt" and "the prompt resulted in 200 tokens" in e.value.message


def test_a_stale_service_time_cannot_lock_a_lane_out():
    from router.load_signals import Ewma

    service = Ewma()
    service.observe(6.6, now=100.0)  # one slow burst: above the 2 s objective
    adm = Admission(4096, None)
    busy = ((5, 20),)  # one request running
    with pytest.raises(RouterError):
        _admit(adm, _input(service_s=service.fresh(15.0, now=110.0), running=busy))
    # Nothing admitted since: after 15 s the measurement is stale and the model estimate
    # (100 prompt tokens at 1000 tokens/s) lets a probe through.
    assert service.fresh(15.0, now=116.0) is None
    assert _admit(adm, _input(service_s=service.fresh(15.0, now=116.0), running=busy)) == pytest.approx(0.1)


def test_a_slow_decode_pace_rejects_until_it_recovers():
    adm = Admission(4096, None)
    # Tokens take 0.4 s each right now (objective 0.25 s): one more sequence would slow them further.
    busy = ((5, 20), (9, 20))
    with pytest.raises(RouterError) as e:
        _admit(adm, _input(service_s=0.2, decode_pace_s=0.4, running=busy))
    assert e.value.kind is ErrorKind.OVERLOADED and "time-per-output-token" in str(e.value)
    assert adm.rejections == {("interactive", "slo_tpot"): 1}
    _admit(adm, _input(service_s=0.2, decode_pace_s=0.1, running=busy))  # recovered
    _admit(adm, _input(service_s=0.2, decode_pace_s=0.4))  # the slow streams have finished
    _admit(Admission(4096, None, slo_rejection=False), _input(service_s=0.2, decode_pace_s=0.4, running=busy))


def test_the_pace_checks_headroom_loosens_while_the_lanes_streams_keep_well_within_their_objective():
    """The predicted pace is compared with ``slo_headroom`` x the TPOT objective, loosened up to
    ``pace_headroom`` x it in proportion as the lane's recently finished streams ran faster than the
    fixed guard (``recent_tpot_s``, their 90th percentile); never tighter than the fixed guard."""
    adm = Admission(4096, None)  # slo_headroom 0.75, pace_headroom 0.95: guards at 0.1875 and 0.2375 s
    near = dict(service_s=0.2, decode_pace_s=0.22, running=((5, 20),))
    with pytest.raises(RouterError) as e:  # no outcomes yet: the fixed guard
        _admit(adm, _input(**near))
    assert "time-per-output-token" in str(e.value) and "0.22 s each" in str(e.value)
    with pytest.raises(RouterError):  # its streams ran at the fixed guard: no margin to loosen with
        _admit(adm, _input(**near, recent_tpot_s=0.19))
    # They ran at 0.15 s: 0.75 x 0.1875 / 0.15 = 0.9375, a 0.234 s guard
    assert adm.pace_check_headroom(_input(recent_tpot_s=0.15)) == pytest.approx(0.9375)
    _admit(adm, _input(**near, recent_tpot_s=0.15))
    assert adm.pace_check_headroom(_input(recent_tpot_s=0.05)) == 0.95  # at most pace_headroom
    assert adm.pace_check_headroom(_input(recent_tpot_s=0.4)) == 0.75  # never tighter than slo_headroom
    with pytest.raises(RouterError):  # pace_headroom at slo_headroom: the fixed guard whatever the outcomes
        _admit(Admission(4096, None, pace_headroom=0.75), _input(**near, recent_tpot_s=0.05))
    with pytest.raises(RouterError):  # the most it loosens to: 0.24 s > 0.2375 s
        _admit(adm, _input(service_s=0.2, decode_pace_s=0.24, running=((5, 20),), recent_tpot_s=0.05))


def test_idle_pools_admit_even_a_request_that_cannot_meet_the_objective():
    adm = Admission(4096, None)
    # 5 s of its own prefill (a long prompt on a slow machine): nothing ahead, nothing running, so
    # waiting cannot help; rejecting it would lock it out for good.
    assert _admit(adm, _input(service_s=5.0)) == pytest.approx(5.0)
    with pytest.raises(RouterError):  # with anything running or queued it is judged as usual
        _admit(adm, _input(service_s=5.0, running=((1, 10),)))
    with pytest.raises(RouterError):
        _admit(adm, _input(service_s=5.0, pool_queued_tokens=10))


def test_slots_free_when_running_requests_finish_not_at_an_average_rate():
    # 8 requests started together, 40 of 48 tokens left at 50 ms/token: no slot frees for 2 s.
    running = tuple((8, 48) for _ in range(8))
    p = predict_ttft(
        _input(
            requests_ahead=0,
            free_seq_slots=0,
            running=running,
            decode_pace_s=0.05,
            completions_per_s=4.0,
            service_s=0.1,
            expected_output_tokens=48,
        )
    )
    assert p.wait_s == pytest.approx(2.0)
    # Seven ahead of us take seven of the wave's slots; we get the eighth.
    p = predict_ttft(
        _input(
            requests_ahead=7,
            free_seq_slots=0,
            running=running,
            decode_pace_s=0.05,
            service_s=0.1,
            expected_output_tokens=48,
        )
    )
    assert p.wait_s == pytest.approx(2.0)
    # Eight ahead: the whole wave goes to them; we wait for one of them to finish.
    p = predict_ttft(
        _input(
            requests_ahead=8,
            free_seq_slots=0,
            running=running,
            decode_pace_s=0.05,
            service_s=0.1,
            expected_output_tokens=48,
        )
    )
    assert p.wait_s == pytest.approx(2.0 + 0.1 + 48 * 0.05)
    # Staggered finishes: the earliest one frees our slot.
    staggered = tuple((48 - k, 48) for k in range(1, 9))
    p = predict_ttft(_input(free_seq_slots=0, running=staggered, decode_pace_s=0.05, service_s=0.1))
    assert p.wait_s == pytest.approx(0.05)
    assert slot_free_after([], 2, 1.5) == pytest.approx(3.0) and slot_free_after([1.0], 0, 1.0) == 0.0


def test_the_queue_bound_holds_for_a_burst_whose_admission_awaits():
    """A burst arriving together: each request's depth snapshot is taken before the rate limiter's
    await, and the ones admitted meanwhile (queued, or on their way through the batch journal) must
    count when the bound is checked (a burst of 6 into a lane bounded at 3 was admitted whole)."""

    class SlowLimiter:  # a Redis round trip: every arrival awaits before the bound is checked
        async def acquire(self, tenant, tokens, n_requests=1):
            await asyncio.sleep(0.01)  # the behaviour under test: an await before the bound is checked
            return type("Decision", (), {"allowed": True, "retry_after_s": 0.0, "reason": None})()

    lane = LaneConfig("batch", ttft_slo_s=600.0, tpot_slo_s=5.0, queue_bound=3)
    adm = Admission(4096, SlowLimiter(), slo_rejection=False)
    queued: list[int] = []

    async def arrive(i: int) -> str:
        x = _input(lane=lane, lane_depth=len(queued), lane_depth_now=lambda: len(queued))
        try:
            await adm.admit(x)
        except RouterError as e:
            assert e.code is not None
            return e.code
        queued.append(i)  # joins the queue (or holds its place) with no await after admission
        return "admitted"

    async def burst():
        return await asyncio.gather(*(arrive(i) for i in range(6)))

    assert sorted(asyncio.run(burst())) == ["admitted"] * 3 + ["queue_full"] * 3


class RecordingLimiter:
    """Allows everything and records what is charged and what is given back."""

    def __init__(self) -> None:
        self.taken: list[tuple[int, int]] = []  # (requests, tokens)
        self.refunded: list[tuple[int, int]] = []

    async def acquire(self, tenant, tokens, n_requests=1):
        from router.admission import RateDecision

        self.taken.append((n_requests, tokens))

        async def refund() -> None:
            self.refunded.append((n_requests, tokens))

        return RateDecision(True, refund=refund)


def test_a_request_refused_after_the_rate_limiter_gets_its_charge_back():
    """A 503 (full queue, predicted SLO miss) after the buckets were charged spent the tenant's
    budget: four requests/min, three 503s, one served, and the next was a 429."""
    lim = RecordingLimiter()
    adm = Admission(4096, lim)
    for x, code in (
        (_input(lane_depth=4), "queue_full"),
        (_input(tokens_ahead=1300, service_s=0.4), "slo_predicted_violation"),
        (_input(service_s=0.2, decode_pace_s=0.4, running=((5, 20),)), "slo_predicted_violation"),
    ):
        with pytest.raises(RouterError) as e:
            _admit(adm, x)
        assert e.value.code == code
    assert lim.taken == [(1, 116)] * 3 and lim.refunded == lim.taken
    _admit(adm, _input())  # admitted: the charge stands
    assert len(lim.taken) == 4 and len(lim.refunded) == 3


def test_refused_requests_leave_the_tenants_local_buckets_as_they_were():
    from router.cluster_state import _Limiter

    tenant = TenantConfig("t", requests_per_min=4)
    adm = Admission(4096, _Limiter(None))  # no Redis: the per-replica buckets
    for _ in range(3):
        with pytest.raises(RouterError) as e:
            _admit(adm, _input(tenant=tenant, lane_depth=4))
        assert e.value.code == "queue_full"
    for _ in range(4):  # the whole budget is still there
        _admit(adm, _input(tenant=tenant))
    with pytest.raises(RouterError) as e:
        _admit(adm, _input(tenant=tenant))
    assert e.value.code == "rate_limit_exceeded"


def test_a_choice_group_is_charged_once_for_all_its_choices():
    from router.api import ChoiceCharge

    lim = RecordingLimiter()
    adm = Admission(4096, lim)

    async def choices(n: int, refuse_at: int | None = None) -> ChoiceCharge:
        charge = ChoiceCharge(n)
        try:
            for i in range(n):
                charge.pending = n - i
                await adm.admit(_input(lane_depth=4 if i == refuse_at else 0, choice_charge=charge))
        except RouterError:
            await charge.give_back()
        return charge

    asyncio.run(choices(3))
    assert lim.taken == [(3, 3 * 116)] and lim.refunded == []  # the first choice takes all three
    lim.taken.clear()
    asyncio.run(choices(3, refuse_at=2))  # a later choice refused: the group's charge comes back
    assert lim.taken == [(3, 348)] and lim.refunded == [(3, 348)]
    lim.taken.clear(), lim.refunded.clear()
    asyncio.run(choices(3, refuse_at=0))  # the first refused after its charge: given back once
    assert lim.taken == [(3, 348)] and lim.refunded == [(3, 348)]


def test_more_choices_than_the_request_bucket_holds_is_too_large_not_rate_limited():
    from router.api import ChoiceCharge
    from router.cluster_state import _Limiter

    tenant = TenantConfig("t", requests_per_min=12)  # a bucket of 12
    adm = Admission(4096, _Limiter(None))

    async def first_choice(n: int) -> None:
        await adm.admit(_input(tenant=tenant, choice_charge=ChoiceCharge(n)))

    for _ in range(2):  # never a 429 with a Retry-After that can never come true
        with pytest.raises(RouterError) as e:
            asyncio.run(first_choice(16))
        assert (e.value.kind, e.value.code, e.value.param) == (ErrorKind.INVALID_REQUEST, "rate_limit_too_large", "n")
    asyncio.run(first_choice(12))  # nothing was spent by the refusals: all 12 at once
    with pytest.raises(RouterError) as e:
        _admit(adm, _input(tenant=tenant))
    assert e.value.code == "rate_limit_exceeded"


def test_a_slow_live_pace_rejects_even_with_free_sequence_slots():
    """The router builds the running requests' progress only when a request must wait for a slot,
    and says how many run: with slots free, the pace check (and the TTFT check) still apply. They
    were skipped while any slot was free, when it passed an empty ``running`` (a review found it)."""
    adm = Admission(4096, None)
    slow = _input(free_seq_slots=255, running=(), num_running=1, decode_pace_s=0.6)
    with pytest.raises(RouterError) as e:
        _admit(adm, slow)
    assert e.value.code == "slo_predicted_violation" and "time-per-output-token" in e.value.message
    assert adm.rejections == {("interactive", "slo_tpot"): 1}
    _admit(adm, _input(free_seq_slots=255, running=(), num_running=0, decode_pace_s=0.6))  # nothing runs: goes


def test_a_prompt_a_decode_worker_prefills_itself_runs_at_its_prompt_budget_a_step_beside_its_decodes():
    from router.decode_pace import StepSplit, local_prompt_rate

    # steps of 0.4 s carrying 100 prompt tokens at 2.5 ms each: 0.15 s of decoding; 256 prompt
    # tokens a step at most: 256 / (0.15 + 0.64) tokens/s, slower than the prefill worker's 400
    split = StepSplit(step_s=0.4, prompt_tokens_per_step=100, running=12, prompt_budget=256)
    assert local_prompt_rate(400.0, split) == pytest.approx(256 / (0.15 + 0.64))
    assert local_prompt_rate(400.0, None) == 400.0  # not known yet: the prefill worker's rate
    assert local_prompt_rate(400.0, StepSplit(0.4, 100, 12, prompt_budget=0)) == 400.0  # no budget reported
