"""Scheduler behaviour with the fake runner (pure Python, milliseconds)."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.fake_runner import FakeModelRunner, fake_next_token
from engine.request import FinishReason, Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput
from engine.scheduler_policies import WaitingQueue

BS = 4
VOCAB = 1000


def make(num_blocks=64, max_model_len=256, **cfg):
    sched = Scheduler(SchedulerConfig(**cfg), BlockManager(num_blocks, BS), max_model_len)
    runner = FakeModelRunner(
        max_num_seqs=sched.config.max_num_seqs, max_model_len=max_model_len, block_size=BS, vocab_size=VOCAB
    )
    return sched, runner


def req(rid, n_prompt, max_tokens, priority=0, start=10):
    return Request(
        rid,
        list(range(start, start + n_prompt)),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        priority=priority,
    )


def expected_output(prompt, max_tokens):
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(fake_next_token(toks[-1], len(toks), VOCAB))
    return toks[len(prompt) :]


def run(sched, runner, max_steps=10_000):
    steps: list[SchedulerOutput] = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return steps
        so = sched.schedule()
        steps.append(so)
        sched.update_from_output(runner.execute(so))
    raise AssertionError("did not finish")


def test_outputs_and_no_leak():
    sched, runner = make(max_num_batched_tokens=16)
    reqs = [req(f"r{i}", 5 + 3 * i, 6 + i) for i in range(6)]
    for r in reqs:
        sched.add_request(r)
    run(sched, runner)
    for r in reqs:
        assert r.state is RequestState.FINISHED and r.finish_reason is FinishReason.LENGTH
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    assert not sched.requests and not sched.running


def test_token_budget_chunked_prefill_and_decode_first():
    sched, runner = make(max_num_batched_tokens=8)
    a, b = req("a", 3, 5), req("b", 20, 2)
    sched.add_request(a)
    so = sched.schedule()
    sched.update_from_output(runner.execute(so))
    sched.add_request(b)
    so = sched.schedule()
    assert list(so.num_scheduled_tokens.items()) == [("a", 1), ("b", 7)]  # decode first, prefill chunk
    sched.update_from_output(runner.execute(so))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 7}
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    assert b.output_token_ids == expected_output(b.prompt_token_ids, 2)


def test_max_num_seqs():
    sched, _runner = make(max_num_seqs=2)
    for i in range(4):
        sched.add_request(req(f"r{i}", 4, 3))
    so = sched.schedule()
    assert len(so.num_scheduled_tokens) == 2 and sched.num_waiting == 2


def test_priority_orders_admission():
    sched, _runner = make(max_num_seqs=1)
    sched.add_request(req("low", 4, 1, priority=5))
    sched.add_request(req("high", 4, 1, priority=0))
    so = sched.schedule()
    assert list(so.num_scheduled_tokens) == ["high"]


def test_preemption_picks_lowest_priority_newest_and_recomputes():
    # 10 blocks of 4 tokens; three requests that cannot all grow to completion at once.
    sched, runner = make(num_blocks=10, max_num_batched_tokens=64, admission_watermark=0.0)
    a = req("a", 8, 8, priority=0, start=10)
    b = req("b", 8, 8, priority=1, start=40)
    c = req("c", 8, 8, priority=1, start=70)
    for r in (a, b, c):
        sched.add_request(r)
    steps = run(sched, runner)
    assert sum(s.num_preempted for s in steps) >= 1
    assert a.num_preemptions == 0  # the most important request is never the victim
    assert c.num_preemptions >= 1  # newest of the least important goes first
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 8)
    assert sched.block_manager.num_free_blocks == 10


def test_abort_in_every_state_frees_blocks():
    sched, runner = make(max_num_batched_tokens=4)
    waiting, prefilling, decoding = req("w", 4, 5), req("p", 12, 5), req("d", 2, 50)
    sched.add_request(decoding)
    sched.update_from_output(runner.execute(sched.schedule()))
    sched.add_request(prefilling)
    sched.update_from_output(runner.execute(sched.schedule()))
    sched.add_request(waiting)
    assert decoding.state is RequestState.DECODING and prefilling.state is RequestState.PREFILLING
    for r in (waiting, prefilling, decoding):
        assert sched.abort(r.request_id) is r and r.state is RequestState.ABORTED
    assert sched.abort("unknown") is None
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    assert not sched.has_unfinished()
    so = sched.schedule()
    assert {"p", "d"} <= so.finished_request_ids  # the runner is told to drop their rows


@pytest.mark.parametrize("priority", [0, -1])
def test_an_id_reused_after_its_queued_request_was_aborted_names_only_the_new_request(priority):
    sched, runner = make()
    old = req("w", 4, 3)
    sched.add_request(old)
    assert sched.abort("w") is old
    new = req("w", 6, 4, priority=priority, start=50)
    sched.add_request(new)  # the aborted entry is still in the queue (removal is lazy)
    assert sched.abort("w") is new and sched.num_waiting == 0
    again = req("w", 5, 2, start=80)
    sched.add_request(again)
    other = req("x", 4, 2, start=90)
    sched.add_request(other)
    run(sched, runner)  # was: IllegalTransitionError (ABORTED -> PREFILLING): a stale entry was served
    assert old.state is RequestState.ABORTED and new.state is RequestState.ABORTED and not new.output_token_ids
    for r in (again, other):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_aborted_queued_requests_do_not_stay_in_the_queue():
    """Removal is lazy, and an entry that never reached the head stayed for good: 5,000 queued
    prompts aborted behind a long request kept ~150 MB. Removed entries go once they are half the
    heap, and all at once when no live request is left."""
    q = WaitingQueue()
    important: Request = req("a", 4, 2, priority=0)
    queued = [req(f"b{i}", 4, 2, priority=1, start=20 + i) for i in range(100)]
    for seq, r in enumerate([important, *queued]):
        r.arrival_seq = seq  # (as the scheduler numbers registrations)
        q.push(r)
    for r in queued[:-1]:
        q.remove(r)
    assert len(q) == 2 and len(q._heap) <= 4  # (101 entries before)
    assert q.peek() is important and list(q) == [important, queued[-1]]
    assert set(q.more_important_than(1)) == {important} and set(q.more_important_than(2)) == {important, queued[-1]}
    q.remove(important)
    q.remove(queued[-1])
    assert len(q) == 0 and q._heap == [] and q.peek() is None
    # The last live request admitted (popped) with removed ones still behind it: those go too
    late = req("c", 4, 2, priority=2)
    for seq, r in enumerate([important, queued[0], late], start=200):
        r.arrival_seq = seq
        q.push(r)
    q.remove(late)  # 1 removed of 3 entries: no compaction
    assert q.pop() is important and len(q._heap) == 2
    assert q.pop() is queued[0] and len(q) == 0 and q._heap == [] and q._removed == set()


def test_a_decode_that_needs_no_block_is_not_skipped_in_the_step_of_a_preemption():
    sched, runner = make(num_blocks=4, admission_watermark=0.0)
    a = req("a", 2, 6, priority=1, start=5)
    sched.add_request(a)
    sched.update_from_output(runner.execute(sched.schedule()))
    b, c = req("b", 3, 5, start=8), req("c", 2, 5, start=10)
    sched.add_request(b)
    sched.add_request(c)
    steps = [sched.schedule()]
    sched.update_from_output(runner.execute(steps[-1]))
    first_token_time = a.first_token_time
    while not steps[-1].num_preempted:
        steps.append(sched.schedule())
        sched.update_from_output(runner.execute(steps[-1]))
    # a (least important) was preempted for b's block; c's decode fits its block and must still run
    assert a.num_preemptions == 1 and set(steps[-1].request_ids) == {"b", "c"}
    assert sched.num_preemptions == 1 and sched.preempted_tokens > 0  # (the workers report both)
    run(sched, runner)
    # Its recompute after the preemption neither moves its first token's time (TTFT) nor turns the
    # blocks it had computed itself into a prefix-cache hit at its first admission.
    assert a.first_token_time == first_token_time and a.num_cached_tokens == 0
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)


def test_a_static_batch_releases_a_padding_row_rather_than_preempt_anyone():
    # 6 blocks of 4: b grows past what is left while a's finished row (padding) still holds blocks.
    sched, runner = make(num_blocks=6, policy="static", admission_watermark=0.0)
    b, a = req("b", 4, 12, start=10), req("a", 4, 1, start=5)
    sched.add_request(b)
    sched.add_request(a)
    run(sched, runner)  # was: IllegalTransitionError (FINISHED -> PREEMPTED) on the padding row
    assert b.num_preemptions == 0 and a.finish_reason is FinishReason.LENGTH
    for r in (a, b):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == 6 and not sched.requests


def test_aborting_a_static_batch_padding_row_reports_nothing_more():
    sched, runner = make(policy="static")
    b, a = req("b", 3, 8, start=10), req("a", 2, 1, start=5)
    sched.add_request(b)
    sched.add_request(a)
    for _ in range(2):
        sched.update_from_output(runner.execute(sched.schedule()))
    assert a.state is RequestState.FINISHED and a.is_padding
    assert sched.abort("a") is None  # it ended (length) already: no second, contradictory final output
    run(sched, runner)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_request_needing_more_blocks_than_the_cache_is_rejected():
    sched, _ = make(num_blocks=4)
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add_request(req("big", 10, 10))


def test_static_policy_runs_batches_to_their_longest_request():
    sched, runner = make(policy="static", static_batch_size=2)
    a, b, c = req("a", 4, 2), req("b", 4, 6), req("c", 4, 2)
    for r in (a, b, c):
        sched.add_request(r)
    steps = run(sched, runner)
    first_c = next(i for i, s in enumerate(steps) if "c" in s.num_scheduled_tokens)
    # c starts only after b, the longest of the first batch, has finished all its tokens,
    # and a's row kept computing (padding) until then.
    assert first_c == 6
    assert sum("a" in s.num_scheduled_tokens for s in steps) == 6
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_a_static_batch_is_its_full_size_even_when_the_budget_starts_its_prompts_over_several_steps():
    sched, runner = make(policy="static", static_batch_size=2, max_num_batched_tokens=4)
    a, b, c = req("a", 4, 3), req("b", 4, 8), req("c", 4, 2)
    for r in (a, b, c):
        sched.add_request(r)
    steps = run(sched, runner)
    first = {r: next(i for i, s in enumerate(steps) if r in s.num_scheduled_tokens) for r in "abc"}
    assert first["a"] == 0 and first["b"] == 1  # the budget took one prompt a step: b still joins a's batch
    last_b = max(i for i, s in enumerate(steps) if "b" in s.num_scheduled_tokens)
    assert first["c"] == last_b + 1  # c waits for the batch's longest request
    assert all(len(s.num_scheduled_tokens) <= 2 for s in steps)
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_prefix_cache_hit_skips_computed_tokens():
    sched, runner = make()
    a = req("a", 12, 2)
    sched.add_request(a)
    run(sched, runner)
    b = req("b", 12, 2)
    sched.add_request(b)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 4} and b.num_cached_tokens == 8
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    assert b.output_token_ids == a.output_token_ids


def test_a_prefill_token_budget_caps_the_prompt_tokens_of_a_step_but_never_the_decodes():
    """A disaggregated decode worker's local prefills ride in its decode steps: the cap keeps them short."""
    sched, runner = make(max_num_batched_tokens=64, prefill_token_budget=8)
    d0, d1 = req("d0", 3, 12), req("d1", 3, 12, start=20)
    sched.add_request(d0)
    sched.add_request(d1)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"d0": 3, "d1": 3}
    sched.update_from_output(runner.execute(so))
    p0, p1 = req("p0", 20, 2, start=40), req("p1", 20, 2, start=70)
    sched.add_request(p0)
    sched.add_request(p1)
    seen = []
    for _ in range(4):
        so = sched.schedule()
        seen.append(so.num_scheduled_tokens)
        sched.update_from_output(runner.execute(so))
    assert seen == [  # decodes first and every step; prompt chunks share 8 tokens, a new one admitted in the rest
        {"d0": 1, "d1": 1, "p0": 8},
        {"d0": 1, "d1": 1, "p0": 8},
        {"d0": 1, "d1": 1, "p0": 4, "p1": 4},
        {"d0": 1, "d1": 1, "p0": 1, "p1": 8},
    ]
    run(sched, runner)
    for r in (d0, d1, p0, p1):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_without_a_prefill_token_budget_prompts_take_the_whole_step_budget():
    sched, _runner = make(max_num_batched_tokens=16)
    sched.add_request(req("a", 40, 2))
    assert sched.schedule().num_scheduled_tokens == {"a": 16}


