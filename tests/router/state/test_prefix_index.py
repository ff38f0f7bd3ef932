"""Cluster prefix index: Redis and local implementations, checked against each other."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from engine.block_hash import hash_blocks
from engine.kv_events import AllBlocksCleared, BlocksRemoved, BlocksStored
from router.state import RedisState
from router.state.prefix_index import LocalPrefixIndex, RedisPrefixIndex


def _chains(rng: random.Random, n: int = 6, block_size: int = 4) -> list[list[bytes]]:
    """Block-hash chains of prompts sharing prefixes (like a common system prompt)."""
    base = [rng.randrange(1000) for _ in range(6 * block_size)]
    out = []
    for _ in range(n):
        cut = rng.randrange(len(base) + 1)
        tail = [rng.randrange(1000) for _ in range(rng.randrange(2, 6) * block_size)]
        out.append(hash_blocks(base[:cut] + tail, block_size))
    return out


@pytest.fixture(params=["redis", "local"])
def impl(request: pytest.FixtureRequest, make_state: Callable[..., RedisState]) -> Callable[[], Any]:
    return (lambda: RedisPrefixIndex(make_state())) if request.param == "redis" else LocalPrefixIndex


def test_apply_longest_prefix_and_clear(impl: Callable[[], Any]) -> None:
    h = hash_blocks(list(range(40)), 4)  # 10 chained blocks

    async def main() -> None:
        idx = impl()
        await idx.apply("a", [BlocksStored(tuple(h[:6]))])
        await idx.apply("b", [BlocksStored(tuple(h[:3])), BlocksStored(tuple(h[4:8]))])  # gap at 3
        await idx.apply("c", [BlocksStored(tuple(h)), BlocksRemoved((h[0],))])  # lacks the first block
        got = await idx.longest_prefix(h, ["a", "b", "c", "nobody"])
        assert got == {"a": 6, "b": 3, "c": 0, "nobody": 0}
        assert await idx.longest_prefix(h[:2], ["a"]) == {"a": 2}
        assert await idx.longest_prefix([], ["a"]) == {"a": 0}
        assert await idx.longest_prefix(h, []) == {}
        await idx.apply("a", [BlocksRemoved((h[2],))])
        assert (await idx.longest_prefix(h, ["a"]))["a"] == 2
        await idx.clear_worker("b")
        assert (await idx.longest_prefix(h, ["b"]))["b"] == 0
        await idx.apply("a", [AllBlocksCleared(), BlocksStored((h[0],))])  # in order: clear, then store
        assert (await idx.longest_prefix(h, ["a"]))["a"] == 1
        await idx.replace_worker("c", h[:9])
        assert (await idx.longest_prefix(h, ["a", "c"])) == {"a": 1, "c": 9}
        with pytest.raises(TypeError):
            await idx.apply("a", ["not an event"])
        if isinstance(idx, RedisPrefixIndex):
            await idx.state.close()

    asyncio.run(main())


def test_redis_layout_and_cleanup(make_state: Callable[..., RedisState]) -> None:
    h = hash_blocks(list(range(12)), 4)

    async def main() -> None:
        st = make_state()
        idx = RedisPrefixIndex(st, ttl_s=100)
        await idx.apply("w1", [BlocksStored(tuple(h))])
        await idx.apply("w2", [BlocksStored(tuple(h[:1]))])
        r = st.client
        assert await r.smembers(st.key("blk", h[0].hex())) == {b"w1", b"w2"}
        assert await r.smembers(st.key("wblk", "w1")) == {x.hex().encode() for x in h}
        assert 0 < await r.pttl(st.key("blk", h[0].hex())) <= 100_000
        assert 0 < await r.pttl(st.key("wblk", "w1")) <= 100_000
        await idx.clear_worker("w1")
        assert await r.smembers(st.key("blk", h[0].hex())) == {b"w2"}
        assert not await r.exists(st.key("blk", h[1].hex()), st.key("wblk", "w1"))  # empty sets vanish
        await idx.clear_worker("w2")
        assert await r.keys(st.key("*")) == []  # nothing left behind
        await st.close()

    asyncio.run(main())


def test_ttl_is_renewed_by_lookup_hits(make_state: Callable[..., RedisState]) -> None:
    h = hash_blocks(list(range(8)), 4)

    async def main() -> None:
        st = make_state()
        idx = RedisPrefixIndex(st, ttl_s=2.0)  # (seconds: a loaded host's stalls stay well inside the margins)
        await idx.apply("w", [BlocksStored(tuple(h))])
        await asyncio.sleep(1.2)  # below half the TTL left: a hit renews it
        assert await idx.longest_prefix(h[:1], ["w"]) == {"w": 1}
        assert await st.client.pttl(st.key("blk", h[0].hex())) > 1600
        assert await st.client.pttl(st.key("wblk", "w")) > 1600
        assert await st.client.pttl(st.key("blk", h[1].hex())) < 1000  # not looked up: not renewed
        await asyncio.sleep(1.2)  # the behaviour under test: block 1's TTL runs out
        assert await idx.longest_prefix(h, ["w"]) == {"w": 1}  # block 1 expired, block 0 kept alive
        await st.close()

    asyncio.run(main())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_redis_and_local_agree_on_random_event_sequences(make_state: Callable[..., RedisState], seed: int) -> None:
    rng = random.Random(seed)
    chains = _chains(rng)
    universe = sorted({x for c in chains for x in c})
    workers = [f"w{i}" for i in range(4)]

    def random_events() -> list[Any]:
        evs: list[Any] = []
        for _ in range(rng.randrange(1, 4)):
            roll = rng.random()
            if roll < 0.55:
                c = rng.choice(chains)
                a = rng.randrange(len(c))
                evs.append(BlocksStored(tuple(c[a : rng.randrange(a + 1, len(c) + 1)])))
            elif roll < 0.95:
                evs.append(BlocksRemoved(tuple(rng.sample(universe, rng.randrange(1, 5)))))
            else:
                evs.append(AllBlocksCleared())
        return evs

    async def main() -> None:
        st = make_state()
        red, loc = RedisPrefixIndex(st), LocalPrefixIndex()
        for step in range(120):
            w = rng.choice(workers)
            roll = rng.random()
            if roll < 0.03:
                await red.clear_worker(w), await loc.clear_worker(w)
            elif roll < 0.05:
                snap = rng.sample(universe, rng.randrange(len(universe) // 2))
                await red.replace_worker(w, snap), await loc.replace_worker(w, snap)
            else:
                evs = random_events()
                await red.apply(w, evs), await loc.apply(w, evs)
            for c in chains:
                q = c[: rng.randrange(len(c) + 1)]
                cands = rng.sample(workers + ["ghost"], rng.randrange(1, 6))
                assert await red.longest_prefix(q, cands) == await loc.longest_prefix(q, cands), step
        # Full state equality, both directions of the mapping.
        for x in universe:
            got = {m.decode() for m in await st.client.smembers(st.key("blk", x.hex()))}
            assert got == loc._holders.get(x, set())
        for w in workers:
            got = {m.decode() for m in await st.client.smembers(st.key("wblk", w))}
            assert got == {x.hex() for x in loc._blocks.get(w, set())}
        await st.close()

    asyncio.run(main())
