"""Bad flags of ``baton bench``, ``baton plan`` and ``baton profile``: one ``baton: error: --flag ...``
line and exit code 2, checked before any cluster, model, server or long run starts (no Ray, no
model load, no connection: every case here fails in milliseconds, or would hang or grow without
the check, which the timeouts catch)."""

from __future__ import annotations

import argparse

import pytest

from baton.cli import main as baton_main

URL = ["--url", "http://127.0.0.1:9", "--no-progress"]  # nothing listens: a run would fail to connect


def _error(capsys, argv: list[str]) -> str:
    """The one error line of a command that must be refused."""
    assert baton_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("baton: error: "), err
    return lines[0]


@pytest.fixture
def cost_model(tmp_path) -> str:
    from baton.perf.profile.synthetic import synthetic_cost_model

    path = tmp_path / "cm.json"
    synthetic_cost_model(const_s=0.02, per_token_s=0.0005).save(path)
    return str(path)


def _plan(cost_model: str, *flags: str) -> list[str]:
    return [
        "plan",
        "--workload",
        "sharegpt",
        "--slo",
        "ttft=2000,tpot=250",
        "--cost-model",
        cost_model,
        "--max-workers",
        "1",
        *flags,
    ]


# -- 1, 2: bench scheduler ------------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize("steps", ["10001", "100000000000"])
def test_scheduler_steps_are_bounded(capsys, steps):
    line = _error(capsys, ["bench", "scheduler", "--num-seqs", "8", "--steps", steps])
    assert "--steps must be between 2 and 10000" in line


def test_scheduler_steps_are_bounded_by_memory_with_many_sequences(capsys):
    line = _error(capsys, ["bench", "scheduler", "--num-seqs", "65536", "--steps", "1000"])
    assert "--steps must be at most" in line and "--num-seqs 65536" in line


@pytest.mark.timeout(30)
def test_scheduler_runs_with_more_sequences_than_the_first_steps_prefill():
    # 1729 sequences took more prefill steps than max_tokens allowed: the first ones finished before
    # the measurement and `assert len(so.slots) == num_seqs` failed.
    from baton.perf.scheduler_overhead import measure

    assert measure(1729, steps=2)["num_seqs"] == 1729


# -- 3: rate x duration -----------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("flags", [["--rate", "0.4", "--duration", "1e12"], ["--rate", "1e9"]])
def test_plan_bounds_the_requests_a_workload_plans(capsys, cost_model, flags):
    line = _error(capsys, _plan(cost_model, *flags))
    assert "--rate" in line and "--duration" in line and "at most 1000000" in line


@pytest.mark.timeout(10)
def test_serve_bounds_the_requests_a_workload_plans(capsys):
    line = _error(capsys, ["bench", "serve", *URL, "--workload", "fixed", "--duration", "2", "--rate", "1e9"])
    assert "--rate 1e+09 req/s over --duration 2 s" in line


@pytest.mark.timeout(10)
def test_plan_requests_refuses_a_plan_too_big_to_hold():
    from baton.perf.loadgen.arrivals import plan_requests
    from baton.perf.loadgen.workload import load_workload

    with pytest.raises(ValueError, match="lower --rate or --duration"):
        plan_requests(load_workload("fixed"), 1e9, 2.0)


# -- 4: bench interference --------------------------------------------------------------------------


def _interference_args(*argv: str) -> argparse.Namespace:
    from baton.perf.interference_workload import add_arguments

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return ap.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, words",
    [
        (("--duration", "inf"), "--duration must be a number of seconds in (0, 86400]"),
        (("--duration", "nan"), "--duration must be a number of seconds"),
        (("--long-every", "inf", "--duration", "1"), "--long-every must be a number of seconds"),
        (("--local-prefill-threshold", "-5"), "--local-prefill-threshold must be >= 0"),
        (("--max-num-batched-tokens", "0"), "--max-num-batched-tokens must be >= 1"),
        (("--interactive", "100000"), "--interactive must be between 1 and 4096"),
    ],
)
def test_interference_flags_are_checked_before_the_cluster_starts(argv, words):
    # run_from_args builds the workload (these checks) before run() starts a cluster
    from baton.perf.interference_workload import workload_from_args

    with pytest.raises(ValueError) as e:
        workload_from_args(_interference_args(*argv))
    assert words in str(e.value)


# -- 5: bench kv-transfer ---------------------------------------------------------------------------


def test_kv_transfer_refuses_lengths_beyond_its_bound(capsys):
    line = _error(capsys, ["bench", "kv-transfer", "--lengths", "10000000", "--no-ray", "--repeats", "1"])
    assert "--lengths must be at most 131072" in line


def test_kv_transfer_refuses_lengths_beyond_memory(capsys, monkeypatch):
    import baton.perf.kv_transfer_sizes as sizes

    monkeypatch.setattr(sizes, "_available_memory", lambda: 2**30)
    line = _error(capsys, ["bench", "kv-transfer", "--lengths", "100000", "--no-ray"])
    assert "--lengths 100000: the run needs about" in line and "1.0 GiB is available" in line


