"""Greedy outputs equal transformers token for token (fp32) on tiny seeded models of every family
``engine/model/family.py`` describes: batched, with chunked prefill, prefix caching and forced
preemption (the harness of tests/engine/test_golden_tiny.py)."""

from __future__ import annotations

import pytest

from tests.engine.hf_oracle import hf_greedy, load_hf
from tests.engine.model.family_oracle import FAMILIES, build_family_model
from tests.engine.test_golden_tiny import _engine, _prompts, _run


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    d = build_family_model(tmp_path_factory.mktemp(request.param), request.param, seed=1)
    return d, load_hf(d)


def test_batched_equals_hf(family):
    d, hf = family
    prompts, max_new = _prompts(0)
    assert _run(_engine(d), prompts, max_new) == hf_greedy(hf, prompts, max_new)


def test_chunked_prefill_equals_hf(family):
    d, hf = family
    prompts, max_new = _prompts(1)
    eng = _engine(d, scheduler={"max_num_batched_tokens": 16}, cache={"block_size": 8})
    assert _run(eng, prompts, max_new) == hf_greedy(hf, prompts, max_new)


def test_prefix_caching_equals_hf(family):
    d, hf = family
    prompts, max_new = _prompts(2, shared_prefix=40)
    eng = _engine(d, cache={"block_size": 8})
    first = _run(eng, prompts[:1], max_new[:1])
    hits_before = eng.block_manager.num_prefix_hits
    rest = _run(eng, prompts[1:], max_new[1:])
    assert eng.block_manager.num_prefix_hits - hits_before >= 7 * 40 // 8 * 8
    assert first + rest == hf_greedy(hf, prompts, max_new)


def test_preemption_equals_hf(family):
    d, hf = family
    prompts, max_new = _prompts(3, n=10)
    max_new = [24] * len(prompts)
    sched, blocks = {"admission_watermark": 0.0}, 40
    if d.name.startswith("mistral"):  # its decodes give back the blocks behind the window: prompt chunks run out
        sched, blocks = {**sched, "max_num_batched_tokens": 16}, 24
    eng = _engine(d, cache={"block_size": 4, "num_blocks": blocks}, scheduler=sched)
    got = _run(eng, prompts, max_new)
    assert eng.scheduler.num_preemptions > 0
    assert got == hf_greedy(hf, prompts, max_new)
