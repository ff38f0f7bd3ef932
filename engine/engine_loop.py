"""Runs an ``LLMEngine`` on its own thread: the one place a worker's engine is touched.

Other threads (a Ray actor's call threads, the KV-transfer receiver) never call the engine
directly: they ``call(fn)`` to run ``fn(engine)`` on the engine thread between two steps, and they
collect outputs in per-step batches with ``poll_outputs`` (a long poll). Periodic work (transfer
deadlines) runs through ``add_ticker``; per-step hooks (shipping KV after each prefill chunk) through
``add_after_step``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.scheduler_output import SchedulerOutput

T = TypeVar("T")

log = logging.getLogger(__name__)


class EngineLoopStopped(RuntimeError):
    pass


class EngineLoop:
    def __init__(
        self,
        engine: LLMEngine,
        *,
        idle_wait_s: float = 0.02,
        name: str = "engine-loop",
        output_sink: Callable[[list[RequestOutput]], None] | None = None,
    ) -> None:
        self.engine = engine
        self._sink = output_sink  # when set, outputs go there instead of the poll_outputs buffer
        self.idle_wait_s = idle_wait_s
        self._calls: queue.SimpleQueue[tuple[Callable[[LLMEngine], Any], Future[Any]]] = queue.SimpleQueue()
        self._outputs: list[RequestOutput] = []
        self._out_cv = threading.Condition()
        self._after_step: list[Callable[[LLMEngine, SchedulerOutput], None]] = []
        self._tickers: list[Callable[[LLMEngine], object]] = []  # (what a ticker returns is dropped)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.num_steps = 0
        self.busy_seconds = 0.0
        # CPU time of the loop thread during steps: below busy_seconds when the step waited for a
        # core (other processes on a small host), which is how contention is measured.
        self.busy_cpu_seconds = 0.0

    # -- wiring ----------------------------------------------------------------------------
    def add_after_step(self, hook: Callable[[LLMEngine, SchedulerOutput], None]) -> None:
        """``hook(engine, scheduler_output)`` after every step that computed something."""
        self._after_step.append(hook)

    def add_ticker(self, ticker: Callable[[LLMEngine], object]) -> None:
        """``ticker(engine)`` on every loop iteration, busy or idle (at least every ``idle_wait_s``)."""
        self._tickers.append(ticker)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._calls.put((lambda e: None, Future()))
        self._thread.join(timeout)
        with self._out_cv:
            self._out_cv.notify_all()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    # -- from other threads ----------------------------------------------------------------
    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = 60.0) -> T:
        """Run ``fn(engine)`` on the engine thread and return its result (exceptions propagate)."""
        return self.call_async(fn).result(timeout)

    def call_async(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        fut: Future[T] = Future()
        if self._stop.is_set() or self._error is not None:
            fut.set_exception(EngineLoopStopped(f"engine loop stopped: {self._error!r}"))
            return fut
        self._calls.put((fn, fut))
        return fut

    def push_outputs(self, outputs: list[RequestOutput]) -> None:
        """Outputs produced outside a step (first tokens of received KV, aborts)."""
        if outputs and self._sink is not None:
            self._sink(outputs)
        elif outputs:
            with self._out_cv:
                self._outputs.extend(outputs)
                self._out_cv.notify_all()

    def poll_outputs(self, timeout: float) -> list[RequestOutput]:
        """Every output since the last poll; waits up to ``timeout`` seconds for the first one."""
        deadline = time.monotonic() + timeout
        with self._out_cv:
            while not self._outputs and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._out_cv.wait(left)
            out, self._outputs = self._outputs, []
        if self._error is not None and not out:
            raise EngineLoopStopped(f"engine loop failed: {self._error!r}")
        return out

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stop.is_set():
                self._drain_calls(block=not engine.has_unfinished_requests())
                for tick in self._tickers:
                    tick(engine)
                if not engine.has_unfinished_requests():
                    continue
                t0, c0 = time.perf_counter(), time.thread_time()
                outputs = engine.step()
                so = engine.last_scheduler_output
                assert so is not None  # step() sets it first thing
                for hook in self._after_step:
                    hook(engine, so)
                self.busy_seconds += time.perf_counter() - t0
                self.busy_cpu_seconds += time.thread_time() - c0
                self.num_steps += 1
                self.push_outputs(outputs)
        except BaseException as e:  # a broken engine must not hang its callers
            log.exception("engine loop failed")
            self._error = e
            with self._out_cv:
                self._out_cv.notify_all()
            self._fail_pending(e)

    def _drain_calls(self, block: bool) -> None:
        try:
            fn, fut = self._calls.get(timeout=self.idle_wait_s) if block else self._calls.get_nowait()
        except queue.Empty:
            return
        while True:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except Exception as e:  # noqa: BLE001 - reported to the caller, the loop goes on
                    fut.set_exception(e)
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return

    def _fail_pending(self, error: BaseException) -> None:
        while True:
            try:
                _, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineLoopStopped(f"engine loop failed: {error!r}"))