@pytest.mark.parametrize("bad", [0, -1])
def test_a_prefill_token_budget_must_be_positive(bad):
    with pytest.raises(ValueError, match="prefill_token_budget"):
        SchedulerConfig(prefill_token_budget=bad)


def _shared(rid, prefix_len, suffix_start, suffix_len=3, max_tokens=2):
    """A prompt of ``prefix_len`` common tokens, then ``suffix_len`` of its own."""
    tokens = list(range(10, 10 + prefix_len)) + list(range(suffix_start, suffix_start + suffix_len))
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


@pytest.mark.parametrize("defer", [True, False])
def test_a_burst_sharing_a_prefix_computes_it_once(defer):
    """Three prompts with a common 32-token prefix arrive together, and one unrelated prompt behind
    them. With deferral the first computes the prefix (in two 16-token chunks) while the other two
    wait for it and then hit it; the unrelated one is not held up. Without, all three compute it."""
    sched, runner = make(max_num_batched_tokens=24, defer_for_shared_prefix=defer)
    a, b, c = (_shared(x, 32, 500 + 10 * i) for i, x in enumerate("abc"))
    other = req("other", 6, 2, start=900)
    for r in (a, b, c, other):
        sched.add_request(r)
    steps = run(sched, runner)
    first = steps[0].num_scheduled_tokens
    computed = sched.prompt_tokens_computed
    if defer:
        assert first == {"a": 24}  # a takes the whole budget
        assert (
            "other" in steps[1].num_scheduled_tokens
        )  # b and c pass over (a's blocks 6-7 in flight); it does not wait
        assert b.num_cached_tokens == c.num_cached_tokens == 32
        assert computed == 35 + 3 + 3 + 6
    else:  # b and c start while a's second chunk is in flight, and compute it again
        assert b.num_cached_tokens < 32 and computed > 35 + 3 + 3 + 6
    for r in (a, b, c, other):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_a_waiting_request_is_not_held_for_its_last_prompt_block():
    """The block holding a prompt's last token is always recomputed, so waiting for it gains nothing:
    only the blocks before it are waited for."""
    sched, runner = make(max_num_batched_tokens=64)
    x, y = req("x", 8, 2), req("y", 8, 2)  # identical 8-token prompts: 2 blocks, the second holds the last token
    sched.add_request(x), sched.add_request(y)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"x": 8}  # y waits for x's first block, which it can hit
    sched.update_from_output(runner.execute(so))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"x": 1, "y": 4} and y.num_cached_tokens == 4  # its second block: computed
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    assert y.output_token_ids == x.output_token_ids == expected_output(x.prompt_token_ids, 2)


