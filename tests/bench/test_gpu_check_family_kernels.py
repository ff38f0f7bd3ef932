"""gpu_check's family_kernels step (issue 45): registered, says so and succeeds without CUDA, and its
reduced mode runs every check on tiny shapes (on a CPU under the Triton interpreter) and passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_ROOT = Path(__file__).resolve().parents[2]


def test_the_step_is_registered(tmp_path: Path) -> None:
    from bench.gpu_check import _steps

    steps = {name: cmd for name, cmd, _ in _steps(tmp_path)}
    assert steps["family_kernels"][1:] == ["-m", "bench.gpu_check_family_kernels", "--json"]


def test_without_cuda_it_says_so_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the real run applies")
    from bench.gpu_check_family_kernels import main

    assert main(["--json"]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def test_the_reduced_run_checks_attention_and_moe() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("TRITON_INTERPRET", None)  # the reduced mode sets it itself on a CPU
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check_family_kernels", "--reduced", "--json"],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    att, moe = report["attention_gemma2_2b"], report["moe_mixtral_layer"]
    assert report["ok"] and att["ok"] and moe["ok"]
    assert att["decode_rel_err"] <= 1e-4 and att["prefill_rel_err"] <= 1e-4
    # The reduced shape keeps the features on: a window shorter than the contexts, soft-capping.
    assert att["shape"]["window"] < max(att["shape"]["decode_contexts"]) and att["shape"]["softcap"]
    assert set(moe["tokens"]) == {"1", "20"} and all(r["rel_err"] <= 1e-4 for r in moe["tokens"].values())
    assert {"triton_windowed", "triton_full_context", "torch_reference"} <= set(att["decode_ms"])
