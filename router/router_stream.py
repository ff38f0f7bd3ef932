"""The router's ``GenerationStream``: a request's deltas as ``StreamEvent``s for the frontends, the
usage on the last one, metrics when it finishes, and abort (client gone, deadline passed).

A stream is given what it calls: ``on_end`` (the request's end is recorded), ``abort`` (the
request is withdrawn from its lane queue or the pools) and ``token_gaps`` (the inter-token latency
histogram); it knows nothing else of the router."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from engine.logprobs import TokenLogprob
from engine.output_error import OutputError
from engine.outputs import RequestOutput
from engine.request import FinishReason
from router.api import ErrorKind, GenerationResult, RouterError, StreamEvent, Usage
from router.request_context import RequestContext
from router.request_ids import shown_request_id
from router.stream import RequestFailed


class RouterStream:
    def __init__(
        self,
        ctx: RequestContext,
        *,
        on_end: Callable[[RequestContext], None],
        abort: Callable[[RequestContext], Awaitable[None]],
        token_gaps: Callable[[str, list[float]], None],
    ) -> None:
        self.ctx = ctx
        self.request_id = shown_request_id(ctx.request_id)  # the client's id; ctx's is tenant-scoped
        self.lane = ctx.lane
        self._on_end = on_end
        self._abort = abort
        self._token_gaps = token_gaps
        self._consumed = False
        self.deadline_hit = False

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._consumed:
            raise RuntimeError("a generation stream can be consumed once")
        self._consumed = True
        ctx = self.ctx
        try:
            async for out in ctx.stream.aiter():
                if out.finished and out.finish_reason == FinishReason.ABORT and self.deadline_hit:
                    yield self._error_event(
                        out, RouterError(ErrorKind.DEADLINE_EXCEEDED, "The request's deadline passed.")
                    )
                    return
                self._observe_gaps(len(out.new_token_ids))
                yield self._event(out)
                if out.finished:
                    return
        except RequestFailed as e:
            yield StreamEvent(
                self.request_id,
                "",
                (),
                finished=True,
                finish_reason=FinishReason.ERROR,
                usage=self._usage(),
                error=RouterError(ErrorKind.INTERNAL, str(e)),
            )
        finally:
            # A consumer that stops early (client gone) leaves the request to ``abort()``.
            if ctx.stream.finished:
                self._on_end(ctx)

    def _error_event(self, out: RequestOutput, error: RouterError) -> StreamEvent:
        """The final event of a request that ended in ``error``, with what it delivered last."""
        return StreamEvent(
            self.request_id,
            out.text_delta,
            tuple(out.new_token_ids),
            finished=True,
            finish_reason=FinishReason.ERROR,
            usage=self._usage(),
            error=error,
            logprobs=_tuple(out.logprobs),
        )

    def _observe_gaps(self, n: int) -> None:
        """The gaps before this delta's ``n`` tokens (their arrival times are in the stream already)."""
        times, start = self.ctx.stream.token_times, self.ctx.timed_tokens
        self.ctx.timed_tokens = end = min(start + n, len(times))
        if end > max(start, 1):
            self._token_gaps(self.lane, [times[i] - times[i - 1] for i in range(max(start, 1), end)])

    def _event(self, out: RequestOutput) -> StreamEvent:
        if out.finished and out.error is not None:  # the engine said why it failed the request
            return self._error_event(out, _error(out.error))
        return StreamEvent(
            self.request_id,
            out.text_delta,
            tuple(out.new_token_ids),
            finished=out.finished,
            finish_reason=out.finish_reason if out.finished else None,
            stop_reason=out.stop_reason if out.finished else None,
            usage=self._usage() if out.finished else None,
            logprobs=_tuple(out.logprobs),
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
        return GenerationResult(
            self.request_id,
            "".join(text),
            tuple(ids),
            reason,
            usage or self._usage(),
            self.ctx.lane,
            prompt_text=self.ctx.prompt_text,
            logprobs=_tuple(s.logprobs),
            prompt_logprobs=_tuple(s.prompt_logprobs),
        )

    async def abort(self) -> None:
        """Its own request, not whatever holds its id now (a choice's id may be past the client id
        rule, and a later request may reuse the id)."""
        ctx = self.ctx
        if not ctx.durable and not ctx.stream.finished:  # a journaled job outlives its client
            await self._abort(ctx)

    async def cancel(self) -> None:
        if not self.ctx.stream.finished:
            await self._abort(self.ctx)


class ReplayStream:
    """A finished result replayed (an idempotent retry): one event with the whole generation."""

    def __init__(self, result: GenerationResult) -> None:
        self._result = result
        self.request_id = result.request_id
        self.lane = result.lane

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        r = self._result
        yield StreamEvent(
            r.request_id,
            r.text,
            r.token_ids,
            finished=True,
            finish_reason=r.finish_reason,
            usage=r.usage,
            logprobs=r.logprobs,
            prompt_logprobs=r.prompt_logprobs,
        )

    async def result(self) -> GenerationResult:
        return self._result

    async def abort(self) -> None:
        return None

    async def cancel(self) -> None:
        return None  # it already ran: a replay of its stored result


async def with_deadline(stream: RouterStream, deadline_s: float | None) -> None:
    """Abort ``stream`` when the monotonic ``deadline_s`` passes (a gRPC deadline)."""
    if deadline_s is None:
        return
    await asyncio.sleep(max(0.0, deadline_s - time.monotonic()))
    stream.deadline_hit = True
    await stream.abort()


def _error(e: OutputError) -> RouterError:
    """A request field at fault (its constraint could not be enforced) is the client's to change: a
    400 naming it (and never retried as a 5xx would be); else the server's own failure."""
    if e.param is not None:
        return RouterError(ErrorKind.INVALID_REQUEST, e.message, param=e.param)
    return RouterError(ErrorKind.INTERNAL, e.message)


def _tuple(logprobs: list[TokenLogprob] | None) -> tuple[TokenLogprob, ...] | None:
    return None if logprobs is None else tuple(logprobs)
