"""Families other than Llama through one prefill and one decode worker (chunked prompts whose KV
crosses the transfer) equal transformers token for token: Gemma 3 (sliding windows shorter than the
prompts, q/k norms, two rope bases), Qwen2-MoE (experts and the shared expert) and Mistral (a window
shorter than the prompts: the decode worker releases the blocks behind it once the KV has come)."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import greedy, prompts, start_cluster
from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import build_family_model


@pytest.mark.parametrize("family", ["gemma3", "qwen2_moe", "mistral"])
def test_1p1d_equals_transformers(ray_session, tmp_path, family):
    d = build_family_model(tmp_path / family, family, seed=1)
    ps = prompts(0, 4, 512, lo=40, hi=120)  # a 32-token budget: several chunks each
    max_new = [8, 16, 12, 20]
    c = start_cluster(d, 1, 1, local_prefill_threshold=24, short_prompts_to_idle_prefill=False, block_size=8)
    try:
        got = [o.token_ids for o in c.generate(ps, [greedy(n) for n in max_new])]
        assert c.dispatcher.num_disaggregated >= 4
        loads = c.wait_until_drained()
        assert loads["decode-0"].transfers_completed >= 4 and loads["decode-0"].transfers_failed == 0
        assert all(load.num_free_blocks == load.num_total_blocks for load in loads.values())  # nothing leaked
    finally:
        c.shutdown()
    assert got == hf_greedy(load_hf(d), ps, max_new)
