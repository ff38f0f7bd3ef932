"""Per-tenant rate limits: requests/min and tokens/min token buckets shared by all routers.

Each limited dimension is a token bucket holding up to ``rate * burst_s`` units that refills
continuously at ``rate`` units/s. A request takes ``n_requests`` from the request bucket and
``n_tokens`` from the token bucket atomically: both or neither, so a request refused for tokens
does not burn a request slot. A request larger than a bucket's capacity can never pass and gets
``retry_after_s = inf`` (the caller should answer 413/400 rather than 429). ``refund`` gives back
what an allowed acquire took, for a request refused after it was charged (a full queue, an SLO
prediction): a refused request must not spend the tenant's budget.

In Redis the buckets are hashes ``{level, ts}`` updated by one Lua script (atomic, one round trip)
that refills by elapsed *Redis server* time (``TIME``), so router replicas with skewed clocks
agree. A missing bucket means "full", so each key expires once it would have refilled anyway.

Degraded mode: when Redis is unavailable :class:`RateLimiter` falls back to an in-process
:class:`LocalRateLimiter` with the same semantics; limits then apply **per router replica**
(N replicas admit up to N times the limit) until Redis returns, at which point the shared
buckets are used again (they refilled meanwhile). Decisions made locally say ``degraded=True``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from router.state.connection import RedisState, StateUnavailable

Reason = Literal["requests", "tokens"]
_REASONS: tuple[Reason, Reason] = ("requests", "tokens")

# KEYS: request bucket, token bucket. ARGV per bucket b (1, 2): rate/s (0 = unlimited),
# capacity, amount. Returns {allowed 0/1, retry_after as a string ("inf" allowed), reason 0/1/2}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels, worst, reason, allowed = {}, 0, 0, 1
for b = 1, 2 do
  local rate, cap, n = tonumber(ARGV[3*b-2]), tonumber(ARGV[3*b-1]), tonumber(ARGV[3*b])
  if rate > 0 and n > 0 then
    local v = redis.call('HMGET', KEYS[b], 'level', 'ts')
    local level = cap
    if v[1] then
      level = math.min(cap, tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * rate)
    end
    levels[b] = level
    if n > level then
      allowed = 0
      local w = math.huge
      if n <= cap then w = (n - level) / rate end
      if reason == 0 or w > worst then worst, reason = w, b end
    end
  end
end
if allowed == 1 then
  for b = 1, 2 do
    if levels[b] then
      local rate, cap, n = tonumber(ARGV[3*b-2]), tonumber(ARGV[3*b-1]), tonumber(ARGV[3*b])
      local left = levels[b] - n
      redis.call('HSET', KEYS[b], 'level', string.format('%.17g', left), 'ts', string.format('%.17g', now))
      redis.call('PEXPIRE', KEYS[b], math.ceil((cap - left) / rate * 1000) + 1000)
    end
  end
end
local w = 'inf'
if worst < math.huge then w = string.format('%.17g', worst) end
return {allowed, w, reason}
"""

# The same KEYS and ARGV: give back what an acquire took (admission refused the request after it
# was charged). A missing bucket is full: nothing to give back, and none is created.
_REFUND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for b = 1, 2 do
  local rate, cap, n = tonumber(ARGV[3*b-2]), tonumber(ARGV[3*b-1]), tonumber(ARGV[3*b])
  if rate > 0 and n > 0 then
    local v = redis.call('HMGET', KEYS[b], 'level', 'ts')
    if v[1] then
      local level = math.min(cap, tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * rate + n)
      if level >= cap then
        redis.call('DEL', KEYS[b])
      else
        redis.call('HSET', KEYS[b], 'level', string.format('%.17g', level), 'ts', string.format('%.17g', now))
        redis.call('PEXPIRE', KEYS[b], math.ceil((cap - level) / rate * 1000) + 1000)
      end
    end
  end
