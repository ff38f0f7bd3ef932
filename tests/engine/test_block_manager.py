"""Block manager: unit cases and invariants under random operation sequences (hypothesis)."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.block_hash import hash_blocks
from engine.block_manager import BlockManager
from engine.kv_events import BlocksRemoved, BlocksStored
from engine.request import Request
from engine.sampling_params import SamplingParams

BS = 4


def _req(rid, tokens, salt=None):
    return Request(rid, tokens, SamplingParams(max_tokens=8), cache_salt=salt)


def _compute(bm, req, n, cached=()):
    assert bm.allocate(req, n, list(cached))
    req.num_computed_tokens += n
    bm.register_full_blocks(req, req.num_computed_tokens)


def test_blocks_a_failed_step_registered_leave_the_cache_and_say_so():
    bm = BlockManager(16, BS, record_events=True)
    a = _req("a", list(range(14)))
    _compute(bm, a, 5)  # block 0 full and registered; block 1 partly written
    _compute(bm, a, 9)  # the step that fails: registers blocks 1 and 2
    first = a.block_hashes[0]
    assert a.num_registered_blocks == 3
    bm.take_events()
    bm.unregister_unwritten(a, 5)
    assert a.num_registered_blocks == 1
    removed = [h for e in bm.take_events() if isinstance(e, BlocksRemoved) for h in e.block_hashes]
    assert removed == a.block_hashes[1:3]
    assert set(bm.pool.cached) == {first}
    b = _req("b", list(range(14)))
    assert bm.find_cached_prefix(b) == a.block_ids[:1]  # the written block is still a hit
    bm.free(a)
    assert bm.num_free_blocks == 16


def test_prefix_hit_reuses_blocks_and_recomputes_the_last_token():
    bm = BlockManager(16, BS, record_events=True)
    a = _req("a", list(range(12)))  # exactly 3 full blocks
    _compute(bm, a, 12)
    stored = [e for e in bm.take_events() if isinstance(e, BlocksStored)]
    assert sum(len(e.block_hashes) for e in stored) == 3
    b = _req("b", list(range(12)))
    hit = bm.find_cached_prefix(b)
    assert hit == a.block_ids[:2]  # the block holding the last token is not a hit
    c = _req("c", list(range(12)) + [99])
    assert bm.find_cached_prefix(c) == a.block_ids[:3]


def test_hashes_are_process_independent_and_salted():
    toks = list(range(8))
    assert hash_blocks(toks, BS, "tenant-a") != hash_blocks(toks, BS, "tenant-b")
    code = "from engine.block_hash import hash_blocks; print(hash_blocks(list(range(8)), 4, 's')[1].hex())"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {hash_blocks(toks, BS, "s")[1].hex()}


def test_salt_isolates_caches():
    bm = BlockManager(16, BS)
    a = _req("a", list(range(9)), salt="t1")
    _compute(bm, a, 9)
    assert bm.find_cached_prefix(_req("b", list(range(9)), salt="t2")) == []
    assert len(bm.find_cached_prefix(_req("c", list(range(9)), salt="t1"))) == 2


def test_hit_is_verified_against_token_ids():
    bm = BlockManager(16, BS)
    a = _req("a", list(range(9)))
    _compute(bm, a, 9)
    # Corrupt the stored tokens of the first block: a hash "collision" must not be served.
    bm.pool.blocks[a.block_ids[0]].token_ids = [7, 7, 7, 7]
    assert bm.find_cached_prefix(_req("b", list(range(9)))) == []


def test_lazy_eviction_keeps_freed_blocks_cached_until_reused():
    bm = BlockManager(4, BS, record_events=True)
    a = _req("a", list(range(9)))
    _compute(bm, a, 9)
    first_blocks = a.block_ids[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4
    hit = bm.find_cached_prefix(_req("b", list(range(9))))
    assert hit == first_blocks
    # Allocating all blocks evicts them (tail blocks first) and reports the removals.
    bm.take_events()
    c = _req("c", list(range(100, 116)))
    _compute(bm, c, 16)
    removed = [h for e in bm.take_events() if isinstance(e, BlocksRemoved) for h in e.block_hashes]
    assert len(removed) == 2
    assert bm.find_cached_prefix(_req("d", list(range(9)))) == []


def test_allocation_failure_changes_nothing():
    bm = BlockManager(2, BS)
    r = _req("r", list(range(12)))
    assert not bm.allocate(r, 12)
    assert r.block_ids == [] and bm.num_free_blocks == 2


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions (with shared prefixes), chunked steps, decodes and frees."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(24, BS, record_events=True)
        self.live: dict[str, Request] = {}
        self.n = 0
        self.cached_hashes: set[bytes] = set()

    @rule(prefix=st.integers(0, 3), extra=st.lists(st.integers(0, 50), max_size=10), chunk=st.integers(1, 16))
    def admit(self, prefix, extra, chunk):
        tokens = [prefix] * (4 * (prefix + 1)) + extra + [prefix]
        req = _req(f"r{self.n}", tokens)
        self.n += 1
        hit = self.bm.find_cached_prefix(req)
        for i, bid in enumerate(hit):  # a hit returns the right tokens
            assert self.bm.pool.blocks[bid].token_ids == tokens[i * BS : (i + 1) * BS]
        n = min(chunk, req.num_tokens - len(hit) * BS)
        if self.bm.allocate(req, n, hit):
            req.num_computed_tokens += n
            self.bm.register_full_blocks(req, req.num_computed_tokens)
            self.live[req.request_id] = req
        else:
            assert req.block_ids == [] and req.num_computed_tokens == 0

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 8))
    def step(self, data, chunk):
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if req.num_computed_tokens == req.num_tokens:
            req.append_token(data.draw(st.integers(0, 50)))  # a decode
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        if self.bm.allocate(req, n):
            req.num_computed_tokens += n
            self.bm.register_full_blocks(req, req.num_computed_tokens)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.bm.free(self.live.pop(rid))

    @invariant()
    def ref_counts_match_holders(self):
        holders = Counter(b for r in self.live.values() for b in r.block_ids)
        pool = self.bm.pool
        for blk in pool.blocks:
            assert blk.ref_cnt == holders.get(blk.block_id, 0)
            assert (blk.ref_cnt == 0) == (blk.block_id in pool.free)
        assert len(pool.free) + len(holders) == pool.num_blocks

    @invariant()
    def no_block_twice_in_a_request(self):
        for r in self.live.values():
            assert len(r.block_ids) == len(set(r.block_ids))
            assert len(r.block_ids) * BS >= r.num_computed_tokens

    @invariant()
    def cache_map_consistent(self):
        pool = self.bm.pool
        for h, bid in pool.cached.items():
            assert pool.blocks[bid].block_hash == h
        # Every registered block of a live request holds its own tokens.
        for r in self.live.values():
            for i in range(r.num_registered_blocks):
                blk = pool.blocks[r.block_ids[i]]
                if blk.token_ids is not None:
                    assert blk.token_ids == r.all_token_ids[i * BS : (i + 1) * BS]

    def teardown(self):
        for r in list(self.live.values()):
            self.bm.free(r)
        assert self.bm.num_free_blocks == self.bm.num_blocks  # no leak


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_registering_the_blocks_decodes_filled_in_one_call_is_registering_each():
    """``register_filled_blocks`` (the scheduler's decode step) caches what ``register_full_blocks``
    caches, request by request: same hashes, same blocks, same events; and it falls back to it for a
    request in any other state (its first block, several blocks at once, hashes computed ahead)."""
    managers = [BlockManager(64, BS, record_events=True) for _ in range(2)]
    reqs = [
        [_req(f"r{i}", list(range(10 * i, 10 * i + 2 + 3 * i)), salt="s" if i == 2 else None) for i in range(4)]
        for _ in managers
    ]
    for bm, rs in zip(managers, reqs):
        for r in rs:
            _compute(bm, r, r.num_tokens)
        rs[3].all_token_ids += [7, 8, 9, 10, 11]  # two more blocks known at once: the fallback
        bm.update_block_hashes(rs[3])  # hashes computed ahead of registration: the fallback too
    for step in range(12):
        filled: list[list[Request]] = [[], []]
        for k, (bm, rs) in enumerate(zip(managers, reqs)):
            for r in rs:
                if not (r is rs[3] and step == 0):  # (r3 computes its 5 known tokens at once)
                    r.all_token_ids.append(1000 + step)
                n = r.num_tokens - r.num_computed_tokens
                assert bm.allocate(r, n)
                r.num_computed_tokens += n
                if r.num_computed_tokens // BS > r.num_registered_blocks:
                    filled[k].append(r)
        managers[0].register_filled_blocks(filled[0])
        for r in filled[1]:
            managers[1].register_full_blocks(r, r.num_computed_tokens)
        assert [r.request_id for r in filled[0]] == [r.request_id for r in filled[1]]
    for a, b in zip(*reqs):
        assert a.block_hashes == b.block_hashes and a.block_ids == b.block_ids
        assert a.num_registered_blocks == b.num_registered_blocks == a.num_computed_tokens // BS
    assert managers[0].pool.cached == managers[1].pool.cached and len(managers[0].pool.cached) > 10
    stored = [
        sorted(h for e in bm.take_events() if isinstance(e, BlocksStored) for h in e.block_hashes) for bm in managers
    ]
    assert stored[0] == stored[1]


def test_a_decodes_next_block_evicts_like_any_allocation():
    """``append_block`` (the scheduler's decode pass) takes the free list's head as ``allocate`` does:
    a cached block it takes leaves the prefix cache, with a ``BlocksRemoved`` event."""
    managers = [BlockManager(2, BS, record_events=True) for _ in range(2)]
    taken = []
    for k, bm in enumerate(managers):
        a = _req("a", list(range(4)))
        _compute(bm, a, 4)
        bm.free(a)  # its block stays cached, at the free list's tail
        b = _req("b", list(range(100, 109)))
        for _ in range(2):
            if k == 0:
                bm.append_block(b)
            else:
                assert bm.allocate(b, len(b.block_ids) * BS + 1 - b.num_computed_tokens)
            b.num_computed_tokens = len(b.block_ids) * BS
        assert not bm.pool.cached and bm.num_free_blocks == 0
        taken.append(b.block_ids)
    events = [bm.take_events() for bm in managers]
    assert taken[0] == taken[1] and taken[0][-1] == 0  # a's block, last
    assert [type(e) for e in events[0]] == [BlocksStored, BlocksRemoved] and events[0] == events[1]
