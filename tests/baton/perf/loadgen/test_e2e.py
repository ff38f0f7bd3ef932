"""The load generator end to end over real loopback servers: the OpenAI HTTP app and the gRPC
server in front of the scripted ``FakeRouter`` (tokens every few ms, errors on demand), driven by
``run_load`` and by the ``baton bench serve`` command; the JSON report's schema; the plots; the
``/metrics`` sampler against the router's real Prometheus exposition."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from baton.cli import main as baton_main
from baton.perf.loadgen.runner import RunConfig, RunResult, run_load_sync
from baton.perf.loadgen.server_metrics import MetricsSample, lane_decode_shares, parse_metrics, worker_utilisation
from baton.perf.loadgen.workload import LengthDist, WorkloadSpec
from engine.lane_shares import LaneCounters
from engine.worker_stats import WorkerLoad
from router.grpc_server import GrpcServer
from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from router.metrics import RouterMetrics
from tests.router.fake_router import FakeRouter

Wire = Literal["http", "grpc"]  # RunConfig.protocol
SPEC = WorkloadSpec("t", {"interactive": 0.5, "batch": 0.5}, LengthDist.uniform(4, 12), LengthDist.uniform(2, 6))


@pytest.fixture
def fake() -> FakeRouter:
    return FakeRouter(max_model_len=1000, token_delay_s=0.002)


@pytest.fixture
def http_url(fake: FakeRouter) -> Iterator[str]:
    srv = ThreadedHttpServer(create_app(fake, served_model_name="fake-served"), "127.0.0.1", 0).start()
    try:
        yield srv.url
    finally:
        srv.stop()


@pytest.fixture
def grpc_target(fake: FakeRouter) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = GrpcServer(fake, "127.0.0.1", 0)
    port = asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _run(url: str, protocol: Wire = "http", spec: WorkloadSpec = SPEC, **kw) -> RunResult:
    kw = {"rate": 20.0, "duration_s": 1.5, **kw}
    return run_load_sync(RunConfig(url=url, spec=spec, protocol=protocol, progress=False, metrics_interval_s=0.2, **kw))


def _check_all_ok(result: RunResult, fake: FakeRouter) -> None:
    assert len(result.records) >= 10
    for r in result.records:
        assert r.status == "ok", r.to_dict()
        assert r.output_tokens == r.output_len  # the fake emits exactly max_tokens tokens
        assert r.served_lane == r.lane
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert len(r.itl_s) == r.output_len - 1
        assert r.send_s - r.arrival_s < 0.5  # sent on schedule
    sent = {(len(q.prompt_token_ids or ()), q.sampling.max_tokens, q.lane) for q in fake.requests}
    assert sent == {(r.prompt_len, r.output_len, r.lane) for r in result.records}
    assert all(q.sampling.ignore_eos and q.sampling.min_tokens == q.sampling.max_tokens for q in fake.requests)
    s = result.summary()
    assert s.completed == s.requests and s.slo_attainment == 1.0 and s.ttft_s.n == s.requests
    assert set(result.lanes()) == {"interactive", "batch"}


def test_open_loop_over_http(http_url: str, fake: FakeRouter) -> None:
    result = _run(http_url)
    _check_all_ok(result, fake)
    assert result.server.model == "fake-served" and result.server.max_model_len == 1000
    assert fake.requests[0].stream and fake.requests[0].prompt_token_ids is not None
    assert len(result.timeseries) >= 5 and all(s.scraped for s in result.timeseries)


def test_open_loop_over_grpc(grpc_target: str, fake: FakeRouter) -> None:
    result = _run(grpc_target, "grpc")
    _check_all_ok(result, fake)
    assert result.server.vocab_size == 1000
    assert all(q.endpoint == "grpc" for q in fake.requests)
    assert result.timeseries and not any(s.scraped for s in result.timeseries)  # no /metrics over gRPC


def test_closed_loop_keeps_c_requests_in_flight(http_url: str, fake: FakeRouter) -> None:
    result = _run(http_url, rate=None, concurrency=3, duration_s=1.0)
    _check_all_ok(result, fake)
    assert max(s.in_flight for s in result.timeseries) <= 3
    assert result.summary().offered_rate is None


def test_non_streaming_workload(http_url: str, fake: FakeRouter) -> None:
    spec = WorkloadSpec("ns", {"interactive": 1.0}, LengthDist.fixed(8), LengthDist.fixed(4), streaming=False)
    result = _run(http_url, spec=spec, duration_s=0.5)
    assert result.records and all(
        r.status == "ok" and r.output_tokens == 4 and r.ttft_s == r.e2e_s for r in result.records
    )
    assert not any(q.stream for q in fake.requests)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_rejections_failures_and_timeouts_are_recorded(protocol: Wire, request, fake: FakeRouter) -> None:
    url = request.getfixturevalue("http_url" if protocol == "http" else "grpc_target")
    bad = WorkloadSpec("bad", {"interactive": 0.5, "nosuchlane": 0.5}, LengthDist.fixed(4), LengthDist.fixed(3))
    result = _run(url, protocol, spec=bad)
    rejected = [r for r in result.records if r.lane == "nosuchlane"]
    assert rejected and all(r.status == "rejected" for r in rejected)
    want = "HTTP 400 invalid_request_error" if protocol == "http" else "gRPC INVALID_ARGUMENT"
    assert {r.reason for r in rejected} == {want}
    s = result.summary()
    assert s.rejections == {want: len(rejected)} and s.slo_met == s.requests - len(rejected)

    fake.fail_after_tokens = 1  # an in-band failure after the first token
    failed = _run(url, protocol, duration_s=0.3)
    assert failed.records and all(r.status == "error" and r.first_token_s is not None for r in failed.records)

    fake.fail_after_tokens, fake.token_delay_s = None, 1.0
    slow = _run(url, protocol, duration_s=0.3, timeout_s=0.3, drain_s=5.0)
    assert slow.records and all(r.status == "timeout" for r in slow.records)
    assert slow.summary().rejections == {"client timeout": len(slow.records)}
    cut = _run(url, protocol, duration_s=0.3, drain_s=0.1)  # still streaming when the run ends
    assert cut.records and all(r.status == "timeout" for r in cut.records)
    assert cut.summary().rejections == {"unfinished at end of run": len(cut.records)}


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"cannot reach the server at http://127.0.0.1:9"):
        _run("http://127.0.0.1:9", duration_s=0.2)


def test_metrics_parser_reads_the_router_exposition() -> None:
    loads = [
        WorkerLoad("decode-0", "i", "decode", 3, 1, 25, 100, 0, steps=40, busy_seconds=2.5, busy_cpu_seconds=2.0),
        WorkerLoad("prefill-0", "i", "prefill", 0, 2, 90, 100, 512),
    ]
    m = RouterMetrics("m", loads=lambda: loads)
    m.set_lane_gauges({"interactive": 4, "batch": 7}, {"interactive": 2, "batch": 1})
    text, _ = m.exposition()
    s = parse_metrics(text.decode(), MetricsSample(t=0.0, in_flight=0))
    assert s.scraped
    assert s.waiting == {"interactive": 4.0, "batch": 7.0}
    assert s.running == {"interactive": 2.0, "batch": 1.0}
    assert s.kv_usage == {"decode/decode-0": 0.75, "prefill/prefill-0": pytest.approx(0.1)}
    assert s.worker_waiting == {"decode/decode-0": 1.0, "prefill/prefill-0": 2.0}
    assert s.worker_running == {"decode/decode-0": 3.0, "prefill/prefill-0": 0.0}
    assert s.worker_steps == {"decode/decode-0": 40.0, "prefill/prefill-0": 0.0}
    assert s.worker_busy_s["decode/decode-0"] == 2.5 and s.worker_busy_cpu_s["decode/decode-0"] == 2.0


def test_the_lanes_decode_token_shares_count_while_the_lane_has_demand() -> None:
    counters = LaneCounters({0: 300, 2: 900}, {2: 4}, {2: 12.5})
    loads = [WorkerLoad("decode-0", "i", "decode", 3, 1, 25, 100, 0, lane_counters=counters)]
    text, _ = RouterMetrics("m", loads=lambda: loads, lane_names={0: "interactive", 2: "batch"}).exposition()
    s = parse_metrics(text.decode(), MetricsSample(t=0.0, in_flight=0))
    assert s.lane_decode_tokens == {"interactive": 300.0, "batch": 900.0}

    def at(t, inter, batch, running_inter):
        return MetricsSample(
            t=t,
            in_flight=0,
            scraped=True,
            running={"interactive": running_inter, "batch": 5.0},
            lane_decode_tokens={"interactive": inter, "batch": batch},
        )

    # batch alone for the first interval, then interactive running: 80 of the 100 tokens are its;
    # then interactive with every request running (it lends the rest), then refused for pace once,
    # and for its predicted TTFT once before that
    samples = [at(0.0, 0, 0, 0.0), at(1.0, 0, 100, 0.0), at(2.0, 80, 120, 3.0), at(3.0, 90, 160, 1.0)]
    samples.append(at(4.0, 180, 170, 9.0))
    shares = lane_decode_shares(samples, {"interactive": [3.5], "batch": []}, {"interactive": [2.5, 3.5]})
    assert shares["interactive"] == {
        "decode_tokens": 180.0,
        "share": 0.5143,
        "share_with_demand": round(180 / 250, 4),  # the intervals with interactive running
        "share_with_unmet_demand": 0.9,  # only (3, 4]: a refusal for pace in it
        "share_while_refused": round(100 / 150, 4),  # (2, 3] and (3, 4]: refusals in them
    }
    assert shares["batch"]["share_with_demand"] == round(170 / 350, 4)  # batch runs throughout
    assert shares["batch"]["share_with_unmet_demand"] is None  # never waiting, never refused
    assert lane_decode_shares(samples)["interactive"]["share_with_unmet_demand"] is None  # no refusals given
    assert lane_decode_shares(samples[:1]) == {}  # one scrape: no interval
    # the measured window: the intervals inside it only
    windowed = lane_decode_shares(samples, {"interactive": [3.5]}, window=(2.0, 4.0))["interactive"]
    assert windowed["decode_tokens"] == 100.0 and windowed["share"] == round(100 / 150, 4)
    assert lane_decode_shares(samples, window=(5.0, 9.0)) == {}  # no interval inside it


def test_worker_utilisation_is_the_counters_difference_over_the_run() -> None:
    def at(t, steps, busy, cpu):
        return MetricsSample(
            t=t,
            in_flight=0,
            scraped=True,
            worker_steps={"decode/d": steps},
            worker_busy_s={"decode/d": busy},
            worker_busy_cpu_s={"decode/d": cpu},
        )

    u = worker_utilisation([MetricsSample(t=0.0, in_flight=0), at(1.0, 10, 1.0, 0.9), at(11.0, 110, 6.0, 4.9)])
    assert u == {
        "decode/d": {
            "steps": 100,
            "busy_s": 5.0,
            "busy_cpu_s": 4.0,
            "mean_step_ms": 50.0,
            "busy_share": 0.5,
            "cpu_share": 0.8,
        }
    }
    assert worker_utilisation([at(1.0, 10, 1.0, 0.9)]) == {}  # one scrape: no interval


# -- the command, its JSON and its plots -------------------------------------------------------
STATS_KEYS = {
    "requests",
    "completed",
    "rejected",
    "errors",
    "rejections",
    "duration_s",
    "elapsed_s",
    "offered_rate",
    "request_throughput",
    "output_token_throughput",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "client_lag_s",
    "slo",
    "slo_met",
    "slo_attainment",
    "goodput_rps",
}
DIST_KEYS = {"n", "mean", "p50", "p90", "p99", "max"}
RECORD_KEYS = {
    "index",
    "lane",
    "served_lane",
    "status",
    "reason",
    "arrival_s",
    "send_s",
    "prompt_len",
    "output_len",
    "output_tokens",
    "cached_tokens",
    "chunks",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "http_status",
    "grpc_code",
    "error_type",
    "error_code",
    "error_message",
}


def _check_stats(s: dict) -> None:
    assert set(s) == STATS_KEYS
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "client_lag_s"):
        assert set(s[key]) == DIST_KEYS


def test_cli_writes_a_versioned_report_and_plots(http_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run.json"
    rc = baton_main(
        [
            "bench",
            "serve",
            "--url",
            http_url,
            "--workload",
            "fixed",
            "--lanes",
            "interactive=3,batch=1",
            "--rate",
            "15",
            "--duration",
            "1.5",
            "--burst",
            "2:0.5:0.5",
            "--slo",
            "interactive:ttft=900",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "| interactive |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["schema"] == "baton.bench.serve/1"
    assert set(report) == {
        "schema",
        "created_unix",
        "config",
        "server",
        "wall_s",
        "clipped_prompts",
        "summary",
        "lanes",
        "timeseries",
        "workers",
        "lane_decode_shares",
        "requests",
        "search",
    }
    cfg = report["config"]
    assert (
        cfg["mode"] == "open" and cfg["rate"] == 15 and cfg["burst"] == {"factor": 2.0, "start_s": 0.5, "length_s": 0.5}
    )
    assert cfg["workload"]["lanes"] == {"interactive": 0.75, "batch": 0.25}
    assert cfg["slos"]["interactive"] == {"ttft_s": 0.9, "tpot_s": 0.25}
    _check_stats(report["summary"])
    for s in report["lanes"].values():
        _check_stats(s)
    assert report["requests"] and all(set(r) == RECORD_KEYS for r in report["requests"])
    assert {"t", "in_flight", "scraped", "waiting", "running", "kv_usage"} <= set(report["timeseries"][0])
    assert report["search"] is None
    pytest.importorskip("matplotlib")
    plots = tmp_path / "run_plots"
    assert {p.name for p in plots.iterdir()} == {"latency_cdf.png", "timeseries.png"}
    assert all(p.stat().st_size > 10_000 for p in plots.iterdir())


def test_cli_search_finds_a_rate_and_plots_latency_vs_rate(http_url: str, fake: FakeRouter, tmp_path: Path) -> None:
    # The fake serves any rate within the SLOs, so the search doubles up to its cap (the bisection
    # itself is tested against a scripted capacity in test_serve_stats.py).
    out = tmp_path / "search.json"
    rc = baton_main(
        [
            "bench",
            "serve",
            "--url",
            http_url,
            "--workload",
            "fixed",
            "--rate",
            "4",
            "--duration",
            "0.5",
            "--search",
            "--search-runs",
            "3",
            "--search-max-rate",
            "8",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    search = report["search"]
    assert [p["rate"] for p in search["points"]] == [4.0, 8.0]  # both pass; capped at the max rate
    assert search["goodput_rate"] == 8.0 and report["config"]["rate"] == 8.0
    for p in search["points"]:
        assert p["passed"] and p["attainment"] == 1.0
        _check_stats(p["summary"])
    pytest.importorskip("matplotlib")
    assert (tmp_path / "search_plots" / "latency_vs_rate.png").exists()


def test_plots_degrade_without_matplotlib(monkeypatch, tmp_path: Path) -> None:
    from baton.perf.loadgen.plots import PlotsUnavailable, write_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlotsUnavailable, match=r"pip install 'baton\[bench\]'"):
        write_plots({"requests": [{"status": "ok"}], "timeseries": [], "config": {}}, tmp_path)


def test_cli_argument_errors(http_url: str, capsys) -> None:
    assert baton_main(["bench", "serve", "--url", http_url, "--concurrency", "2", "--search"]) == 2
    assert "--search needs --rate" in capsys.readouterr().err
    assert baton_main(["bench", "serve", "--url", http_url, "--rate", "1", "--workload", "nope"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert baton_main(["bench", "serve", "--url", http_url, "--rate", "1", "--burst", "2:3"]) == 2
    assert "FACTOR:START:LEN" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        baton_main(["bench", "serve", "--url", http_url, "--rate", "1", "--concurrency", "2"])


def test_cli_checks_its_report_path_before_the_run(http_url: str, tmp_path: Path, capsys) -> None:
    """A --json that is a directory failed only after the whole load run."""
    import time

    t0 = time.monotonic()
    assert (
        baton_main(["bench", "serve", "--url", http_url, "--rate", "1", "--duration", "30", "--json", str(tmp_path)])
        == 2
    )
    assert "is a directory, not a file" in capsys.readouterr().err and time.monotonic() - t0 < 10
