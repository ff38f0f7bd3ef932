"""The shared-prefix burst bench (bench/shared_prefix_burst.py) on the tiny model: both settings
give the same tokens, and deferral computes the common prefix once."""

from bench.shared_prefix_burst import run


def test_deferral_computes_the_shared_prefix_once_and_changes_no_token(tiny_model_dir):
    r = run(str(tiny_model_dir), requests=4, prefix=256, suffix=8, max_tokens=3, rounds=1)
    assert r["tokens_identical"]
    assert r["deferred"]["prompt_tokens_computed"] == 264 + 3 * 8  # the prefix once, then each suffix
    assert r["first_come"]["prompt_tokens_computed"] > r["deferred"]["prompt_tokens_computed"]
