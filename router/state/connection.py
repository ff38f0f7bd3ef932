"""The router's connection to the shared Redis, built to fail fast and recover by itself.

A router must keep serving when Redis goes away ("degraded mode"), so a dead or unreachable
Redis has to cost a caller at most about one timeout, never a hang and never a retry storm:

* socket and connect timeouts are short (0.5 s by default) and redis-py's retries are off
  (its default would retry 10 times with backoff, i.e. seconds per call);
* every call also runs under an overall deadline, so connect + write + read cannot add up;
* after a failure the state is marked unavailable for ``backoff_s``: calls in that window fail
  at once with :class:`StateUnavailable` without touching the network, so a dead Redis is
  probed at most about once per backoff window per router;
* idle pooled connections are dropped on failure, and checked for EOF when taken from the pool
  (RESP2, see below), so the first call after Redis returns does not fail on a stale socket;
  :meth:`RedisState.ping` probes even inside the backoff window and clears it on success (for health loops).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "Redis cannot serve us right now" (as opposed to a bug in a command).
# BusyLoadingError (a restarting server loading its data) is a ConnectionError subclass;
# ReadOnlyError is what a demoted primary answers during a failover.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ReadOnlyError,
    OSError,  # includes the builtin TimeoutError raised by the overall deadline
)


class StateUnavailable(Exception):
    """Shared state could not be read or written: Redis is down, unreachable, or backing off.

    Callers catch this and fall back (local index, local rate limits, or a 503), never hang.
    """


def _escape(part: object) -> str:
    # ':' separates key parts and '%' is the escape character, so tenant "a:b" + key "c" and
    # tenant "a" + key "b:c" can never map to the same Redis key.
    return str(part).replace("%", "%25").replace(":", "%3A")


class RedisState:
    """One cluster's view of Redis: a fast-failing async client, key naming and availability."""

    def __init__(
        self,
        url: str,
        cluster: str,
        *,
        timeout_s: float = 0.5,
        backoff_s: float = 0.75,
        deadline_s: float | None = None,
        max_connections: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not cluster:
            raise ValueError("cluster name must be non-empty")
        self.url = url
        u = urlsplit(url)
        self.where = f"{u.hostname}:{u.port or 6379}"  # for logs: never the password
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        # Connect and read each get timeout_s; the whole call gets a little more than both.
        self.deadline_s = deadline_s if deadline_s is not None else 2.5 * timeout_s
        self._clock = clock
        self._down_until = 0.0  # clock() before which calls fail without touching the network
        self._down = False  # for logging transitions only
        self.last_error: BaseException | None = None
        # A blocking pool: a burst of more concurrent calls than ``max_connections`` waits (within the
        # call's deadline) for a connection. The default pool raised MaxConnectionsError instead, a
        # ConnectionError that put a healthy Redis into degraded mode (idempotency records lost).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=self.deadline_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
            # RESP2: stable reply shapes, and the pool then checks idle connections for EOF on
            # checkout (redis-py 8 skips that under RESP3 with maintenance notifications), so a
            # Redis restart between two calls is invisible instead of failing the next call.
            protocol=2,
        )
        self.client: aioredis.Redis = aioredis.Redis.from_pool(pool)  # closing the client closes the pool
        self._prefix = f"baton:{_escape(cluster)}:"

    def __repr__(self) -> str:
        return f"RedisState(cluster={self.cluster!r}, available={self.available})"

    # -- naming ---------------------------------------------------------------------------------

    def key(self, *parts: object) -> str:
        """``baton:<cluster>:<part>:<part>...`` with ':' and '%' escaped inside parts."""
        return self._prefix + ":".join(_escape(p) for p in parts)

    # -- availability ---------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Cheap: False while backing off after a failure (no I/O)."""
        return self._clock() >= self._down_until

    def _mark_up(self) -> None:
        if self._down:
            log.info("redis %s is back (cluster %s)", self.where, self.cluster)
            self._down = False
        self._down_until = 0.0

    async def _mark_down(self, err: BaseException) -> None:
        self.last_error = err
        self._down_until = self._clock() + self.backoff_s
        if not self._down:
            log.warning("redis %s unavailable (cluster %s): %r; degraded mode", self.where, self.cluster, err)
            self._down = True
        try:  # drop idle (probably dead) connections so the next attempt reconnects
            await self.client.connection_pool.disconnect(inuse_connections=False)
        except Exception:  # noqa: BLE001 - best effort on a broken pool
            pass

    def _unavailable(self, err: BaseException | None = None) -> StateUnavailable:
        why = f": {err!r}" if err is not None else f" (backing off after {self.last_error!r})"
        return StateUnavailable(f"redis state for cluster {self.cluster!r} unavailable{why}")

    # -- calls ----------------------------------------------------------------------------------

    async def run(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run ``op(client)`` under the deadline; connection trouble becomes StateUnavailable."""
        if not self.available:
            raise self._unavailable()
        try:
            async with asyncio.timeout(self.deadline_s):
                result = await op(self.client)
        except _UNAVAILABLE as e:
            await self._mark_down(e)
            raise self._unavailable(e) from e
        self._mark_up()
        return result

    async def ping(self) -> bool:
        """A real PING, even while backing off (it is the probe); updates availability."""
        try:
            async with asyncio.timeout(self.deadline_s):
                ok = bool(await self.client.ping())
        except _UNAVAILABLE as e:
            await self._mark_down(e)
            return False
        self._mark_up()
        return ok

    async def server_time(self) -> float:
        """Redis server clock in seconds (shared by all replicas, unlike their local clocks)."""
        sec, usec = await self.run(lambda r: r.time())
        return sec + usec / 1e6

    async def run_id(self) -> str:
        """The server process's random id: another one means Redis restarted (its data may be gone)."""
        info = await self.run(lambda r: r.info("server"))
        return str(info.get("run_id", ""))

    async def close(self) -> None:
        """Close the client and its pool (must be awaited on the loop that used it)."""
        try:
            await self.client.aclose()
        except Exception:  # noqa: BLE001 - closing a client of a dead server must not raise
            pass
