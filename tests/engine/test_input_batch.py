"""The runner's persistent batch: a step of one token a row takes a shorter path through
``InputBatch.prepare``; it must build exactly the arrays the general path builds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.input_batch import InputBatch


def _batch_with_rows(rng: np.random.Generator, num_rows: int, block_size: int) -> tuple[InputBatch, np.ndarray]:
    batch = InputBatch(max_num_seqs=64, max_model_len=512, block_size=block_size)
    rows = rng.choice(64, size=num_rows, replace=False).astype(np.int64)
    for row in rows:
        n = int(rng.integers(2, 500))
        batch.token_ids[row, :n] = rng.integers(3, 30000, size=n)
        batch.num_tokens[row] = n
        # Most rows decode (one token left); some are one-token chunks in the middle of a prompt.
        batch.num_computed[row] = n - 1 if rng.random() < 0.8 else int(rng.integers(0, n - 1))
        nb = -(-n // block_size)
        batch.block_table[row, :nb] = rng.permutation(10_000)[:nb]
        batch.num_blocks[row] = nb
    return batch, rows


def _assert_same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("seed", range(20))
def test_single_token_rows_give_the_general_paths_arrays(seed):
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([1, 4, 16]))
    batch, rows = _batch_with_rows(rng, int(rng.integers(1, 64)), block_size)
    twin = InputBatch(64, 512, block_size)
    for name in ("token_ids", "num_tokens", "num_computed", "block_table", "num_blocks"):
        getattr(twin, name)[...] = getattr(batch, name)
    fast = batch._prepare_single_tokens(rows.copy())
    general = twin._prepare_rows(rows.copy(), np.ones(len(rows), dtype=np.int64))
    _assert_same(fast, general)
    np.testing.assert_array_equal(batch.num_computed, twin.num_computed)  # both advanced the rows