end
return 1
"""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's limits; None = unlimited. Buckets hold ``burst_s`` seconds worth of rate."""

    requests_per_min: float | None = None
    tokens_per_min: float | None = None
    burst_s: float = 60.0

    def __post_init__(self) -> None:
        for v in (self.requests_per_min, self.tokens_per_min):
            if v is not None and v <= 0:
                raise ValueError("rates must be positive (or None for unlimited)")
        if self.burst_s <= 0:
            raise ValueError("burst_s must be positive")

    @property
    def unlimited(self) -> bool:
        return self.requests_per_min is None and self.tokens_per_min is None

    def buckets(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """(rate per s, capacity) of the request and token buckets; rate 0 = unlimited."""
        out = []
        for per_min in (self.requests_per_min, self.tokens_per_min):
            rate = (per_min or 0.0) / 60.0
            out.append((rate, rate * self.burst_s))
        return out[0], out[1]


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0  # 0 when allowed; inf when the request exceeds a bucket's capacity
    reason: Reason | None = None  # the binding bucket (longest wait) when refused
    degraded: bool = False  # decided by the per-replica fallback, not the shared buckets


ALLOWED = Decision(True)


def _check(n_requests: float, n_tokens: float) -> None:
    if n_requests < 0 or n_tokens < 0:
        raise ValueError("n_requests and n_tokens must be >= 0")


class LocalTokenBucket:
    """One token bucket in process memory, with an injectable clock (seconds)."""

    def __init__(self, rate_per_s: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.capacity = capacity
        self._clock = clock
        self._level = capacity
        self._ts = clock()

    def level(self) -> float:
        """Units available now (refilled lazily; never above capacity)."""
        now = self._clock()
        return min(self.capacity, self._level + max(0.0, now - self._ts) * self.rate)

    def wait_s(self, n: float) -> float:
        """Seconds until ``n`` units are available: 0 if now, inf if never (n > capacity)."""
        level = self.level()
        if n <= level:
            return 0.0
        return math.inf if n > self.capacity else (n - level) / self.rate

    def take(self, n: float) -> None:
        """Debit ``n`` units (callers check :meth:`wait_s` first)."""
        self._level, self._ts = self.level() - n, self._clock()

    def give(self, n: float) -> None:
        """Credit ``n`` units back (a refund), never above capacity."""
        self._level, self._ts = min(self.capacity, self.level() + n), self._clock()

    def reconfigure(self, rate_per_s: float, capacity: float) -> None:
        """Apply changed limits, keeping the current level (capped to the new capacity)."""
        if (rate_per_s, capacity) != (self.rate, self.capacity):
            self._level, self._ts = min(capacity, self.level()), self._clock()
            self.rate, self.capacity = rate_per_s, capacity

    @property
    def full(self) -> bool:
        return self.level() >= self.capacity


class LocalRateLimiter:
    """Per-tenant buckets in process memory, same semantics as the Redis script."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, max_tenants: int = 10_000) -> None:
        self._clock = clock
        self._max_tenants = max_tenants
        self._buckets: dict[tuple[str, int], LocalTokenBucket] = {}

    def _bucket(self, tenant: str, i: int, rate: float, cap: float) -> LocalTokenBucket:
        b = self._buckets.get((tenant, i))
        if b is None:
            if len(self._buckets) >= 2 * self._max_tenants:  # full buckets carry no state
                self._buckets = {k: v for k, v in self._buckets.items() if not v.full}
            b = self._buckets[(tenant, i)] = LocalTokenBucket(rate, cap, self._clock)
        else:
            b.reconfigure(rate, cap)
        return b

    def acquire(self, tenant: str, n_requests: float = 1, n_tokens: float = 0, *, limits: TenantLimits) -> Decision:
        _check(n_requests, n_tokens)
        if limits.unlimited:
            return ALLOWED
        taken: list[tuple[LocalTokenBucket, float]] = []
        worst, reason = 0.0, None
        for i, ((rate, cap), n) in enumerate(zip(limits.buckets(), (n_requests, n_tokens))):
            if rate <= 0 or n <= 0:
                continue
            b = self._bucket(tenant, i, rate, cap)
            w = b.wait_s(n)
            if w > 0 and (reason is None or w > worst):
                worst, reason = w, _REASONS[i]
            taken.append((b, n))
        if reason is not None:
            return Decision(False, worst, reason)
        for b, n in taken:
            b.take(n)
        return ALLOWED

    def refund(self, tenant: str, n_requests: float = 1, n_tokens: float = 0, *, limits: TenantLimits) -> None:
        """Give back what :meth:`acquire` took (capped at capacity). A bucket not held is full."""
        _check(n_requests, n_tokens)
        for i, ((rate, cap), n) in enumerate(zip(limits.buckets(), (n_requests, n_tokens))):
            b = self._buckets.get((tenant, i))
            if rate > 0 and n > 0 and b is not None:
                b.reconfigure(rate, cap)
                b.give(n)


class RateLimiter:
    """Shared per-tenant limits in Redis, falling back to per-replica buckets while it is down."""

    def __init__(self, state: RedisState, *, local: LocalRateLimiter | None = None) -> None:
        self.state = state
        self.local = local if local is not None else LocalRateLimiter()
        self._script = state.client.register_script(_ACQUIRE)
        self._refund = state.client.register_script(_REFUND)

    async def acquire(
        self, tenant: str, n_requests: float = 1, n_tokens: float = 0, *, limits: TenantLimits
    ) -> Decision:
        """Take ``n_requests`` and ``n_tokens`` for ``tenant`` now, or say when to retry."""
        _check(n_requests, n_tokens)
        if limits.unlimited:
            return ALLOWED
        keys, args = self._keys_args(tenant, n_requests, n_tokens, limits)
        try:
            res: Any = await self.state.run(lambda r: self._script(keys=keys, args=args, client=r))
        except StateUnavailable:
            d = self.local.acquire(tenant, n_requests, n_tokens, limits=limits)
            return Decision(d.allowed, d.retry_after_s, d.reason, degraded=True)
        allowed, retry_after, reason = int(res[0]), float(res[1]), int(res[2])
        if allowed:
            return ALLOWED
        return Decision(False, retry_after, _REASONS[reason - 1])

    async def refund(
        self, tenant: str, n_requests: float = 1, n_tokens: float = 0, *, limits: TenantLimits, degraded: bool = False
    ) -> None:
        """Give back what an allowed :meth:`acquire` took, to the buckets it took it from
        (``degraded``: its Decision's flag). With Redis away the refund is dropped: the shared
        buckets refill anyway, and crediting the local ones would not undo the shared charge."""
        _check(n_requests, n_tokens)
        if limits.unlimited:
            return
        if degraded:
            self.local.refund(tenant, n_requests, n_tokens, limits=limits)
            return
        keys, args = self._keys_args(tenant, n_requests, n_tokens, limits)
        try:
            await self.state.run(lambda r: self._refund(keys=keys, args=args, client=r))
        except StateUnavailable:
            pass

    def _keys_args(
        self, tenant: str, n_requests: float, n_tokens: float, limits: TenantLimits
    ) -> tuple[list[str], list[str]]:
        (rr, rc), (tr, tc) = limits.buckets()
        keys = [self.state.key("rl", "req", tenant), self.state.key("rl", "tok", tenant)]
        return keys, [repr(float(x)) for x in (rr, rc, n_requests, tr, tc, n_tokens)]
