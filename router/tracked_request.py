"""A request the dispatcher has placed (or is placing) on the pools: where it runs, how often it
moved, and the workers that may still hold a stale copy of it. Shared by the dispatcher, which
places requests and delivers their outputs, and its failure handling, which migrates them."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request_spec import RequestSpec
from router.placement import NO_HINT, PlacementHint
from router.stream import RequestStream


@dataclass
class TrackedRequest:
    spec: RequestSpec
    stream: RequestStream
    hint: PlacementHint = NO_HINT
    decode_id: str | None = None
    prefill_id: str | None = None
    migrations: int = 0
    placing: bool = False  # a place call owns it: a worker's death is handled there, not by a migration
    # Decode workers it left when they were taken for dead: one only slow may still run a copy.
    stale_copies: set[str] = field(default_factory=set)
