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

Each request keeps an index of its n-grams (``DraftState.index``), grown by the tokens appended
since the last proposal, so a proposal costs a few dictionary lookups, not a scan of the sequence.

How many tokens a request drafts adapts to how its drafts fare (``SpeculativeConfig.min_keep_chance``
c): it keeps a moving keep rate r over the drafts its steps judged (a kept draft raises r, the first
miss of a run lowers it; the drafts after a miss were not judged and do not count), and drafts the
largest k with r^k >= c, the chance that its k-th draft is kept. Where r^1 < c it drafts nothing,
except one token every ``PROBE_EVERY`` steps, so a request whose text starts to repeat is noticed.
A draft that misses costs a row of the step as much as a useful one (on a CPU, decode is bound by
arithmetic from a few rows), so this keeps sampled requests at high temperatures and text that does
not repeat from paying for drafts (docs/BENCHMARKS.md, "Speculative decoding for sampled requests").
"""

from __future__ import annotations

import math

from engine.config import SpeculativeConfig
from engine.draft_state import DraftState
from engine.request import Request

RATE_WEIGHT = 0.2  # each judged draft moves the keep rate this share of the way to 1 (kept) or 0
PROBE_EVERY = 16  # steps without drafts before a request whose rate is too low drafts one token


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.num_tokens = config.num_tokens
        self.max_ngram = config.max_ngram
        self.min_ngram = config.min_ngram
        self.min_keep_chance = config.min_keep_chance
        self._log_chance = math.log(config.min_keep_chance) if config.min_keep_chance else 0.0

    def draft_length(self, state: DraftState) -> int:
        """How many tokens the request's keep rate allows (``num_tokens`` without adaptation)."""
        if not self.min_keep_chance:
            return self.num_tokens
        r = state.keep_rate
        k = self.num_tokens if r >= 1.0 else min(self.num_tokens, int(self._log_chance / math.log(r)))
        if k:
            state.idle_steps = 0
            return k
        state.idle_steps += 1
        if state.idle_steps >= PROBE_EVERY:
            state.idle_steps = 0
            return 1
        return 0

    @staticmethod
    def record(state: DraftState, num_drafts: int, num_kept: int) -> None:
        """A step judged ``num_drafts`` drafts and kept the first ``num_kept``: each kept one moves
        the keep rate up, the first miss (if any) moves it down; the drafts after it were not judged."""
        r = 1.0 - (1.0 - state.keep_rate) * (1.0 - RATE_WEIGHT) ** num_kept
        if num_kept < num_drafts:
            r *= 1.0 - RATE_WEIGHT
        state.keep_rate = max(r, 1e-6)  # (never 0: its logarithm divides)

    def propose(self, req: Request, limit: int) -> list[int]:
        """Up to ``min(num_tokens, limit)`` drafted tokens to follow ``req.all_token_ids``, fewer as
        its keep rate allows ([] if no earlier occurrence of its last tokens, or ``limit`` < 1)."""
        state = req.draft_state
        if state is None:
            state = req.draft_state = DraftState(self.max_ngram)
        k = min(self.draft_length(state), limit)
        if k < 1:
            return []
        tokens = req.all_token_ids
        n = len(tokens)
        index = state.index
        # Matches must end before the last token (the suffix itself is not an earlier occurrence).
        index.extend(tokens, n - 1)
        latest = index.latest
        for m in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            end = latest[m].get(tuple(tokens[n - m :]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []
