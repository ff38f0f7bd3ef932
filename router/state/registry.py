"""Cluster membership by heartbeat: which workers (and router replicas) are alive right now.

Each member refreshes its own key ``baton:<c>:worker:<id>`` (a JSON string with a TTL) every
``ttl_s / 3`` or so; a member that stops heartbeating simply expires, with nobody having to
notice its death. A set ``baton:<c>:workers`` lists every id ever seen so readers can find the
keys without SCAN; ids whose key has expired are pruned from it lazily by readers. Router
replicas register themselves the same way with role ``"router"``.

Degraded mode: every method raises :class:`StateUnavailable`; the router keeps using the
membership it already knows (its own Ray handles) until Redis returns.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from router.state.connection import RedisState

# Remove ids from the members set only if their key is (still) gone: a member that heartbeats
# between the reader's MGET and this prune must not be dropped from the set.
_PRUNE = """
local n = 0
for i, id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    n = n + redis.call('SREM', KEYS[1], id)
  end
end
return n
"""


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One live member as of its last heartbeat."""

    worker_id: str
    role: str  # "prefill" | "decode" | "router" | ...
    payload: dict[str, Any] = field(default_factory=dict)  # JSON: address, capacity, incarnation...
    heartbeat_at: float = 0.0  # sender's wall clock (time.time()) at the heartbeat
    ttl_s: float = 0.0


class WorkerRegistry:
    """Heartbeat-based membership of one cluster."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        self._members = state.key("workers")
        self._prune = state.client.register_script(_PRUNE)

    def _key(self, worker_id: str) -> str:
        return self.state.key("worker", worker_id)

    async def heartbeat(self, worker_id: str, role: str, payload: dict[str, Any], ttl_s: float) -> None:
        """Announce ``worker_id`` as alive for the next ``ttl_s`` seconds (call every ~ttl_s/3)."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        value = json.dumps({"role": role, "payload": payload, "ts": time.time(), "ttl_s": ttl_s})
        key, ttl_ms = self._key(worker_id), max(1, int(ttl_s * 1000))

        async def op(r: Any) -> None:
            async with r.pipeline(transaction=True) as p:
                p.set(key, value, px=ttl_ms)
                p.sadd(self._members, worker_id)
                await p.execute()

        await self.state.run(op)

    async def live_workers(self, role: str | None = None) -> dict[str, WorkerRecord]:
        """Members whose heartbeat has not expired (optionally of one role), by id."""

        async def op(r: Any) -> tuple[list[str], list[bytes | None]]:
            ids = sorted(m.decode() for m in await r.smembers(self._members))
            values = await r.mget([self._key(i) for i in ids]) if ids else []
            return ids, values

        ids, values = await self.state.run(op)
        live: dict[str, WorkerRecord] = {}
        expired: list[str] = []
        for worker_id, raw in zip(ids, values):
            if raw is None:
                expired.append(worker_id)
                continue
            rec = json.loads(raw)
            if role is None or rec["role"] == role:
                live[worker_id] = WorkerRecord(
                    worker_id, rec["role"], rec.get("payload") or {}, rec.get("ts", 0.0), rec.get("ttl_s", 0.0)
                )
        if expired:  # lazy cleanup; safe against a concurrent heartbeat (see _PRUNE)
            keys = [self._members] + [self._key(i) for i in expired]
            await self.state.run(lambda r: self._prune(keys=keys, args=expired, client=r))
        return live

    async def remove(self, worker_id: str) -> None:
        """Deregister at once (graceful shutdown) instead of waiting for the TTL."""

        async def op(r: Any) -> None:
            async with r.pipeline(transaction=True) as p:
                p.delete(self._key(worker_id))
                p.srem(self._members, worker_id)
                await p.execute()

        await self.state.run(op)
