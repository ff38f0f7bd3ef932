"""The multi-GPU tensor-parallel check (bench/gpu_check_tp.py): where the machine has too few GPUs it
says so and succeeds, and its reduced run (a tiny Llama on the CPU, TP 2 as local gloo ranks) goes
through every step the GPU run takes, with the same tokens at both sizes."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from bench import gpu_check_tp


def _report(capsys, argv: list[str]) -> tuple[int, dict]:
    rc = gpu_check_tp.main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out[out.index("{") :])


def test_a_size_beyond_the_visible_gpus_is_refused_politely(capsys):
    beyond = torch.cuda.device_count() + 1  # one GPU more than this machine has, whatever it has
    rc, report = _report(capsys, ["--json", "--tp-sizes", f"1,{beyond}"])
    assert rc == 0
    assert f"tensor parallel size {beyond} needs {beyond}" in report["skipped"]
    assert "several GPUs" in report["skipped"]


def test_the_reduced_run_times_both_sizes_and_they_make_the_same_tokens(capsys):
    rc, report = _report(capsys, ["--reduced", "--json"])
    assert rc == 0
    assert (report["device"], report["dtype"]) == ("cpu", "float32")
    assert report["runs"].keys() == {"1", "2"}
    for tp, r in report["runs"].items():
        assert r["tensor_parallel_size"] == int(tp)
        assert [d["batch"] for d in r["decode"]] == list(gpu_check_tp.REDUCED.sizes)
        assert all(d["step_ms"] > 0 and d["tok_s"] > 0 for d in r["decode"])
        assert r["offline"]["requests"] == gpu_check_tp.REDUCED.requests and r["offline"]["tok_s"] > 0
        assert r["cuda_graphs"] is False
    c = report["compare"]["tp2_vs_tp1"]
    assert set(c["decode_speedup"]) == {str(b) for b in gpu_check_tp.REDUCED.sizes}
    assert c["offline_speedup"] > 0
    # fp32, greedy, EOS ignored: the sharded model's tokens are the whole model's
    assert c["requests_identical"] == gpu_check_tp.REDUCED.requests
