"""The runner's grammar matchers: one per constrained row of the batch (so one per request, and one
per choice of an ``n`` > 1 request), and the token bitmask applied to a step's logits.

A matcher only ever holds tokens the batch holds: before a row's mask is computed, the matcher
consumes the row's output tokens it has not seen yet (``token_ids`` from its prompt's end). So a
request that joins a batch with tokens already generated -- the first token the prefill worker
sampled, a request preempted and recomputed, one migrated with its delivered tokens -- gets a fresh
matcher that replays them; nothing about grammar state is sent between workers. A row with drafts
(speculative decoding) gets one mask per drafted position: the matcher consumes the drafts one by
one (a mask after each), then is rolled back to the row's known tokens; past a draft the grammar
refuses, the positions reuse the last mask (they cannot be kept: the token sampled at the refused
draft's position differs from it, so verification stops there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llguidance
import llguidance.numpy as lnp
import numpy as np
import torch

from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler

_BITS = torch.arange(32, dtype=torch.int32)


class _Row:
    __slots__ = ("consumed", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.consumed = 0  # output tokens the matcher holds


class GrammarRows:
    def __init__(self, compiler: Callable[[], GrammarCompiler], vocab_size: int) -> None:
        self._make_compiler = compiler  # built at the first constrained request (its tokenizer takes ~0.2 s)
        self._compiler: GrammarCompiler | None = None
        self.vocab_size = vocab_size
        self.rows: dict[int, _Row] = {}

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = self._make_compiler()
        return self._compiler

    def join(self, slot: int, params: SamplingParams) -> None:
        """A request takes ``slot`` (anew: its matcher starts over and replays its tokens)."""
        if params.structured is None:
            self.rows.pop(slot, None)
        else:
            self.rows[slot] = _Row(self.compiler.matcher(params.structured))

    def constrained(self, slots: Sequence[int]) -> bool:
        return bool(self.rows) and any(s in self.rows for s in slots)

    def apply(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        offsets: np.ndarray | None,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        num_prompt_tokens: np.ndarray,
    ) -> torch.Tensor:
        """``logits`` [N, V] (one row per sampled position; ``offsets[i]``: position i's place in its
        row's run of drafts) with every token the grammar forbids at -inf: a new tensor where a
        row is constrained, else ``logits`` itself."""
        at = [i for i, s in enumerate(slots) if s in self.rows]
        if not at:
            return logits
        bitmask = lnp.allocate_token_bitmask(len(at), self.vocab_size)
        run_slot, run_kept, ok = -1, 0, True
        for j, i in enumerate(at):
            slot = slots[i]
            row = self.rows[slot]
            m = row.matcher
            offset = 0 if offsets is None else int(offsets[i])
            if offset == 0:
                if run_slot >= 0 and run_kept:
                    self.rows[run_slot].matcher.rollback(run_kept)
                run_slot, run_kept, ok = slot, 0, True
                start, end = int(num_prompt_tokens[slot]) + row.consumed, int(num_tokens[slot])
                if end > start:
                    m.consume_tokens(token_ids[slot, start:end].tolist())
                    row.consumed += end - start
            elif ok:  # the draft before this position
                # (try_: a refused token leaves the matcher as it was; consume_token would fail it for good)
                ok = m.try_consume_tokens([int(token_ids[slot, int(num_tokens[slot]) + offset - 1])]) == 1
                run_kept += ok
            if offset and not ok:
                bitmask[j] = bitmask[j - 1]
            elif m.is_error() or m.is_stopped():
                bitmask[j] = 0  # (an exhausted or failed matcher: only EOS, set below)
            else:
                lnp.fill_next_token_bitmask(m, bitmask, j)
        if run_slot >= 0 and run_kept:
            self.rows[run_slot].matcher.rollback(run_kept)
        allowed = _unpack(torch.from_numpy(bitmask), logits.shape[1])
        for j in range(len(at)):
            if not allowed[j].any():  # nothing left to say: end the request (EOS finishes a constrained one)
                allowed[j, list(self.compiler.tokenizer.eos_tokens)] = True
        out = logits.clone()
        idx = torch.tensor(at, device=logits.device)
        out[idx] = out[idx].masked_fill(~allowed.to(logits.device), float("-inf"))
        return out


def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 bitmask [R, ceil(V / 32)] -> bool [R, V] (bit b of word w: token 32 w + b)."""
    bits = (bitmask[:, :, None] >> _BITS) & 1
    return bits.reshape(len(bitmask), -1)[:, :vocab].bool()


def grammar_rows(tokenizer: Tokenizer | None, vocab_size: int) -> GrammarRows | None:
    """The runner's matchers for an engine with ``tokenizer`` (None without one: nothing to compile with)."""
    if tokenizer is None:
        return None
    return GrammarRows(lambda: GrammarCompiler.for_tokenizer(tokenizer, vocab_size), vocab_size)
