"""Counting a durable batch consumer's polls of its journal: a job that never ran is proven so
after polls that would have run it (rather than after a sleep)."""

from __future__ import annotations

import pytest

from router.state.journal import BatchJournal, ClaimedJob


def count_claims(journal: BatchJournal, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts ``journal``'s claims from here on: one element per claim, the number of jobs it handed out."""
    claims: list[int] = []
    real_claim = journal.claim

    async def claim(consumer: str, count: int = 10, min_idle_ms: int = 60_000) -> list[ClaimedJob]:
        got = await real_claim(consumer, count=count, min_idle_ms=min_idle_ms)
        claims.append(len(got))
        return got

    monkeypatch.setattr(journal, "claim", claim)
    return claims
