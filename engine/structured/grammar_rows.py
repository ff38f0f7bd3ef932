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

A step's masks depend only on the tokens sampled before it, so ``start`` computes them on a
thread while the model runs the step's forward, every row's in one call to llguidance's parallel
fill (its executor made once per engine; one fill thread: each row in turn, on that thread); ``apply``
waits for them and masks the logits in one op.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import llguidance
import llguidance.numpy as lnp
import numpy as np
import torch

from engine.errors import InvalidParameterError
from engine.model.tokenizer import Tokenizer
from engine.output_error import OutputError
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler

_BITS = torch.arange(32, dtype=torch.int32)
# llguidance's fill threads: its own default's (most of the cores, at most 32), at least one.
_FILL_THREADS = max(1, min(32, int(0.8 * (os.cpu_count() or 1))))


class _Row:
    __slots__ = ("consumed", "failure", "matcher", "param", "slot")

    def __init__(
        self, matcher: llguidance.LLMatcher | None, slot: int, param: str, failure: OutputError | None
    ) -> None:
        self.matcher = matcher  # None: its constraint did not compile (``failure`` says why)
        self.slot = slot
        self.param = param  # the request field the constraint came from (named in its error)
        self.failure = failure
        self.consumed = 0  # output tokens the matcher holds

    @property
    def failed(self) -> bool:
        return self.matcher is None or self.matcher.is_error()


