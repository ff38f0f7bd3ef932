"""The projection work of a Baton run: rows counted from what the engine computed, FLOPs from the config."""

import pytest

from baton.perf.offline import run_offline
from baton.perf.work import RowCost, WorkCounter
from engine.model.config import ModelConfig
from engine.model.tiny import CONFIG


def test_a_rows_cost_is_its_multiply_adds():
    cfg = ModelConfig.from_hf_dict(CONFIG)
    h, i, layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    c = RowCost.of(cfg)
    assert c.layers == 2 * layers * (h * q + 2 * h * kv + q * h + 3 * h * i)
    assert c.head == 2 * v * h and c.skipped_if_not_sampled == 2 * (q * h + 3 * h * i)
    w = WorkCounter(c)
    w.add_step(10, 2)  # a 9-token prompt chunk that samples and one decode row
    assert w.flop == 10 * c.layers - 8 * c.skipped_if_not_sampled + 2 * c.head
    assert w.report(2.0)["projection_gflop_s"] == pytest.approx(w.flop / 2e9)


def test_static_batching_pays_for_its_padding_rows(tiny_model_dir):
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=6, include_hf=False)
    from baton.perf.offline import model_and_workload

    _, requests = model_and_workload(str(tiny_model_dir), "anyscale-cpu-small", 6)
    prompt, output = sum(len(q.prompt_token_ids) for q in requests), sum(q.max_tokens for q in requests)
    cb, static = r["details"]["baton-cb"]["work"], r["details"]["baton-static"]["work"]
    # CB: every prompt token once, and a row for each output token but the first (the prompt's last row samples it)
    assert cb["layer_rows"] == prompt + output - len(requests) and cb["head_rows"] == output
    # static: the same prompt rows; one batch of 6 decodes until its longest request ends
    longest = max(q.max_tokens for q in requests)
    assert static["layer_rows"] == prompt + len(requests) * (longest - 1)
    assert r["static_over_cb_work"] > 1 and r["cb_over_static_gflop_s"] > 0
    assert r["baton_cb_over_static"] == pytest.approx(r["static_over_cb_work"] * r["cb_over_static_gflop_s"], rel=1e-9)
