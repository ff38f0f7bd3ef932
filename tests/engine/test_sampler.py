"""The sampler's filters keep exactly the tokens they should, and a seeded row draws the same
token whatever it is batched with."""

import numpy as np
import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams

# probabilities 0.4, 0.3, 0.15, 0.1, 0.05 at temperature 1
LOGITS = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))


def _draws(sp: SamplingParams, n: int = 3000) -> set[int]:
    sampler = Sampler(0, torch.device("cpu"))
    got = sampler.sample(LOGITS.repeat(n, 1), [sp] * n, list(range(n)))
    return set(got.tolist())


def test_min_p_keeps_the_tokens_at_least_that_fraction_of_the_most_likely():
    assert _draws(SamplingParams(temperature=1.0, min_p=0.3)) == {0, 1, 2}  # 0.15 >= 0.3 * 0.4 > 0.1
    assert _draws(SamplingParams(temperature=1.0, min_p=0.5)) == {0, 1}
    assert _draws(SamplingParams(temperature=1.0, min_p=1.0)) == {0}
    assert _draws(SamplingParams(temperature=1.0)) == {0, 1, 2, 3, 4}


def test_top_k_and_top_p_keep_what_they_should():
    assert _draws(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert _draws(SamplingParams(temperature=1.0, top_p=0.7)) == {0, 1}  # 0.4 + 0.3 reaches 0.7
    assert _draws(SamplingParams(temperature=1.0, top_p=0.71)) == {0, 1, 2}
    assert _draws(SamplingParams(temperature=1.0, top_k=3, min_p=0.5)) == {0, 1}


def test_a_seeded_row_does_not_depend_on_its_batch():
    sp = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(0, torch.device("cpu")).sample(LOGITS[None], [sp], [5])
    others = [SamplingParams(temperature=0.7), SamplingParams(), sp]
    batched = Sampler(1, torch.device("cpu")).sample(LOGITS.repeat(3, 1), others, [0, 9, 5])
    assert batched[2] == alone[0] and batched[1] == 0  # and the greedy row took the argmax


def test_seeds_differ_in_all_64_bits():
    """Seeds 2**63 apart drew the same noise (the seed was cut to 63 bits), and so did seeds 2**32
    apart (torch's CPU generator keeps a seed's low 32 bits); a negative seed is its two's-complement
    64-bit value, the one alias the accepted range [-2**63, 2**64) has."""
    logits = torch.zeros(1, 4096)  # uniform: the draw is the noise's argmax

    def draw(seed: int) -> int:
        return int(Sampler(0, torch.device("cpu")).sample(logits, [SamplingParams(temperature=1.0, seed=seed)], [3])[0])

    for seed in (0, 12345, 7):
        assert draw(seed) != draw(seed + 2**63) and draw(seed) != draw(seed + 2**32)
    assert draw(-1) == draw(2**64 - 1) and draw(-(2**63)) == draw(2**63)


def _frequencies(sp: SamplingParams, positions, logits=LOGITS, seed: int = 0) -> torch.Tensor:
    n = len(positions)
    got = Sampler(seed, torch.device("cpu")).sample(logits.repeat(n, 1), [sp] * n, list(positions))
    return torch.bincount(got, minlength=logits.shape[0]).double() / n


def _assert_close_to(freq: torch.Tensor, probs: list[float], n: int) -> None:
    p = torch.tensor(probs, dtype=torch.float64)
    sigma = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * sigma + 1e-12).all(), (freq.tolist(), probs)


def test_sampled_tokens_follow_the_distribution():
    """Inverse transform sampling: each token as often as its probability (within 5 sigma of 40,000
    draws), after temperature, top-k, top-p and min-p; seeded rows (one per output position) too."""
    n = 40_000
    _assert_close_to(_frequencies(SamplingParams(temperature=1.0), range(n)), [0.4, 0.3, 0.15, 0.1, 0.05], n)
    _assert_close_to(_frequencies(SamplingParams(temperature=1.0, seed=7), range(n)), [0.4, 0.3, 0.15, 0.1, 0.05], n)
    _assert_close_to(
        _frequencies(SamplingParams(temperature=1.0, top_p=0.71), range(n)),
        [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0],
        n,
    )
    _assert_close_to(
        _frequencies(SamplingParams(temperature=1.0, top_k=2, seed=3), range(n)), [4 / 7, 3 / 7, 0, 0, 0], n
    )
    _assert_close_to(
        _frequencies(SamplingParams(temperature=1.0, min_p=0.3), range(n)),
        [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0],
        n,
    )
    t2 = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], dtype=torch.float64) ** 0.5  # temperature 2
    _assert_close_to(_frequencies(SamplingParams(temperature=2.0), range(n)), (t2 / t2.sum()).tolist(), n)


def test_a_zero_probability_token_is_never_sampled_even_at_the_top_of_the_range(monkeypatch):
    """u close to 1 (1 - 2**-53, the largest the seeded hash gives) must not run past the last
    token that can be taken into a masked tail."""
    import engine.sampler as sampler

    logits = torch.tensor([[float("-inf"), 0.0, 1.0, float("-inf")]])
    # (1.0 itself, which the hash never gives, stands in for u x total rounding up to the total.)
    for u, want in ((1.0 - 2.0**-53, 2), (1.0, 2), (0.0, 1)):
        monkeypatch.setattr(sampler, "seeded_uniforms", lambda seeds, positions: np.full(len(seeds), u))
        got = Sampler(0, torch.device("cpu")).sample(logits, [SamplingParams(temperature=1.0, seed=1)], [0])
        assert got.tolist() == [want]


def test_top_p_among_candidates_keeps_what_a_full_sort_keeps(monkeypatch):
    """The cut is looked for among the 256, then 4,096 most likely tokens before a full sort: rows
    whose cut lies in each tier keep exactly the tokens the full sort keeps."""
    import engine.sampler as sampler

    g = torch.Generator().manual_seed(0)
    vocab = 49152
    # Peaked rows (cut within 256), flatter ones (within 4,096) and near-uniform ones (full sort).
    logits = torch.cat([torch.randn(4, vocab, generator=g) * s for s in (12.0, 4.0, 0.2)])
    top_p = [0.5, 0.9, 0.95, 0.99] + [0.5, 0.9, 0.95, 0.97] + [0.5, 0.9, 0.95, 0.999]
    tiered = sampler._apply_top_p(logits, top_p)
    monkeypatch.setattr(sampler, "_TOP_P_CANDIDATES", ())
    full = sampler._apply_top_p(logits, top_p)
    assert torch.equal(tiered, full)
    kept = (full > float("-inf")).sum(1).tolist()
    assert max(kept[:4]) <= 256 < max(kept[4:8]) <= 4096 < min(kept[8:])


def test_nan_logits_still_give_a_token_id_in_the_vocabulary():
    """A broken model's NaN row: whatever token, never an id past the vocabulary (the next step's
    embedding lookup would fail on it)."""
    vocab = 1000  # not a multiple of the CDF's block: padded
    logits = torch.randn(3, vocab)
    logits[1] = float("nan")
    got = Sampler(0, torch.device("cpu")).sample(logits, [SamplingParams(temperature=1.0)] * 3, [0, 0, 0])
    assert all(0 <= t < vocab for t in got.tolist())