@pytest.mark.parametrize("how", ["abort", "padding released"])
def test_a_static_batch_takes_no_newcomer_into_a_place_freed_mid_batch(how: str) -> None:
    """A member's place freed before the batch's longest request ends (an abort; a finished row's
    padding released under KV pressure) went to the next waiting request."""
    bs = 4
    sched = Scheduler(
        SchedulerConfig(policy="static", static_batch_size=2, admission_watermark=0.0),
        BlockManager(6 if how == "padding released" else 64, bs),
        64,
    )
    runner = FakeModelRunner(max_num_seqs=256, max_model_len=64, block_size=bs, vocab_size=1000)

    def req(rid: str, start: int, max_tokens: int) -> Request:
        return Request(
            rid, list(range(start, start + 4)), SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        )

    longest, short, newcomer = req("a", 10, 12), req("b", 5, 1 if how == "padding released" else 8), req("c", 50, 2)
    for r in (longest, short, newcomer):
        sched.add_request(r)
    for step in range(40):
        if not sched.has_unfinished():
            break
        if how == "abort" and step == 2:
            assert sched.abort("b") is short
        out = sched.schedule()
        assert "c" not in out.num_scheduled_tokens or longest.is_finished, f"step {step}: c joined a's batch"
        sched.update_from_output(runner.execute(out))
    assert longest.is_finished and newcomer.is_finished and len(newcomer.output_token_ids) == 2


