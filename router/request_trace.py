"""One request's trace: the client's W3C context and the router's timestamps that its spans are built
from when the request ends (router/tracing.py). Only exists while tracing is on: with it off a
request carries None and pays nothing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestTrace:
    traceparent: str | None  # the client's, as sent (None: the request starts a trace)
    tracestate: str | None
    received: float  # time.monotonic() when the router took the request
    received_ns: int  # time.time_ns() at the same moment: spans need wall-clock times
    placed: float | None = None  # monotonic: the pool dispatcher's placement calls returned
    prefill_worker: str | None = None  # None: the decode worker prefilled it itself
    decode_worker: str | None = None

    def wall_ns(self, monotonic: float) -> int:
        """A monotonic stamp of this router as wall-clock nanoseconds."""
        return self.received_ns + int((monotonic - self.received) * 1e9)