@dataclass(slots=True)
class StepMasks:
    """One step's masks: ``at`` the constrained positions among the step's sampled positions
    (ascending), ``bitmask`` [len(at), ceil(V / 32)] int32 their allowed tokens (never none);
    ``errors``: slot -> why its matcher failed (its request ends with ERROR: its masks are no longer
    the grammar's)."""

    at: np.ndarray
    bitmask: np.ndarray
    errors: dict[int, OutputError] = field(default_factory=dict)

    def allows(self, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Whether each of ``positions`` (constrained ones) allows its token in ``tokens``."""
        j = np.searchsorted(self.at, positions)
        words = self.bitmask[j, tokens >> 5]
        allowed: np.ndarray = ((words >> (tokens & 31).astype(np.int32)) & 1).astype(bool)
        return allowed


class MaskJob:
    """The masks of one step, being computed (``result`` waits for them)."""

    def __init__(self, future: Future[StepMasks]) -> None:
        self._future = future

    def result(self) -> StepMasks:
        return self._future.result()


class GrammarRows:
    def __init__(self, compiler: Callable[[], GrammarCompiler], vocab_size: int, *, overlap: bool = True) -> None:
        self._make_compiler = compiler  # built at the first constrained request (its tokenizer takes ~0.2 s)
        self._compiler: GrammarCompiler | None = None
        self.vocab_size = vocab_size
        self.rows: dict[int, _Row] = {}
        self.overlap = overlap  # masks computed on a thread, beside the forward
        self._executor: llguidance.LLExecutor | None = None  # llguidance's fill threads, made once
        self._thread: ThreadPoolExecutor | None = None
        self._pending: MaskJob | None = None
        self._eos: np.ndarray | None = None

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = self._make_compiler()
        return self._compiler

    def join(self, slot: int, params: SamplingParams) -> None:
        """A request takes ``slot`` (anew: its matcher starts over and replays its tokens)."""
        self.wait()  # (a step's masks still being computed hold matchers: never swap one under it)
        c = params.structured
        if c is None:
            self.rows.pop(slot, None)
            return
        try:  # (compiled before the request was scheduled, unless evicted since: engine/structured/grammar_waits.py)
            self.rows[slot] = _Row(self.compiler.matcher(c), slot, c.field, None)
        except InvalidParameterError as e:  # the step goes on; this row's request ends with ERROR
            self.rows[slot] = _Row(None, slot, c.field, OutputError(e.message, c.field))

    def constrained(self, slots: Sequence[int]) -> bool:
        return bool(self.rows) and any(s in self.rows for s in slots)

    def start(
        self,
        slots: np.ndarray,
        offsets: np.ndarray | None,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        num_prompt_tokens: np.ndarray,
    ) -> MaskJob | None:
        """Begin computing the masks of a step sampling ``slots`` (``offsets[i]``: position i's place
        in its row's run of drafts); None when no row is constrained. The arrays are not written
        until the step samples (the runner waits for the job before that)."""
        self.wait()
        slot_list = slots.tolist()
        if not self.constrained(slot_list):
            return None
        # The inputs copied now (cheap), so that the thread reads nothing the main thread may write.
        runs: list[tuple[int, _Row, list[int], list[int]]] = []  # (first position, row, new tokens, drafts)
        at: list[int] = []
        for i, slot in enumerate(slot_list):
            row = self.rows.get(slot)
            if row is None:
                continue
            at.append(i)
            if offsets is not None and offsets[i]:
                runs[-1][3].append(int(token_ids[slot, int(num_tokens[slot]) + int(offsets[i]) - 1]))
                continue
            start, end = int(num_prompt_tokens[slot]) + row.consumed, int(num_tokens[slot])
            runs.append((len(at) - 1, row, token_ids[slot, start:end].tolist() if end > start else [], []))
        positions = np.asarray(at, dtype=np.int64)
        if not self.overlap:
            done: Future[StepMasks] = Future()
            done.set_result(self._compute(positions, runs))
            return MaskJob(done)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._pending = MaskJob(self._thread.submit(self._compute, positions, runs))
        return self._pending

    def wait(self) -> None:
        """The pending step's masks done (their matchers free to change)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending._future.exception()  # (its error, if any, is raised where the step takes the result)

    def _compute(self, positions: np.ndarray, runs: list[tuple[int, _Row, list[int], list[int]]]) -> StepMasks:
        # Never all-ones: a position the fill leaves untouched (past a refused draft) stays all-zero.
        bitmask = np.zeros((len(positions), (self.vocab_size + 31) // 32), dtype=np.int32)
        if self._executor is None:
            self._executor = llguidance.LLExecutor(_FILL_THREADS)
        for _, row, new, _ in runs:
            if new and row.matcher is not None:
                row.matcher.consume_tokens(new)
                row.consumed += len(new)
        plain = [(row.matcher, j) for j, row, _, drafts in runs if not drafts and row.matcher is not None]
        if len(plain) > 1 and _FILL_THREADS > 1:
            lnp.fill_next_token_bitmask_par(self._executor, plain, bitmask)
        else:  # (one row, or one fill thread: a handoff to the executor's thread would only add its wake-up)
            for m, j in plain:
                lnp.fill_next_token_bitmask(m, bitmask, j)
        drafted = [(row.matcher, j, drafts) for j, row, _, drafts in runs if drafts and row.matcher is not None]
        if drafted:  # each draft consumed after the mask before it, the matcher rolled back after
            lnp.fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
        empty = np.count_nonzero(bitmask, axis=1) == 0
        if empty.any():
            for j, _row, _, drafts in runs:  # past a refused draft: the last mask (never kept, see above)
                for k in range(j + 1, j + 1 + len(drafts)):
                    if empty[k]:
                        bitmask[k] = bitmask[k - 1]
            empty = np.count_nonzero(bitmask, axis=1) == 0
            # (A failed or finished matcher's mask is its EOS; should one allow nothing: EOS ends the request.)
            bitmask[empty] |= self._eos_mask()
        # A matcher fails when it refuses a token its own mask allowed, or runs out of room (an Earley
        # row, lexer fuel): from then on its mask is EOS alone, which would end the request as if
        # the grammar were complete. Its request ends with ERROR instead, naming the constraint.
        errors = {row.slot: row.failure or _failure(row) for _, row, _, _ in runs if row.failed}
        return StepMasks(positions, bitmask, errors)

    def _eos_mask(self) -> np.ndarray:
        if self._eos is None:
            eos = np.zeros((self.vocab_size + 31) // 32, dtype=np.uint32)
            for t in self.compiler.tokenizer.eos_tokens:
                if t < self.vocab_size:
                    eos[t >> 5] |= np.uint32(1 << (t & 31))
            self._eos = eos.view(np.int32)
        return self._eos

    def apply(self, logits: torch.Tensor, masks: StepMasks, positions: np.ndarray | None = None) -> torch.Tensor:
        """``logits`` [N, V] (one row per sampled position of the step, or per one of ``positions``,
        ascending) with every token the grammar forbids at -inf: a new tensor where a row is
        constrained, else ``logits`` itself."""
        if positions is None:
            rows, bitmask = masks.at, masks.bitmask
        else:
            keep = np.isin(masks.at, positions)
            rows, bitmask = np.searchsorted(positions, masks.at[keep]), masks.bitmask[keep]
        if not len(rows):
            return logits
        forbidden = _forbidden(bitmask, logits.shape[1], logits.device)
        if len(rows) == len(logits):  # every row constrained (so in order): one op
            return logits.masked_fill(forbidden, float("-inf"))
        out = logits.clone()
        idx = torch.from_numpy(rows).to(logits.device)
        out[idx] = out[idx].masked_fill(forbidden, float("-inf"))
        return out

    def mask(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        offsets: np.ndarray | None,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        num_prompt_tokens: np.ndarray,
    ) -> torch.Tensor:
        """``start`` and ``apply`` at once (no overlap): ``logits`` one row per position of ``slots``."""
        job = self.start(np.asarray(slots, dtype=np.int64), offsets, token_ids, num_tokens, num_prompt_tokens)
        return logits if job is None else self.apply(logits, job.result())


def _failure(row: _Row) -> OutputError:
    assert row.matcher is not None  # (a row without one has its failure)
    error = " ".join(row.matcher.get_error().replace("<non-verbose/>", "").split())
    if len(error) > 300:
        error = error[:300] + "..."
    return OutputError(
        f"{row.param} could not be enforced: its grammar failed with {row.consumed} output tokens generated ({error})",
        row.param,
    )


def _forbidden(bitmask: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
    """int32 bitmask [R, ceil(V / 32)] -> bool [R, V] of the tokens it forbids (bit b of word w:
    token 32 w + b). On the host numpy's unpackbits (the words' bytes are little-endian); on a
    device the words are sent (32 times smaller) and unpacked there."""
    if device.type == "cpu":
        unpacked = np.unpackbits((~bitmask).view(np.uint8), axis=1, count=vocab, bitorder="little")
        return torch.from_numpy(unpacked).view(torch.bool)
    words = torch.from_numpy(bitmask).to(device, non_blocking=True)
    bits = (words[:, :, None] >> _BITS.to(device)) & 1
    forbidden: torch.Tensor = bits.reshape(len(bitmask), -1)[:, :vocab] == 0
    return forbidden


def grammar_rows(tokenizer: Tokenizer | None, vocab_size: int) -> GrammarRows | None:
    """The runner's matchers for an engine with ``tokenizer`` (None without one: nothing to compile with)."""
    if tokenizer is None:
        return None
    return GrammarRows(lambda: GrammarCompiler.for_tokenizer(tokenizer, vocab_size), vocab_size)
