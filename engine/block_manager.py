"""Paged KV block manager: ref-counted blocks, LRU free list with lazy eviction, prefix caching.

(Over 400 lines as one concept: the block table of every request, the prefix cache over it and the
window's released blocks share one free list and one ref count; split, each would reach into the
others' state.)

Pure Python (no torch); everything here is O(blocks touched).

- A block is *in use* while its ref count is > 0. At ref count 0 it goes to the tail of the free
  list but keeps its hash: it is still a prefix-cache entry until the allocator takes it from the
  head of the free list (lazy eviction), at which point its hash is dropped.
- Prefix caching covers full blocks only. A block is found by its chained hash
  (``engine.block_hash``), and every hit is verified against the block's stored parent hash and
  token ids, so a hash collision can never serve wrong KV.
- The last prompt token is always recomputed: a hit never covers the whole prompt, since the step
  must produce logits for it.
- An all-sliding model (Mistral) never reads a block wholly before the window of a sequence's next
  query: ``free_passed_blocks`` releases it, leaving ``WINDOW_FREED`` in the block table. Like any
  freed block it keeps its hash until reallocated: a prefix hit on it is still verified KV.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from engine.block_hash import BlockHash, block_packer, hash_packed, root_hash
from engine.kv_events import AllBlocksCleared, BlocksRemoved, BlocksStored, KVCacheEvent
from engine.request import Request

WINDOW_FREED = -1  # a block-table entry whose block the sliding window left behind (released)


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    parent_hash: BlockHash | None = None
    token_ids: list[int] | None = None  # its own copy (a slice the registration made)


class BlockPool:
    """The blocks, the free list (LRU order) and the hash → block map."""

    def __init__(self, num_blocks: int, *, record_events: bool = False) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks in eviction order: head = least recently freed. Values unused.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[BlockHash, int] = {}
        self.record_events = record_events
        self._events: list[KVCacheEvent] = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        """Take n blocks from the head of the free list, evicting their cache entries."""
        if n > len(self.free):
            raise RuntimeError(f"allocate({n}) with only {len(self.free)} free blocks")
        removed: list[BlockHash] = []
        out = [self._take_head(removed) for _ in range(n)]
        self._record_removed(removed)
        return out

    def take_one(self) -> int:
        """``allocate(1)[0]`` without its check and list, for a decode's next block (the caller
        knows the free list is not empty)."""
        bid = self.free.popitem(last=False)[0]
        blk = self.blocks[bid]
        if blk.block_hash is not None:
            self._record_removed([self._uncache(blk)])
        blk.ref_cnt = 1
        return bid

    def _take_head(self, removed: list[BlockHash]) -> int:
        """The free list's head, with one reference; its cache entry, if any, dropped into ``removed``."""
        bid = self.free.popitem(last=False)[0]
        blk = self.blocks[bid]
        if blk.block_hash is not None:
            removed.append(self._uncache(blk))
        blk.ref_cnt = 1
        return bid

    def _record_removed(self, removed: list[BlockHash]) -> None:
        if removed and self.record_events:
            self._events.append(BlocksRemoved(tuple(removed)))

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks (prefix hit); revive them from the free list."""
        for bid in block_ids:
            blk = self.blocks[bid]
            if blk.ref_cnt == 0:
                del self.free[bid]
            blk.ref_cnt += 1

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference from each block; blocks reaching 0 go to the free-list tail in order."""
        blocks, free = self.blocks, self.free
        for bid in block_ids:
            blk = blocks[bid]
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                free[bid] = None
            elif blk.ref_cnt < 0:
                raise RuntimeError(f"block {bid} freed twice")

    def lookup(self, block_hash: BlockHash, parent: BlockHash, token_ids: list[int]) -> int | None:
        bid = self.cached.get(block_hash)
        if bid is None:
            return None
        blk = self.blocks[bid]
        if blk.parent_hash != parent or blk.token_ids != token_ids:
            return None  # a hash collision: never serve someone else's KV
        return bid

    def register(self, bid: int, block_hash: BlockHash, parent: BlockHash, token_ids: list[int]) -> bool:
        """Make a full, computed block findable. False if another block already holds that hash.
        ``token_ids`` is kept as it is: the caller hands over a list no one else holds."""
        if block_hash in self.cached:
            return False
        blk = self.blocks[bid]
        blk.block_hash, blk.parent_hash, blk.token_ids = block_hash, parent, token_ids
        self.cached[block_hash] = bid
        return True

    def forget(self, block_ids: list[int]) -> None:
        """Withdraw these blocks' prefix-cache entries (their KV cannot be trusted); the blocks stay
        allocated to whoever holds them."""
        self._record_removed(
            [self._uncache(blk) for blk in map(self.blocks.__getitem__, block_ids) if blk.block_hash is not None]
        )

    def record_stored(self, hashes: list[BlockHash]) -> None:
        if hashes and self.record_events:
            self._events.append(BlocksStored(tuple(hashes)))

    def _uncache(self, blk: KVBlock) -> BlockHash:
        h = blk.block_hash
        assert h is not None
        if self.cached.get(h) == blk.block_id:
            del self.cached[h]
        blk.block_hash = blk.parent_hash = blk.token_ids = None
        return h

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only possible when no block is in use."""
        if len(self.free) != self.num_blocks:
            return False
        for blk in self.blocks:
            blk.block_hash = blk.parent_hash = blk.token_ids = None
        self.cached.clear()
        if self.record_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events


class BlockManager:
    """Per-request block accounting on top of a ``BlockPool``."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        record_events: bool = False,
        window: int | None = None,
    ) -> None:
        """``window``: an all-sliding model's (``Family.freeing_window``); None keeps every block."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if window is not None and window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.block_size = block_size
        self.window = window
        self.num_window_freed = 0  # blocks released behind windows so far (a counter)
        self._pack = block_packer(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, record_events=record_events)
        self.num_prefix_queries = 0  # tokens looked up
        self.num_prefix_hits = 0  # tokens found

    # -- capacity ---------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_to_finish(
        self, num_prompt_tokens: int, num_tokens: int, chunk_tokens: int | None, *, holds_prompt: bool = True
    ) -> int:
        """The most blocks a sequence of ``num_tokens`` (``num_prompt_tokens`` of them prompt) holds at
        once. Behind a window: a chunk of ``chunk_tokens`` with the window before it, or the whole
        prompt where ``holds_prompt`` (a prefill-role request, or a decode worker's reservation, into
        which the prompt's KV arrives); every block without one."""
        whole = self.blocks_needed(num_tokens)
        if self.window is None or chunk_tokens is None:
            return whole
        span = self.blocks_needed(self.window - 1 + chunk_tokens) + 1
        return min(whole, max(self.blocks_needed(num_prompt_tokens), span) if holds_prompt else span)

    # -- hashing ----------------------------------------------------------------------------
    def update_block_hashes(self, req: Request) -> None:
        """Extend ``req.block_hashes`` to cover every full block of its known tokens."""
        bs = self.block_size
        tokens = req.all_token_ids
        hashes = req.block_hashes
        n_full = len(tokens) // bs
        if len(hashes) >= n_full:
            return
        parent = hashes[-1] if hashes else root_hash(req.cache_salt, req.long_rope)
        pack = self._pack
        for i in range(len(hashes), n_full):
            parent = hash_packed(parent, pack(*tokens[i * bs : (i + 1) * bs]))
            hashes.append(parent)

    def _parent_of(self, req: Request, i: int) -> BlockHash:
        return req.block_hashes[i - 1] if i else root_hash(req.cache_salt, req.long_rope)

    # -- prefix hits --------------------------------------------------------------------------
    def max_hit_blocks(self, req: Request, max_tokens: int | None = None) -> int:
        """How many leading blocks of ``req`` a prefix-cache hit may cover (its hashes must be up to
        date): full blocks within ``max_tokens``, by default all but the last known token."""
        limit = req.num_tokens - 1 if max_tokens is None else max_tokens
        return min(len(req.block_hashes), limit // self.block_size)

    def find_cached_prefix(self, req: Request, max_tokens: int | None = None) -> list[int]:
        """Block ids of the longest cached prefix of ``req`` (not yet referenced).

        Covers at most ``max_tokens`` tokens (default: all but the last known token, which is always
        recomputed so the step produces its logits).
        """
        if not self.enable_prefix_caching:
            return []
        hit = self._lookup_prefix(req, max_tokens)
        self.num_prefix_queries += req.num_tokens
        self.num_prefix_hits += len(hit) * self.block_size
        return hit

    def _lookup_prefix(self, req: Request, max_tokens: int | None = None) -> list[int]:
        """``find_cached_prefix`` without counting the query."""
        self.update_block_hashes(req)
        hit: list[int] = []
        bs, tokens = self.block_size, req.all_token_ids
        for i in range(self.max_hit_blocks(req, max_tokens)):
            bid = self.pool.lookup(req.block_hashes[i], self._parent_of(req, i), tokens[i * bs : (i + 1) * bs])
            if bid is None:
                break
            hit.append(bid)
        return hit

    def free_blocks_to_admit(self, req: Request) -> int:
        """Free blocks admitting ``req``'s known tokens would take: all their blocks less the cached
        prefix other requests already hold (taking those takes nothing from the free pool). No
        side effect on the prefix-hit counts."""
        total = -(-req.num_tokens // self.block_size)
        if not self.enable_prefix_caching or req.num_computed_tokens:
            return total
        return total - sum(self.pool.blocks[bid].ref_cnt > 0 for bid in self._lookup_prefix(req))

    # -- allocation ---------------------------------------------------------------------------
    def can_allocate(
        self, req: Request, num_new_tokens: int, cached_blocks: Sequence[int] = (), *, leave_passed: bool = False
    ) -> bool:
        need = self._num_new_blocks(req, num_new_tokens, len(cached_blocks))
        taken = cached_blocks[self.passed_hit_blocks(req, len(cached_blocks)) :] if leave_passed else cached_blocks
        revived = sum(1 for b in taken if self.pool.blocks[b].ref_cnt == 0)
        return need <= self.pool.num_free - revived

    def passed_hit_blocks(self, req: Request, num_cached_blocks: int) -> int:
        """How many leading blocks of a prefix hit of ``num_cached_blocks`` for ``req`` (holding no
        block yet) lie wholly before the window of its first query after the hit: none of its queries
        reads them. None without a window, or for a prefill-role request (it ships every block)."""
        window = self.window
        if window is None or req.prefill_only or req.block_ids:
            return 0
        position = req.num_computed_tokens + num_cached_blocks * self.block_size
        return min(num_cached_blocks, max(0, (position - window + 1) // self.block_size))

    def _num_new_blocks(self, req: Request, num_new_tokens: int, num_cached_blocks: int) -> int:
        have = len(req.block_ids) + num_cached_blocks
        total = req.num_computed_tokens + num_cached_blocks * self.block_size + num_new_tokens
        return max(0, -(-total // self.block_size) - have)

    def allocate(
        self, req: Request, num_new_tokens: int, cached_blocks: Sequence[int] = (), *, leave_passed: bool = False
    ) -> bool:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens, after taking ``cached_blocks``.

        ``cached_blocks`` (from ``find_cached_prefix``) advance ``num_computed_tokens``. With
        ``leave_passed`` (admission), the hit's blocks behind the window of its first query are not
        taken: ``WINDOW_FREED`` stands for them, so a hit never holds more than the window (one
        longer than the pool still fits). Returns False, changing nothing, when the pool cannot
        satisfy the request.
        """
        pool = self.pool
        if cached_blocks:
            if not self.can_allocate(req, num_new_tokens, cached_blocks, leave_passed=leave_passed):
                return False
            passed = self.passed_hit_blocks(req, len(cached_blocks)) if leave_passed else 0
            pool.touch(cached_blocks[passed:])
            if passed:
                req.block_ids.extend([WINDOW_FREED] * passed)
                req.num_window_freed = passed
            req.block_ids.extend(cached_blocks[passed:])
            req.num_computed_tokens += len(cached_blocks) * self.block_size
            req.num_registered_blocks = len(req.block_ids)
        total = req.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size) - len(req.block_ids)
        if need > 0:
            if need > pool.num_free:
                return False
            req.block_ids.extend(pool.allocate(need))
        return True

    def free_passed_blocks(self, req: Request, position: int) -> int:
        """Release ``req``'s blocks wholly before the window of its query at ``position`` (the first
        it computes next): no query of it reads them again. A prefill-role request keeps them (they
        are still to be shipped). Returns how many were released."""
        window = self.window
        if window is None or req.prefill_only:
            return 0
        start, ids = req.num_window_freed, req.block_ids
        passed = min((position - window + 1) // self.block_size, len(ids))
        if passed <= start:
            return 0
        self.pool.release(ids[start:passed])
        ids[start:passed] = [WINDOW_FREED] * (passed - start)
        req.num_window_freed = passed
        self.num_window_freed += passed - start
        return passed - start

    def kv_slot_usage(self, reqs: Sequence[Request]) -> tuple[int, int]:
        """(token slots holding KV a query can still read, token slots held) over ``reqs``: blocks a
        window left behind are neither (released, they are back in the pool)."""
        bs = self.block_size
        held = sum(len(r.block_ids) - r.num_window_freed for r in reqs)
        used = sum(min(r.num_computed_tokens, len(r.block_ids) * bs) - r.num_window_freed * bs for r in reqs)
        return used, held * bs

    def append_block(self, req: Request) -> None:
        """One more block for ``req`` (a decode crossing into a new block), when the caller knows the
        pool has one: ``allocate(req, 1)`` without its checks, for the scheduler's hot loop."""
        req.block_ids.append(self.pool.take_one())

    def register_filled_blocks(self, reqs: list[Request]) -> None:
        """``register_full_blocks(req, req.num_computed_tokens)`` for each request, in one call (a
        decode step's requests whose token fills a block)."""
        self._register(reqs)

    def register_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Add the full blocks among the first ``num_tokens`` tokens of ``req`` to the prefix cache.

        Called once those tokens' KV is (being) written by the step, so a later request can reuse it.
        """
        self._register((req,), num_tokens)

    def _register(self, reqs: Sequence[Request], num_tokens: int | None = None) -> None:
        """``register_full_blocks(req, num_tokens)`` for each request (by default up to its computed
        tokens); one ``BlocksStored`` event a call."""
        if not self.enable_prefix_caching:
            return
        bs, pool, pack = self.block_size, self.pool, self._pack
        register = pool.register
        stored = []
        for req in reqs:
            tokens = req.all_token_ids
            n_full = min(req.num_computed_tokens if num_tokens is None else num_tokens, len(tokens)) // bs
            start = max(req.num_registered_blocks, req.num_window_freed)  # (released blocks: not ours to enter)
            if n_full <= start:
                continue
            hashes, block_ids = req.block_hashes, req.block_ids
            if start > len(hashes):
                self.update_block_hashes(req)
            parent = hashes[start - 1] if start else root_hash(req.cache_salt, req.long_rope)
            for i in range(start, n_full):
                block_tokens = tokens[i * bs : (i + 1) * bs]
                if i < len(hashes):
                    h = hashes[i]
                else:  # hashed in the same pass (a decode's newly full block, most often)
                    h = hash_packed(parent, pack(*block_tokens))
                    hashes.append(h)
                if register(block_ids[i], h, parent, block_tokens):  # (a new list: the block keeps it)
                    stored.append(h)
                parent = h
            req.num_registered_blocks = n_full
        if pool.record_events and stored:
            pool.record_stored(stored)

    def unregister_unwritten(self, req: Request, num_written: int) -> None:
        """A step failed: forget the cache entries of ``req``'s blocks past its first ``num_written``
        tokens. They were registered as the step was scheduled, but the step wrote no KV into them,
        so a later prefix hit on them would read garbage."""
        keep = num_written // self.block_size
        if req.num_registered_blocks > keep:
            self.pool.forget(req.block_ids[keep : req.num_registered_blocks])
            req.num_registered_blocks = keep

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks. Tail blocks are released first so they are evicted first."""
        self.pool.release(req.block_ids[req.num_window_freed :][::-1])  # (a window's released ones: already back)
        req.block_ids = []
        req.num_registered_blocks = req.num_window_freed = 0

    def take_events(self) -> list[KVCacheEvent]:
        return self.pool.take_events()
