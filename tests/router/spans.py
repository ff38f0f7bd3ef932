"""Reading finished spans in tests (router/tracing.py's, from the SDK's in-memory exporter)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from opentelemetry.sdk.trace import ReadableSpan


def start(span: ReadableSpan) -> int:
    assert span.start_time is not None
    return span.start_time


def end(span: ReadableSpan) -> int:
    assert span.end_time is not None
    return span.end_time


def attrs(span: ReadableSpan) -> Mapping[str, object]:
    assert span.attributes is not None
    return span.attributes


def in_order(spans: Mapping[str, ReadableSpan], names: list[str]) -> None:
    """Each of ``names`` starts where the one before it ended (or later)."""
    for a, b in itertools.pairwise(names):
        assert end(spans[a]) <= start(spans[b]) + 1000, (a, b)
