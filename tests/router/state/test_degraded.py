"""Degraded mode: Redis stops or hangs -> every component fails fast (or falls back); Redis
returns -> the same objects work again. Uses its own server, since these tests stop it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from baton.redis_server import EmbeddedRedis
from engine.kv_events import BlocksStored
from router.state import RedisState, StateUnavailable
from router.state.idempotency import IdempotencyStore
from router.state.journal import BatchJournal
from router.state.prefix_index import RedisPrefixIndex
from router.state.rate_limit import RateLimiter, TenantLimits
from router.state.registry import WorkerRegistry
from tests.waiting import async_wait_until

H = (b"\x01" * 16, b"\x02" * 16)
LIMITS = TenantLimits(requests_per_min=600)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


class Components:
    def __init__(self, st: RedisState) -> None:
        self.st = st
        self.reg, self.idx, self.rl = WorkerRegistry(st), RedisPrefixIndex(st), RateLimiter(st)
        self.idem, self.journal = IdempotencyStore(st), BatchJournal(st)

    def calls(self) -> dict[str, Callable[[], Awaitable[Any]]]:
        """One call per component that must raise StateUnavailable while Redis is down."""
        return {
            "heartbeat": lambda: self.reg.heartbeat("w0", "decode", {}, ttl_s=30),
            "live_workers": lambda: self.reg.live_workers(),
            "apply": lambda: self.idx.apply("w0", [BlocksStored(H)]),
            "longest_prefix": lambda: self.idx.longest_prefix(list(H), ["w0"]),
            "begin": lambda: self.idem.begin("t", "k", "fp"),
            "submit": lambda: self.journal.submit({"tenant": "t"}),
            "claim": lambda: self.journal.claim("r0", min_idle_ms=0),
            "get": lambda: self.journal.get("x", "t"),
        }

    async def check_working(self) -> None:
        await self.reg.heartbeat("w0", "decode", {}, ttl_s=30)
        assert set(await self.reg.live_workers()) == {"w0"}
        await self.idx.apply("w0", [BlocksStored(H)])
        assert await self.idx.longest_prefix(list(H), ["w0"]) == {"w0": 2}
        d = await self.rl.acquire("t", limits=LIMITS)
        assert d.allowed and not d.degraded
        assert (await self.idem.begin("t", f"k{time.monotonic()}", "fp")).state == "new"
        job = await self.journal.submit({"tenant": "t"})
        claimed = await self.journal.claim("r0", count=100, min_idle_ms=0)
        assert job in [c.job_id for c in claimed]
        for c in claimed:
            await self.journal.complete(c.job_id, c.entry_id, {})
        assert self.st.available


async def _assert_all_fail_fast(c: Components, limit_s: float = 1.0) -> None:
    for name, call in c.calls().items():
        t0 = time.monotonic()
        with pytest.raises(StateUnavailable):
            await call()
        assert time.monotonic() - t0 < limit_s, name
    assert not c.st.available
    d = await c.rl.acquire("t", limits=LIMITS)  # rate limits fall back to local buckets
    assert d.allowed and d.degraded


def test_redis_stops_and_restarts(server: EmbeddedRedis, cluster: str) -> None:
    async def main() -> None:
        c = Components(RedisState(server.url, cluster))
        await c.check_working()
        server.stop()
        t0 = time.monotonic()
        await _assert_all_fail_fast(c)
        assert await c.st.ping() is False
        assert time.monotonic() - t0 < 2.0
        server.start()  # same port, empty (no persistence)
        assert await c.st.ping()  # a probe clears the backoff at once
        await c.check_working()  # same objects; the journal re-creates its consumer group
        server.stop()
        await async_wait_until(lambda: not server.running, message="the server stopped")
        with pytest.raises(StateUnavailable):
            await c.reg.live_workers()
        server.start()
        await async_wait_until(lambda: c.st.available, message="the end of the backoff")  # no probe: recovery then
        await c.check_working()
        await c.st.close()

    asyncio.run(main())


def test_restart_between_calls_is_invisible(server: EmbeddedRedis, cluster: str) -> None:
    """Pooled connections to the old server are detected as dead when checked out."""

    async def main() -> None:
        c = Components(RedisState(server.url, cluster))
        await c.check_working()
        server.restart()
        # the behaviour under test: a gap between calls (the old server's close reaches the pool)
        await asyncio.sleep(0.05)
        await c.check_working()
        await c.st.close()

    asyncio.run(main())


def test_hung_redis_times_out(server: EmbeddedRedis, cluster: str) -> None:
    """A Redis that accepts but never answers (SIGSTOP) costs one timeout, not a hang."""

    async def main() -> None:
        c = Components(RedisState(server.url, cluster, timeout_s=0.3))
        await c.check_working()
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            await _assert_all_fail_fast(c)
            assert time.monotonic() - t0 < 1.5  # one timeout, then backoff: no per-call waits
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert await c.st.ping()
        await c.check_working()
        await c.st.close()

    asyncio.run(main())
