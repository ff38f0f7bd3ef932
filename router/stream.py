"""One request's output stream as the caller sees it: the deltas in order, nothing lost or repeated
even when the request migrates between decode workers (the stream, not the worker, owns the record
of what the caller has been sent)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from engine.logprobs import TokenLogprob
from engine.outputs import RequestOutput
from engine.request import FinishReason


class RequestFailed(RuntimeError):
    pass


class RequestStream:
    def __init__(self, request_id: str, num_prompt_tokens: int = 0) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.token_ids: list[int] = []  # everything delivered so far
        self.text = ""
        self.finished = False
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = 0
        self.error: str | None = None
        self.created = time.monotonic()
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.token_times: list[float] = []  # arrival time of each delivered token (ITL measurement)
        self.ttft_breakdown: dict[str, float] | None = None  # stages measured on the workers
        self.preempted: list[tuple[float, float]] | None = None  # (from, to) on this clock: times preempted
        self.logprobs: list[TokenLogprob] | None = None  # one per delivered token, when asked for
        self.prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token, when asked for
        self._queue: queue.SimpleQueue[RequestOutput | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._async: tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | None]] | None = None
        self._on_finish: Callable[[], None] | None = None  # run once on the bound loop when it ends

    # -- producer side (poller threads) -------------------------------------------------------
    def put(self, out: RequestOutput) -> None:
        now = time.monotonic()
        with self._lock:
            if self.finished:
                return
            if out.new_token_ids and self.first_token_time is None:
                self.first_token_time = now
            if out.ttft_breakdown is not None and self.ttft_breakdown is None:
                self.ttft_breakdown = out.ttft_breakdown
            self.token_ids.extend(out.new_token_ids)
            if out.prompt_logprobs is not None and self.prompt_logprobs is None:
                self.prompt_logprobs = out.prompt_logprobs
            if out.logprobs is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(out.logprobs)
            self.token_times.extend([now] * len(out.new_token_ids))
            self.text += out.text_delta
            if out.finished:
                self.finished = True
                self.finished_time = now
                if out.preempted:  # (relative to the final output: laid back from its arrival here)
                    self.preempted = [(now + a, now + b) for a, b in out.preempted]
                self.finish_reason = out.finish_reason
                self.stop_reason = out.stop_reason
                self.num_cached_tokens = out.num_cached_tokens
                self._finish_callback()
            self._deliver(out)

    def fail(self, reason: str) -> None:
        with self._lock:
            if self.finished:
                return
            self.finished = True
            self.error = reason
            self.finish_reason = FinishReason.ERROR
            self.finished_time = time.monotonic()
            self._finish_callback()
            self._deliver(None)

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the bound loop once the stream ends (at once if it has), whoever reads
        it: a stream nobody reads to its end (a choice of n whose client left) still ends there."""
        with self._lock:
            assert self._async is not None, "bind the stream to a loop first"
            self._on_finish = callback
            if self.finished:
                self._finish_callback()

    def _finish_callback(self) -> None:  # under the lock
        if self._on_finish is not None and self._async is not None:
            self._async[0].call_soon_threadsafe(self._on_finish)
            self._on_finish = None

    def _deliver(self, item: RequestOutput | None) -> None:
        if self._async is not None:
            loop, q = self._async
            loop.call_soon_threadsafe(q.put_nowait, item)
        else:
            self._queue.put(item)

    # -- consumer side ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self._queue.get()
            if item is None:
                raise RequestFailed(self.error or "request failed")
            yield item
            if item.finished:
                return

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` from now on (for async consumers); anything already delivered moves over."""
        with self._lock:
            if self._async is not None:
                return
            q: asyncio.Queue[RequestOutput | None] = asyncio.Queue()
            while True:
                try:
                    q.put_nowait(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._async = (loop, q)

    async def aiter(self) -> AsyncIterator[RequestOutput]:
        """Async iteration; call from the event loop that consumes the stream."""
        self.bind(asyncio.get_running_loop())
        assert self._async is not None  # bind set it
        q = self._async[1]
        while True:
            item = await q.get()
            if item is None:
                raise RequestFailed(self.error or "request failed")
            yield item
            if item.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until finished; the whole generation as one output."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"request {self.request_id} did not finish in {timeout}s")
        return self.final_output()

    def final_output(self) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            [],
            "",
            finished=self.finished,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            token_ids=list(self.token_ids),
            text=self.text,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            prompt_logprobs=self.prompt_logprobs,
        )
