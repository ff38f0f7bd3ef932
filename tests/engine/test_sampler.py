"""The sampler's filters keep exactly the tokens they should, and a seeded row draws the same
token whatever it is batched with."""

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
