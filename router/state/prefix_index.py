"""The cluster prefix index: which worker holds which KV block, fed by the workers' cache events.

Block hashes are chained (``engine.block_hash``), so "worker w holds blocks 0..k-1 of this
prompt" is answered by checking the prompt's block hashes in order and stopping at the first
one w lacks. Placement uses that count to send a request where most of its prefix is cached.

Redis layout (``<hex>`` = 32 hex digits of a 16-byte block hash):

* ``baton:<c>:blk:<hex>``  set of worker ids holding the block (lookups);
* ``baton:<c>:wblk:<id>``  set of the hex hashes a worker holds (so a dead worker's entries can
  be removed without scanning the whole index).

Memory bound: Redis deletes a set when its last member goes, so with every ``BlocksRemoved``
delivered the index is exactly the cluster's cached blocks. Events can be lost (a worker dies,
Redis was down), so every key also carries a long TTL (``ttl_s``, 1 h by default) that is renewed
when the block is stored and, throttled to at most about once per ``ttl_s / 2``, when a lookup
hits it: a block that is neither re-stored nor hit for ``ttl_s`` drops out of the index (a lost
cache-affinity hint, never a wrong answer about correctness). Keys therefore stay bounded by the
blocks cached now plus those stored or hit within the last ``ttl_s``.

:class:`LocalPrefixIndex` is the same index in a Python dict (no TTL: it relies on the events),
for degraded mode and tests; both are checked against each other on random event sequences.
Degraded mode: the Redis index raises :class:`StateUnavailable`; the router then places on load
alone (or on a local index it feeds itself). Events applied while Redis is down are lost, so a
worker's forwarder should resend a full snapshot with :meth:`replace_worker` once Redis is back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis.typing import EncodableT

from engine.kv_events import AllBlocksCleared, BlocksRemoved, BlocksStored, KVCacheEvent
from router.state.connection import RedisState

# KEYS: wblk key of each candidate, then the blk key of each hash in prompt order.
# ARGV: number of candidates, ttl in ms, candidate ids. Returns one count per candidate.
_LONGEST_PREFIX = """
local nc = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local counts, alive, names = {}, {}, {}
for j = 1, nc do counts[j] = 0; alive[j] = j end
local function refresh(key)
  if ttl > 0 and redis.call('PTTL', key) < ttl / 2 then redis.call('PEXPIRE', key, ttl) end
