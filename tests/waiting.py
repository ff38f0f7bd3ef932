"""The test suite's one way to wait for a condition (sync and async): poll it until it holds or the
time runs out, then fail with a message. Tests wait on events or on this, never on a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Message = str | Callable[[], str]


def _timed_out(timeout_s: float, message: Message, condition: object) -> str:
    said = message() if callable(message) else message
    return f"timed out after {timeout_s:g} s waiting for {said or condition!r}"


def wait_until(
    condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.01, message: Message = ""
) -> float:
    """Poll ``condition`` until it is truthy; return the seconds waited. Fails (AssertionError) after
    ``timeout_s``, naming ``message`` (a callable is asked only then, for what the test last saw)."""
    start = time.monotonic()
    while not condition():
        waited = time.monotonic() - start
        assert waited < timeout_s, _timed_out(timeout_s, message, condition)
        time.sleep(interval_s)
    return time.monotonic() - start


async def async_wait_until(
    condition: Callable[[], object | Awaitable[object]],
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    message: Message = "",
) -> float:
    """``wait_until`` for an event loop: ``condition`` may be a plain or an async callable."""
    start = time.monotonic()
    while True:
        held = condition()
        if isinstance(held, Awaitable):
            held = await held
        if held:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, _timed_out(timeout_s, message, condition)
        await asyncio.sleep(interval_s)
