"""A request's drafting state for speculative decoding (engine/spec_decode.py): the index of its
n-grams and the rate at which its drafts are kept. Apart from the proposer, so that ``Request`` can
name the type it holds without importing the proposer, which imports it (pure Python, no torch)."""

from __future__ import annotations

INITIAL_KEEP_RATE = 0.8  # a new request's: drafts 3 at the default chance of 0.5, then learns


class NgramIndex:
    """For each n-gram length ``m``, the end position of the latest occurrence of every m-gram
    among positions ``< indexed``."""

    __slots__ = ("indexed", "latest")

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


class DraftState:
    """A request's drafting state (``Request.draft_state``): its n-gram index and its keep rate."""

    __slots__ = ("idle_steps", "index", "keep_rate")

    def __init__(self, max_ngram: int) -> None:
        self.index = NgramIndex(max_ngram)
        self.keep_rate = INITIAL_KEEP_RATE
        self.idle_steps = 0  # steps its keep rate allowed no draft, since the last one it drafted
