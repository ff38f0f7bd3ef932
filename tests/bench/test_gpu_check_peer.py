"""The peer's GPU step runs end to end on the CPU in its reduced mode: Baton and transformers'
continuous batching both serve the workload on both model families, their greedy fp32 tokens agree,
and the run keeps to its budget."""

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from bench import gpu_check_peer
from bench.gpu_check import _steps


def _report(capsys, argv: list[str]) -> tuple[int, dict]:
    rc = gpu_check_peer.main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out[out.index("{") :])


def test_the_reduced_run_serves_both_models_on_both_systems_with_the_same_tokens(capsys):
    rc, report = _report(capsys, ["--reduced", "--json"])
    assert rc == 0 and report["ok"], report
    assert report["environment"]["device"] == "cpu" and report["environment"]["dtype"] == "float32"
    assert report["models"].keys() == set(gpu_check_peer.MODELS)
    for name, m in report["models"].items():
        assert m["errors"] == {}, name
        assert all(m[k] > 0 for k in ("baton_cb_tok_s", "baton_static_tok_s", "hf_cb_tok_s")), name
        assert m["baton_cb_over_hf_cb"] == pytest.approx(m["baton_cb_tok_s"] / m["hf_cb_tok_s"])
        # two interleaved rounds of every system, each of which checked every request's length
        assert {s: len(r) for s, r in m["runs_tok_s"].items()} == dict.fromkeys(gpu_check_peer.SYSTEMS, 2)
        # greedy, fp32, EOS ignored: every run of every system gives every request the same tokens
        assert m["requests_identical_across_systems"] == m["workload"]["requests"] == gpu_check_peer.REDUCED.n
        assert "sdpa" in m["hf_settings"]["attn_implementation"]  # (no flash-attention on a CPU; 5.17: "paged|sdpa")


def test_runs_the_budget_cannot_fit_are_skipped_and_named(capsys):
    rc, report = _report(capsys, ["--reduced", "--json", "--models", "qwen2.5-0.5b", "--budget-s", "0"])
    m = report["models"]["qwen2.5-0.5b"]
    assert rc == 1 and not report["ok"]
    assert m["errors"].keys() == set(gpu_check_peer.SYSTEMS) and "skipped" in m["errors"]["hf-cb"]
    assert m["hf_cb_tok_s"] is None and m["baton_cb_over_hf_cb"] is None


def test_a_peer_run_cut_short_is_stopped_and_reported_as_a_bound_and_the_others_go_on(capsys):
    argv = ["--reduced", "--json", "--models", "llama-3.2-1b", "--n", "400", "--hf-timeout-s", "0.02"]
    rc, report = _report(capsys, argv)
    m = report["models"]["llama-3.2-1b"]
    assert rc == 1 and m["errors"].keys() == {"hf-cb"}
    assert "TimeoutError" in m["errors"]["hf-cb"] and "tok/s" in m["errors"]["hf-cb"]
    # the other systems' rounds still ran after it (its loop stopped: the next engine built and ran)
    assert m["hf_cb_tok_s"] is None and len(m["runs_tok_s"]["baton-cb"]) == len(m["runs_tok_s"]["baton-static"]) == 2


def test_without_cuda_the_full_run_says_so_and_succeeds(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the real run applies")
    assert gpu_check_peer.main(["--json"]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def test_gpu_check_runs_the_full_comparison_as_a_step(tmp_path: Path):
    steps = {name: (cmd, limit) for name, cmd, limit in _steps(tmp_path)}
    cmd, limit = steps["peer_transformers_cb"]
    assert cmd[1:] == ["-m", "bench.gpu_check_peer", "--json"] and limit >= 60
