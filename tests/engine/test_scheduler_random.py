"""The scheduler under random workloads (hypothesis, fake runner): whatever the budgets, the pool's
size (preemptions), shared prefixes (prefix-cache hits), priorities and aborts, every request that is
not aborted gets exactly its own tokens, every step keeps to its budgets, and nothing leaks.

The runner also keeps a shadow KV cache: the token each (block, offset) slot was last written with.
Every step, each row's context must read back as that row's own tokens, through its block table:
a wrong prefix hit, a block registered or reused too early, or a slot written twice shows up there,
although the fake runner's tokens never depend on the KV."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import event, given, settings

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.fake_runner import FakeModelRunner, fake_next_token
from engine.request import FinishReason, Request, RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import RunnerOutput, SchedulerOutput

BS = 4
VOCAB = 1000
MAX_LEN = 96

request_specs = st.lists(
    st.tuples(
        st.integers(0, 2),  # which shared prefix (0: none)
        st.integers(1, 30),  # prompt tokens after it
        st.integers(1, 24),  # max_tokens
        st.integers(0, 2),  # priority
        st.integers(0, 6),  # the step it arrives at
        st.one_of(st.none(), st.integers(0, 40)),  # the step it is aborted at, if any
    ),
    min_size=1,
    max_size=10,
)


class ShadowKVRunner(FakeModelRunner):
    """The fake runner, writing each step's tokens into a shadow KV cache and checking that every
    row's context reads back as its own tokens."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.kv: dict[tuple[int, int], int] = {}

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        batch = self.batch
        batch.apply(so)
        if so.is_empty:
            return RunnerOutput([], [])
        inputs = batch.prepare(so)
        for block, offset, tok in zip(
            inputs.slot_block.tolist(), inputs.slot_offset.tolist(), inputs.input_ids.tolist()
        ):
            self.kv[block, offset] = tok
        # prepare's row order: single-token rows first, each group in the step's order
        rows = [s for s, c in zip(so.slots, so.counts) if c == 1] + [s for s, c in zip(so.slots, so.counts) if c != 1]
        tables = list(inputs.decode_block_tables) + list(inputs.prefill_block_tables)
        lens = inputs.decode_seq_lens.tolist() + inputs.prefill_seq_lens.tolist()
        for row, table, n in zip(rows, tables, lens):
            read = [self.kv.get((int(table[p // BS]), p % BS)) for p in range(n)]
            assert read == batch.token_ids[row, :n].tolist(), f"row {row} reads another sequence's KV"
        out_rows = inputs.sample_rows
        n = batch.num_tokens[out_rows]
        sampled = (batch.token_ids[out_rows, n - 1] * 31 + n * 17 + 7) % (self.vocab_size - 3) + 3
        batch.append_sampled(out_rows, sampled)
        return RunnerOutput(out_rows.tolist(), sampled.tolist())


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(fake_next_token(toks[-1], len(toks), VOCAB))
    return toks[len(prompt) :]


@settings(max_examples=150, deadline=None)
@given(
    specs=request_specs,
    budget=st.sampled_from([3, 8, 32, 256]),
    prefill_budget=st.sampled_from([0, 2, 5]),
    spare_blocks=st.sampled_from([0, 2, 8, 64]),
    max_num_seqs=st.sampled_from([2, 4, 16]),
)
def test_random_workloads_get_their_own_tokens_within_budget_and_leak_nothing(
    specs, budget, prefill_budget, spare_blocks, max_num_seqs
):
    prefixes = {0: [], 1: list(range(100, 110)), 2: list(range(200, 217))}
    # The pool always holds the largest request whole (else it is refused up front), often little more.
    need = max(-(-min(len(prefixes[p]) + n + m, MAX_LEN) // BS) for p, n, m, _, _, _ in specs)
    num_blocks = need + spare_blocks
    sched = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=budget,
            prefill_token_budget=prefill_budget or None,
            max_num_seqs=max_num_seqs,
            admission_watermark=0.0,
        ),
        BlockManager(num_blocks, BS),
        MAX_LEN,
    )
    runner = ShadowKVRunner(max_num_seqs=max_num_seqs, max_model_len=MAX_LEN, block_size=BS, vocab_size=VOCAB)
    reqs = []
    for i, (p, n, m, priority, _, _) in enumerate(specs):
        prompt = prefixes[p] + [(7 * i + 3 * j) % 90 + 5 for j in range(n)]
        m = min(m, MAX_LEN - len(prompt))
        reqs.append(Request(f"r{i}", prompt, SamplingParams(max_tokens=m, ignore_eos=True), priority=priority))
    aborted = set()
    for step in range(2000):
        for (_, _, _, _, arrive, abort_at), r in zip(specs, reqs):
            if step == arrive:
                sched.add_request(r)
            if step == max(arrive, abort_at or 0) and abort_at is not None and not r.is_finished:
                sched.abort(r.request_id)
                aborted.add(r.request_id)
        if step > max(s[4] for s in specs) and not sched.has_unfinished():
            break
        so = sched.schedule()
        # One entry per request, within the budgets; prompt chunks within the prefill budget.
        assert len(set(so.request_ids)) == len(so.request_ids) == len(so.counts)
        assert all(c >= 1 for c in so.counts) and so.total_num_scheduled_tokens == sum(so.counts) <= budget
        if prefill_budget:
            assert sum(c for c in so.counts if c > 1) <= prefill_budget
        for rid, slot in zip(so.request_ids, so.slots):
            assert sched.requests[rid].slot == slot and sched.requests[rid].num_computed_tokens <= MAX_LEN
        if not prefill_budget and not so.num_preempted:
            # A chunk is cut short only by the budget, which it then used up. (A preemption after the
            # cut may give tokens back: a victim scheduled earlier in the step.)
            cut = [
                rid
                for rid in so.request_ids
                if sched.requests[rid].num_computed_tokens < sched.requests[rid].num_tokens
            ]
            assert not cut or so.total_num_scheduled_tokens == budget, f"{cut} cut with budget left"
        sched.update_from_output(runner.execute(so))
    else:
        raise AssertionError("the workload did not finish")
    for r in reqs:
        if r.request_id in aborted:
            assert r.state in (RequestState.ABORTED, RequestState.FINISHED)
            continue
        assert r.state is RequestState.FINISHED and r.finish_reason is FinishReason.LENGTH
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    event(f"preempted: {bool(sched.num_preemptions)}")  # (how often each path ran: --hypothesis-show-statistics)
    event(f"prefix hit: {any(r.num_cached_tokens for r in reqs)}")
    bm = sched.block_manager
    assert bm.num_free_blocks == num_blocks and not sched.running and not sched.requests
    assert all(blk.ref_cnt == 0 for blk in bm.pool.blocks)
    for h, bid in bm.pool.cached.items():  # every cache entry still describes its block
        assert bm.pool.blocks[bid].block_hash == h
