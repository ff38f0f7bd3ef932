"""The decode role's scheduler paths (engine/scheduler_disagg.py) with the fake runner: a prompt
reserved for KV from a prefill worker, then prefilled here after all."""

from __future__ import annotations

import pytest

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.errors import InvalidParameterError
from engine.fake_runner import FakeModelRunner
from engine.request import Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

BS = 4
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True, detokenize=False)


def _run(sched: Scheduler, runner: FakeModelRunner, max_steps: int = 50) -> None:
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return
        out = sched.schedule()
        assert all(n > 0 for n in out.num_scheduled_tokens.values()), out.num_scheduled_tokens
        sched.update_from_output(runner.execute(out))
    raise AssertionError("requests left unfinished")


@pytest.mark.parametrize("with_batch_mate", [False, True])
def test_a_local_prefill_after_a_whole_prompt_cache_hit_computes_its_last_token(with_batch_mate: bool) -> None:
    """reserve() may take a hit over the whole block-aligned prompt (the first token comes from the
    prefill side); the fallback then scheduled it with 0 tokens: alone it never finished, beside
    another request its logits row was that request's (the real runner raised IndexError)."""
    sched = Scheduler(SchedulerConfig(), BlockManager(32, BS), 64)
    runner = FakeModelRunner(max_num_seqs=256, max_model_len=64, block_size=BS, vocab_size=1000)
    prompt = list(range(10, 18))  # two full blocks
    first = Request("a", prompt, PARAMS)
    sched.add_request(first)
    _run(sched, runner)

    again = Request("b", prompt, PARAMS)
    assert sched.reserve(again) and again.num_cached_tokens == len(prompt)  # all of it cached here
    assert sched.fallback_to_local_prefill("b") is again  # the prefill worker died
    if with_batch_mate:
        sched.add_request(Request("c", list(range(100, 105)), PARAMS))
    _run(sched, runner)
    assert again.state is RequestState.FINISHED and again.output_token_ids == first.output_token_ids
    assert sched.block_manager.num_free_blocks == 32  # (cached blocks with no holder count as free)


def test_reserve_refuses_a_request_the_whole_cache_could_not_hold() -> None:
    """add_request refused it; reserve() took it, and it decoded until it preempted itself for good."""
    sched = Scheduler(SchedulerConfig(), BlockManager(4, BS), 64)
    big = Request("r", list(range(10, 19)), SamplingParams(max_tokens=14, ignore_eos=True, detokenize=False))
    with pytest.raises(InvalidParameterError, match="needs 6 KV blocks but the cache has only 4"):
        sched.reserve(big)
    with pytest.raises(InvalidParameterError):
        sched.add_request(Request("r2", list(range(10, 19)), big.sampling_params))
    assert sched.block_manager.num_free_blocks == 4 and not sched.has_unfinished()


def test_reserve_leaves_the_blocks_that_more_important_waiting_requests_need() -> None:
    """A reservation took the free blocks while a more important request waited for them here (a
    preempted interactive stream behind a batch prompt's reservation). It is refused now, and only
    while such a request waits; one of the same or a lower priority does not block it."""
    sched = Scheduler(SchedulerConfig(), BlockManager(10, BS), 64)
    runner = FakeModelRunner(max_num_seqs=256, max_model_len=64, block_size=BS, vocab_size=1000)
    running = Request("run", list(range(10, 26)), SamplingParams(max_tokens=20, ignore_eos=True, detokenize=False))
    sched.add_request(running)
    sched.update_from_output(runner.execute(sched.schedule()))
    free = sched.block_manager.num_free_blocks
    urgent = Request("urgent", list(range(30, 46)), PARAMS, priority=0)  # needs 4 blocks
    sched.add_request(urgent)  # waiting (admitted at the next step)
    batch = Request("batch", list(range(50, 62)), PARAMS, priority=5)  # 3 blocks: fits alone, not beside urgent
    assert free < 4 + 3 and free >= 3
    assert not sched.reserve(batch) and sched.block_manager.num_free_blocks == free
    peer = Request("peer", list(range(70, 82)), PARAMS, priority=0)  # as important as urgent: not held back
    assert sched.reserve(peer) and peer.state is RequestState.RESERVED
    sched.abort("peer")
    sched.update_from_output(runner.execute(sched.schedule()))
    assert urgent.state is RequestState.DECODING  # (it had the blocks it needed)


def test_the_cached_prefix_a_waiting_request_shares_with_running_ones_is_not_counted_against_a_reservation() -> None:
    """Blocks of a shared prompt prefix that running requests hold are not taken from the free pool
    when the waiting request is admitted; counting them refused reservations that fit."""
    sched = Scheduler(SchedulerConfig(), BlockManager(16, BS), 128)
    runner = FakeModelRunner(max_num_seqs=256, max_model_len=128, block_size=BS, vocab_size=1000)
    system = list(range(100, 128))  # 7 full blocks, shared
    sched.add_request(
        Request("run", system + [1, 2, 3, 4], SamplingParams(max_tokens=20, ignore_eos=True, detokenize=False))
    )
    sched.update_from_output(runner.execute(sched.schedule()))
    queries = sched.block_manager.num_prefix_queries
    sched.add_request(Request("urgent", system + [5, 6, 7, 8], PARAMS, priority=0))  # needs 1 new block
    batch = Request("batch", list(range(300, 312)), PARAMS, priority=5)  # 3 blocks
    assert sched.block_manager.num_free_blocks < 8 + 3  # (its whole prompt and batch's would not fit)
    assert sched.reserve(batch)
    assert sched.block_manager.num_prefix_queries == queries + batch.num_tokens  # (the estimate counts no lookup)
