"""longrope's short and long states in the scheduler and the input batch, with the fake runner (pure
Python, milliseconds): which rotary index every computed token gets, the crossing's recompute, the
drafts cut at the original length, and the block hashes per state."""

from __future__ import annotations

import numpy as np

from engine.block_hash import hash_blocks, root_hash
from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.fake_runner import FakeModelRunner
from engine.request import Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from tests.engine.test_scheduler import BS, VOCAB, expected_output, req

ORIGINAL = 16
MAX_LEN = 64


def make(**cfg):
    sched = Scheduler(SchedulerConfig(**cfg), BlockManager(64, BS), MAX_LEN, long_rope_from=ORIGINAL)
    runner = FakeModelRunner(
        max_num_seqs=sched.config.max_num_seqs, max_model_len=MAX_LEN, block_size=BS, vocab_size=VOCAB
    )
    return sched, runner


def test_every_token_gets_its_state_s_rotary_index_and_each_output_once():
    """A token is computed with its position's short index while its sequence is within the
    original length, and with the long half's from the step that passes it on (whole sequence
    recomputed); outputs are the same as without longrope, each token delivered once."""
    sched, runner = make(max_num_batched_tokens=12)
    reqs = [req("within", 6, 4), req("crossing", 10, 12, start=40), req("long", 20, 3, start=80)]
    for r in reqs:
        sched.add_request(r)
    assert [r.long_rope for r in reqs] == [False, False, True]
    delivered: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    batch, prepared = runner.batch, []
    prepare = batch.prepare
    batch.prepare = lambda so: prepared.append(prepare(so)) or prepared[-1]  # (kept to read)
    while sched.has_unfinished():
        so = sched.schedule()
        want = []
        for rid, n in zip(so.request_ids, so.counts):
            r = sched.requests[rid]
            positions = np.arange(r.num_computed_tokens - n, r.num_computed_tokens)  # (advanced as scheduled)
            assert r.long_rope == (r.num_tokens > ORIGINAL or positions[-1] >= ORIGINAL)
            want += (positions + (MAX_LEN if r.long_rope else 0)).tolist()
        for r in sched.update_from_output(runner.execute(so)):
            delivered[r.request_id].append(r.all_token_ids[-1])
        if want:
            assert sorted(prepared[-1].positions.tolist()) == sorted(want)
    for r in reqs:
        assert delivered[r.request_id] == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert sched.long_rope is not None and sched.long_rope.num_crossings == 1
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_drafts_are_cut_at_the_original_length():
    sched, runner = make()
    r = req("r", ORIGINAL - 3, 8)
    sched.add_request(r)
    sched.update_from_output(runner.execute(sched.schedule()))  # the prompt, then its first token
    assert r.state is RequestState.DECODING and r.num_computed_tokens == ORIGINAL - 3
    r.spec_token_ids = [5, 6, 7, 8]
    assert sched.long_rope is not None and sched.long_rope.cross(sched.running) == 0
    assert r.spec_token_ids == [5, 6]  # its last token and two drafts: fed up to the original length


def test_block_hashes_differ_by_rope_state():
    """The long state's hashes never equal the short state's, nor any salt's (UTF-8 has no 0xff)."""
    tokens = list(range(3, 3 + 4 * BS))
    assert hash_blocks(tokens, BS, long_rope=True)[0] != hash_blocks(tokens, BS)[0]
    assert root_hash("t", True) not in {root_hash("t"), root_hash("\xfflong-rope" + "t"), root_hash("ÿlong-ropet")}
    long_req = Request("x", [7] * (ORIGINAL + 1), SamplingParams(max_tokens=1))
    sched, _ = make()
    sched.add_request(long_req)
    sched.block_manager.update_block_hashes(long_req)
    assert long_req.block_hashes == hash_blocks(long_req.all_token_ids, BS, long_rope=True)
