"""Why the engine ended a request with an error (pure Python: the request, the scheduler and the
outputs all carry it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutputError:
    """Why the engine ended a request with finish reason ERROR, where it can say: ``param`` names
    the request field at fault (its constraint could not be enforced: the client's to change), or
    is None (the server's own failure)."""

    message: str
    param: str | None = None
