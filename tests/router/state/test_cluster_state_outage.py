"""The router's shared state across a Redis outage (router/cluster_state.py): when Redis returns,
the prefix index in it is what this router saw meanwhile (a worker emptied during the outage too,
and after a restart that lost the data between two heartbeats), and a keyed request that finished
during the outage is replayed, not run again. Its own server: these tests stop it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from baton.redis_server import EmbeddedRedis
from engine.kv_events import BlocksRemoved, BlocksStored
from router.api import GenerationResult, Usage
from router.cluster_state import HEARTBEAT_S, ClusterState
from router.state import RedisState
from router.state.prefix_index import RedisPrefixIndex
from router.worker_pool import WorkerPool
from tests.waiting import async_wait_until

H = tuple(bytes([i]) * 16 for i in range(1, 4))


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


async def _unreachable_for_a_moment(srv: EmbeddedRedis, state: ClusterState) -> None:
    """One failed probe while Redis hangs: the client then fails fast for its backoff, data kept."""
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        assert await state.redis.ping() is False
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["worker_forgotten", "all_blocks_evicted"])
def test_a_worker_emptied_while_redis_was_away_is_emptied_in_it_too(server, cluster, how) -> None:
    """The re-seed wrote only workers holding blocks in the local view: w1 kept its three blocks in
    Redis (for the index's hour-long TTL), and placement sent prompts to it for a cache it lacked."""

    async def main() -> None:
        redis = RedisState(server.url, cluster, timeout_s=0.5, backoff_s=1.0)
        state = ClusterState("router-a", redis)
        try:
            await state.prefix_apply("w1", [BlocksStored(H)])
            await state.prefix_apply("w2", [BlocksStored(H[:1])])
            await _unreachable_for_a_moment(server, state)
            if how == "worker_forgotten":
                await state.forget_worker("w1")
            else:
                await state.prefix_apply("w1", [BlocksRemoved(H)])
            assert await state.prefix_lookup(list(H), ["w1", "w2"]) == {"w1": 0, "w2": 1}  # local view
            await async_wait_until(lambda: redis.available, message="the end of the backoff")
            await state.prefix_apply("w2", [BlocksStored(H[1:2])])  # Redis is back: re-seeded from the local view
            shared = RedisPrefixIndex(redis)
            assert await shared.longest_prefix(list(H), ["w1", "w2"]) == {"w1": 0, "w2": 2}
        finally:
            await redis.close()

    asyncio.run(main())


def test_a_redis_restart_between_heartbeats_reseeds_the_prefix_index(server, cluster) -> None:
    """A restart (no persistence) faster than a heartbeat was never noticed: the index stayed empty,
    and blocks that were only hit afterwards were never stored again."""

    async def main() -> None:
        redis = RedisState(server.url, cluster)
        state = ClusterState("router-a", redis)
        await state.start(dict, WorkerPool([], []))
        try:
            await state.prefix_apply("d0", [BlocksStored(H)])
            await async_wait_until(lambda: state._redis_run_id is not None, message="a heartbeat seeing this server")
            server.restart()  # here: its child dies with the thread that started it (PR_SET_PDEATHSIG)
            shared = RedisPrefixIndex(redis)

            async def reseeded() -> bool:
                try:
                    return await shared.longest_prefix(list(H), ["d0"]) == {"d0": 3}
                except Exception:  # noqa: BLE001 - the pool's old connections, right after the restart
                    return False

            await async_wait_until(
                reseeded, timeout_s=5 * HEARTBEAT_S, interval_s=0.1, message="the index re-seeded after the restart"
            )
        finally:
            await state.stop()

    asyncio.run(main())


def test_a_keyed_request_finished_while_redis_was_away_is_replayed_after_it_returns(server, cluster) -> None:
    """Its claim and result were in this replica's memory only, and Redis (asked first) said "new":
    the retry ran the request a second time."""

    async def main() -> None:
        redis = RedisState(server.url, cluster, timeout_s=0.5, backoff_s=1.0)
        state = ClusterState("router-a", redis)
        try:
            await _unreachable_for_a_moment(server, state)
            assert await state.idempotency_begin("alice", "K1", "fp") is None  # runs, claimed here
            done = GenerationResult("first", "xy", (7, 8), "length", Usage(3, 2, 0), "interactive")
            await state.idempotency_store("alice", "K1", done)
            await async_wait_until(lambda: redis.available, message="the end of the backoff")  # Redis answers again
            assert await redis.ping()
            replay = await state.idempotency_begin("alice", "K1", "fp")
            assert replay is not None and replay.token_ids == (7, 8) and replay.request_id == "first"
        finally:
            await redis.close()

    asyncio.run(main())
