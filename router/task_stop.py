"""Stopping a component's background asyncio tasks without letting one of them hold the stop.

A cancelled task normally ends at its next await. One that swallows its cancellation (it can be
lost inside a library call on the way out) would keep an unbounded ``gather`` waiting forever, and
with it the router's shutdown: so the wait is bounded, and what is still running is named in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


async def stop_tasks(
    tasks: Iterable[asyncio.Task[object]], owner: str, timeout_s: float = 5.0
) -> list[asyncio.Task[object]]:
    """Cancel ``tasks`` and wait up to ``timeout_s`` for them to end; returns the ones still running."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if not pending:
        return []
    _, late = await asyncio.wait(pending, timeout=timeout_s)
    if late:
        log.warning(
            "%s: %d task(s) still running %.0f s after being cancelled: %s",
            owner,
            len(late),
            timeout_s,
            ", ".join(sorted(t.get_name() for t in late)),
        )
    return list(late)
