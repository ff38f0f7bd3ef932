"""Idempotency in the router (router/cluster_state.py): retries waiting on a key in progress back off
and are bounded per key, and the replica's own records (no Redis, or while it is away) expire and
are bounded like the Redis keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from router.api import GenerationResult, RouterError, Usage
from router.cluster_state import ClusterState
from router.state import RedisState
from router.state.idempotency import Begin, LocalIdempotencyStore
from tests.waiting import async_wait_until

RESULT = GenerationResult("r1", "xy", (7, 8), "length", Usage(3, 2), "interactive")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_local_claims_expire_like_the_redis_keys() -> None:
    clock = FakeClock()
    store = LocalIdempotencyStore(ttl_s=100.0, lease_s=10.0, clock=clock)
    assert store.begin("t", "k", "fp") == Begin("new")
    assert store.begin("t", "k", "fp") == Begin("in_progress")
    assert store.begin("t", "k", "other") == Begin("mismatch")
    clock.t += 11  # the lease ran out (the request never finished): a retry runs
    assert store.begin("t", "k", "fp") == Begin("new")
    assert store.complete("t", "k", {"text": "hi"})
    clock.t += 50  # kept ttl_s from completion, not from the claim
    assert store.begin("t", "k", "fp") == Begin("done", {"text": "hi"})
    assert not store.release("t", "k")  # a stored result is never thrown away
    clock.t += 51
    assert store.begin("t", "k", "fp") == Begin("new")
    assert store.release("t", "k") and store.begin("t", "k", "fp") == Begin("new")
    clock.t += 11
    assert not store.complete("t", "k", {"late": True})  # the claim expired: nothing stored
    assert len(store) == 0


def test_local_claims_are_bounded_least_recently_used_first() -> None:
    store = LocalIdempotencyStore(max_entries=3, clock=FakeClock())
    for k in "abc":
        store.begin("t", k, "fp")
        store.complete("t", k, {"k": k})
    assert store.begin("t", "a", "fp").state == "done"  # used: "b" is now the oldest
    store.begin("t", "d", "fp")
    assert len(store) == 3
    assert store.begin("t", "b", "fp").state == "new"  # dropped (and claimed again, dropping "c")
    assert store.begin("t", "a", "fp") == Begin("done", {"k": "a"})


def test_without_redis_the_routers_records_are_bounded() -> None:
    async def main() -> None:
        cs = ClusterState.local("r")
        cs._local_idem.max_entries = 10
        for i in range(50):
            assert await cs.idempotency_begin("t", f"k{i}", "fp") is None
            await cs.idempotency_store("t", f"k{i}", RESULT)
        assert len(cs._local_idem) == 10
        assert await cs.idempotency_begin("t", "k49", "fp") == RESULT  # the recent ones still replay
        assert cs._local_idem.ttl_s == 86_400.0 and cs._local_idem.lease_s == 900.0

    asyncio.run(main())


def test_a_waiting_retry_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters polled every 0.1 s for up to 600 s: 200 of them made Redis run ~5,800 commands a second."""
    real_sleep = asyncio.sleep
    delays: list[float] = []

    async def main() -> None:
        cs = ClusterState.local("r")

        async def sleep(d: float) -> None:
            delays.append(d)
            if len(delays) == 8:  # the first attempt finishes meanwhile
                await cs.idempotency_store("t", "k", RESULT)
            await real_sleep(0)

        assert await cs.idempotency_begin("t", "k", "fp") is None
        monkeypatch.setattr(asyncio, "sleep", sleep)  # (what cluster_state calls)
        assert await cs.idempotency_begin("t", "k", "fp") == RESULT
        monkeypatch.undo()
        assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
        assert cs._idem_waiters == {}

    asyncio.run(main())


def test_waiters_on_one_key_are_bounded(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        cs = ClusterState("r", make_state())
        cs.max_idem_waiters = 4
        assert await cs.idempotency_begin("t", "k", "fp") is None  # the first attempt runs
        waiters = [asyncio.create_task(cs.idempotency_begin("t", "k", "fp")) for _ in range(4)]
        await async_wait_until(
            lambda: cs._idem_waiters.get(("t", "k"), 0) == 4, message="four waiters"
        )  # (each asks Redis first)
        assert not any(w.done() for w in waiters)
        t0 = time.monotonic()
        with pytest.raises(RouterError) as e:  # one too many: refused at once, not one more poller
            await asyncio.wait_for(cs.idempotency_begin("t", "k", "fp"), 5.0)
        assert e.value.code == "idempotency_in_progress" and time.monotonic() - t0 < 2.5
        assert await cs.idempotency_begin("t", "other", "fp") is None  # per key
        waiters[0].cancel()  # a client that went away frees its place
        await asyncio.gather(waiters[0], return_exceptions=True)
        extra = asyncio.create_task(cs.idempotency_begin("t", "k", "fp"))
        await async_wait_until(lambda: cs._idem_waiters.get(("t", "k"), 0) == 4, message="the freed place taken")
        assert not extra.done()
        await cs.idempotency_store("t", "k", RESULT)
        got = await asyncio.wait_for(asyncio.gather(*waiters[1:], extra), 5.0)
        assert got == [RESULT] * 4 and cs._idem_waiters == {}
        await cs.redis.close()

    asyncio.run(main())
