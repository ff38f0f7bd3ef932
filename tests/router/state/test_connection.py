"""The router's Redis client under a burst: more concurrent calls than pooled connections wait for one
(within the call's deadline) instead of failing, and a healthy Redis never looks down."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from router.state import RedisState
from router.state.idempotency import IdempotencyStore


def test_a_burst_beyond_the_pool_waits_for_connections_and_stays_available(
    make_state: Callable[..., RedisState],
) -> None:
    async def main() -> None:
        st = make_state(max_connections=4)
        idem = IdempotencyStore(st)
        # 150 concurrent first uses of distinct keys through 4 connections: each must be recorded.
        # With redis-py's default pool the extra callers got MaxConnectionsError, a ConnectionError,
        # which marked Redis down ("degraded mode") and dropped their idempotency records.
        begun = await asyncio.gather(*(idem.begin("acme", f"key-{i}", "fp") for i in range(150)))
        assert [b.state for b in begun] == ["new"] * 150
        assert st.available and st.last_error is None
        again = await asyncio.gather(*(idem.begin("acme", f"key-{i}", "fp") for i in range(150)))
        assert all(b.state == "in_progress" for b in again)  # every record is there
        await st.close()

    asyncio.run(main())
