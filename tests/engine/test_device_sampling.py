"""The sync-free (CUDA) sampling path keeps the same tokens and makes the same logits as the CPU
path, so a seeded request's output does not depend on the device it runs on."""

import numpy as np
import pytest
import torch

from engine.device_sampling import apply_top_p, process_logits_on_device, seeded_uniforms
from engine.logits_processing import process_logits
from engine.sampler import Sampler, _apply_top_p, row_uniform
from engine.sampling_params import SamplingParams

VOCAB = 5000


def test_seeded_uniforms_equal_the_scalar_hash_bit_for_bit():
    seeds = [0, 1, -1, 2**63 - 1, -(2**63), 123456789, 2**64 - 1]
    positions = [0, 1, 7, 1000, 2**20, 3, 0]
    got = seeded_uniforms(seeds, positions)
    assert got.tolist() == [row_uniform(s, p) for s, p in zip(seeds, positions)]
    assert got.dtype == np.float64


def test_whole_row_top_p_keeps_what_the_candidate_search_keeps():
    g = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(3, VOCAB, generator=g) * s for s in (12.0, 4.0, 0.2)])
    top_p = [0.5, 0.9, 0.99, 0.5, 0.9, 0.97, 0.5, 0.95, 0.999]
    want = _apply_top_p(logits, top_p)
    got = apply_top_p(logits, torch.tensor(top_p))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])


def _mixed_params() -> list[SamplingParams]:
    return [
        SamplingParams(),  # greedy
        SamplingParams(temperature=0.7, seed=3),
        SamplingParams(temperature=1.0, top_p=0.9, seed=4),
        SamplingParams(temperature=1.3, top_k=20, seed=5),
        SamplingParams(temperature=0.9, top_k=50, top_p=0.8, min_p=0.05, seed=6),
        SamplingParams(temperature=1.0, min_p=0.1, seed=-7),
        SamplingParams(),  # greedy
        SamplingParams(temperature=2.0, top_p=0.5, seed=2**40),
    ]


@pytest.mark.parametrize("trial", range(3))
def test_both_paths_sample_the_same_tokens(trial):
    g = torch.Generator().manual_seed(trial)
    params = _mixed_params()
    logits = torch.randn(len(params), VOCAB, generator=g) * 3
    positions = [trial * 5 + i for i in range(len(params))]
    cpu = Sampler(0, torch.device("cpu"), sync_free=False).sample(logits, params, positions)
    free = Sampler(0, torch.device("cpu"), sync_free=True).sample(logits, params, positions)
    assert free.tolist() == cpu.tolist()


def _penalty_params() -> list[SamplingParams]:
    return [
        SamplingParams(),  # processes nothing
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(min_tokens=5, stop_token_ids=(11, 12)),
        SamplingParams(logit_bias={7: 3.0, 100: -2.5}),
        SamplingParams(
            repetition_penalty=0.8,
            frequency_penalty=-0.4,
            presence_penalty=1.0,
            logit_bias={3: 1.0},
            min_tokens=50,
            max_tokens=64,
            ignore_eos=True,
        ),
        SamplingParams(min_tokens=2),  # already past its minimum: EOS stays
        SamplingParams(repetition_penalty=1.5),  # an empty history
    ]


def test_penalties_on_the_device_equal_the_row_by_row_ones():
    g = torch.Generator().manual_seed(1)
    params = _penalty_params()
    rng = np.random.default_rng(0)
    histories: list[np.ndarray | None] = []
    prompts: list[int] = []
    for i, sp in enumerate(params):
        n = 0 if i == len(params) - 1 else int(rng.integers(3, 40))
        prompt = min(n, int(rng.integers(0, 10)))
        # Repeated tokens, so counts exceed one.
        histories.append(rng.integers(0, 200, n) if sp.processes_logits else None)
        prompts.append(prompt)
    logits = torch.randn(len(params), VOCAB, generator=g) * 2
    want = process_logits(logits, params, histories, prompts, eos_token_ids=(2,))
    got = process_logits_on_device(logits, params, histories, prompts, eos_token_ids=(2,))
    assert torch.equal(got, want)
    assert not torch.equal(got, logits)  # (the processing did something)


def test_no_row_processing_gives_an_equal_copy():
    logits = torch.randn(3, VOCAB)
    params = [SamplingParams()] * 3
    got = process_logits_on_device(logits, params, [None] * 3, [0] * 3)
    assert torch.equal(got, logits) and got.data_ptr() != logits.data_ptr()