def test_a_preemptible_request_is_the_victim_before_any_other_whatever_its_priority():
    """Lanes' ``preemptible`` (documented, validated) was read by nothing: a non-preemptible lane's
    request was preempted by priority like any other. Now preemptible ones go first."""
    from engine.scheduler_policies import PreemptionPolicy

    keep = req("keep", 2, 4, priority=5)  # least important, but its lane is not preemptible
    keep.preemptible = False
    fair = req("fair", 2, 4, priority=0)  # most important, preemptible
    assert PreemptionPolicy().pick_victim([keep, fair]) is fair
    other = req("other", 2, 4, priority=1)
    other.preemptible = False
    assert PreemptionPolicy().pick_victim([keep, other]) is keep  # none preemptible: by priority, as before


def test_a_decode_scheduled_earlier_in_the_step_can_be_the_victim():
    # "low" decodes first in the running order and is scheduled; "high" then needs a block the pool
    # no longer has, and "low" (less important) is preempted after all: it leaves the step, its token
    # is taken back (the preemption counts the tokens it had computed before the step), and the block
    # it was about to fill is not entered in the prefix cache (its KV will never be written).
    sched, runner = make(num_blocks=3, admission_watermark=0.0)
    low = req("low", 2, 4, priority=1, start=10)
    high, mid = req("high", 4, 4, start=50), req("mid", 2, 4, start=90)
    sched.add_request(low)
    sched.update_from_output(runner.execute(sched.schedule()))
    sched.add_request(high)
    sched.add_request(mid)
    sched.update_from_output(runner.execute(sched.schedule()))
    assert [r.request_id for r in sched.running] == ["low", "high", "mid"]
    assert (low.num_computed_tokens, high.num_computed_tokens) == (3, 4) and sched.block_manager.num_free_blocks == 0
    cached_before = dict(sched.block_manager.pool.cached)
    so = sched.schedule()
    assert so.request_ids == ["high", "mid"] and so.counts == [1, 1] and so.num_preempted == 1
    assert low.state is RequestState.PREEMPTED and low.num_computed_tokens == 0 and sched.preempted_tokens == 3
    assert sched.block_manager.pool.cached == cached_before  # high's prompt block only
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    for r in (low, high, mid):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 4)
    assert sched.block_manager.num_free_blocks == 3


