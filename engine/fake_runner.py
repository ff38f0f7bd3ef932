"""A model runner without a model: same batch preparation as ``ModelRunner``, deterministic tokens.

Shipped in the product (not only the tests) so scheduler overhead can be measured, and so the
scheduler, router and simulator can be exercised at full speed. The token it "samples" for a request
is a pure function of the tokens so far, so any schedule of the same requests yields the same outputs.
"""

from __future__ import annotations

import time

import numpy as np

from engine.input_batch import InputBatch
from engine.scheduler_output import RunnerOutput, SchedulerOutput


def fake_next_token(prev_token: int, position: int, vocab_size: int) -> int:
    return (prev_token * 31 + position * 17 + 7) % (vocab_size - 3) + 3  # never 0, 1 or 2 (specials)


class FakeModelRunner:
    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        vocab_size: int = 32000,
        step_time_s: float = 0.0,
    ) -> None:
        self.batch = InputBatch(max_num_seqs, max_model_len, block_size)
        self.vocab_size = vocab_size
        self.step_time_s = step_time_s  # emulate a forward pass

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        self.batch.apply(so)
        if so.is_empty:
            return RunnerOutput([], [])
        inputs = self.batch.prepare(so)
        if self.step_time_s:
            time.sleep(self.step_time_s)
        rows = inputs.sample_rows
        n = self.batch.num_tokens[rows]
        prev = self.batch.token_ids[rows, n - 1]
        sampled = (prev * 31 + n * 17 + 7) % (self.vocab_size - 3) + 3
        self.batch.append_sampled(rows, sampled.astype(np.int64))
        return RunnerOutput(inputs.sample_rows.tolist(), sampled.tolist())
