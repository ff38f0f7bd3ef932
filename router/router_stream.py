"""The router's ``GenerationStream``: a request's deltas as ``StreamEvent``s for the frontends, the
usage on the last one, metrics when it finishes, and abort (client gone, deadline passed)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

from engine.outputs import RequestOutput
from router.api import ErrorKind, GenerationResult, RouterError, StreamEvent, Usage
from router.request_ids import shown_request_id
from router.stream import RequestFailed, RequestStream

if TYPE_CHECKING:
    from router.router import Router


@dataclass(eq=False)
class RequestContext:
    """Everything the router knows about one request, from admission to its last token."""

    request_id: str
    tenant: str
    lane: str
    prompt_tokens: int
    max_tokens: int
    stream: RequestStream
    spec: object  # engine.request_spec.RequestSpec
    prompt_text: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    dispatched: float | None = None
    window_s: float = 0.0
    hint: object = None
    predicted_ttft_s: float | None = None
    finished: bool = False
    idempotency: tuple[str, str] | None = None  # (tenant, key)
    durable: bool = False  # a journaled batch job: a client going away does not abort it
    deadline_task: asyncio.Task | None = None  # a gRPC deadline's timer, cancelled when the request ends
    timed_tokens: int = 0  # tokens whose inter-token gaps are in the ITL histogram (over all its readers)


class RouterStream:
    def __init__(self, ctx: RequestContext, router: Router) -> None:
        self.ctx = ctx
        self.request_id = shown_request_id(ctx.request_id)  # the client's id; ctx's is tenant-scoped
        self.lane = ctx.lane
        self._router = router
        self._consumed = False
        self.deadline_hit = False

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._consumed:
            raise RuntimeError("a generation stream can be consumed once")
        self._consumed = True
        ctx = self.ctx
        try:
            async for out in ctx.stream.aiter():
                if out.finished and out.finish_reason == "abort" and self.deadline_hit:
                    yield StreamEvent(self.request_id, out.text_delta, tuple(out.new_token_ids), finished=True,
                                      finish_reason="error", usage=self._usage(),
                                      error=RouterError(ErrorKind.DEADLINE_EXCEEDED, "The request's deadline passed."),
                                      logprobs=_tuple(out.logprobs))
                    return
                self._observe_gaps(len(out.new_token_ids))
                yield self._event(out)
                if out.finished:
                    return
        except RequestFailed as e:
            yield StreamEvent(self.request_id, "", (), finished=True, finish_reason="error",
                              usage=self._usage(), error=RouterError(ErrorKind.INTERNAL, str(e)))
        finally:
            # A consumer that stops early (client gone) leaves the request to ``abort()``.
            if ctx.stream.finished:
                self._router._finished(ctx)

    def _observe_gaps(self, n: int) -> None:
        """The gaps before this delta's ``n`` tokens (their arrival times are in the stream already)."""
        times, start = self.ctx.stream.token_times, self.ctx.timed_tokens
        self.ctx.timed_tokens = end = min(start + n, len(times))
        if end > max(start, 1):
            self._router.prom.token_gaps(self.lane, [times[i] - times[i - 1] for i in range(max(start, 1), end)])

    def _event(self, out: RequestOutput) -> StreamEvent:
        return StreamEvent(
            self.request_id, out.text_delta, tuple(out.new_token_ids), finished=out.finished,
            finish_reason=out.finish_reason if out.finished else None,
            stop_reason=out.stop_reason if out.finished else None,
            usage=self._usage() if out.finished else None, logprobs=_tuple(out.logprobs),
            prompt_logprobs=_tuple(out.prompt_logprobs),
        )

    def _usage(self) -> Usage:
        s = self.ctx.stream
        return Usage(self.ctx.prompt_tokens, len(s.token_ids), s.num_cached_tokens)

    async def result(self) -> GenerationResult:
        text: list[str] = []
        ids: list[int] = []
        reason = None
        usage = None
        async for ev in self:
            if ev.error is not None:
                raise ev.error
            text.append(ev.text)
            ids.extend(ev.token_ids)
            if ev.finished:
                reason, usage = ev.finish_reason, ev.usage
        s = self.ctx.stream  # it already keeps the logprobs the caller was sent
        return GenerationResult(self.request_id, "".join(text), tuple(ids), reason, usage or self._usage(),
                                self.ctx.lane, prompt_text=self.ctx.prompt_text, logprobs=_tuple(s.logprobs),
                                prompt_logprobs=_tuple(s.prompt_logprobs))

    async def abort(self) -> None:
        """Its own request, not whatever holds its id now (a choice's id may be past the client id
        rule, and a later request may reuse the id)."""
        ctx = self.ctx
        if not ctx.durable and not ctx.stream.finished:  # a journaled job outlives its client
            await self._router._abort_here(ctx)

    async def cancel(self) -> None:
        if not self.ctx.stream.finished:
            await self._router._abort_here(self.ctx)


class ReplayStream:
    """A finished result replayed (an idempotent retry): one event with the whole generation."""

    def __init__(self, result: GenerationResult) -> None:
        self._result = result
        self.request_id = result.request_id
        self.lane = result.lane

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        r = self._result
        yield StreamEvent(r.request_id, r.text, r.token_ids, finished=True, finish_reason=r.finish_reason,
                          usage=r.usage, logprobs=r.logprobs, prompt_logprobs=r.prompt_logprobs)

    async def result(self) -> GenerationResult:
        return self._result

    async def abort(self) -> None:
        return None

    async def cancel(self) -> None:
        return None  # it already ran: a replay of its stored result


async def with_deadline(stream, deadline_s: float | None) -> None:
    """Abort ``stream`` when the monotonic ``deadline_s`` passes (a gRPC deadline)."""
    if deadline_s is None:
        return
    await asyncio.sleep(max(0.0, deadline_s - time.monotonic()))
    stream.deadline_hit = True
    await stream.abort()


def _tuple(logprobs: list | None) -> tuple | None:
    return None if logprobs is None else tuple(logprobs)
