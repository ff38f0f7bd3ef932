"""Placement helpers in isolation (pure Python)."""

from dataclasses import replace

from engine.lane_shares import LaneCounters
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from engine.worker_stats import WorkerLoad
from router.placement import NO_HINT, choose_prefill, prefill_on_decode, prefill_queue, short_prompt_still_fits
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
    d0.count_dispatched("r", 50)  # placed since its last report
    assert prefill_queue(WorkerPool([], [d0, d1]), 900, 256, _rates({"d0": 60.0, "d1": 40.0})) == (450, 100.0)
    p0 = _handle("p0", "prefill")
    p0.alive = False
    assert prefill_queue(WorkerPool([p0], [d0, d1]), 900, 256, _rates({"d0": 60.0, "d1": 40.0})) == (450, 100.0)


def test_prompts_placed_on_a_decode_worker_since_its_report_are_queued_there():
    """A burst placed during one long step: each request waits behind the ones placed before it,
    though the worker's report does not show them yet; once a report includes them, they count once."""
    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(p0), _load(d0, queued_prefill=100)
    pool = WorkerPool([p0], [d0])
    rates = _rates({"p0": 200.0, "d0": 50.0})
    d0.count_placed("router-a", 180)  # placed locally, not yet reported
    d0.count_placed("router-b", 40)  # another router's
    assert prefill_queue(pool, 80, 256, rates) == (320, 200.0)
    assert d0.load is not None
    d0.update_load(replace(d0.load, queued_prefill_tokens=280, prompt_tokens_placed={"router-a": 180}))
    assert prefill_queue(pool, 80, 256, rates) == (320, 200.0)  # router-b's 40 still on the way
    colocated = WorkerPool([], [d0])
    assert prefill_queue(colocated, 900, 256, rates) == (320, 50.0)


def _spec(n: int) -> RequestSpec:
    return RequestSpec("r1", tuple(range(3, 3 + n)), SamplingParams(max_tokens=4), origin="router-a")


def test_a_short_prompt_goes_to_a_prefill_worker_with_room_for_it_and_stays_local_when_it_is_busy():
    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(p0), _load(d0)
    pool = WorkerPool([p0], [d0])
    idle = dict(short_to_idle_prefill=True)
    assert not prefill_on_decode(pool, _spec(48), d0, NO_HINT, 256, **idle)  # idle: P computes it
    assert prefill_on_decode(pool, _spec(48), d0, NO_HINT, 256)  # the rule off: every short prompt stays
    p0.count_dispatched("router-a", 2048)  # a long prompt on its way to P
    assert prefill_on_decode(pool, _spec(48), d0, NO_HINT, 256, **idle)
    _load(p0, queued_prefill=0, received={"router-a": 2048})  # computed: room again
    assert not prefill_on_decode(pool, _spec(48), d0, NO_HINT, 256, **idle)
    _load(p0, queued_prefill=220, received={"router-a": 2048})  # 220 + 48 > 256: no room for this one
    assert prefill_on_decode(pool, _spec(48), d0, NO_HINT, 256, **idle)
    assert not prefill_on_decode(pool, _spec(30), d0, NO_HINT, 256, **idle)  # 220 + 30 fits
    assert not prefill_on_decode(pool, _spec(900), d0, NO_HINT, 256, **idle)  # long prompts: always P
    resumed = RequestSpec("r2", (5,) * 48, SamplingParams(max_tokens=4), resume_token_ids=(7,))
    _load(p0)
    assert prefill_on_decode(pool, resumed, d0, NO_HINT, 256, **idle)  # a migration recomputes where it is


def test_a_short_prompt_sent_to_an_idle_prefill_worker_is_taken_back_if_a_long_one_got_there_first():
    p0 = _handle("p0", "prefill")
    _load(p0)
    p0.count_dispatched("router-a", 48)  # ours, counted when placed
    assert short_prompt_still_fits(p0, 256)
    p0.count_dispatched("router-b", 2048)  # a long prompt placed while our reserve waited for a decode step
    assert not short_prompt_still_fits(p0, 256)


