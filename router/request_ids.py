"""The rule for a client-chosen request id, shared by the HTTP (``X-Request-Id``) and gRPC
(``GenerateRequest.request_id``) frontends.

A request id names the request in logs, in ``POST /v1/abort/{id}`` and, for a durable batch job,
in ``GET /v1/batches/{id}``: so it must be a plain URL path segment, with nothing (a newline, ``/``,
``:``, ``%``) that could forge a log line or that a path could not carry. An id outside the rule
names nothing, so an abort or a batch lookup with one is "not found" at once. Pure Python (no
FastAPI): both frontends and the router import it.

Ids belong to a tenant: inside the cluster a request runs under ``scoped_request_id(tenant, id)``,
the client's id tagged with a hash of its tenant's name after a ``~`` (a character no client id
has), and the router's streams show clients the id they chose (``shown_request_id``). So tenants
cannot see (by a 409) or take each other's ids, and the tag is the same on every router replica
(a durable batch job, an abort that reaches another replica through the journal).
"""

from __future__ import annotations

from hashlib import blake2b

MAX_REQUEST_ID_LEN = 128
REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
REQUEST_ID_RULE = f"1-{MAX_REQUEST_ID_LEN} characters of letters, digits, '.', '_' or '-'"


def is_valid_request_id(rid: str, max_len: int = MAX_REQUEST_ID_LEN) -> bool:
    return 1 <= len(rid) <= max_len and set(rid) <= REQUEST_ID_CHARS  # length first: cheap


# A request of n choices runs as "<id>-0" ... "<id>-15" (router/choices.py): ids up to this long name
# a request, though clients choose at most MAX_REQUEST_ID_LEN characters.
MAX_CHOICE_ID_LEN = MAX_REQUEST_ID_LEN + len("-15")


def names_a_request(rid: str) -> bool:
    """Whether ``rid`` could be the id of a request here (a client's, or one of its choices')."""
    return is_valid_request_id(rid, MAX_CHOICE_ID_LEN)


def scoped_request_id(tenant: str, rid: str) -> str:
    """The id ``tenant``'s request ``rid`` runs under in the router, the journal and the workers."""
    return f"{rid}~{blake2b(tenant.encode(), digest_size=6).hexdigest()}"


def shown_request_id(rid: str) -> str:
    """The client's own id of a request running under ``rid`` (a scoped id, or already the client's)."""
    return rid.split("~", 1)[0]
