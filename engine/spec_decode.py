"""N-gram (prompt lookup) drafts for speculative decoding (pure Python, no torch).

After a step, each decoding request gets up to ``num_tokens`` drafted tokens: the tokens that
followed the latest earlier occurrence of its last ``m`` tokens (``m`` from ``max_ngram`` down to
``min_ngram``, the longest match first), searched in its prompt and output. The next step computes
the request's last token and the drafts together, each position over the request's paged KV, and
samples at every position as plain decoding would there (engine/runner.py): its penalties' history
and ``min_tokens`` count include the drafts before it, and a seeded request's noise is the one for
that output index. The request keeps its drafts up to the first one that differs from the token
sampled before it, plus that sampled token. So a step yields 1 to ``num_tokens + 1`` tokens, each
one sampled after the tokens really before it: the output has plain decoding's distribution, and a
greedy or seeded request gets plain decoding's very tokens (up to the float order of the batch's
arithmetic, as between any two batch shapes). For a point-mass draft this coupling accepts a draft
``d`` with probability ``p(d)``, which is what the rejection rule of speculative sampling accepts.
Logprobs of a kept draft are those of the position that sampled it.

Each request keeps an index of its n-grams (``Request.draft_index``), grown by the tokens appended
since the last proposal, so a proposal costs a few dictionary lookups, not a scan of the sequence.
"""

from __future__ import annotations

from engine.config import SpeculativeConfig
from engine.request import Request


class NgramIndex:
    """For each n-gram length ``m``, the end position of the latest occurrence of every m-gram
    among positions ``< indexed``."""

    __slots__ = ("latest", "indexed")

    def __init__(self, max_ngram: int) -> None:
        self.latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        self.indexed = 0  # n-grams ending before this position are in ``latest``

    def extend(self, tokens: list[int], end: int) -> None:
        """Index the n-grams ending at positions ``indexed .. end - 1``."""
        latest = self.latest
        top = len(latest) - 1
        for e in range(self.indexed, end):
            for m in range(1, min(top, e + 1) + 1):
                latest[m][tuple(tokens[e - m + 1 : e + 1])] = e
        self.indexed = max(self.indexed, end)


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.num_tokens = config.num_tokens
        self.max_ngram = config.max_ngram
        self.min_ngram = config.min_ngram

    def propose(self, req: Request, limit: int) -> list[int]:
        """Up to ``min(num_tokens, limit)`` drafted tokens to follow ``req.all_token_ids`` ([] if no
        earlier occurrence of its last tokens, or ``limit`` < 1)."""
        k = min(self.num_tokens, limit)
        if k < 1:
            return []
        tokens = req.all_token_ids
        n = len(tokens)
        index = req.draft_index
        if index is None:
            index = req.draft_index = NgramIndex(self.max_ngram)
        # Matches must end before the last token (the suffix itself is not an earlier occurrence).
        index.extend(tokens, n - 1)
        latest = index.latest
        for m in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            end = latest[m].get(tuple(tokens[n - m :]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []
