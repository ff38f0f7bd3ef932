"""Lanes keep their priority on the decode worker: batch sequences preempted for the interactive
lane's pace resume by recompute, and each client sees every token once (the whole ``baton up``
stack in-process: Ray pools, the router's real polls carrying the lanes' pressure)."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import httpx
import pytest

from baton.config import load_config
from engine.lane_shares import LaneDemand
from tests.e2e.helpers import colocated
from tests.e2e.server_thread import ServerThread
from tests.waiting import wait_until

BATCH_PRIORITY, JOBS_PRIORITY = 2, 3


@pytest.fixture(scope="module")
def srv(ray_session, tiny_model_dir):
    cfg = load_config(
        overrides={
            "model.path": str(tiny_model_dir),
            "model.served_name": "tiny",
            "engine.max_num_seqs": 8,
            "engine.max_num_batched_tokens": 256,
            "engine.kv_cache_memory_gb": 0.25,
            "router.http_port": 0,
            "router.grpc_port": 0,
            "pools.max_restarts": 0,
            "lanes": [
                {"name": "interactive", "ttft_slo_s": 2.0, "tpot_slo_s": 0.25, "weight": 8, "priority": 0},
                {
                    "name": "batch",
                    "ttft_slo_s": 600,
                    "tpot_slo_s": 5,
                    "weight": 1,
                    "priority": BATCH_PRIORITY,
                    "preemptible": True,
                    "decode_floor": 0.05,
                },
                {
                    "name": "jobs",
                    "ttft_slo_s": 600,
                    "tpot_slo_s": 5,
                    "weight": 1,
                    "priority": JOBS_PRIORITY,
                    "preemptible": True,
                    "durable": True,
                    "decode_floor": 0.05,
                },
            ],
            "classification.long_context_tokens": 100000,
        }
    )
    s = ServerThread(cfg).start()
    yield s
    s.stop()


def _stream(url: str, prompt: list[int], max_tokens: int, started: concurrent.futures.Future[bool]) -> str:
    text = []
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "lane": "batch",
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text.append(chunk["choices"][0]["text"])
            if len(text) >= 4 and not started.done():
                started.set_result(True)
    return "".join(text)


def _pace_preemptions(srv, priority=BATCH_PRIORITY) -> int:
    loads = [w.load for w in srv.router.pool.live("decode") if w.load is not None]
    return sum((load.lane_counters.pace_preemptions.get(priority, 0) if load.lane_counters else 0) for load in loads)


def test_batch_preempted_for_interactive_pace_completes_with_the_unpreempted_tokens(srv, tiny_model_dir):
    prompts = [list(range(100 + 7 * i, 140 + 7 * i)) for i in range(4)]
    max_tokens = 200
    want = [srv.router.tokenizer.decode(t) for t in colocated(tiny_model_dir, prompts, [max_tokens] * 4)]
    dispatcher = srv.router.dispatcher
    real = dispatcher.lane_pressure
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        started: list[concurrent.futures.Future[bool]] = [concurrent.futures.Future() for _ in prompts]
        jobs = [pool.submit(_stream, srv.http, p, max_tokens, f) for p, f in zip(prompts, started)]
        concurrent.futures.wait(started, timeout=60)
        try:
            # The interactive lane is short of its pace (as the router reports when its streams are
            # slow or admission refuses it for pace): the worker preempts batch down to its floor.
            dispatcher.lane_pressure = lambda: (LaneDemand(0, waiting=1, pace_short=True),)
            wait_until(lambda: _pace_preemptions(srv) >= 1, timeout_s=30, message="a batch sequence preempted for pace")
        finally:
            dispatcher.lane_pressure = real  # the pace is back: the victims resume by recompute
        got = [j.result(timeout=120) for j in jobs]
    assert got == want  # every token once, the ones greedy decoding gives unpreempted
    assert srv.cluster.wait_until_drained(10.0)
    metrics = httpx.get(f"{srv.http}/metrics").text
    assert 'baton_lane_pace_preemptions_total{lane="batch"' in metrics


def test_durable_jobs_preempted_for_pace_survive_a_router_restart(srv, tiny_model_dir):
    """Durable-lane jobs preempted for pace stay durable: the router dies while they are preempted,
    a new one takes them over from the journal, and each result is the unpreempted greedy output."""
    prompts = [list(range(400 + 9 * i, 440 + 9 * i)) for i in range(4)]
    want = colocated(tiny_model_dir, prompts, [240] * 4)

    def submit(i):
        try:
            httpx.post(
                f"{srv.http}/v1/completions",
                headers={"X-Request-Id": f"paced-{i}"},
                json={
                    "model": "tiny",
                    "prompt": prompts[i],
                    "max_tokens": 240,
                    "ignore_eos": True,
                    "lane": "jobs",
                    "temperature": 0,
                },
                timeout=30,
            )
        except httpx.HTTPError:
            pass  # the router dies under it: that is the point

    journaled: set[int] = set()

    def all_journaled_and_running() -> bool:
        journaled.update(
            i for i in set(range(4)) - journaled if httpx.get(f"{srv.http}/v1/batches/paced-{i}").status_code == 200
        )
        return len(journaled) == 4 and srv.router.batch is not None and len(srv.router.batch._running) >= 2

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(submit, i) for i in range(4)]
        wait_until(all_journaled_and_running, timeout_s=30, message=lambda: f"journaled {sorted(journaled)} of 4")
        before = _pace_preemptions(srv, JOBS_PRIORITY)
        srv.router.dispatcher.lane_pressure = lambda: (LaneDemand(0, waiting=1, pace_short=True),)
        wait_until(
            lambda: _pace_preemptions(srv, JOBS_PRIORITY) > before,
            timeout_s=30,
            message="a durable job preempted for pace",
        )
        srv.call(srv.server.crash_router())  # (its pressure expires on the worker: the jobs regrow)
        concurrent.futures.wait(futures, timeout=30)
    srv.call(srv.server.restart_router("router-0", job_idle_ms=1500))
    results: dict[int, dict[str, Any]] = {}  # the finished jobs' JSON
    last: dict[int, tuple[int, Any]] = {}  # each job's last poll: status code, body

    def all_done() -> bool:
        for i in set(range(4)) - set(results):
            r = httpx.get(f"{srv.http}/v1/batches/paced-{i}")
            last[i] = (r.status_code, r.json())
            if r.status_code == 200 and r.json()["status"] == "done":
                results[i] = r.json()["result"]
        return len(results) == 4

    wait_until(
        all_done, timeout_s=120, interval_s=0.2, message=lambda: str({i: last[i] for i in last if i not in results})
    )
    for i in range(4):
        assert list(results[i]["token_ids"]) == want[i]
    assert srv.cluster.wait_until_drained(20.0)
