"""Decode capacity by lane (engine/lane_shares.py) with the fake runner (pure Python, milliseconds)."""

from engine.block_manager import BlockManager
from engine.config import LaneShareConfig, SchedulerConfig
from engine.fake_runner import FakeModelRunner, fake_next_token
from engine.lane_shares import LaneDemand, water_fill
from engine.output_processor import OutputProcessor
from engine.request import Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

BS = 4
VOCAB = 1000
INTERACTIVE, BATCH = 0, 2
LANES = (
    LaneShareConfig(INTERACTIVE, weight=8.0, floor=0.05),
    LaneShareConfig(BATCH, weight=1.0, floor=0.1, preemptible=True),
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ClockedScheduler(Scheduler):
    """A scheduler whose lane shares read ``clock``, which the test moves."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int, clock: Clock) -> None:
        super().__init__(config, block_manager, max_model_len, clock=clock)
        self.clock = clock


def make(max_num_seqs=16, lanes=LANES, num_blocks=512):
    sched = ClockedScheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256, lane_shares=lanes),
        BlockManager(num_blocks, BS),
        512,
        Clock(),
    )
    runner = FakeModelRunner(max_num_seqs=max_num_seqs, max_model_len=512, block_size=BS, vocab_size=VOCAB)
    return sched, runner


def req(rid, priority, max_tokens=40, n_prompt=6, start=10):
    return Request(
        rid,
        list(range(start, start + n_prompt)),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        priority=priority,
        preemptible=priority == BATCH,
    )


def expected_output(prompt, max_tokens):
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(fake_next_token(toks[-1], len(toks), VOCAB))
    return toks[len(prompt) :]


def step(sched, runner, n=1):
    for _ in range(n):
        sched.clock.now += 0.05  # a decode step's time
        so = sched.schedule()
        sched.update_from_output(runner.execute(so))


def running_by_lane(sched):
    out = {INTERACTIVE: 0, BATCH: 0}
    for r in sched.running:
        out[r.priority] += 1
    return out


def test_water_fill_shares_by_weight_with_floors_and_lending():
    w, f = {0: 8.0, 2: 1.0}, {0: 0.05, 2: 0.1}
    # Both lanes want more than there is: by weight, the batch lane above its floor.
    assert water_fill({0: 100, 2: 100}, w, f, 90) == {0: 80, 2: 10}
    # Floors: a light lane keeps its floor even against a heavy one.
    assert water_fill({0: 100, 2: 100}, {0: 100.0, 2: 1.0}, f, 100)[2] == 10
    # Lending: what a lane does not want goes to the other.
    assert water_fill({0: 3, 2: 100}, w, f, 50) == {0: 3, 2: 47}
    # A lane without demand gets nothing; the other gets everything it wants.
    assert water_fill({0: 0, 2: 30}, w, f, 16) == {0: 0, 2: 16}
    assert sum(water_fill({0: 7, 2: 9}, w, f, 16).values()) == 16


def test_without_interactive_demand_batch_takes_every_slot():
    sched, runner = make()
    for i in range(20):
        sched.add_request(req(f"b{i}", BATCH))
    step(sched, runner, 3)
    assert running_by_lane(sched)[BATCH] == 16  # lent: nobody else wants the slots


def test_shares_hold_slots_for_the_router_waiting_interactive_lane():
    sched, runner = make()
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=12),))
    for i in range(20):
        sched.add_request(req(f"b{i}", BATCH))
    step(sched, runner, 3)
    assert running_by_lane(sched)[BATCH] == 4  # 12 of 16 slots kept for the interactive lane, the rest lent
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=30),))
    for r in list(sched.running)[2:]:  # (they finish or leave in time; here, a fresh start)
        sched.abort(r.request_id)
    step(sched, runner, 3)
    # demand 30 + 18 over 16 slots: by weight the batch lane would get 1.8, so it gets its floor (2)
    assert running_by_lane(sched)[BATCH] == 2
    sched.lane_shares.set_pressure("r", ())  # the interactive queue drained: the batch lane borrows again
    step(sched, runner, 3)
    assert running_by_lane(sched)[BATCH] == 16


def test_pace_preempts_newest_batch_first_down_to_the_floor_then_resumes_exactly():
    sched, runner = make(max_num_seqs=32)
    batch = [req(f"b{i}", BATCH, max_tokens=30) for i in range(10)]
    for r in batch:
        sched.add_request(r)
    inter = [req(f"i{i}", INTERACTIVE, max_tokens=30, start=100) for i in range(2)]
    for r in inter:
        sched.add_request(r)
    step(sched, runner, 3)
    assert running_by_lane(sched) == {INTERACTIVE: 2, BATCH: 10}
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=4, pace_short=True),))
    victims = []
    for _ in range(12):
        before = {r.request_id for r in sched.running}
        step(sched, runner)
        victims += sorted(before - {r.request_id for r in sched.running} - {r.request_id for r in inter})
    # one a step, newest first, down to the floor: a share of the sequences the step runs, not of the
    # slots wanted (ceil(0.1 x 12) = 2 at first, 1 once 4 run); interactive untouched
    assert victims == [f"b{i}" for i in range(9, 0, -1)]
    assert running_by_lane(sched) == {INTERACTIVE: 2, BATCH: 1}
    assert all(r.state is not RequestState.PREEMPTED for r in inter)
    assert sched.lane_shares.pace_preemptions == {BATCH: 9}
    sched.lane_shares.set_pressure("r", ())  # the pace is back: the victims resume by recompute,
    sizes = []  # the batch lane regrowing one sequence every REGROW_S (10 steps here)
    for _ in range(500):
        if not sched.has_unfinished():
            break
        step(sched, runner)
        sizes.append(running_by_lane(sched)[BATCH])
    assert sizes[:14] == [1] * 9 + [2] * 5
    assert max(sizes) == 9  # the interactive lane done, nothing is shared: every victim is back at once
    for r in batch + inter:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 30), r.request_id
    assert set(sched.lane_shares.preempted_seconds) == {BATCH}
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_the_held_lane_regrows_only_once_the_more_important_lane_has_no_demand_left():
    """Back within its pace, the interactive lane still has requests waiting or refused in the router:
    the batch lane stays at its floor (regrown, it would set the pace again and be preempted again,
    each round trip recomputing what its victims had done); it regrows once that demand is gone."""
    sched, runner = make(max_num_seqs=32)
    for i in range(6):
        sched.add_request(req(f"b{i}", BATCH, max_tokens=200))
    for i in range(3):
        sched.add_request(req(f"i{i}", INTERACTIVE, max_tokens=200, start=100))
    step(sched, runner, 2)
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=3, pace_short=True),))
    step(sched, runner, 8)
    assert running_by_lane(sched) == {INTERACTIVE: 3, BATCH: 1}
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=2),))  # pace back, demand left
    step(sched, runner, 40)  # 2 s: four REGROW_S
    assert running_by_lane(sched) == {INTERACTIVE: 3, BATCH: 1}
    sched.lane_shares.set_pressure("r", ())
    step(sched, runner, 11)
    assert running_by_lane(sched)[BATCH] == 2  # one more every REGROW_S (10 steps here)


def test_a_waiting_interactive_request_takes_a_slot_from_batch_above_its_share():
    sched, runner = make(max_num_seqs=8)
    for i in range(8):
        sched.add_request(req(f"b{i}", BATCH, max_tokens=60))
    step(sched, runner, 2)
    assert running_by_lane(sched)[BATCH] == 8
    sched.add_request(req("i0", INTERACTIVE, start=100))
    step(sched, runner, 3)
    assert running_by_lane(sched) == {INTERACTIVE: 1, BATCH: 7}
    assert sched.requests["b7"].state is RequestState.PREEMPTED  # the newest


def test_pressure_from_a_silent_router_expires():
    sched, _ = make()
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=5, pace_short=True),))
    assert sched.lane_shares.router_demand() == ({INTERACTIVE: 5}, INTERACTIVE)
    sched.clock.now = 10.0
    assert sched.lane_shares.router_demand() == ({}, None)


def test_off_by_default():
    sched = Scheduler(SchedulerConfig(), BlockManager(16, BS), 64)
    assert sched.lane_shares is None


def test_a_step_computing_a_more_important_prompt_gives_the_less_important_lanes_their_floor():
    """A step's prompt tokens (256 here, no decodes yet) go to the most important lane computing a
    prompt; the less important lanes keep their floor of the step (10% for batch), lent nothing even
    when that prompt is short: the step's length is its time to first token. Alone, a lane takes
    the whole step."""

    sched, runner = make()
    b = req("b", BATCH, max_tokens=4, n_prompt=500)
    sched.add_request(b)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 256}  # one lane: no sharing
    sched.update_from_output(runner.execute(so))
    i = req("i", INTERACTIVE, max_tokens=4, n_prompt=400, start=100)
    sched.add_request(i)
    so = sched.schedule()
    # 8:1 of 256 gives the interactive prompt 227 (+ the rounding's spare token); the batch chunk its floor
    assert so.num_scheduled_tokens == {"b": 25, "i": 228}
    sched.update_from_output(runner.execute(so))
    step(sched, runner, 40)
    assert not sched.has_unfinished()  # both prompts computed in pieces: the same tokens as alone
    for r in (b, i):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 4), r.request_id

    # A short interactive prompt: the batch chunk is not lent the rest of the step, and has the next.
    sched, runner = make()
    b = req("b", BATCH, max_tokens=4, n_prompt=500)
    sched.add_request(b)
    sched.update_from_output(runner.execute(sched.schedule()))
    sched.add_request(req("i", INTERACTIVE, max_tokens=4, n_prompt=40, start=100))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 25, "i": 40}
    sched.update_from_output(runner.execute(so))
    assert sched.schedule().num_scheduled_tokens["b"] == 500 - 256 - 25  # its whole rest

    # A waiting batch prompt is held the same way (a prefill worker's queue: prompts only).
    sched, runner = make()
    sched.add_request(req("i", INTERACTIVE, max_tokens=4, n_prompt=60, start=100))
    sched.add_request(req("b", BATCH, max_tokens=4, n_prompt=300))
    assert sched.schedule().num_scheduled_tokens == {"i": 60, "b": 25}

    # Floors: against a far heavier lane, the batch chunk keeps its 10% of the step.
    heavy = (LaneShareConfig(INTERACTIVE, weight=1000.0, floor=0.05), LANES[1])
    sched, runner = make(lanes=heavy)
    sched.add_request(req("b", BATCH, max_tokens=4, n_prompt=500))
    sched.update_from_output(runner.execute(sched.schedule()))
    sched.add_request(req("i", INTERACTIVE, max_tokens=4, n_prompt=400, start=100))
    assert sched.schedule().num_scheduled_tokens == {"b": 25, "i": 231}


def test_a_lane_with_demand_in_the_router_keeps_its_share_of_the_prompt_tokens():
    """Interactive requests waiting (or refused) in the router, none here yet: the batch prompt keeps to
    its share of the step (8:1 of 256, at least its floor), so the interactive prompts, when they come,
    wait for a short step; without that demand it is lent the whole step again."""
    sched, runner = make()
    sched.add_request(req("d", BATCH, max_tokens=40, start=300))  # a batch stream decoding beside it
    step(sched, runner)
    b = req("b", BATCH, max_tokens=4, n_prompt=480)
    sched.add_request(b)
    step(sched, runner)
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=2),))
    so = sched.schedule()
    assert so.num_scheduled_tokens["b"] == 28  # floor(256 x max(0.1, 1/9))
    assert so.num_scheduled_tokens["d"] == 1  # decodes are not prompt work: untouched
    sched.update_from_output(runner.execute(so))
    sched.lane_shares.set_pressure("r", ())
    assert sched.schedule().num_scheduled_tokens["b"] == 480 - 255 - 28  # its whole rest: lent the step again


def test_the_waiting_queue_and_the_batch_keep_their_counts_by_lane():
    """The lane shares read the counts each step without a pass over the queue or the batch."""
    sched, runner = make(max_num_seqs=4)
    reqs = [req(f"b{i}", BATCH, n_prompt=6, start=20 * i) for i in range(3)] + [
        req(f"i{i}", INTERACTIVE, n_prompt=9, start=100 + 20 * i) for i in range(3)
    ]
    for r in reqs:
        sched.add_request(r)
    assert sched.waiting.count_by_priority() == {BATCH: 3, INTERACTIVE: 3}
    assert sched.waiting.tokens_by_priority() == {BATCH: 18, INTERACTIVE: 27}
    sched.abort("b0")
    assert sched.waiting.tokens_by_priority() == {BATCH: 12, INTERACTIVE: 27}
    step(sched, runner)
    assert sched.batch.by_priority == running_by_lane(sched) == {INTERACTIVE: 3, BATCH: 1}
    assert sched.waiting.count_by_priority() == {BATCH: 1}
    assert sched.waiting.tokens_by_priority() == {BATCH: 6}
    sched.abort("i1")
    step(sched, runner, 60)
    assert not sched.has_unfinished() and not sched.waiting.count_by_priority()
    assert not any(sched.batch.by_priority.values()) and not sched.waiting.tokens_by_priority()


def test_time_preempted_is_in_the_ttft_breakdown_and_the_final_output():
    """Preempted before its first token: a ``preempted`` stage in the TTFT breakdown (out of
    ``prefill_compute``); preempted at all: each time out on the final output (router/tracing.py lays
    them out as spans)."""
    sched, runner = make()
    proc = OutputProcessor(sched, None)
    a = req("a", BATCH, max_tokens=6, n_prompt=6, start=300)
    b = req("b", BATCH, max_tokens=6, n_prompt=6, start=400)
    c = req("c", BATCH, max_tokens=3, n_prompt=400)  # its prompt takes two steps
    outs: dict[str, list] = {"a": [], "b": [], "c": []}
    for r in (a, b, c):
        sched.add_request(r)
        proc.add(r)

    def run(n):
        for _ in range(n):
            sched.clock.now += 0.05
            so = sched.schedule()
            for o in proc.process(sched.update_from_output(runner.execute(so))):
                outs[o.request_id].append(o)

    run(1)
    assert len(b.output_token_ids) == 1 and not c.output_token_ids
    # Short of pace: newest first, c (mid-prompt) then b (after its first token), down to the floor.
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, waiting=4, pace_short=True),))
    run(2)
    assert b.state is c.state is RequestState.PREEMPTED
    sched.lane_shares.set_pressure("r", ())
    run(80)
    assert not sched.has_unfinished()
    for r, n in ((a, 6), (b, 6), (c, 3)):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, n), r.request_id
    assert outs["a"][-1].preempted is None
    for r in (b, c):
        final = outs[r.request_id][-1]
        assert final.finished and final.preempted is not None and len(final.preempted) == 1
        since, until = final.preempted[0]
        assert since < until <= 0  # relative to the final output
    assert "preempted" not in (outs["b"][0].ttft_breakdown or {})
    bd = outs["c"][0].ttft_breakdown
    assert bd is not None and bd["preempted"] > 0
    spans = c.preempted_spans or []
    assert bd["preempted"] == spans[0][1] - spans[0][0]


def test_the_counters_carry_the_batch_by_lane_for_what_admission_may_free():
    sched, runner = make()
    for i in range(5):
        sched.add_request(req(f"b{i}", BATCH))
    sched.add_request(req("i0", INTERACTIVE, start=100))
    step(sched, runner, 3)  # (the batch requests share their prompt: the first computes it for the rest)
    assert sched.lane_shares.counters().running == {INTERACTIVE: 1, BATCH: 5}
    sched.abort("b0")
    step(sched, runner)
    assert sched.lane_shares.counters().running == {INTERACTIVE: 1, BATCH: 4}


def test_while_a_lane_is_short_of_pace_less_important_prompt_work_keeps_to_its_floor():
    sched, runner = make()
    sched.add_request(req("i0", INTERACTIVE, start=100))
    step(sched, runner)
    b0 = req("b0", BATCH, n_prompt=400)
    sched.add_request(b0)
    step(sched, runner)
    assert b0.num_computed_tokens == 255  # the budget the decode left: nobody else wants prompt tokens
    sched.lane_shares.set_pressure("r", (LaneDemand(INTERACTIVE, pace_short=True),))
    step(sched, runner)
    assert b0.num_computed_tokens == 255 + 25  # its floor: 0.1 of the 255 tokens the decode left
    sched.lane_shares.set_pressure("r", ())
    step(sched, runner)
    assert b0.num_computed_tokens == 400  # the pace is back: it is lent the step again
