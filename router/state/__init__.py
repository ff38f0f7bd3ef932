"""Baton's shared cluster state, kept in Redis so several router replicas act as one.

What lives here: the worker/router registry (heartbeats with TTLs), the cluster prefix index
(which worker holds which KV block hashes), per-tenant rate limits, idempotency keys and the
durable batch-lane journal. Every key is namespaced ``baton:<cluster>:...``.

Redis is an optimisation and a coordination point, never a single point of failure: every
component fails fast (sub-second timeouts, no retries) with :class:`StateUnavailable` while
Redis is down, backs off so a dead server is not hammered, and reconnects by itself when it
returns. The rate limiter falls back to in-process buckets; the others let the caller decide.
Pure Python on top of ``redis.asyncio`` (never imports torch).
"""

from router.state.connection import RedisState, StateUnavailable

__all__ = ["RedisState", "StateUnavailable"]
