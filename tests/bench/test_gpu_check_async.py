"""The asynchronous scheduling GPU check runs its timing and golden comparison on the CPU too
(``--reduced``: the same code, a shrunken model)."""

import json

from bench import gpu_check_async


def test_the_async_scheduling_check_passes_reduced_on_the_cpu(capsys):
    assert gpu_check_async.main(["--reduced", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["ok"] and report["golden"]["tokens_equal_transformers"]
    assert [r["batch"] for r in report["timing"]["rows"]] == [1, 4]
    assert report["timing"]["overlapped_steps"] > 0


def test_without_cuda_it_says_so_and_succeeds(capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the real run applies")
    assert gpu_check_async.main(["--json"]) == 0
    assert "no CUDA device" in capsys.readouterr().out
