"""The block manager of an all-sliding model (Mistral): blocks wholly before the window of a
sequence's next query go back to the pool as the sequence moves past them, with placeholders left
in its block table; a prefix hit on such a block is still verified KV until the block is reused."""

import pytest

from engine.block_manager import WINDOW_FREED, BlockManager
from engine.request import Request
from engine.sampling_params import SamplingParams

BS, W = 4, 8  # a query at position p reads keys p - 7 .. p


def _req(rid, tokens, prefill_only=False):
    return Request(rid, tokens, SamplingParams(max_tokens=64), prefill_only=prefill_only)


def _compute(bm, req, n):
    assert bm.allocate(req, n)
    req.num_computed_tokens += n
    bm.register_full_blocks(req, req.num_computed_tokens)


def test_blocks_wholly_before_the_window_are_released_once():
    bm = BlockManager(16, BS, window=W)
    a = _req("a", list(range(20)))
    _compute(bm, a, 20)  # blocks 0..4
    held = list(a.block_ids)
    # The next query is at 20: it reads 13..20, so blocks 0..2 (tokens 0..11) are behind it; block 3 is not
    assert bm.free_passed_blocks(a, 20) == 3
    assert a.block_ids == [WINDOW_FREED] * 3 + held[3:] and a.num_window_freed == 3
    assert bm.num_free_blocks == 16 - 2 and bm.num_window_freed == 3
    assert bm.free_passed_blocks(a, 20) == 0  # nothing twice
    assert bm.free_passed_blocks(a, 23) == 1  # reads 16..23: block 3 (12..15) is behind it now
    assert bm.kv_slot_usage([a]) == (20 - 16, 4)  # the released blocks are neither held nor used
    bm.free(a)  # the rest only (a double release would raise)
    assert bm.num_free_blocks == 16 and a.num_window_freed == 0


def test_a_sequence_holds_the_window_and_one_block_while_it_decodes():
    bm = BlockManager(16, BS, window=W)
    a = _req("a", list(range(5)))
    _compute(bm, a, 5)
    for position in range(5, 200):
        bm.free_passed_blocks(a, position)
        a.all_token_ids.append(7)
        _compute(bm, a, 1)
        assert len(a.block_ids) - a.num_window_freed <= -(-W // BS) + 1
    bm.free(a)
    assert bm.num_free_blocks == 16


def test_without_a_window_or_on_the_prefill_role_nothing_is_released():
    plain = BlockManager(16, BS)
    a = _req("a", list(range(20)))
    _compute(plain, a, 20)
    assert plain.free_passed_blocks(a, 20) == 0 and plain.num_free_blocks == 11
    bm = BlockManager(16, BS, window=W)
    p = _req("p", list(range(20)), prefill_only=True)  # its blocks are still to be shipped
    _compute(bm, p, 20)
    assert bm.free_passed_blocks(p, 20) == 0 and -1 not in p.block_ids


def test_a_released_block_is_a_prefix_hit_until_it_is_reused():
    bm = BlockManager(8, BS, window=W)
    a = _req("a", list(range(20)))
    _compute(bm, a, 20)
    first_blocks = list(a.block_ids[:3])
    bm.free_passed_blocks(a, 20)
    b = _req("b", list(range(16)) + [99])
    assert bm.find_cached_prefix(b) == first_blocks + [a.block_ids[3]]  # released, still cached: same KV
    assert bm.allocate(_req("c", [1] * 16), 16)  # the three never used, then the released block 0
    assert bm.find_cached_prefix(_req("d", list(range(16)) + [99])) == []  # the chain breaks at block 0


def test_a_prefix_hit_takes_only_the_blocks_its_window_reaches():
    """Admitted on a hit, a request takes the hit's blocks from its first query's window on; the
    ones before stay free (placeholders stand for them), so a hit as long as the pool still fits.
    A prefill-role request takes the whole hit (it ships every block)."""
    bm = BlockManager(8, BS, window=W)
    a = _req("a", list(range(32)))
    _compute(bm, a, 32)  # every block of the pool, entered in the cache
    blocks = list(a.block_ids)
    bm.free(a)
    b = _req("b", list(range(32)) + [99])
    hit = bm.find_cached_prefix(b)
    assert hit == blocks and not bm.can_allocate(b, 1, hit)  # all eight, and one more for the last token
    assert bm.passed_hit_blocks(b, len(hit)) == (32 - W + 1) // BS
    assert bm.allocate(b, 1, hit, leave_passed=True)
    assert b.block_ids[:6] == [WINDOW_FREED] * 6 and b.block_ids[6:8] == blocks[6:] and b.num_window_freed == 6
    assert b.num_computed_tokens == 32 and bm.num_free_blocks == 8 - 3
    p = _req("p", list(range(32)) + [99], prefill_only=True)
    assert bm.passed_hit_blocks(p, len(hit)) == 0
    bm.free(b)
    # The blocks left stayed cache entries, but for the free list's head, taken for b's last token.
    assert bm.num_free_blocks == 8 and bm.find_cached_prefix(_req("c", list(range(24)) + [1])) == blocks[:5]


def test_registration_skips_released_blocks():
    """A request whose blocks were released before they were entered (prefix caching behind) never
    enters a placeholder into the cache."""
    bm = BlockManager(16, BS, window=W)
    a = _req("a", list(range(20)))
    assert bm.allocate(a, 20)
    a.num_computed_tokens = 20  # computed, not yet registered
    bm.free_passed_blocks(a, 20)
    bm.register_full_blocks(a, 20)
    assert a.num_registered_blocks == 5 and len(bm.pool.cached) == 2  # blocks 3 and 4 only
    assert all(bid >= 0 for bid in bm.pool.cached.values())


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        BlockManager(4, BS, window=0)
