"""Requests held out of the scheduler while their grammar compiles (no torch).

A worker compiles every constraint it is given (the router compiled it too, in its own process),
and a compile may take up to the compile budget. The engine thread never waits for one: a request
whose constraint is not compiled yet is held here, its compile running on the compiler's threads,
while the engine steps its other requests; at each step the requests whose compile is done join
the scheduler's waiting queue (QUEUED, as if just added), and those whose compile failed, or ran
past the budget's ``wall_s``, end with finish reason ERROR naming their constraint's field (their
compile, if still running, goes on and is cached). A held request holds no blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import InvalidParameterError
from engine.output_error import OutputError
from engine.request import Request
from engine.structured.compiler import GrammarCompiler, over_budget

if TYPE_CHECKING:
    import llguidance


@dataclass(slots=True)
class _Held:
    req: Request
    compile: Future[llguidance.LLMatcher]
    since: float


class GrammarWaits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[str, _Held] = {}
        self._clock = clock

    def hold(self, req: Request, compiler: GrammarCompiler) -> bool:
        """Hold ``req`` (True) unless its constraint is compiled already (False: it may be scheduled)."""
        c = req.sampling_params.structured
        assert c is not None  # (only a constrained request waits for a grammar)
        future = compiler.compile_async(c)
        if future.done() and future.exception() is None:
            return False
        self._held[req.request_id] = _Held(req, future, self._clock())
        return True

    def take(self, budget_s: float) -> tuple[list[Request], list[Request]]:
        """The held requests now compiled (to schedule), and those that cannot be (their ``error``
        set: to end with ERROR); both let go."""
        ready: list[Request] = []
        failed: list[Request] = []
        now = self._clock()
        for rid, held in list(self._held.items()):
            c = held.req.sampling_params.structured
            assert c is not None
            if held.compile.done():
                e = held.compile.exception()
                if e is None:
                    ready.append(held.req)
                else:
                    failed.append(_failed(held.req, e, c.field))
            elif now - held.since > budget_s:
                failed.append(
                    _failed(held.req, InvalidParameterError(c.field, over_budget(c.field, budget_s)), c.field)
                )
            else:
                continue
            del self._held[rid]
        return ready, failed

    def wait(self, timeout_s: float) -> None:
        """Block until a held compile is done, or ``timeout_s`` (an engine with nothing else to step)."""
        if self._held:
            wait_futures([h.compile for h in self._held.values()], timeout_s, FIRST_COMPLETED)

    def drop(self, request_id: str) -> Request | None:
        """Let go of a held request (aborted); None if it is not held."""
        held = self._held.pop(request_id, None)
        return None if held is None else held.req

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def __len__(self) -> int:
        return len(self._held)


def _failed(req: Request, e: BaseException, field: str) -> Request:
    message = e.message if isinstance(e, InvalidParameterError) else f"{field} cannot be compiled: {e!r}"
    req.error = OutputError(message, field)
    return req
