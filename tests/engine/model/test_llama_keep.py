"""``LlamaModel.forward(keep=...)``: the last layer runs its output projection and MLP for the kept rows
only, but writes every row's K/V; the kept rows' hidden states are the full forward's."""

import pytest
import torch

from engine.attention.backend import select_backend
from engine.attention.metadata import AttentionMetadata
from engine.kernels import kernels_for
from engine.model.config import ModelConfig
from engine.model.linear import ProjectionMode
from engine.model.llama import LlamaModel
from engine.model.tiny import CONFIG

BLOCK = 16


def _model() -> LlamaModel:
    model = LlamaModel(
        ModelConfig.from_hf_dict(CONFIG),
        torch.device("cpu"),
        torch.float32,
        256,
        kernels_for(torch.device("cpu"), torch.float32),
    )
    g = torch.Generator().manual_seed(0)
    model.load_weights((n, torch.randn(*s, generator=g) * 0.05, "test") for n, s in model.expected_shapes().items())
    model.set_projections(ProjectionMode.DENSE)
    return model


def _prefill(model: LlamaModel, lens: list[int], keep: torch.Tensor | None):
    """One step prefilling sequences of ``lens`` tokens into a fresh cache: (hidden, cache)."""
    cfg = model.cfg
    blocks_per = [-(-n // BLOCK) for n in lens]
    cache = torch.zeros(sum(blocks_per), cfg.num_hidden_layers, 2, BLOCK, model.num_kv_heads, model.head_dim)
    tables = torch.zeros(len(lens), max(blocks_per), dtype=torch.int32)
    slot_block, slot_offset, positions, first = [], [], [], 0
    for s, n in enumerate(lens):
        tables[s, : blocks_per[s]] = torch.arange(first, first + blocks_per[s], dtype=torch.int32)
        slot_block += [first + p // BLOCK for p in range(n)]
        slot_offset += [p % BLOCK for p in range(n)]
        positions += list(range(n))
        first += blocks_per[s]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        0,
        sum(lens),
        torch.tensor(slot_block),
        torch.tensor(slot_offset),
        None,
        None,
        tables,
        cu,
        torch.tensor(lens, dtype=torch.int32),
    )
    ids = torch.randint(3, cfg.vocab_size, (sum(lens),), generator=torch.Generator().manual_seed(1))
    hidden = model.forward(ids, torch.tensor(positions), cache, meta, select_backend(torch.device("cpu")), keep=keep)
    return hidden, cache


@pytest.mark.parametrize("keep", [[39, 59, 96], [0], [5, 6, 7, 50]])
def test_kept_rows_are_the_full_forwards_rows_and_every_kv_is_written(keep):
    model, lens = _model(), [40, 20, 37]
    full, full_cache = _prefill(model, lens, None)
    rows = torch.tensor(keep)
    kept, kept_cache = _prefill(model, lens, rows)
    assert kept.shape == (len(keep), model.cfg.hidden_size)
    torch.testing.assert_close(kept, full[rows], rtol=1e-5, atol=1e-5)
    assert torch.equal(kept_cache, full_cache)  # the last layer's K/V too: later tokens attend to them


def test_no_kept_row_still_writes_every_kv():
    model, lens = _model(), [33, 8]
    _, full_cache = _prefill(model, lens, None)
    none, cache = _prefill(model, lens, torch.tensor([], dtype=torch.int64))
    assert none.shape == (0, model.cfg.hidden_size)
    assert torch.equal(cache, full_cache)


def test_keeping_every_row_is_the_full_forward_exactly():
    model, lens = _model(), [20, 9]
    full, _ = _prefill(model, lens, None)
    every, _ = _prefill(model, lens, torch.arange(sum(lens)))
    assert torch.equal(every, full)
