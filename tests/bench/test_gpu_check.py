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


# ---- issue 43's steps: each imports, builds its config and skips cleanly without CUDA -----------

_ISSUE43_STEPS = {
    "shared_gpu_disagg": "bench.disagg_check",
    "payload_streams": "bench.gpu_check_payload_streams",
    "decode_split_k": "bench.gpu_check_decode_split",
    "golden_hd128_bf16": "bench.gpu_check_hd128_golden",
}


def test_issue43_steps_are_prepared_and_every_step_module_imports(tmp_path):
    import importlib
    from pathlib import Path

    from bench.gpu_check import _steps

    steps = {name: cmd for name, cmd, _ in _steps(Path(tmp_path))}
    for name, module in _ISSUE43_STEPS.items():
        assert steps[name][1:3] == ["-m", module], name
    for cmd in steps.values():
        if cmd[1] == "-m":
            importlib.import_module(cmd[2])
    assert "--gpu-fraction" in steps["shared_gpu_disagg"]
    assert sum(most for _, _, most in _steps(Path(tmp_path))[:5]) <= 650  # env + the four: well inside a lease


def test_issue43_scripts_say_so_and_succeed_without_cuda(capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the real run applies")
    from bench import gpu_check_2gpu, gpu_check_decode_split, gpu_check_hd128_golden, gpu_check_payload_streams

    for mod in (gpu_check_payload_streams, gpu_check_decode_split, gpu_check_hd128_golden):
        assert mod.main(["--json"]) == 0
        assert "CUDA is not available" in capsys.readouterr().out
    assert gpu_check_2gpu.main(["--json"]) == 0
    assert "this check needs two" in capsys.readouterr().out


def test_the_shared_gpu_step_sizes_kv_from_the_workers_share():
    from bench.disagg_check import _engine_config

    fixed = _engine_config("m", "cuda", 16, 64, shared=False)
    shared = _engine_config("m", "cuda", 16, 64, shared=False, gpu_fraction=0.5)
    assert fixed.cache.num_blocks == 256 and fixed.cache.gpu_fraction == 1.0
    assert shared.cache.num_blocks is None and shared.cache.gpu_fraction == 0.5  # the profiling pass sizes it


def test_the_split_k_step_compares_with_the_width_based_split():
    from bench.gpu_check_decode_split import Geometry, kv_bytes_read, old_partition_size

    g = Geometry()
    assert (g.head_dim, g.heads // g.kv_heads, g.max_context) == (128, 4, 131072)
    assert old_partition_size(1, 8, 131072) == 512  # batch 1: 256 partitions over the table's width
    assert old_partition_size(64, 8, 131072) == 131072  # batch 64: one partition
    assert kv_bytes_read(g, [4096]) == 4096 * 8 * 128 * 2 * 2


def test_the_hd128_step_builds_its_model_config_and_engine_config():
    from bench.gpu_check_hd128_golden import HD128_OVERRIDES, engine_config, prompts

    o = HD128_OVERRIDES
    assert o["head_dim"] == 128 and o["num_attention_heads"] // o["num_key_value_heads"] == 4
    cfg = engine_config("/m")
    assert (cfg.device, cfg.dtype) == ("cuda", "bfloat16")
    ps, max_new = prompts()
    assert max(len(p) for p in ps) + max(max_new) <= cfg.max_model_len <= o["max_position_embeddings"]


def test_the_two_gpu_check_carries_its_stream_counter_to_the_workers():
    import pickle

    from bench.gpu_check_2gpu import StreamCheckedNccl

    assert pickle.loads(pickle.dumps(StreamCheckedNccl(1234))) == StreamCheckedNccl(1234)


def test_the_structured_step_runs_its_bench_on_the_cpu(tiny_model_dir, capsys):
    """Issue 46's step: constrained against unconstrained decode steps, here on the CPU (``--device cpu``)."""
    from pathlib import Path

    from bench import grammar_backends
    from bench.gpu_check import _steps

    cmd = {name: c for name, c, _ in _steps(Path("."))}["structured"]
    assert cmd[1:3] == ["-m", "bench.grammar_backends"] and cmd[cmd.index("--device") + 1] == "cuda"
    args = cmd[3:]
    args[args.index("--device") + 1] = "cpu"
    grammar_backends.main([*args, "--model", str(tiny_model_dir), "--rows", "2", "--steps", "3", "--repeats", "1"])
    report = _last_json(capsys.readouterr().out)
    assert report is not None and report["device"] == "cpu"
    row = report["decode_ms_per_step"]["2"]
    assert row["constrained"] > 0 and row["unconstrained"] > 0 and row["mask_ms"] > 0
