"""``baton up`` / ``baton cluster`` configuration and start-up checks: a wrong setting is a one-line
error naming it, before anything starts (found by an audit: each case below was a traceback, a hang,
or a setting silently ignored)."""

from __future__ import annotations

import math
import socket

import pytest

from baton.config import ConfigError, load_config
from baton.serve import local_notes, preflight
from baton.supervisor import check_reachable


def _config(tmp_path, text: bytes | str, overrides=None):
    path = tmp_path / "baton.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return load_config(path, overrides)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("router: {http_port: 1}\nrouter: {grpc_port: 2}\n", "the key 'router' is given twice"),
        ("router: {http_port: 18213, grpc_port: 18213}\n", "they need a port each"),
        (
            "tenants:\n  - {name: x, api_key: {value: k1}}\n  - {name: x, api_key: {value: k2}}\n",
            "tenants[1]: the name 'x' is taken",
        ),
        ("tenants: [{name: y, allowed_lanes: [batch], default_lane: interactive}]\n", "is not in its allowed_lanes"),
        ("auth: {api_key: {value: a}}\ntenants: [{name: default, api_key: {value: t}}]\n", "a tenant named 'default'"),
        ("tenants: [{name: x, allowed_lanes: []}]\n", "allowed_lanes"),
        ("engine: {kv_cache_memory_gb: .inf}\n", "engine.kv_cache_memory_gb: Input should be a finite number"),
        ("redis: {url: notaurl}\n", "redis.url: must start with redis://"),
        (b"\xff\xfe", "not UTF-8 text"),
        ("model: {path: ''}\n", "model.path: String should have at least 1 character"),
        ("engine: {speculative_tokens: -1}\n", "engine.speculative_tokens: Input should be greater than or equal to 0"),
        ("engine: {speculative_tokens: 64}\n", "engine.speculative_tokens: Input should be less than or equal to 32"),
        (
            "engine: {speculative_min_keep_chance: 1}\n",
            "engine.speculative_min_keep_chance: Input should be less than 1",
        ),
        ("redis: {url: 'redis://127.0.0.1:abc/0'}\n", "redis.url: Port could not be cast to integer value as 'abc'"),
    ],
)
def test_a_bad_config_names_the_problem(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, text)
    assert needle in str(e.value) and str(e.value).startswith(str(tmp_path / "baton.yaml"))


def test_an_empty_redis_url_means_the_embedded_server(tmp_path):
    assert _config(tmp_path, "redis: {url: ''}\n").redis.url is None


def test_a_command_line_option_over_a_section_that_is_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"router: must be a mapping, got 5"):
        _config(tmp_path, "router: 5\n", {"router.http_port": 18201})  # was a TypeError traceback
    with pytest.raises(ConfigError, match=r"command-line options: router.http_port"):
        _config(tmp_path, "{}\n", {"router.http_port": 99999})  # not blamed on the file alone


def test_preflight_finds_a_taken_port_and_missing_gpus_before_anything_starts(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"router.http_port {port}: cannot listen on 127.0.0.1:{port}"):
            preflight(_config(tmp_path, f"router: {{http_port: {port}, grpc_port: 0}}\n"))
    import torch

    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"ask for {gpus + 1} GPUs .* has {gpus}"):
        preflight(
            _config(tmp_path, f"router: {{http_port: 0, grpc_port: 0}}\npools: {{decode: {{gpus: {gpus + 1}}}}}\n")
        )


