"""Idempotency keys: a client retrying a request with the same key gets the first run's result.

One Redis hash per (tenant, key), ``baton:<c>:idem:<tenant>:<key>`` with fields ``state``
(``in_progress`` | ``done``), ``fp`` (fingerprint of the request body), ``ttl`` (ms) and
``result`` (JSON). The first :meth:`IdempotencyStore.begin` claims the key atomically (a Lua
script: create-if-absent, else report), so of N concurrent retries exactly one runs.

Lifetimes: an in-progress claim is a *lease* (``lease_s``, 15 min by default) so a router that
crashes mid-request does not block retries of that key for a day; :meth:`complete` then keeps the
result for ``ttl_s`` (24 h by default) from completion. A request that fails calls
:meth:`release` so a retry may run it again.

Degraded mode: every method raises :class:`StateUnavailable`; the caller chooses between serving
without deduplication and refusing keyed requests (503) until Redis returns. The router keeps
deduplicating in this replica's memory then (:class:`LocalIdempotencyStore`: the same lifetimes,
and at most ``max_entries`` keys, least recently used dropped first).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from redis.typing import EncodableT

from router.state.connection import RedisState

BeginState = Literal["new", "in_progress", "done", "mismatch"]

# KEYS[1]; ARGV: fingerprint, lease ms, ttl ms. Returns {state[, result json]}.
_BEGIN = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'in_progress', 'fp', ARGV[1], 'ttl', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'new'}
end
local v = redis.call('HMGET', KEYS[1], 'state', 'fp', 'result')
if v[2] ~= ARGV[1] then return {'mismatch'} end
return {v[1], v[3]}
"""

# KEYS[1]; ARGV: result json. 0 if the claim is gone (lease expired or released).
_COMPLETE = """
local ttl = redis.call('HGET', KEYS[1], 'ttl')
if not ttl then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""

# KEYS[1]. Only an in-progress claim is released: a stored result is never thrown away.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'state') == 'in_progress' then return redis.call('DEL', KEYS[1]) end
return 0
"""


TTL_S = 86_400.0  # a stored result answers retries this long
LEASE_S = 900.0  # an in-progress claim lasts this long unless completed or released


@dataclass(frozen=True, slots=True)
class Begin:
    """``new``: you own the key, run the request. ``in_progress``: another attempt is running.
    ``done``: ``result`` holds the first run's result. ``mismatch``: the key was used with a
    different request body (answer 422/409)."""

    state: BeginState
    result: dict[str, Any] | None = None


class IdempotencyStore:
    """Tenant-scoped idempotency keys in Redis."""

    def __init__(self, state: RedisState, *, ttl_s: float = TTL_S, lease_s: float = LEASE_S) -> None:
        self.state = state
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self._begin = state.client.register_script(_BEGIN)
        self._complete = state.client.register_script(_COMPLETE)
        self._release = state.client.register_script(_RELEASE)

    def _key(self, tenant: str, key: str) -> str:
        return self.state.key("idem", tenant, key)

    async def begin(
        self, tenant: str, key: str, fingerprint: str, ttl_s: float | None = None, *, lease_s: float | None = None
    ) -> Begin:
        """Claim ``key`` for this attempt, or report what a previous attempt left."""
        ttl_ms = max(1, int((ttl_s if ttl_s is not None else self.ttl_s) * 1000))
        lease_ms = max(1, int((lease_s if lease_s is not None else self.lease_s) * 1000))
        keys = [self._key(tenant, key)]
        args: list[EncodableT] = [fingerprint, min(lease_ms, ttl_ms), ttl_ms]
        res = await self.state.run(lambda r: self._begin(keys=keys, args=args, client=r))
        state = res[0].decode()
        if state == "done":
            return Begin("done", json.loads(res[1]) if len(res) > 1 and res[1] is not None else None)
        return Begin(state)

    async def complete(self, tenant: str, key: str, result: dict[str, Any]) -> bool:
        """Store the result for retries (kept ``ttl_s``). False if the claim had already expired
        or been released, in which case nothing is stored and a retry will run again."""
        keys, args = [self._key(tenant, key)], [json.dumps(result)]
        return bool(await self.state.run(lambda r: self._complete(keys=keys, args=args, client=r)))

    async def release(self, tenant: str, key: str) -> bool:
        """Drop an in-progress claim (the request failed) so a retry may run; True if dropped."""
        keys = [self._key(tenant, key)]
        return bool(await self.state.run(lambda r: self._release(keys=keys, args=[], client=r)))


@dataclass(slots=True)
class _LocalEntry:
    fingerprint: str
    state: BeginState
    result: dict[str, Any] | None
    expires_at: float


class LocalIdempotencyStore:
    """The same claims in this process's memory (no Redis, or while it is away), synchronous.

    Entries expire like the Redis keys (a lease while in progress, ``ttl_s`` once done), and at most
    ``max_entries`` are kept, least recently used dropped first: each holds a whole result, and a
    replica serving keyed requests without Redis for a day must not grow without bound. A dropped
    claim behaves like an expired lease: a retry runs again, and completing it stores nothing.
    """

    def __init__(
        self,
        *,
        ttl_s: float = TTL_S,
        lease_s: float = LEASE_S,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _LocalEntry] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, k: tuple[str, str]) -> _LocalEntry | None:
        e = self._entries.get(k)
        if e is not None and e.expires_at <= self._clock():
            del self._entries[k]
            return None
        return e

    def begin(self, tenant: str, key: str, fingerprint: str) -> Begin:
        k = (tenant, key)
        e = self._get(k)
        if e is None:
            now = self._clock()
            while self._entries and (
                len(self._entries) >= self.max_entries or next(iter(self._entries.values())).expires_at <= now
            ):
                self._entries.popitem(last=False)  # least recently used, or expired
            self._entries[k] = _LocalEntry(fingerprint, "in_progress", None, now + min(self.lease_s, self.ttl_s))
            return Begin("new")
        self._entries.move_to_end(k)
        if e.fingerprint != fingerprint:
            return Begin("mismatch")
        return Begin(e.state, e.result)

    def peek(self, tenant: str, key: str, fingerprint: str) -> Begin | None:
        """What ``begin`` would answer for a key held here, without claiming one that is not."""
        e = self._get((tenant, key))
        if e is None:
            return None
        self._entries.move_to_end((tenant, key))
        return Begin("mismatch") if e.fingerprint != fingerprint else Begin(e.state, e.result)

    def complete(self, tenant: str, key: str, result: dict[str, Any]) -> bool:
        e = self._get((tenant, key))
        if e is None:
            return False
        e.state, e.result, e.expires_at = "done", result, self._clock() + self.ttl_s
        return True

    def release(self, tenant: str, key: str) -> bool:
        e = self._get((tenant, key))
        if e is None or e.state != "in_progress":  # a stored result is never thrown away
            return False
        del self._entries[(tenant, key)]
        return True
