"""Token buckets: one table of cases run against the Redis script, the local buckets and the
degraded-mode fallback; plus atomicity under concurrency and replicas sharing a bucket."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from baton.redis_server import free_port
from router.state import RedisState
from router.state.rate_limit import Decision, LocalRateLimiter, LocalTokenBucket, RateLimiter, TenantLimits

INF = math.inf


@dataclass(frozen=True)
class Step:
    n_req: float
    n_tok: float
    allowed: bool
    reason: str | None = None
    retry: float = 0.0  # expected retry_after_s
    advance_s: float = 0.0  # time passing before this step


R10 = TenantLimits(requests_per_min=600, burst_s=1)  # 10 requests/s, bucket of 10
T100 = TenantLimits(tokens_per_min=6000, burst_s=1)  # 100 tokens/s, bucket of 100
BOTH = TenantLimits(requests_per_min=600, tokens_per_min=6000, burst_s=1)

CASES: dict[str, tuple[TenantLimits, list[Step]]] = {
    "burst": (R10, [Step(1, 0, True)] * 10 + [Step(1, 0, False, "requests", 0.1)]),
    "refill": (R10, [Step(10, 0, True), Step(2, 0, True, advance_s=0.25), Step(1, 0, False, "requests", 0.05)]),
    "token_only": (
        T100,
        [
            Step(1, 60, True),
            Step(1, 60, False, "tokens", 0.2),
            *[Step(1, 0, True)] * 20,  # requests are unlimited
            Step(1, 60, True, advance_s=0.25),
            Step(0, 10, False, "tokens", 0.05),
        ],
    ),
    "unlimited": (TenantLimits(), [Step(1000, 10**9, True)] * 3),
    "larger_than_bucket": (T100, [Step(1, 101, False, "tokens", INF), Step(1, 100, True)]),
    "both_or_neither": (
        BOTH,
        [
            Step(1, 90, True),
            Step(1, 20, False, "tokens", 0.1),  # refused: the request slot is not spent
            Step(9, 0, True),
            Step(1, 0, False, "requests", 0.1),
        ],
    ),
    "binding_bucket_wins": (
        BOTH,
        [Step(10, 100, True), Step(1, 50, False, "tokens", 0.5), Step(5, 1, False, "requests", 0.5)],
    ),
    "zero_amounts": (R10, [Step(10, 0, True), Step(0, 0, True), Step(0, 5, True), Step(1, 0, False, "requests", 0.1)]),
}


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _check(name: str, i: int, step: Step, d: Decision, tol: float) -> None:
    where = f"{name} step {i}: {d}"
    assert d.allowed == step.allowed, where
    assert d.reason == step.reason, where
    if step.retry == INF:
        assert d.retry_after_s == INF, where
    else:
        assert d.retry_after_s == pytest.approx(step.retry, abs=tol), where


@pytest.mark.parametrize("name", list(CASES))
def test_local_buckets(name: str) -> None:
    limits, steps = CASES[name]
    clock = FakeClock()
    rl = LocalRateLimiter(clock)
    for i, s in enumerate(steps):
        clock.t += s.advance_s
        _check(name, i, s, rl.acquire("t", s.n_req, s.n_tok, limits=limits), tol=1e-9)


def test_degraded_fallback_uses_the_same_semantics() -> None:
    """Redis unreachable: RateLimiter answers from its local buckets, flagged degraded."""
    clock = FakeClock()

    async def main() -> None:
        st = RedisState(f"redis://127.0.0.1:{free_port()}/0", "c", timeout_s=0.2)  # nothing listens
        rl = RateLimiter(st, local=LocalRateLimiter(clock))
        for name, (limits, steps) in CASES.items():
            for i, s in enumerate(steps):
                clock.t += s.advance_s
                d = await rl.acquire(f"{name}", s.n_req, s.n_tok, limits=limits)
                _check(name, i, s, d, tol=1e-9)
                assert d.degraded or limits.unlimited
        assert not st.available
        await st.close()

    asyncio.run(main())


SLOW = 10  # Redis buckets refill by Redis' own clock: their cases run 10x slower (below)


def _slowed(limits: TenantLimits) -> TenantLimits:
    """The same buckets (capacities) refilling ``SLOW`` times slower."""
    slower = {f: getattr(limits, f) / SLOW for f in ("requests_per_min", "tokens_per_min") if getattr(limits, f)}
    return dataclasses.replace(limits, burst_s=limits.burst_s * SLOW, **slower)


def test_redis_buckets(make_state: Callable[..., RedisState]) -> None:
    """The table against the Redis script, in real time: rates ``SLOW`` times slower so that a
    loaded host's stalls between steps (up to ~0.5 s) do not refill a unit, and each retry checked
    against the time that really passed (the bucket refilled for that long, so the wait is at most
    that much shorter than the table's)."""

    async def run_case(rl: RateLimiter, name: str) -> None:
        limits, steps = CASES[name]
        limits = _slowed(limits)
        planned, start = 0.0, time.monotonic()
        for i, s in enumerate(steps):
            if s.advance_s:
                await asyncio.sleep(s.advance_s * SLOW)  # the behaviour under test: the bucket refills in real time
                planned += s.advance_s * SLOW
            d = await rl.acquire(name, s.n_req, s.n_tok, limits=limits)
            slack = time.monotonic() - start - planned  # time passed beyond the table's
            where = f"{name} step {i}: {d} ({slack:.3f} s beyond the plan)"
            assert not d.degraded, where
            assert d.allowed == s.allowed, where
            assert d.reason == s.reason, where
            expected = s.retry * SLOW
            if expected in (0.0, INF):
                assert d.retry_after_s == expected, where
            else:
                assert expected - slack - 0.01 <= d.retry_after_s <= expected + 0.01, where

    async def main() -> None:
        st = make_state()
        rl = RateLimiter(st)
        await asyncio.gather(*(run_case(rl, name) for name in CASES))  # tenants are independent
        assert await st.client.keys(st.key("rl", "req", "unlimited")) == []  # unlimited: no Redis state
        ttl = await st.client.pttl(st.key("rl", "req", "burst"))
        assert 0 < ttl <= 1000 * (SLOW + 1)  # empty bucket of 10 at 1/s: full again after 10 s (+1 s margin)
        await st.close()

    asyncio.run(main())


def test_concurrent_acquires_are_atomic(make_state: Callable[..., RedisState]) -> None:
    limits = TenantLimits(requests_per_min=10)  # bucket of 10, refills 1 per 6 s

    async def main() -> None:
        st = make_state()
        rl = RateLimiter(st)
        ds = await asyncio.gather(*(rl.acquire("t", limits=limits) for _ in range(50)))
        assert sum(d.allowed for d in ds) == 10
        assert all(d.reason == "requests" and 0 < d.retry_after_s <= 6 for d in ds if not d.allowed)
        await st.close()

    asyncio.run(main())


def test_two_router_replicas_share_one_bucket(make_state: Callable[..., RedisState]) -> None:
    limits = TenantLimits(requests_per_min=10, tokens_per_min=1000)

    async def main() -> None:
        a, b = make_state(), make_state()  # two clients, two connection pools: two "routers"
        ra, rb = RateLimiter(a), RateLimiter(b)
        assert (await ra.acquire("t", 6, 100, limits=limits)).allowed
        assert not (await rb.acquire("t", 5, 0, limits=limits)).allowed  # only 4 left, shared
        assert (await rb.acquire("t", 4, 0, limits=limits)).allowed
        d = await ra.acquire("t", 1, 0, limits=limits)
        assert not d.allowed and d.reason == "requests" and not d.degraded
        assert (await rb.acquire("other-tenant", 10, 0, limits=limits)).allowed  # per tenant
        await a.close(), await b.close()

    asyncio.run(main())


def test_local_token_bucket_and_validation() -> None:
    clock = FakeClock()
    b = LocalTokenBucket(2.0, 10.0, clock)
    assert b.level() == 10 and b.full
    b.take(10)
    assert b.wait_s(4) == pytest.approx(2.0) and b.wait_s(11) == INF
    clock.t += 100
    assert b.level() == 10  # never above capacity
    b.take(6)
    b.reconfigure(1.0, 3.0)  # lower limits: level capped to the new capacity
    assert b.level() == 3 and b.wait_s(3) == 0
    assert TenantLimits(requests_per_min=60).buckets()[0] == (1.0, 60.0)  # default burst: 1 min
    with pytest.raises(ValueError):
        TenantLimits(requests_per_min=0)
    with pytest.raises(ValueError):
        LocalRateLimiter().acquire("t", -1, limits=R10)


def test_local_refund_gives_back_what_was_taken() -> None:
    clock = FakeClock()
    rl = LocalRateLimiter(clock)
    assert rl.acquire("t", 10, 100, limits=BOTH).allowed
    assert not rl.acquire("t", 1, 0, limits=BOTH).allowed
    rl.refund("t", 4, 40, limits=BOTH)  # admission refused four of them after the charge
    assert rl.acquire("t", 4, 40, limits=BOTH).allowed
    assert not rl.acquire("t", 1, 0, limits=BOTH).allowed
    rl.refund("t", 100, 1000, limits=BOTH)  # never above capacity
    assert not rl.acquire("t", 11, 0, limits=BOTH).allowed and rl.acquire("t", 10, 100, limits=BOTH).allowed
    rl.refund("never-charged", 5, 5, limits=BOTH)  # a bucket not held is full: nothing to do
    assert ("never-charged", 0) not in rl._buckets


def test_redis_refund_gives_back_what_was_taken(make_state: Callable[..., RedisState]) -> None:
    limits = TenantLimits(requests_per_min=10, tokens_per_min=1000)  # slow refill: 1 request per 6 s

    async def main() -> None:
        st = make_state()
        rl = RateLimiter(st)
        assert (await rl.acquire("t", 10, 500, limits=limits)).allowed
        assert not (await rl.acquire("t", 1, 0, limits=limits)).allowed
        await rl.refund("t", 3, 300, limits=limits)
        assert (await rl.acquire("t", 3, 800, limits=limits)).allowed  # 3 requests, 500 + 300 tokens back
        assert not (await rl.acquire("t", 1, 0, limits=limits)).allowed
        await rl.refund("t", 50, 5000, limits=limits)  # capped: a full bucket is no bucket
        assert await st.client.exists(st.key("rl", "req", "t"), st.key("rl", "tok", "t")) == 0
        assert not (await rl.acquire("t", 11, 0, limits=limits)).allowed
        await rl.refund("other", 1, 1, limits=limits)  # never charged: no key is created
        assert await st.client.exists(st.key("rl", "req", "other")) == 0
        await st.close()

    asyncio.run(main())


def test_a_degraded_charge_is_refunded_locally_and_a_shared_one_not_while_redis_is_away() -> None:
    clock = FakeClock()

    async def main() -> None:
        st = RedisState(f"redis://127.0.0.1:{free_port()}/0", "c", timeout_s=0.2)  # nothing listens
        rl = RateLimiter(st, local=LocalRateLimiter(clock))
        d = await rl.acquire("t", 10, 0, limits=R10)
        assert d.allowed and d.degraded
        await rl.refund("t", 10, 0, limits=R10, degraded=True)
        assert (await rl.acquire("t", 10, 0, limits=R10)).allowed  # given back to the local buckets
        await rl.refund("t", 10, 0, limits=R10)  # taken from Redis, which is away: dropped quietly
        assert not (await rl.acquire("t", 1, 0, limits=R10)).allowed
        await st.close()

    asyncio.run(main())
