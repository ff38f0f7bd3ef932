"""Streaming responses and client disconnects: the SSE byte stream of a request's choices, and a
``text/event-stream`` response that stops the generation as soon as the client goes away (also
used, through ``unless_disconnected``, while a whole response is awaited)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from router.api import RouterError, Usage
from router.choices import Choices
from router.http.responses import SSE_DONE, ChunkBuilder, internal_error, sse, total_usage

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone. Only called once the request body has been read, so the
    next ASGI message can only be ``http.disconnect`` (uvicorn sends it on connection loss)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> tuple[bool, T | None]:
    """(True, result of ``work``) or (False, None) if the client disconnected first."""
    main = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({main, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancel(main, watch)  # no-op for the finished one, but retrieves its exception
    if main.done() and not main.cancelled():
        return True, main.result()
    return False, None


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that aborts its generation when the client disconnects.

    Starlette's ``StreamingResponse`` only notices a vanished client when a write fails (uvicorn
    silently drops writes to a closed connection), which for a request still queued or prefilling
    could be much later; here the pump races an ``http.disconnect`` watcher instead.
    """

    def __init__(self, events: AsyncIterator[bytes], choices: Choices, headers: dict[str, str]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._events = events
        self._choices = choices

    async def _pump(self, send: Send) -> None:
        async for chunk in self._events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            completed, _ = await unless_disconnected(self._pump(send), receive)
        except OSError:  # the connection broke under a write: nobody to tell
            log.debug("stream of request %s: client connection lost", self._choices.request_id)
        finally:  # disconnected, failed to send, or cancelled (server shutdown): free the request
            if not completed:
                await self._choices.abort()
            await self._events.aclose()  # type: ignore[attr-defined]


async def sse_events(choices: Choices, chunks: ChunkBuilder, echo_text: str | None) -> AsyncIterator[bytes]:
    """The SSE byte stream of one request's choices, ``[DONE]``-terminated. A failure after
    streaming started can no longer change the status code, so it is sent in-band as an error event."""
    try:
        for i in range(len(choices.streams)):
            opening = chunks.opening(echo_text, i)
            if opening is not None:
                yield sse(opening)
        usages: dict[int, Usage] = {}
        async for i, ev in choices.events():
            if ev.error is not None:
                yield sse(ev.error.to_openai())
                break
            chunk = chunks.delta(ev, i)
            if chunk is not None:
                yield sse(chunk)
            if ev.finished and ev.usage is not None:
                usages[i] = ev.usage
        if chunks.include_usage and len(usages) == len(choices.streams):
            yield sse(chunks.usage(total_usage([usages[i] for i in sorted(usages)])))
    except RouterError as e:
        yield sse(e.to_openai())
    except Exception:
        log.exception("stream of request %s failed", choices.request_id)
        yield sse(internal_error().to_openai())
    yield SSE_DONE