def test_kv_transfer_takes_the_flags_its_messages_name(capsys):
    from baton.cli import build_parser

    args = build_parser().parse_args(["bench", "kv-transfer", "--chunk-tokens", "64", "--dtype", "bfloat16"])
    assert args.chunk_tokens == 64 and args.dtype == "bfloat16"
    line = _error(capsys, ["bench", "kv-transfer", "--chunk-tokens", "0"])
    assert "--chunk-tokens must be >= 1" in line
    line = _error(capsys, ["bench", "kv-transfer", "--lengths", "0"])  # was: the module's own usage
    assert "--lengths must be positive" in line


# -- 6, 7: bench serve ------------------------------------------------------------------------------


def test_serve_checks_plots_before_the_run(capsys, tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    line = _error(capsys, ["bench", "serve", *URL, "--rate", "1", "--plots", str(a_file)])
    assert f"--plots {a_file}: exists and is not a directory" in line
    line = _error(capsys, ["bench", "serve", *URL, "--rate", "1", "--plots", str(a_file / "sub")])
    assert "--plots" in line and "cannot create it" in line
    (tmp_path / "run_plots").write_text("")  # the default: --json's name + _plots
    line = _error(capsys, ["bench", "serve", *URL, "--rate", "1", "--json", str(tmp_path / "run.json")])
    assert "--plots" in line and "run_plots: exists and is not a directory" in line
    line = _error(capsys, ["bench", "serve", *URL, "--rate", "1", "--plots", str(tmp_path), "--no-plots"])
    assert "--plots and --no-plots" in line


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--search", "--search-tolerance", "-1"], "--search-tolerance must be in (0, 1)"),
        (["--search", "--search-tolerance", "nan"], "--search-tolerance must be in (0, 1)"),
        (["--search", "--search-max-rate", "0.5"], "--search-max-rate 0.5 is below the starting --rate 1"),
        (["--search", "--search-max-rate", "1e9"], "--search-max-rate 1e+09 req/s over --duration 60 s"),
        (["--search", "--search-target", "0"], "--search-target must be in (0, 1]"),
        (["--search-runs", "3"], "--search-runs only applies with --search"),
        (["--gamma-shape", "2"], "--gamma-shape is for gamma arrivals"),
        (["--arrival", "gamma", "--gamma-shape", "0"], "--gamma-shape must be a finite number > 0"),
        (["--warmup", "nan"], "--warmup must be in [0, --duration)"),
        (["--timeout", "inf"], "--timeout must be a finite number > 0"),
    ],
)
def test_serve_refuses_settings_it_would_ignore_or_misuse(capsys, flags, words):
    assert words in _error(capsys, ["bench", "serve", *URL, "--rate", "1", *flags])


# -- 8: profile --refit -----------------------------------------------------------------------------


def test_profile_refit_refuses_the_measuring_flags(capsys, tmp_path):
    cm = tmp_path / "cost_model.json"  # refused before it is read: any existing file will do
    cm.write_text("{}")
    cm = str(cm)
    line = _error(
        capsys,
        [
            "profile",
            "--refit",
            cm,
            "--out",
            str(tmp_path / "x.json"),
            "--threads",
            "0",
            "--model",
            "/nonexistent",
            "--kv-cache-gb",
            "-5",
            "--device",
            "gpu",
            "--quick",
        ],
    )
    assert "--refit measures nothing: --model, --threads, --device, --quick, --kv-cache-gb" in line
    line = _error(capsys, ["profile", "--refit", cm, "--out", str(tmp_path / "x.json"), "--no-neighbour"])
    assert "--no-neighbour would be ignored" in line
    line = _error(capsys, ["profile", "--refit", str(tmp_path / "none.json"), "--out", str(tmp_path / "x.json")])
    assert "--refit" in line and "no such file" in line
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N"),
        (["--threads", "100000"], "--threads must be at most"),
        (["--kv-cache-gb", "-5"], "--kv-cache-gb must be a finite number > 0"),
    ],
)
def test_profile_checks_flags_before_loading_the_model(capsys, tmp_path, flags, words):
    line = _error(capsys, ["profile", "--model", "/nonexistent", "--out", str(tmp_path / "x.json"), *flags])
    assert words in line


# -- 9: plan --kv-blocks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks, words",
    [
        ("1", "--kv-blocks 1 is too small for the workload"),
        ("0", "--kv-blocks must be >= 1"),
        ("100000000", "--kv-blocks must be at most"),
    ],
)
def test_plan_names_kv_blocks(capsys, cost_model, blocks, words):
    line = _error(capsys, _plan(cost_model, "--rate", "0.4", "--kv-blocks", blocks))
    assert words in line
    assert "max_tokens" not in line