def test_the_admission_prediction_follows_the_same_rule():
    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(p0, queued_prefill=40)
    _load(d0, queued_prefill=100)
    pool = WorkerPool([p0], [d0])
    rates = _rates({"p0": 200.0, "d0": 50.0})
    assert prefill_queue(pool, 80, 256, rates, short_to_idle_prefill=True) == (40, 200.0)  # P has room
    _load(p0, queued_prefill=3000)
    assert prefill_queue(pool, 80, 256, rates, short_to_idle_prefill=True) == (100, 200.0)  # P busy: local


def test_a_report_older_than_a_dispatch_does_not_make_a_busy_worker_look_idle():
    p0, p1 = _handle("p0", "prefill"), _handle("p1", "prefill")
    _load(p0), _load(p1)
    p0.count_dispatched("router-a", 2048)
    _load(p0)  # answered before the prompt arrived (it was still being reserved on a decode worker)
    assert p0.dispatched_tokens == 2048
    assert choose_prefill(WorkerPool([p0, p1], []), _spec(100)) is p1
    p0.count_dispatched("router-b", 300)  # another router sharing the worker counts apart
    _load(p0, queued_prefill=1500, received={"router-a": 2048})
    assert p0.dispatched_tokens == 300
    p0.count_dispatched("router-b", -300)  # refused by the worker: never arrived
    assert p0.dispatched_tokens == 0
    p0.count_dispatched("router-a", 100)
    p0.forget_dispatched()  # a new incarnation: nothing sent to the old one is on its way
    assert p0.dispatched_tokens == 0


def test_a_prompt_no_prefill_worker_s_cache_holds_is_prefilled_on_its_decode_worker():
    """A prefill worker keeps a prompt's every block until it is shipped: one whose cache is smaller
    than the prompt is passed over, and with none left the decode worker prefills it."""
    small, big = _handle("small", "prefill", num_blocks=4), _handle("big", "prefill", num_blocks=8)
    _load(small), _load(big, queued_prefill=3000)
    pool = WorkerPool([small, big], [])
    assert choose_prefill(pool, _spec(64)) is small  # 4 blocks of 16 tokens hold it, and it is idle
    assert choose_prefill(pool, _spec(65)) is big
    assert choose_prefill(pool, _spec(129)) is None
    d0 = _handle("d0", "decode", num_blocks=64)
    _load(d0)
    pool = WorkerPool([small, big], [d0])
    assert not prefill_on_decode(pool, _spec(128), d0, NO_HINT, 32)
    assert prefill_on_decode(pool, _spec(129), d0, NO_HINT, 32)  # (as admission's prediction assumes)
    assert prefill_queue(pool, 129, 32, _rates({"small": 1.0, "big": 1.0, "d0": 1.0}))[0] == 0


def _decode_report(h, free: int, placed: dict[str, int] | None = None) -> None:
    from engine.worker_stats import WorkerLoad

    h.update_load(
        WorkerLoad(
            h.worker_id,
            "i0",
            "decode",
            num_running=0,
            num_waiting=0,
            num_free_blocks=free,
            num_total_blocks=h.info.num_blocks,
            queued_prefill_tokens=0,
            prompt_tokens_placed=placed or {},
        )
    )


def test_a_burst_between_two_reports_is_spread_over_the_decode_workers():
    from router.placement import choose_decode

    d0, d1 = _handle("d0", "decode"), _handle("d1", "decode")  # 1,000 blocks of 16 tokens each
    _decode_report(d0, free=810)
    _decode_report(d1, free=800)  # a hair less free: every placement used to go to d0 until d1's next report
    pool = WorkerPool([], [d0, d1])
    placed = {"d0": 0, "d1": 0}
    for i in range(20):  # 20 prompts of 160 tokens (10 blocks each), no report in between
        d = choose_decode(pool)
        d.requests.add(f"r{i}")
        d.count_placed("router-a", 160)
        placed[d.worker_id] += 1
    assert placed == {"d0": 10, "d1": 10}
    # A report that includes d0's placements takes them out of what is pending; a later one counts again.
    _decode_report(d0, free=710, placed={"router-a": 1600})
    assert d0.placed_tokens == 0 and d1.placed_tokens == 1600
    d1.count_placed("router-a", -160)  # a placement the worker refused
    assert d1.placed_tokens == 1440
    d1.forget_dispatched()  # a new incarnation
    assert d1.placed_tokens == 0


