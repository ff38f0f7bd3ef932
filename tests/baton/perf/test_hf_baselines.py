"""The Hugging Face baselines on a tiny random Llama: they finish, count useful tokens right, ignore EOS, and their
greedy outputs equal plain per-request ``model.generate`` token for token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from baton.perf.hf_baselines import BaselineResult, CBSettings, load_hf_model, run_hf_continuous, run_hf_static  # noqa: E402
from baton.perf.offline_workloads import OfflineRequest, anyscale_cpu, total_output_tokens  # noqa: E402

SPECIAL = frozenset({0, 1, 2})


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def workload() -> list[OfflineRequest]:
    reqs = anyscale_cpu(512, n=6, seed=1, avoid_ids=SPECIAL, prompt_len=(4, 40), mean_output=8, output_clip=(2, 24))
    assert len({len(r.prompt_token_ids) for r in reqs}) > 1 and len({r.max_tokens for r in reqs}) > 1
    return reqs


def _reference(model, requests: list[OfflineRequest]) -> list[list[int]]:
    """Plain greedy generate, one unpadded request at a time, EOS disabled."""
    outs = []
    with torch.inference_mode():
        for r in requests:
            ids = torch.tensor([r.prompt_token_ids])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=r.max_tokens,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, ids.shape[1] :].tolist())
    assert [len(o) for o in outs] == [r.max_tokens for r in requests]
    return outs


@pytest.fixture(scope="module")
def model_and_reference(tiny_model_dir: Path, workload: list[OfflineRequest]) -> Iterator[tuple]:
    """The loaded model, whose EOS is then moved to a token the greedy outputs really produce mid-sequence: a baseline
    that stopped at EOS would return short or different outputs."""
    model = load_hf_model(tiny_model_dir)
    reference = _reference(model, workload)
    eos = reference[0][0]
    assert any(eos in out[:-1] for out in reference)
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    yield model, reference


def _check(result: BaselineResult, workload: list[OfflineRequest], reference: list[list[int]]) -> None:
    assert result.useful_output_tokens == total_output_tokens(workload)
    assert result.seconds > 0 and result.tok_s == pytest.approx(result.useful_output_tokens / result.seconds)
    assert result.outputs is not None
    assert [len(o) for o in result.outputs] == [r.max_tokens for r in workload]
    assert result.outputs == reference


def test_load_uses_sdpa_in_eval_mode(model_and_reference: tuple) -> None:
    model, _ = model_and_reference
    assert model.config._attn_implementation == "sdpa"
    assert not model.training and model.device.type == "cpu" and model.dtype == torch.float32


def test_static_matches_per_request_generate(model_and_reference: tuple, workload: list[OfflineRequest]) -> None:
    model, reference = model_and_reference
    result = run_hf_static(model, workload, batch_size=4)  # batches of 4 and 2: left padding is exercised
    _check(result, workload, reference)
    assert result.name == "hf-static"
    # Each static batch runs until its longest request ends.
    computed = 4 * max(r.max_tokens for r in workload[:4]) + 2 * max(r.max_tokens for r in workload[4:])
    assert result.details["computed_output_tokens"] == computed >= result.useful_output_tokens


@pytest.mark.parametrize(
    "settings",
    [
        CBSettings(max_requests_per_batch=16, max_batch_tokens=256, page_size=16),
        # Tight budgets: chunked prefill, queued requests and mixed prefill/decode batches.
        CBSettings(max_requests_per_batch=2, max_batch_tokens=16, page_size=8),
    ],
    ids=["roomy", "tight"],
)
def test_continuous_matches_per_request_generate(
    model_and_reference: tuple, workload: list[OfflineRequest], settings: CBSettings
) -> None:
    model, reference = model_and_reference
    result = run_hf_continuous(model, workload, settings)
    _check(result, workload, reference)
    assert result.name == "hf-continuous"
    assert result.details["max_requests_per_batch"] == settings.max_requests_per_batch
    assert model.config._attn_implementation == "sdpa"  # CB may switch it while running; it must be restored


def test_global_state_is_restored(model_and_reference: tuple, workload: list[OfflineRequest]) -> None:
    from transformers.utils import logging as hf_logging

    model, _ = model_and_reference
    threads, verbosity, bars = torch.get_num_threads(), hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    run_hf_static(model, workload[:2], batch_size=2, num_threads=1)
    run_hf_continuous(model, workload[:2], num_threads=1)
    assert torch.get_num_threads() == threads
    assert hf_logging.get_verbosity() == verbosity and hf_logging.is_progress_bar_enabled() == bars
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_empty_workload(model_and_reference: tuple) -> None:
    model, _ = model_and_reference
    for result in (run_hf_static(model, []), run_hf_continuous(model, [])):
        assert result.useful_output_tokens == 0 and result.outputs == []
