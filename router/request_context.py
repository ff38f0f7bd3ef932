"""Everything the router knows about one request, from admission to its last token: shared by the
registry of requests in flight, the lane dispatcher and the request's stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from engine.request_spec import RequestSpec
from router.placement import NO_HINT, PlacementHint
from router.request_trace import RequestTrace
from router.stream import RequestStream


@dataclass(eq=False)
class RequestContext:
    request_id: str  # tenant-scoped (router.request_ids)
    tenant: str
    lane: str
    prompt_tokens: int
    max_tokens: int
    stream: RequestStream
    spec: RequestSpec
    prompt_text: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    dispatched: float | None = None
    window_s: float = 0.0
    hint: PlacementHint = NO_HINT
    predicted_ttft_s: float | None = None
    finished: bool = False
    idempotency: tuple[str, str] | None = None  # (tenant, key)
    durable: bool = False  # a journaled batch job: a client going away does not abort it
    deadline_task: asyncio.Task[None] | None = None  # a gRPC deadline's timer, cancelled when the request ends
    timed_tokens: int = 0  # tokens whose inter-token gaps are in the ITL histogram (over all its readers)
    trace: RequestTrace | None = None  # set only while tracing is on (router/tracing.py)