def test_preflight_checks_an_ipv6_host_as_ipv6(tmp_path):
    """An IPv6 router.host (served fine) was refused: the port check tried it as an IPv4 address."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6) as probe:
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    preflight(_config(tmp_path, f"router: {{host: '::1', http_port: {port}, grpc_port: 0}}\n"))
    with pytest.raises(ConfigError, match=r"router\.host: String should have at least 1 character"):
        _config(tmp_path, "router: {host: ''}\n")


def test_a_ray_address_nothing_answers_at_fails_at_once():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match=rf"nothing answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")  # ray.init retried it forever
    with pytest.raises(RuntimeError, match="nothing answers"):
        check_reachable(f"ray://127.0.0.1:{port}")
    check_reachable("auto")  # Ray resolves these itself


def test_a_worker_that_failed_to_start_is_named_by_its_own_error():
    from baton.cli import user_error
    from baton.fleet import _raised_in

    ray_text = (
        "The actor died because of an error raised in its creation task, ray::DecodeWorker.__init__() "
        '(pid=1)\n  File "engine/model/config.py", line 124, in from_hf_dict\n'
        "engine.errors.ModelLoadError: /m/config.json: model config: hidden_size must be a positive integer"
    )
    assert _raised_in(RuntimeError(ray_text)) == (
        "/m/config.json: model config: hidden_size must be a positive integer (ModelLoadError)"
    )
    listen = "router.http_port 8000: cannot listen"
    assert user_error(OSError(listen), (OSError,)) == listen
    assert user_error(KeyError("a bug"), (OSError, ValueError)) is None  # a bug keeps its traceback


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["profile", "--quick", "--no-ray", "--model", "tiny", "--rpc-ms", "nan"], "--rpc-ms must be a finite number"),
        (["profile", "--quick", "--no-ray", "--model", "tiny", "--out", "/nonexistent-dir/cm.json"], "does not exist"),
        (
            ["generate", "--model", "tiny", "--prompt", "hi", "--kv-cache-gb", "inf"],
            "kv_cache_memory_gb must be a finite",
        ),
        (["bench", "scheduler", "--steps", "1"], "--steps must be between 2 and"),
    ],
)
def test_cli_values_that_used_to_pass_or_crash(capsys, argv, needle):
    from baton.cli import main

    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_plan_refuses_an_infinite_duration(tmp_path, capsys):
    from baton.cli import main

    assert (
        main(
            [
                "plan",
                "--cost-model",
                str(tmp_path / "missing.json"),
                "--slo",
                "ttft=2000,tpot=250",
                "--rate",
                "1",
                "--duration",
                str(math.inf),
            ]
        )
        == 2
    )
    assert "--duration must be a finite number" in capsys.readouterr().err


def test_a_serving_bench_needs_a_positive_timeout():
    from baton.perf.loadgen.runner import RunConfig
    from baton.perf.loadgen.workload import LengthDist, WorkloadSpec

    spec = WorkloadSpec("t", {"interactive": 1.0}, LengthDist.fixed(8), LengthDist.fixed(4))
    for timeout_s in (0, -1, math.nan):  # was: accepted, and then "cannot reach the server" with no reason
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            RunConfig(url="http://127.0.0.1:1", spec=spec, rate=1.0, duration_s=1.0, timeout_s=timeout_s)


def test_triton_attention_on_a_cpu_without_the_interpreter_is_named(monkeypatch):
    import torch

    from engine.attention.backend import select_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention_backend=triton runs on CUDA"):  # was triton's "0 active drivers"
        select_backend(torch.device("cpu"), "triton")


def test_config_check_resolves_the_redis_password(tmp_path, capsys, monkeypatch):
    from baton.cli import main

    path = tmp_path / "baton.yaml"
    path.write_text("redis: {password: {env: BATON_TEST_MISSING_PASSWORD}}\n")
    monkeypatch.delenv("BATON_TEST_MISSING_PASSWORD", raising=False)
    assert main(["config", "--check", str(path)]) == 2  # was: approved, and `baton up` failed later
    assert "redis.password: environment variable BATON_TEST_MISSING_PASSWORD is not set" in capsys.readouterr().err
    monkeypatch.setenv("BATON_TEST_MISSING_PASSWORD", "pw")
    assert main(["config", "--check", str(path)]) == 0


def test_engine_limits_that_crashed_the_process():
    import os

    from engine.config import EngineConfig, SchedulerConfig

    with pytest.raises(ValueError, match="max_num_seqs must be at most 65536, got 10000000"):
        SchedulerConfig(max_num_seqs=10_000_000)  # was a numpy allocation error far from the flag
    SchedulerConfig(max_num_seqs=65536)
    for threads in (20_000, 100_000):  # were a libgomp failure and a segfault
        with pytest.raises(ValueError, match=f"num_threads must be at most .*got {threads}"):
            EngineConfig(num_threads=threads)
    EngineConfig(num_threads=max(1024, 4 * (os.cpu_count() or 1)))  # loose: a worker host may be bigger


def test_baton_up_says_which_settings_it_does_not_apply_as_written(tmp_path):
    """router.replicas > 1 ran one router, and pools asking for more CPUs than the machine has ran
    anyway, both without a word."""
    import os

    cfg = _config(
        tmp_path, f"router: {{replicas: 3}}\npools: {{decode: {{workers: 1, cpus: {(os.cpu_count() or 1) + 1}}}}}\n"
    )
    notes = local_notes(cfg)
    assert any("router.replicas is 3; baton up runs one router" in n for n in notes)
    assert any("the workers will share them" in n for n in notes)
    assert local_notes(_config(tmp_path, "pools: {prefill: {workers: 0}, decode: {workers: 1, cpus: 1}}\n")) == []


def test_speculative_tokens_reach_the_workers_engine_config(tmp_path):
    assert _config(tmp_path, "engine: {}\n").engine_config().scheduler.speculative is None
    spec = _config(tmp_path, "engine: {speculative_tokens: 4}\n").engine_config().scheduler.speculative
    assert spec is not None and spec.num_tokens == 4 and spec.min_keep_chance == 0.5
    spec = _config(tmp_path, "engine: {speculative_tokens: 2, speculative_min_keep_chance: 0.2}\n").engine_config()
    assert spec.scheduler.speculative.min_keep_chance == 0.2


def test_secrets_can_be_read_from_files(tmp_path):
    """`{file: PATH}` references (a mounted Kubernetes Secret, a file on a Ray node) keep secrets out
    of the config and out of Ray's runtime env, which `ray list jobs` and the dashboard show."""
    (tmp_path / "redis-password").write_text("s3cret\n")  # as `kubectl create secret --from-file` leaves it
    (tmp_path / "acme").write_text("sk-acme")
    path = tmp_path / "baton.yaml"
    path.write_text(
        f"redis: {{password: {{file: {tmp_path / 'redis-password'}}}}}\n"
        f"tenants: [{{name: acme, api_key: {{file: {tmp_path / 'acme'}}}}}]\n"
    )
    cfg = load_config(path)
    assert cfg.redis_password() == "s3cret"
    cfg.lane_policy()  # resolves the tenants' keys
    (tmp_path / "redis-password").unlink()
    with pytest.raises(ConfigError, match=r"cannot read secret file .*redis-password"):
        cfg.redis_password()
