"""The runner's persistent batch: token ids and block tables per request row, in numpy.

The scheduler sends deltas (``engine.scheduler_output``); this keeps the full state so that each
step's inputs are built with a handful of vectorized numpy operations, never a Python loop over
tokens. Rows are recycled as requests leave.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput


@dataclass(slots=True)
class StepInputs:
    """Everything one forward pass needs, as numpy arrays (batch order: single-token rows first)."""

    input_ids: np.ndarray  # [T] int64
    # [T] int64: each token's rotary index, its position (plus the long half's offset for a row in
    # longrope's long state: engine/model/rope.py). Attention and the KV slots use the sequence lengths
    # and slots below, never these.
    positions: np.ndarray
    slot_block: np.ndarray  # [T] int64
    slot_offset: np.ndarray  # [T] int64
    num_decode_tokens: int
    decode_block_tables: np.ndarray  # [D, nb] int32
    decode_seq_lens: np.ndarray  # [D] int32
    prefill_block_tables: np.ndarray  # [P, nb] int32
    prefill_cu_seqlens_q: np.ndarray  # [P + 1] int32
    prefill_seq_lens: np.ndarray  # [P] int32
    logits_indices: np.ndarray  # [N] rows of the hidden states to sample from
    sample_rows: np.ndarray  # [N] rows (slots) that sample (a row with drafts: 1 + drafts times, in a run)
    # Prompt chunks whose request wants prompt logprobs: (slot, index of the first prompt token
    # scored, rows of the hidden states whose logits score it and the next ones, those tokens).
    prompt_logprob_rows: list[tuple[int, int, np.ndarray, np.ndarray]] = field(default_factory=list)
    # [N] with drafts in the step: each sampled position's place in its row's run (0 predicts the
    # row's next token, j the token after its j-th draft); None without drafts.
    sample_offsets: np.ndarray | None = None


class InputBatch:
    """Rows are the scheduler's slots: a request keeps its row from joining the batch to leaving it."""

    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_seqs, max_model_len + 1), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_seqs, dtype=np.int64)
        self.num_computed = np.zeros(max_num_seqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_seqs, self.max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_seqs, dtype=np.int64)
        # longrope: the rows in the long state, and what their rotary indices add to their positions
        # (the model's table has the long half after the short one, its length the context length).
        self.long_rope_rows: set[int] = set()
        self.rope_shift = np.zeros(max_num_seqs, dtype=np.int64)
        # Speculative decoding: this step's drafted tokens per row (written after the row's known
        # tokens in ``token_ids``), and the rows that have them.
        self.num_drafts = np.zeros(max_num_seqs, dtype=np.int64)
        self.draft_rows: list[int] = []
        self.params: list[SamplingParams | None] = [None] * max_num_seqs
        # Rows whose request wants logprobs / prompt logprobs / has penalties or a logit bias: a step
        # looks for those features only while some row in the batch has them.
        self.logprob_rows: set[int] = set()
        self.scoring_rows: set[int] = set()
        self.processing_rows: set[int] = set()
        # A step without prompt chunks: its (empty, read-only) prefill inputs, made once.
        self._no_prefill = (np.zeros((0, 0), dtype=np.int32), np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.int32))
        for a in self._no_prefill:
            a.flags.writeable = False
        # The last step's slot list (the scheduler's, held so that its identity stays unique) and
        # its rows as an array: a batch that stays the same for many steps converts it once.
        self._rows_of: list[int] | None = None
        self._rows = np.zeros(0, dtype=np.int64)

    # -- deltas -----------------------------------------------------------------------------
    def apply(self, so: SchedulerOutput) -> None:
        if self.draft_rows:
            self.num_drafts[self.draft_rows] = 0
            self.draft_rows = []
        for new in so.new_requests:
            row = new.slot
            n = len(new.token_ids)
            self.token_ids[row, :n] = new.token_ids
            self.num_tokens[row] = n
            self.num_computed[row] = new.num_computed_tokens
            nb = len(new.block_ids)
            self.block_table[row, :nb] = new.block_ids
            self.num_blocks[row] = nb
            self.params[row] = new.sampling_params
            sp = new.sampling_params
            for wanted, rows in (
                (sp.logprobs is not None, self.logprob_rows),
                (sp.prompt_logprobs is not None, self.scoring_rows),
                (sp.processes_logits, self.processing_rows),
            ):
                if wanted:
                    rows.add(row)
                else:
                    rows.discard(row)
            self.num_prompt_tokens[row] = new.num_prompt_tokens
            if new.long_rope:
                self.long_rope_rows.add(row)
                self.rope_shift[row] = self.max_model_len
            elif self.long_rope_rows:
                self.long_rope_rows.discard(row)
                self.rope_shift[row] = 0
        if so.spec_token_ids:
            self._apply_drafts(so.spec_token_ids)
        grown = so.new_block_ids
        if grown and all(len(blocks) == 1 for blocks in grown.values()):  # decodes crossing into a block
            grown_rows = np.fromiter(grown, dtype=np.int64, count=len(grown))
            ends = self.num_blocks[grown_rows]
            self.block_table[grown_rows, ends] = [blocks[0] for blocks in grown.values()]
            self.num_blocks[grown_rows] = ends + 1
            return
        for row, blocks in grown.items():
            start = self.num_blocks[row]
            self.block_table[row, start : start + len(blocks)] = blocks
            self.num_blocks[row] = start + len(blocks)

    def _apply_drafts(self, drafts: dict[int, list[int]]) -> None:
        """Drafts go where the tokens they guess would go; ``num_tokens`` stays at the known ones."""
        for row, ids in drafts.items():
            n = self.num_tokens[row]
            self.token_ids[row, n : n + len(ids)] = ids
            self.num_drafts[row] = len(ids)
        self.draft_rows = list(drafts)

    # -- inputs of one step -----------------------------------------------------------------
    def prepare(self, so: SchedulerOutput) -> StepInputs:
        if so.slots is not self._rows_of:  # (the scheduler hands the same list while the batch stays)
            self._rows = np.array(so.slots, dtype=np.int64)
            self._rows.flags.writeable = False  # shared by the steps of one batch
            self._rows_of = so.slots
        rows = self._rows
        if len(rows) and so.total_num_scheduled_tokens == len(rows) and not self.scoring_rows:
            return self._prepare_single_tokens(rows)
        return self._prepare_rows(rows, np.array(so.counts, dtype=np.int64))

    def _prepare_rows(self, rows: np.ndarray, counts: np.ndarray) -> StepInputs:
        """``prepare`` for any mix of rows: ``counts[i]`` tokens for row ``rows[i]``.

        A row with drafts computes its tokens as decode tokens, each attending up to its own
        position over the row's blocks (all of the step's K/V is written before attention runs): so
        a step of decodes and drafts is a decode step, for the decode kernels and the C layer loop."""
        multi = counts != 1
        if self.draft_rows:
            multi &= self.num_drafts[rows] == 0
        if multi.any() and not (np.diff(multi.astype(np.int8)) >= 0).all():
            order = np.argsort(multi, kind="stable")  # single-token rows (and rows with drafts) first
            rows, counts, multi = rows[order], counts[order], multi[order]
        num_decode = int(len(counts) - multi.sum())  # rows

        starts = self.num_computed[rows]
        seq_lens = starts + counts
        cu = np.cumsum(counts)
        total = int(cu[-1])
        rep_rows = np.repeat(rows, counts)
        positions = np.arange(total, dtype=np.int64) + np.repeat(starts - (cu - counts), counts)
        input_ids = self.token_ids[rep_rows, positions]
        bs = self.block_size
        slot_block = self.block_table[rep_rows, positions // bs].astype(np.int64)
        slot_offset = positions % bs

        # Sample where the step reaches the end of the known tokens (not mid-prompt chunks).
        if self.draft_rows:  # ... and the drafts: every drafted position samples too
            drafts = self.num_drafts[rows]
            samples = seq_lens == self.num_tokens[rows] + drafts
            logits_indices, sample_rows, sample_offsets = _sampled_positions(rows, cu, samples, drafts)
        else:
            sample_offsets = None
            samples = seq_lens == self.num_tokens[rows]
            logits_indices = (cu - 1)[samples]
            sample_rows = rows[samples]

        if self.draft_rows:  # one decode token per position: its row's blocks, up to itself
            decode_tokens = int(cu[num_decode - 1]) if num_decode else 0
            d_rows, d_lens = rep_rows[:decode_tokens], positions[:decode_tokens] + 1
        else:
            decode_tokens, d_rows, d_lens = num_decode, rows[:num_decode], seq_lens[:num_decode]
        d_nb = -(-int(d_lens.max()) // bs) if num_decode else 0
        p_rows = rows[num_decode:]
        p_lens = seq_lens[num_decode:]
        p_nb = -(-int(p_lens.max()) // bs) if len(p_rows) else 0
        p_cu = np.zeros(len(p_rows) + 1, dtype=np.int32)
        np.cumsum(counts[num_decode:], out=p_cu[1:])

        scored = self._prompt_logprob_rows(rows, starts, counts, cu) if self.scoring_rows else []
        self.num_computed[rows] = seq_lens
        return StepInputs(
            input_ids=input_ids,
            positions=positions + self.rope_shift[rep_rows] if self.long_rope_rows else positions,
            slot_block=slot_block,
            slot_offset=slot_offset,
            num_decode_tokens=decode_tokens,
            decode_block_tables=self.block_table[d_rows, :d_nb],
            decode_seq_lens=d_lens.astype(np.int32),
            prefill_block_tables=self.block_table[p_rows, :p_nb],
            prefill_cu_seqlens_q=p_cu,
            prefill_seq_lens=p_lens.astype(np.int32),
            logits_indices=logits_indices,
            sample_rows=sample_rows,
            prompt_logprob_rows=scored,
            sample_offsets=sample_offsets,
        )

    def _prepare_single_tokens(self, rows: np.ndarray) -> StepInputs:
        """``prepare`` for a step of one token a row (decodes; one-token prompt chunks): the same
        arrays from half the numpy calls (no repeats, no cumulative sums)."""
        positions = self.num_computed[rows]
        seq_lens = positions + 1
        bs = self.block_size
        samples = seq_lens == self.num_tokens[rows]
        if np.count_nonzero(samples) == len(rows):  # (a quarter of ``samples.all()``'s time)
            logits_indices, sample_rows = np.arange(len(rows), dtype=np.int64), rows
        else:
            logits_indices, sample_rows = np.flatnonzero(samples), rows[samples]
        self.num_computed[rows] = seq_lens
        return StepInputs(
            input_ids=self.token_ids[rows, positions],
            positions=positions + self.rope_shift[rows] if self.long_rope_rows else positions,
            slot_block=self.block_table[rows, positions // bs].astype(np.int64),
            slot_offset=positions % bs,
            num_decode_tokens=len(rows),
            decode_block_tables=self.block_table[rows, : -(-int(seq_lens.max()) // bs)],
            decode_seq_lens=seq_lens.astype(np.int32),
            prefill_block_tables=self._no_prefill[0],
            prefill_cu_seqlens_q=self._no_prefill[1],
            prefill_seq_lens=self._no_prefill[2],
            logits_indices=logits_indices,
            sample_rows=sample_rows,
        )

    def _prompt_logprob_rows(
        self, rows: np.ndarray, starts: np.ndarray, counts: np.ndarray, cu: np.ndarray
    ) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """The hidden-state row at position p scores prompt token p + 1: every position of a
        chunk up to the prompt's second-to-last (the last one samples). A chunk may be one token."""
        out = []
        for row, start, count, end in zip(rows.tolist(), starts.tolist(), counts.tolist(), cu.tolist()):
            if row not in self.scoring_rows:
                continue
            n = min(start + count, int(self.num_prompt_tokens[row]) - 1) - start
            if n > 0:
                first_row = end - count
                out.append(
                    (
                        row,
                        start + 1,
                        np.arange(first_row, first_row + n, dtype=np.int64),
                        self.token_ids[row, start + 1 : start + 1 + n].copy(),
                    )
                )
        return out

    def append_sampled(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        n = self.num_tokens[rows]
        self.token_ids[rows, n] = token_ids
        self.num_tokens[rows] = n + 1

    def take_verified(self, row: int, num_accepted: int, token_id: int) -> None:
        """A row with drafts: its first ``num_accepted`` drafts are kept (already in place), then
        ``token_id``; the KV of the rejected drafts' positions no longer counts as computed."""
        n = int(self.num_tokens[row]) + num_accepted
        self.token_ids[row, n] = token_id
        self.num_tokens[row] = n + 1
        self.num_computed[row] = n


def _sampled_positions(
    rows: np.ndarray, cu: np.ndarray, samples: np.ndarray, drafts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hidden-state rows to sample from (ascending), their batch rows and their places in their
    row's run, when some rows carry drafts: a sampling row's last ``1 + drafts`` positions, each
    predicting the token after it."""
    per_row = np.where(samples, drafts + 1, 0)
    total = int(per_row.sum())
    first = np.repeat(cu - per_row, per_row)  # each row's first sampled position
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    return first + offsets, np.repeat(rows, per_row), offsets