def test_a_decode_that_finds_its_block_in_a_short_pool_leaves_the_rest_of_the_budget_to_prompt_chunks():
    # With fewer free blocks than running requests, a decode crossing into a block goes through the
    # general block search (which may preempt); it takes exactly its one token off the budget.
    sched, runner = make(num_blocks=6, max_num_batched_tokens=4, admission_watermark=0.0)
    b, a, c = req("b", 4, 8, start=10), req("a", 3, 8, start=30), req("c", 20, 2, start=50)
    for r in (b, a, c):
        sched.add_request(r)
        sched.update_from_output(runner.execute(sched.schedule()))
    assert [(r.num_computed_tokens, len(r.block_ids)) for r in (b, a, c)] == [(6, 2), (4, 1), (2, 1)]
    assert sched.block_manager.num_free_blocks == 2  # fewer than the 3 running requests
    so = sched.schedule()
    # b decodes in its block, a takes a new block (the pool has one), and c's chunk gets the 2 tokens left
    assert so.request_ids == ["b", "a", "c"] and so.counts == [1, 1, 2] and not so.num_preempted
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    for r in (a, b, c):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.block_manager.num_free_blocks == 6


PURE_PYTHON_MODULES = [
    "engine.scheduler",
    "engine.scheduler_lifecycle",
    "engine.scheduler_admission",
    "engine.scheduler_disagg",
    "engine.scheduler_spec",
    "engine.scheduler_step",
    "engine.scheduler_policies",
    "engine.scheduler_output",
    "engine.spec_decode",
    "engine.block_manager",
    "engine.block_hash",
    "engine.request",
    "engine.sampling_params",
    "engine.kv_events",
    "engine.config",
    "engine.outputs",
]


def test_the_scheduler_and_its_parts_import_no_torch():
    """The router imports these; DESIGN keeps them pure Python (a torch import would cost the router
    seconds and hundreds of MB)."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        f"for m in {PURE_PYTHON_MODULES!r}: __import__(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' and sys.modules[m] is not None))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=root, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
