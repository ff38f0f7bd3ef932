"""Heartbeat registry and the connection basics it relies on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from router.state import RedisState
from router.state.registry import WorkerRecord, WorkerRegistry


def test_key_namespacing_escapes_separators(make_state: Callable[..., RedisState]) -> None:
    st = make_state(name="prod")
    assert st.key("worker", "w1") == "baton:prod:worker:w1"
    # tenant "a:b" + key "c" must not collide with tenant "a" + key "b:c"
    assert st.key("idem", "a:b", "c") != st.key("idem", "a", "b:c")
    assert st.key("x", "100%") == "baton:prod:x:100%25"


def test_heartbeat_live_workers_roles_and_remove(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        reg = WorkerRegistry(st)
        assert await st.ping() and st.available
        await reg.heartbeat("p0", "prefill", {"addr": "10.0.0.1:5000"}, ttl_s=10)
        await reg.heartbeat("d0", "decode", {"blocks": 1024}, ttl_s=10)
        await reg.heartbeat("r0", "router", {}, ttl_s=10)  # router replicas register too
        live = await reg.live_workers()
        assert set(live) == {"p0", "d0", "r0"}
        assert isinstance(live["p0"], WorkerRecord)
        assert live["p0"].role == "prefill" and live["p0"].payload == {"addr": "10.0.0.1:5000"}
        assert live["p0"].ttl_s == 10 and live["p0"].heartbeat_at > 0
        assert set(await reg.live_workers("decode")) == {"d0"}
        assert set(await reg.live_workers("router")) == {"r0"}
        await reg.remove("d0")
        assert set(await reg.live_workers()) == {"p0", "r0"}
        assert not await st.client.exists(st.key("worker", "d0"))
        await st.close()

    asyncio.run(main())


def test_missed_heartbeats_expire_and_are_pruned(make_state: Callable[..., RedisState]) -> None:
    async def main() -> None:
        st = make_state()
        reg = WorkerRegistry(st)
        await reg.heartbeat("w-dead", "decode", {}, ttl_s=0.3)
        await reg.heartbeat("w-live", "decode", {}, ttl_s=5)
        assert set(await reg.live_workers()) == {"w-dead", "w-live"}
        for _ in range(3):  # w-live keeps heartbeating, w-dead stopped
            await asyncio.sleep(0.15)  # the behaviour under test: time passing past w-dead's TTL
            await reg.heartbeat("w-live", "decode", {"n": 1}, ttl_s=5)
        assert set(await reg.live_workers()) == {"w-live"}
        members = await st.client.smembers(st.key("workers"))
        assert members == {b"w-live"}  # expired id pruned from the members set
        await reg.heartbeat("w-dead", "decode", {}, ttl_s=5)  # it came back
        assert set(await reg.live_workers()) == {"w-dead", "w-live"}
        await st.close()

    asyncio.run(main())
