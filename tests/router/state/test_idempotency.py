"""Idempotency keys: claim once, report in-progress, replay the stored result, detect misuse."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from router.state import RedisState
from router.state.idempotency import Begin, IdempotencyStore


def test_new_in_progress_done(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        store = IdempotencyStore(st)
        assert await store.begin("acme", "k1", "fp-a") == Begin("new")
        assert await store.begin("acme", "k1", "fp-a") == Begin("in_progress")
        assert await store.complete("acme", "k1", {"text": "hi", "tokens": [1, 2]})
        assert await store.begin("acme", "k1", "fp-a") == Begin("done", {"text": "hi", "tokens": [1, 2]})
        assert await store.begin("acme", "k1", "fp-b") == Begin("mismatch")  # same key, other body
        assert not await store.release("acme", "k1")  # a stored result is never released
        assert (await store.begin("acme", "k1", "fp-a")).state == "done"
        ttl = await st.client.pttl(st.key("idem", "acme", "k1"))
        assert 86_000_000 < ttl <= 86_400_000  # result kept 24 h from completion
        await st.close()

    asyncio.run(main())


def test_mismatch_while_in_progress_release_and_tenant_scope(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        store = IdempotencyStore(st)
        assert (await store.begin("acme", "k", "fp1")).state == "new"
        assert (await store.begin("acme", "k", "fp2")).state == "mismatch"
        assert (await store.begin("globex", "k", "fp2")).state == "new"  # keys are per tenant
        assert (await store.begin("acme:k", "", "fp1")).state == "new"  # no collision via separators
        assert await store.release("acme", "k")  # the request failed
        assert (await store.begin("acme", "k", "fp2")).state == "new"  # a retry may run
        await st.close()

    asyncio.run(main())


def test_concurrent_begins_claim_exactly_once(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        store = IdempotencyStore(st)
        got = await asyncio.gather(*(store.begin("t", "race", "fp") for _ in range(30)))
        assert sorted(b.state for b in got).count("new") == 1
        assert {b.state for b in got} == {"new", "in_progress"}
        await st.close()

    asyncio.run(main())


def test_lease_expiry_frees_a_crashed_claim(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        store = IdempotencyStore(st, lease_s=0.2)
        assert (await store.begin("t", "k", "fp")).state == "new"  # then the router "crashes"
        assert 0 < await st.client.pttl(st.key("idem", "t", "k")) <= 200
        await asyncio.sleep(0.3)  # the behaviour under test: the lease (0.2 s) runs out
        assert (await store.begin("t", "k", "fp")).state == "new"  # a retry is not blocked for 24 h
        assert await store.complete("t", "k", {"ok": True})
        await asyncio.sleep(0.3)  # past the lease: completion switched it to the full TTL (the behaviour)
        assert await store.begin("t", "k", "fp") == Begin("done", {"ok": True})
        assert (await store.begin("t", "k2", "fp", lease_s=0.1)).state == "new"
        await asyncio.sleep(0.2)  # the behaviour under test: k2's lease (0.1 s) runs out
        assert not await store.complete("t", "k2", {"late": True})  # claim gone: nothing stored
        assert (await store.begin("t", "k2", "fp")).state == "new"
        await st.close()

    asyncio.run(main())