def test_less_important_waiting_prompts_are_not_ahead_beyond_the_step_that_computes_this_one():
    from router.placement import yielding_tokens

    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(p0, queued_prefill=5000), _load(d0, queued_prefill=900)
    assert p0.load is not None and d0.load is not None
    p0.update_load(replace(p0.load, waiting_tokens_by_priority={0: 400, 2: 4000}, step_prompt_budget=2048))
    d0.update_load(replace(d0.load, waiting_tokens_by_priority={2: 900}, step_prompt_budget=256))
    pool = WorkerPool([p0], [d0])
    # A 548-token interactive prompt on the prefill worker: 1500 batch tokens fill its step, the rest wait.
    assert yielding_tokens(pool, 0, 548, 256) == 4000 - 1500
    assert yielding_tokens(pool, 2, 548, 256) == 0  # nothing less important than batch
    # A short prompt stays on its decode worker: 900 - (256 - 56) of batch recompute there waits for it.
    assert yielding_tokens(pool, 0, 56, 256) == 700
    # With lane shares (lane counters reported) a batch lane takes only its share beside it: all yield.
    counters = LaneCounters({}, {}, {}, queued_tokens={0: 50, 2: 1200})
    d0.update_load(replace(d0.load, lane_counters=counters))
    assert yielding_tokens(pool, 0, 56, 256) == 1200


def test_with_lane_steps_the_step_in_flight_is_ahead_and_the_less_important_keep_their_floor_after_it():
    """A prefill worker with lane shares: its report is taken between two steps, so the step it then
    started (the head of its queue, up to its budget) is ahead of a new interactive prompt whatever
    its lanes, less what the worker has computed of it since; after it, the batch prompts yield but
    for their floor of the interactive prompt's step (engine/lane_shares.py)."""
    from router.placement import LaneSteps, yielding_tokens

    p0, d0 = _handle("p0", "prefill"), _handle("d0", "decode")
    _load(d0)
    pool = WorkerPool([p0], [d0])
    lanes = {0: 0.05, 2: 0.1}

    def report(queued: int, waiting: dict[int, int], at: float) -> None:
        load = WorkerLoad("p0", "i0", "prefill", 0, 0, 1000, 1000, queued_prefill_tokens=queued)
        p0.update_load(replace(load, waiting_tokens_by_priority=waiting, step_prompt_budget=2048), at=at)

    def ahead(now: float, rate: float = 400.0) -> int:
        queued, _ = prefill_queue(pool, 548, 256, lambda ids: rate)
        return queued - yielding_tokens(pool, 0, 548, 256, lanes=LaneSteps(lanes, lambda ids: rate, now))

    # 300 tokens of a running batch prompt, 4,000 waiting: the step in flight is 2,048 of them.
    report(4300, {2: 4000}, at=10.0)
    assert ahead(now=10.0) == 2048 + 204  # the step in flight, then batch's floor of this prompt's step
    assert ahead(now=12.0) == 2048 - 800 + 204  # two seconds of it computed at 400 tokens/s
    assert ahead(now=30.0) == 204  # (at most the step: the next one is counted whole)
    # An interactive prompt waiting there too, and a short queue: the whole queue is in the step.
    report(700, {0: 200, 2: 500}, at=10.0)
    assert ahead(now=10.0) == 700
    # Idle at the report: nothing in flight; a batch prompt dispatched since is ahead whole.
    report(0, {}, at=10.0)
    p0.count_dispatched("router-a", 900)
    assert ahead(now=11.0) == 900
    # Without lane steps the old model: batch fills this prompt's step (2,048 - 548), the rest yields.
    p0.forget_dispatched()
    report(4300, {2: 4000}, at=10.0)
    assert prefill_queue(pool, 548, 256, lambda ids: 400.0)[0] - yielding_tokens(pool, 0, 548, 256) == 300 + 1500