end
for i = nc + 1, #KEYS do
  names = {}
  for n, j in ipairs(alive) do names[n] = ARGV[j + 2] end
  local hits = redis.call('SMISMEMBER', KEYS[i], unpack(names))
  local still = {}
  for n, j in ipairs(alive) do
    if hits[n] == 1 then counts[j] = i - nc; still[#still + 1] = j end
  end
  alive = still
  if #alive == 0 then break end
  refresh(KEYS[i])  -- someone holds block i: keep it
end
for j = 1, nc do
  if counts[j] > 0 then refresh(KEYS[j]) end
end
return counts
"""

# KEYS[1]: the worker's wblk key. ARGV: worker id, blk key prefix.
_CLEAR_WORKER = """
local hs = redis.call('SMEMBERS', KEYS[1])
for _, h in ipairs(hs) do redis.call('SREM', ARGV[2] .. h, ARGV[1]) end
redis.call('DEL', KEYS[1])
return #hs
"""


def _ops(events: Iterable[KVCacheEvent]) -> list[tuple[str, tuple[bytes, ...]]]:
    """Events as ("store" | "remove" | "clear", hashes); rejects anything else early."""
    out: list[tuple[str, tuple[bytes, ...]]] = []
    for ev in events:
        if isinstance(ev, BlocksStored):
            out.append(("store", ev.block_hashes))
        elif isinstance(ev, BlocksRemoved):
            out.append(("remove", ev.block_hashes))
        elif isinstance(ev, AllBlocksCleared):
            out.append(("clear", ()))
        else:
            raise TypeError(f"not a KV cache event: {ev!r}")
    return out


class RedisPrefixIndex:
    """The shared index in Redis (see the module docstring for layout and memory bound)."""

    def __init__(self, state: RedisState, *, ttl_s: float = 3600.0) -> None:
        self.state = state
        self.ttl_ms = int(ttl_s * 1000)
        self._blk_prefix = state.key("blk", "")
        self._lookup = state.client.register_script(_LONGEST_PREFIX)
        self._clear = state.client.register_script(_CLEAR_WORKER)

    def _wkey(self, worker_id: str) -> str:
        return self.state.key("wblk", worker_id)

    async def _queue(self, p: Any, worker_id: str, kind: str, hashes: Sequence[bytes]) -> None:
        """Queue one event's commands on pipeline ``p``."""
        wkey = self._wkey(worker_id)
        if kind == "clear":
            # Queued as EVALSHA; the pipeline loads the script first if the server lacks it.
            await self._clear(keys=[wkey], args=[worker_id, self._blk_prefix], client=p)
            return
        if not hashes:
            return
        hexes = [h.hex() for h in hashes]
        for hx in hexes:
            key = self._blk_prefix + hx
            if kind == "store":
                p.sadd(key, worker_id)
                p.pexpire(key, self.ttl_ms)
            else:
                p.srem(key, worker_id)
        if kind == "store":
            p.sadd(wkey, *hexes)
            p.pexpire(wkey, self.ttl_ms)
        else:
            p.srem(wkey, *hexes)

    async def _transaction(self, worker_id: str, ops: list[tuple[str, tuple[bytes, ...]]]) -> None:
        if not ops:
            return

        async def op(r: Any) -> None:
            # MULTI/EXEC: one round trip, and readers never see half of a batch of events.
            async with r.pipeline(transaction=True) as p:
                for kind, hashes in ops:
                    await self._queue(p, worker_id, kind, hashes)
                await p.execute()

        await self.state.run(op)

    async def apply(self, worker_id: str, events: Sequence[KVCacheEvent]) -> None:
        """Apply one worker's events, in order, atomically."""
        await self._transaction(worker_id, _ops(events))

    async def clear_worker(self, worker_id: str) -> None:
        """Forget everything ``worker_id`` held (it died, restarted or reset its cache)."""
        await self._transaction(worker_id, [("clear", ())])

    async def replace_worker(self, worker_id: str, hashes: Sequence[bytes]) -> None:
        """Atomically reset a worker's entries to a full snapshot (resync after an outage)."""
        await self._transaction(worker_id, [("clear", ()), ("store", tuple(hashes))])

    async def longest_prefix(self, hashes: Sequence[bytes], candidates: Sequence[str]) -> dict[str, int]:
        """For each candidate, how many leading blocks of ``hashes`` it holds (one round trip)."""
        if not candidates:
            return {}
        if not hashes:
            return {c: 0 for c in candidates}
        cands = list(candidates)
        keys = [self._wkey(c) for c in cands] + [self._blk_prefix + h.hex() for h in hashes]
        args: list[EncodableT] = [len(cands), self.ttl_ms, *cands]
        counts = await self.state.run(lambda r: self._lookup(keys=keys, args=args, client=r))
        return {c: int(n) for c, n in zip(cands, counts)}


class LocalPrefixIndex:
    """The same index in process memory: degraded mode, single-router setups and tests.

    No TTL (entries leave only through events), otherwise behaviourally identical to
    :class:`RedisPrefixIndex`. Async methods so the two are interchangeable.
    """

    def __init__(self) -> None:
        self._holders: dict[bytes, set[str]] = {}  # block hash -> worker ids
        self._blocks: dict[str, set[bytes]] = {}  # worker id -> block hashes

    def __len__(self) -> int:
        return len(self._holders)

    def _store(self, worker_id: str, hashes: Iterable[bytes]) -> None:
        mine = self._blocks.setdefault(worker_id, set())
        for h in hashes:
            self._holders.setdefault(h, set()).add(worker_id)
            mine.add(h)

    def _remove(self, worker_id: str, hashes: Iterable[bytes]) -> None:
        mine = self._blocks.get(worker_id, set())
        for h in hashes:
            holders = self._holders.get(h)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[h]
            mine.discard(h)
        if not mine:
            self._blocks.pop(worker_id, None)

    def _clear(self, worker_id: str) -> None:
        self._remove(worker_id, list(self._blocks.get(worker_id, ())))

    async def apply(self, worker_id: str, events: Sequence[KVCacheEvent]) -> None:
        for kind, hashes in _ops(events):
            if kind == "store":
                self._store(worker_id, hashes)
            elif kind == "remove":
                self._remove(worker_id, hashes)
            else:
                self._clear(worker_id)

    async def clear_worker(self, worker_id: str) -> None:
        self._clear(worker_id)

    async def replace_worker(self, worker_id: str, hashes: Sequence[bytes]) -> None:
        self._clear(worker_id)
        self._store(worker_id, hashes)

    def snapshot(self) -> dict[str, set[bytes]]:
        """Every worker's hashes (to re-seed the shared index after an outage)."""
        return {w: set(hs) for w, hs in self._blocks.items()}

    async def longest_prefix(self, hashes: Sequence[bytes], candidates: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in candidates:
            n = 0
            for h in hashes:
                if c not in self._holders.get(h, ()):
                    break
                n += 1
            out[c] = n
        return out
