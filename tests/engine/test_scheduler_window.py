"""An all-sliding model's (Mistral's) sequences in the scheduler, with the fake runner (pure Python,
milliseconds): a request holds its window and one chunk at once, however long its prompt or its
prefix-cache hit, so one longer than the whole pool is admitted and finishes; one that could never
fit is refused when added, naming the numbers."""

from __future__ import annotations

import pytest

from engine.block_manager import WINDOW_FREED, BlockManager
from engine.config import SchedulerConfig
from engine.errors import InvalidParameterError
from engine.fake_runner import FakeModelRunner
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from tests.engine.test_scheduler import BS, VOCAB, expected_output, run

W, POOL, CHUNK, MAX_LEN = 8, 16, 8, 256  # a window of two blocks; a pool of 64 token slots


def make(**cfg):
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=CHUNK, admission_watermark=0.0, **cfg),
        BlockManager(POOL, BS, window=W),
        MAX_LEN,
    )
    runner = FakeModelRunner(
        max_num_seqs=sched.config.max_num_seqs, max_model_len=MAX_LEN, block_size=BS, vocab_size=VOCAB
    )
    return sched, runner


def _req(rid, prompt, max_tokens, resume=(), prefill_only=False):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(prompt), params, resume_token_ids=list(resume), prefill_only=prefill_only)


def _run_until(sched, runner, r, computed):
    while r.num_computed_tokens < computed:
        sched.update_from_output(runner.execute(sched.schedule()))


def test_a_migrated_request_whose_cached_prefix_fills_the_pool_is_admitted_and_finishes():
    """Its first run leaves every block of the pool a cached, verified prefix of it; resumed on the
    same worker, its hit covers the whole pool and its next token needs one block more. Only the hit's
    blocks within its window are taken (the rest stay placeholders), so it fits and finishes as it
    would have, and the queue behind it moves."""
    sched, runner = make()
    prompt, max_tokens = list(range(10, 30)), 80
    first = _req("a", prompt, max_tokens)
    sched.add_request(first)
    _run_until(sched, runner, first, POOL * BS)  # every block of the pool used once, none reused yet
    generated = first.output_token_ids
    assert first.num_tokens == POOL * BS + 1
    sched.abort("a")  # (its router lost it: it is resumed here with what it generated)
    bm = sched.block_manager
    resumed = _req("a2", prompt, max_tokens, resume=generated)
    behind = _req("b", range(500, 505), 3)
    sched.add_request(resumed)
    sched.add_request(behind)
    so = sched.schedule()
    assert so.request_ids[0] == "a2" and so.counts[0] == 1  # the whole pool was a hit: one token left
    assert resumed.num_cached_tokens == POOL * BS
    assert resumed.block_ids[: resumed.num_window_freed] == [WINDOW_FREED] * resumed.num_window_freed
    assert len(resumed.block_ids) - resumed.num_window_freed <= -(-(W - 1 + CHUNK) // BS) + 1
    sched.update_from_output(runner.execute(so))
    run(sched, runner)
    assert generated + resumed.output_token_ids[len(generated) :] == expected_output(prompt, max_tokens)
    assert behind.output_token_ids == expected_output(behind.prompt_token_ids, 3)
    assert bm.num_free_blocks == POOL


def test_a_prompt_longer_than_the_pool_sharing_a_cached_prefix_runs():
    """A prompt of more blocks than the pool, whose first blocks are another's cached prefix, is
    admitted (the hit's blocks behind the window left) and equals its output without the cache."""
    sched, runner = make()
    shared = list(range(10, 42))
    sched.add_request(_req("a", shared, 2))
    run(sched, runner)
    long_prompt = shared + list(range(100, 100 + POOL * BS))
    b = _req("b", long_prompt, 5)
    sched.add_request(b)
    run(sched, runner)
    assert b.num_cached_tokens == len(shared)
    assert b.output_token_ids == expected_output(long_prompt, 5)
    assert sched.block_manager.num_free_blocks == POOL


def test_a_request_that_can_never_fit_is_refused_when_added_naming_the_numbers():
    """Its window and one chunk take more blocks than the pool has (here a chunk the size of the
    pool). A prefill-role prompt keeps every block until it is shipped, and a decode worker's
    reservation receives the whole prompt: both must fit whole (refused, the router prefills the
    prompt on the decode worker, which holds only its window)."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=POOL * BS), BlockManager(POOL, BS, window=W), MAX_LEN)
    with pytest.raises(InvalidParameterError, match=f"needs 19 KV blocks but the cache has only {POOL}"):
        sched.add_request(_req("wide", range(POOL * BS + 8), 4))
    assert not sched.has_unfinished()
    sched, _ = make()
    with pytest.raises(InvalidParameterError, match=f"prompt of {POOL * BS + 1} tokens") as e:
        sched.add_request(_req("p", range(POOL * BS + 1), 1, prefill_only=True))
    assert e.value.param == "prompt"
    sched.add_request(_req("p", range(POOL * BS), 1, prefill_only=True))
    with pytest.raises(InvalidParameterError, match=f"needs {POOL + 1} KV blocks but the cache has only {POOL}"):
        sched.reserve(_req("d", range(POOL * BS + 1), 1))
    assert "d" not in sched.requests
    sched.add_request(_req("d", range(POOL * BS + 1), 1))  # colocated: it holds its window and a chunk
