"""The device sampler's GPU check runs its comparison on the CPU too (the same code, a small size)."""

import json

from bench import gpu_check_sampler


def test_the_whole_batch_sampler_check_passes_on_the_cpu(capsys):
    assert gpu_check_sampler.main(["--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and all(c["tokens_equal"] for c in report["checks"])
