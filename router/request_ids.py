"""The rule for a client-chosen request id, shared by the HTTP (``X-Request-Id``) and gRPC
(``GenerateRequest.request_id``) frontends.

A request id names the request in logs, in ``POST /v1/abort/{id}`` and, for a durable batch job,
in ``GET /v1/batches/{id}``: so it must be a plain URL path segment, with nothing (a newline, ``/``,
``:``, ``%``) that could forge a log line or that a path could not carry. An id outside the rule
names nothing, so an abort or a batch lookup with one is "not found" at once. Pure Python (no
FastAPI): both frontends and the router import it.
"""

from __future__ import annotations

MAX_REQUEST_ID_LEN = 128
REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
REQUEST_ID_RULE = f"1-{MAX_REQUEST_ID_LEN} characters of letters, digits, '.', '_' or '-'"


def is_valid_request_id(rid: str) -> bool:
    return 1 <= len(rid) <= MAX_REQUEST_ID_LEN and set(rid) <= REQUEST_ID_CHARS  # length first: cheap
