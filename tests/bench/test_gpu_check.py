"""The prepared GPU run's bookkeeping (its steps need CUDA; the runner does not): every step is
recorded as it ends, with its JSON report, a failure or a timeout costs only that step, and steps
the budget cannot fit are skipped and named."""

import json
import sys

from bench.gpu_check import _last_json, main, run_checks


def test_steps_are_recorded_with_their_reports_failures_and_timeouts(tmp_path):
    py = sys.executable
    steps = [
        ("reports", [py, "-c", "print('warming up'); import json; print(json.dumps({'gb_s': 3.5}, indent=2))"], 30),
        ("fails", [py, "-c", "raise SystemExit('kernel mismatch')"], 30),
        ("hangs", [py, "-c", "import time; print('started', flush=True); time.sleep(60)"], 1),
        ("after", [py, "-c", "print('{\"ok\": true}')"], 30),
    ]
    report = run_checks(tmp_path, budget_s=60, steps=steps)
    s = report["steps"]
    assert s["reports"]["rc"] == 0 and s["reports"]["result"] == {"gb_s": 3.5}
    assert s["fails"]["rc"] == 1 and "kernel mismatch" in s["fails"]["tail"] and s["fails"]["result"] is None
    assert s["hangs"]["rc"] == "timeout" and "started" in s["hangs"]["tail"]
    assert s["after"]["result"] == {"ok": True}  # the steps after a hang still ran
    assert json.loads((tmp_path / "gpu_check.json").read_text())["steps"].keys() == s.keys()
    assert "kernel mismatch" in (tmp_path / "gpu_check.log").read_text()


def test_steps_the_budget_cannot_fit_are_skipped(tmp_path):
    report = run_checks(tmp_path, budget_s=5, steps=[("big", [sys.executable, "-c", "pass"], 30)])
    assert "skipped" in report["steps"]["big"]


def test_a_report_is_the_last_object_printed_at_the_start_of_a_line():
    assert _last_json('noise\n{\n  "a": {\n    "b": 1\n  }\n}\n') == {"a": {"b": 1}}
    assert _last_json("3 passed in 1.2s") is None and _last_json("") is None


def test_without_cuda_it_says_so_and_succeeds(tmp_path, capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the real run applies")
    assert main(["--out", str(tmp_path)]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def test_only_the_named_steps_run_and_unknown_names_are_refused(tmp_path, capsys):
    py = sys.executable
    steps = [("a", [py, "-c", "print('{\"a\": 1}')"], 30), ("b", [py, "-c", "print('{\"b\": 1}')"], 30)]
    assert run_checks(tmp_path, budget_s=60, steps=steps, only={"b"})["steps"].keys() == {"b"}
    import pytest

    with pytest.raises(SystemExit):
        main(["--only", "no_such_step", "--out", str(tmp_path)])
