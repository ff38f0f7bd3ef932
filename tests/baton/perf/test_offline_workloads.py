"""The anyscale-cpu offline workload: deterministic, within bounds, statistically sane, torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from baton.perf.offline_workloads import (
    OfflineRequest,
    anyscale_cpu,
    describe,
    expected_mean_output,
    total_output_tokens,
    total_prompt_tokens,
)

SMOLLM2_VOCAB = 49152
SPECIAL = frozenset({0, 1, 2})


def test_deterministic_for_a_seed() -> None:
    a = anyscale_cpu(SMOLLM2_VOCAB, seed=0, avoid_ids=SPECIAL)
    assert a == anyscale_cpu(SMOLLM2_VOCAB, seed=0, avoid_ids=SPECIAL)
    assert a != anyscale_cpu(SMOLLM2_VOCAB, seed=1, avoid_ids=SPECIAL)


def test_default_workload_is_pinned() -> None:
    """Golden totals of the benchmark's default workload: any change to the draws (order, distribution, RNG) shows
    up here, so numbers measured before and after such a change are never silently compared."""
    reqs = anyscale_cpu(SMOLLM2_VOCAB, avoid_ids=SPECIAL)
    assert len(reqs) == 64
    assert total_prompt_tokens(reqs) == 10607
    assert total_output_tokens(reqs) == 3352
    assert [r.max_tokens for r in reqs[:6]] == [4, 10, 171, 26, 90, 49]


def test_smaller_n_is_a_prefix() -> None:
    full = anyscale_cpu(1000, n=64, seed=3)
    assert anyscale_cpu(1000, n=8, seed=3) == full[:8]


def test_lengths_and_ids_within_bounds() -> None:
    reqs = anyscale_cpu(SMOLLM2_VOCAB, n=256, avoid_ids=SPECIAL)
    prompt_lens = [len(r.prompt_token_ids) for r in reqs]
    outs = [r.max_tokens for r in reqs]
    assert all(64 <= n <= 256 for n in prompt_lens)
    assert all(4 <= n <= 256 for n in outs)
    # The ranges are actually used, clips included (the exponential tail reaches 256, its head rounds below 4).
    assert min(prompt_lens) < 80 and max(prompt_lens) > 240
    assert min(outs) == 4 and max(outs) == 256
    for r in reqs:
        assert isinstance(r, OfflineRequest)
        assert all(isinstance(t, int) and 0 <= t < SMOLLM2_VOCAB for t in r.prompt_token_ids)
        assert SPECIAL.isdisjoint(r.prompt_token_ids)


def test_avoid_ids_never_in_prompts_even_when_they_are_most_of_the_vocab() -> None:
    avoid = frozenset(range(0, 30))  # only ids 30..31 are allowed
    reqs = anyscale_cpu(32, n=16, avoid_ids=avoid, prompt_len=(4, 8))
    tokens = {t for r in reqs for t in r.prompt_token_ids}
    assert tokens == {30, 31}


def test_mean_output_is_about_64() -> None:
    # n=64 at seed 0: a loose but deterministic check (the sample mean's standard error is ~8).
    reqs = anyscale_cpu(SMOLLM2_VOCAB, avoid_ids=SPECIAL)
    assert 40 <= total_output_tokens(reqs) / len(reqs) <= 90
    # Many requests (short prompts keep it fast): the clipped exponential's mean, within ~3.5 standard errors.
    many = anyscale_cpu(100, n=20000, seed=0, prompt_len=(1, 1))
    mean = total_output_tokens(many) / len(many)
    assert expected_mean_output() == pytest.approx(62.95, abs=0.01)
    assert mean == pytest.approx(expected_mean_output(), abs=1.5)


def test_small_version_for_tests() -> None:
    reqs = anyscale_cpu(512, n=8, seed=0, prompt_len=(4, 16), mean_output=8, output_clip=(2, 12))
    assert len(reqs) == 8
    assert all(4 <= len(r.prompt_token_ids) <= 16 and 2 <= r.max_tokens <= 12 for r in reqs)
    stats = describe(reqs)
    assert stats["requests"] == 8 and stats["output_tokens"] == total_output_tokens(reqs)


def test_total_output_tokens() -> None:
    reqs = [OfflineRequest((5, 6), 3), OfflineRequest((7,), 10)]
    assert total_output_tokens(reqs) == 13
    assert total_output_tokens([]) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": -1},
        {"prompt_len": (0, 4)},
        {"prompt_len": (8, 4)},
        {"output_clip": (0, 4)},
        {"mean_output": 0},
        {"avoid_ids": frozenset(range(10))},
    ],
)
def test_invalid_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        anyscale_cpu(10, **kwargs)


def test_request_validation() -> None:
    with pytest.raises(ValueError):
        OfflineRequest((), 4)
    with pytest.raises(ValueError):
        OfflineRequest((1,), 0)


def test_module_is_torch_free() -> None:
    root = Path(__file__).resolve().parents[3]
    code = "import sys, baton.perf.offline_workloads; sys.exit('torch' in sys.modules or 'numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0
