"""A client that leaves while it waits for a whole (non-streaming) response, through the real app in
front of a real ``Router`` over Redis (its dispatcher answers in process and holds each request,
as a long generation would): the request is aborted within 2 s, except in the durable batch lane,
whose job finishes and keeps its result for ``GET /v1/batches/{id}`` (README: its contract)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from baton.redis_server import EmbeddedRedis
from router.http.app import create_app
from router.http.server import HttpServer
from router.lanes import TenantConfig
from router.request_ids import scoped_request_id
from tests.router.state.inprocess_router import InProcessDispatcher, make_router, release
from tests.waiting import async_wait_until

ABORT_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


async def _leave_while_waiting(
    client: httpx.AsyncClient, dispatcher: InProcessDispatcher, lane: str, request_id: str
) -> float:
    """Post, wait until the request reached the dispatcher, then disconnect; returns when it left."""
    held = len(dispatcher.held)
    post = asyncio.ensure_future(
        client.post(
            "/v1/completions",
            headers={"X-Request-Id": request_id},
            json={"prompt": [1, 2, 3], "max_tokens": 4, "lane": lane},
        )
    )
    await async_wait_until(lambda: len(dispatcher.held) > held, timeout_s=5.0, message=f"request {request_id} held")
    post.cancel()  # the connection closes under the pending response
    await asyncio.gather(post, return_exceptions=True)
    return time.monotonic()


def _aborted(dispatcher: InProcessDispatcher, request_id: str) -> bool:
    return scoped_request_id("default", request_id) in dispatcher.aborted


def test_a_whole_response_is_aborted_when_its_client_leaves_but_a_durable_batch_job_finishes(redis_url):
    async def main() -> None:
        router, dispatcher = make_router(redis_url, f"t{uuid.uuid4().hex[:10]}", (TenantConfig("default"),))
        dispatcher.hold = True
        await router.start()
        server = HttpServer(create_app(router, served_model_name="m"))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                batch_left = await _leave_while_waiting(client, dispatcher, "batch", "job-stays")
                left = await _leave_while_waiting(client, dispatcher, "interactive", "chat-goes")
                await async_wait_until(
                    lambda: _aborted(dispatcher, "chat-goes"),
                    timeout_s=ABORT_WITHIN_S,
                    message=lambda: f"the interactive request aborted ({dispatcher.aborted})",
                )
                assert time.monotonic() - left < ABORT_WITHIN_S
                # The batch job's client left first (longer ago than the interactive one's): still running
                assert batch_left < left and not _aborted(dispatcher, "job-stays")
                release(dispatcher)

                async def finished() -> bool:
                    r = await client.get("/v1/batches/job-stays")
                    return r.status_code == 200 and r.json()["status"] == "done"

                await async_wait_until(finished, timeout_s=10, interval_s=0.05, message="the batch job's result")
        finally:
            await server.stop()
            await router.stop()

    asyncio.run(main())
