"""The KV-transfer bench without Ray (spawned processes, as on a GPU machine without Ray): it runs the
real agents over gloo and shared memory, and a bench peer that fails to start or raises is reported."""

import pytest

from baton.perf.proc_actor import ActorError, ProcActor, gather


class _Counter:
    def __init__(self, start: int) -> None:
        if start < 0:
            raise ValueError("start must be >= 0")
        self.n = start

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def boom(self) -> None:
        raise RuntimeError("boom in the child")


def test_calls_run_in_the_child_and_come_back_in_order():
    a = ProcActor(_Counter, 5)
    try:
        assert gather([a.call("add", 1), a.call("add", 10)]) == [6, 16]
        with pytest.raises(ActorError, match="boom in the child"):
            a.call("boom").result()
        assert a.call("add", 0).result() == 16  # still serving after an exception
    finally:
        a.stop()


def test_a_constructor_that_raises_is_reported_with_its_message():
    with pytest.raises(ActorError, match="start must be >= 0"):
        ProcActor(_Counter, -1)


def test_the_transfer_bench_runs_without_ray_on_cpu():
    from baton.perf.kv_transfer_bench import run

    r = run([64, 160], repeats=1, chunk_tokens=64, use_ray=False)
    assert r["backend"] == "gloo (CPU)" and r["dtype"] == "float32"
    first, second = r["results"]
    assert (first["blocks"], second["blocks"]) == (4, 10)
    assert second["bytes"] == 10 * 30 * 2 * 16 * 3 * 64 * 4
    for x in r["results"]:
        for key in ("latency_ms_median", "raw_send_recv_ms_median", "local_latency_ms_median", "memcpy_gb_s"):
            assert x[key] > 0
        assert 0 < x["local_fraction_of_copy"] < 10


def test_bad_arguments_are_named(capsys):
    from baton.perf.kv_transfer_bench import main

    for argv, name in (
        (["--lengths", "a,b"], "--lengths"),
        (["--lengths", "0"], "--lengths"),
        (["--device", "tpu"], "--device"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert name in capsys.readouterr().err
