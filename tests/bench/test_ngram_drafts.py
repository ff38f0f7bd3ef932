"""The speculative-decoding what-if: the prompt-lookup proposer and the step count it implies."""

import pytest

from bench.ngram_drafts import propose, proposer_steps, run


def test_the_proposer_continues_the_latest_match_of_the_longest_suffix():
    history = [1, 2, 3, 9, 2, 3, 7, 8, 5, 2, 3]
    assert propose(history, n=2, k=2) == [7, 8]  # "2 3" last seen before 7 8
    assert propose(history, n=3, k=2) == [7, 8]  # "5 2 3" never seen: falls back to "2 3"
    assert propose([4, 5, 6], n=3, k=4) == []  # nothing repeats


def test_steps_count_accepted_tokens_plus_one():
    prompt = [1, 2, 3, 4]
    # the output repeats the prompt: after "1" the draft "2 3 4 1"... is right
    steps, accepted, rejected = proposer_steps(prompt, [1, 2, 3, 4, 1, 2], n=1, k=4)
    assert accepted + steps == 6 and steps < 6
    assert proposer_steps([7], [8, 9], n=3, k=4) == (2, 0, 0)  # no draft: one token a step


def test_a_small_run(tiny_model_dir):
    r = run(str(tiny_model_dir), "anyscale-cpu-small", n=2, k=3)
    assert r["output_tokens"] > 0 and 1.0 <= r["tokens_per_step"] <= 4.0
    assert r["target_steps"] * r["tokens_per_step"] == pytest.approx(r["output_tokens"])
    with pytest.raises(ValueError, match="at least 1"):
        run(str(tiny_model_dir), "anyscale-cpu-small", k=0)
