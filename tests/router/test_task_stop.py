"""Stopping background tasks: cancelled ones end, one that swallows its cancellation is reported
instead of holding the stop."""

import asyncio
import logging

from router.task_stop import stop_tasks


def test_a_task_that_swallows_its_cancellation_does_not_hold_the_stop(caplog):
    async def polite():
        await asyncio.sleep(60)  # a task that waits until it is cancelled

    released: asyncio.Event | None = None

    async def stubborn():
        while released is None or not released.is_set():
            try:
                await asyncio.sleep(0.05)  # a task at work, that swallows the cancellation below
            except asyncio.CancelledError:
                pass  # what a library call that loses the cancellation looks like from here

    async def main():
        nonlocal released
        released = asyncio.Event()
        tasks = [asyncio.create_task(polite(), name="polite"), asyncio.create_task(stubborn(), name="stubborn")]
        await asyncio.sleep(0)  # (a yield, not a wait: both tasks start)
        late = await stop_tasks(tasks, "test", timeout_s=0.2)
        assert [t.get_name() for t in late] == ["stubborn"] and tasks[0].cancelled()
        released.set()  # (the test's own cleanup)
        await late[0]

    with caplog.at_level(logging.WARNING):
        asyncio.run(asyncio.wait_for(main(), 5))
    assert "test: 1 task(s) still running" in caplog.text and "stubborn" in caplog.text


def test_nothing_to_stop():
    assert asyncio.run(stop_tasks([], "test")) == []
