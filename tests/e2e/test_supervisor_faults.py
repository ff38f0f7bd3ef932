"""``baton cluster``'s supervisor (baton/supervisor.py) under faults, in process over the session's
Ray (which offers Baton's custom resources): a dead replica and a dead worker in one round, a
replacement that loads slowly, and a drain with one replica dead. Each once stopped the cluster
or its routers (the audit's repros: the round raised, the replacement was never handed over, the
live replicas were killed mid-request). Then: a stop signal in the middle of a round held up by two
frozen workers (the round waited 30 s per unanswered probe, past Ray's stop wait), an actor that no
node can take named in the job log, a replica restarted while a worker cannot answer, and a rank of a
tensor-parallel decode group killed mid-stream (the group replaced in a placement group of its own)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import pytest
import ray
from ray.util import placement_group_table

from baton.config import load_config
from baton.router_replica import RouterReplica, WorkerRef
from baton.supervisor import ClusterSupervisor, run_cluster
from decode_worker.worker import DecodeWorker
from router.grpc_gen.baton.v1 import generate_pb2 as pb
from router.grpc_gen.baton.v1 import generate_pb2_grpc as pbg
from tests.e2e.helpers import colocated, prompts
from tests.waiting import wait_until

# What deploy/ray's examples and the chart give ``ray job stop`` by default (Ray's own is 3 s).
RAY_JOB_STOP_WAIT_TIME_S = 60


@pytest.fixture
def supervisor(ray_session):
    made: list[ClusterSupervisor] = []

    def start(replicas: int = 1, progress=lambda m: None, begin: bool = True, **overrides) -> ClusterSupervisor:
        sup = ClusterSupervisor(load_config(None, _overrides(replicas, f"sup{len(made)}", **overrides)), progress)
        made.append(sup)
        if begin:
            sup.start()
        return sup

    yield start
    for sup in made:
        sup.drain_and_stop()


def _overrides(replicas: int, cluster_name: str, **overrides) -> dict:
    return {
        "model.path": "tiny",
        "pools.prefill.workers": 0,
        "pools.decode.workers": 1,
        "pools.max_restarts": 0,
        "router.replicas": replicas,
        "router.http_port": 0,
        "router.grpc_port": 0,
        "cluster.router_cpus": 0.5,
        "pools.decode.cpus": 0.5,
        "router.drain_timeout_s": 20,
        "redis.cluster_name": cluster_name,
        **overrides,
    }


def _complete(url: str, timeout: float = 30) -> int | None:
    try:
        return httpx.post(
            f"{url}/v1/completions", timeout=timeout, json={"prompt": "hello", "max_tokens": 4, "temperature": 0}
        ).status_code
    except httpx.HTTPError:
        return None


def _serve_after_rounds(sup: ClusterSupervisor, url: str, within_s: float) -> None:
    def served() -> bool:
        sup.supervise_once()  # never raises
        return _complete(url, timeout=10) == 200

    wait_until(
        served,
        timeout_s=within_s,
        interval_s=0.5,
        message=lambda: f"a completion from {url} (replacements pending: {sorted(sup._pending)})",
    )


def _wait_dead(ray, actor) -> None:
    """Until Ray reports a killed actor dead: ``ray.kill`` returns before the actor is gone, and a
    round that still found it alive would not replace it."""

    def dead() -> bool:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError as e:
            return type(e).__name__ != "ActorUnavailableError"  # that one is a restart, not a death
        except ray.exceptions.GetTimeoutError:
            pass
        return False

    wait_until(dead, timeout_s=60, interval_s=0.1, message="the killed actor to be reported dead")


def test_a_dead_replica_and_a_dead_worker_in_one_round(ray_session, supervisor):
    ray = ray_session
    sup = supervisor(replicas=2)
    ray.kill(sup.replicas[1])  # router-1 gone for good
    ray.kill(sup.fleet.pool.decode[0].actor, no_restart=True)  # and decode-0
    _wait_dead(ray, sup.replicas[1])
    _wait_dead(ray, sup.fleet.pool.decode[0].actor)
    _serve_after_rounds(sup, sup.endpoints["router-0"], 120)  # router-0 got the new decode-0


def test_a_slow_replacement_is_handed_to_the_routers_once_it_loads(ray_session, supervisor):
    ray = ray_session
    sup = supervisor()
    ray.kill(sup.fleet.pool.decode[0].actor, no_restart=True)
    _wait_dead(ray, sup.fleet.pool.decode[0].actor)
    sup.supervise_once()  # starts the replacement; the round does not wait for it to load
    assert "decode-0" in sup._pending
    # 240 s: the replacement's start (a Ray worker process, the model load) shares 2 cores with
    # whatever else runs; the bound is a hang detector, not what the test is about
    _serve_after_rounds(sup, sup.endpoints["router-0"], 240)
    assert not sup._pending


def test_a_dead_replica_does_not_cut_the_others_drain_short(ray_session, supervisor):
    ray = ray_session
    # A drain long enough for the 1,500 tokens on a loaded host (20 s was not, at a third of the speed)
    sup = supervisor(replicas=2, **{"router.drain_timeout_s": 90})
    ray.kill(sup.replicas[1])
    lines: list[str] = []

    def stream() -> None:
        with httpx.stream(
            "POST",
            f"{sup.endpoints['router-0']}/v1/completions",
            timeout=120,
            json={"prompt": "drain me", "max_tokens": 1500, "ignore_eos": True, "stream": True},
        ) as r:
            lines.extend(line for line in r.iter_lines() if line)

    reader = threading.Thread(target=stream)
    reader.start()
    wait_until(lambda: len(lines) >= 3, timeout_s=60, interval_s=0.02, message="the stream's first lines")
    assert sup.drain_and_stop() == 0
    reader.join(120)
    assert any('"finish_reason":"length"' in line for line in lines), lines[-2:]


def _actor_pid(name: str) -> int:
    """The process of a named actor (asked of it: Ray's actor listing needs the dashboard)."""
    actor: Any = ray.get_actor(name)
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=30)


def test_a_stop_in_the_middle_of_a_round_with_two_frozen_workers_drains_within_rays_stop_wait(ray_session, monkeypatch):
    """``run_cluster`` as ``ray job submit`` runs it, its SIGTERM sent by the test: both decode
    workers frozen (SIGSTOP: their pings never answer), a round waiting on them, then the stop."""
    rounds: list[tuple[float, float]] = []  # (start, end) of each round
    in_round = threading.Event()
    original = ClusterSupervisor.supervise_once

    def timed_round(self: ClusterSupervisor) -> None:
        start = time.monotonic()
        in_round.set()
        try:
            original(self)
        finally:
            rounds.append((start, time.monotonic()))

    monkeypatch.setattr(ClusterSupervisor, "supervise_once", timed_round)
    cfg = load_config(
        None,
        _overrides(
            1,
            "supstop",
            **{"pools.decode.workers": 2, "cluster.supervise_interval_s": 0.2, "cluster.round_timeout_s": 300},
        ),
    )  # longer than any stop wait: only the stop may end this round
    said: list[str] = []
    frozen: list[int] = []
    signalled: list[float] = []

    def freeze_then_stop() -> None:
        wait_until(
            lambda: any(m.startswith("ready:") for m in said),
            timeout_s=300,
            interval_s=0.1,
            message="the cluster to be ready",
        )
        frozen.extend(_actor_pid(f"supstop-decode-{i}") for i in range(2))
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        in_round.clear()
        in_round.wait(30)  # a round that started with both workers frozen: it waits on their pings
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    helper = threading.Thread(target=freeze_then_stop, daemon=True)
    helper.start()
    try:
        assert run_cluster(cfg, said.append) == 0
        stopped = time.monotonic()
    finally:
        for pid in frozen:  # (killed with their actors; a survivor must not stay frozen)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    helper.join(5)
    assert signalled, said
    last_start, last_end = rounds[-1]
    assert last_start < signalled[0] and last_end - signalled[0] < 2.0, (rounds, signalled)
    assert stopped - signalled[0] < RAY_JOB_STOP_WAIT_TIME_S, said
    assert said[-1] == "stopped"


def test_an_actor_no_node_can_take_is_named_with_what_it_lacks(ray_session, supervisor):
    """The session's Ray offers no ``baton_router_absent``: router-0 waits for a node, and the job
    log says so (and what it needs) once ``pending_report_s`` has passed, as does the supervisor's
    Redis record; ``start_timeout_s`` then ends the start. Both are short here so the test is quick
    (the report is due well before the timeout); decode-0, placed but maybe still loading its model
    when the report is due, is never named."""
    said: list[str] = []
    sup = supervisor(
        progress=said.append,
        begin=False,
        **{
            "cluster.router_resource": "baton_router_absent",
            "cluster.pending_report_s": 4,
            "cluster.start_timeout_s": 15,
        },
    )
    failed: list[BaseException] = []

    def start() -> None:
        try:
            sup.start()
        except RuntimeError as e:  # the replica never starts: start_timeout_s ends it
            failed.append(e)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    wait_until(
        lambda: any("router-0" in m and "still waiting for a node" in m for m in said),
        timeout_s=15,
        interval_s=0.2,
        message=lambda: f"router-0 named in the job log (said: {said})",
    )
    [line] = [m for m in said if "still waiting for a node" in m]
    assert "needs {CPU: 0.5, baton_router_absent: 1}" in line and "no node offers baton_router_absent: 1" in line
    assert not any("decode-0" in m and "waiting for a node" in m for m in said)  # it was placed

    async def record() -> dict:
        await sup.heartbeat()
        return (await sup._registry.live_workers("supervisor"))["supervisor"].payload

    payload = asyncio.run(record())
    assert "baton_router_absent" in payload["unplaced"]["router-0"]
    starting.join(60)
    assert failed and "did not start" in str(failed[0])


def test_a_restarted_replica_serves_with_the_workers_that_answer(ray_session, supervisor):
    """A worker that cannot answer ``info()`` (one Ray never places, as after its node went away)
    no longer holds a (re)starting replica forever: it serves with the others after the timeout."""
    ray = ray_session
    sup = supervisor()
    never_placed = (
        ray.remote(DecodeWorker).options(num_cpus=0, resources={"baton_absent": 1}).remote("decode-9", None, None)
    )
    cc = sup.cfg.cluster
    replica = (
        ray.remote(RouterReplica)
        .options(num_cpus=cc.router_cpus, resources={cc.router_resource: 1.0}, max_concurrency=32)
        .remote("router-9", sup.cfg, sup.redis_url, info_timeout_s=3.0)
    )
    try:
        t0 = time.monotonic()
        endpoints = ray.get(
            replica.start.remote([*sup.worker_refs(), WorkerRef("decode-9", "decode", never_placed)]), timeout=120
        )
        assert time.monotonic() - t0 < 60
        assert _complete(endpoints.http_url) == 200
    finally:
        ray.get(replica.stop.remote(), timeout=60)
        ray.kill(replica)
        ray.kill(never_placed)


def _stream(target: str, prompt: list[int], n: int, got: list[int]) -> None:
    """A greedy gRPC stream of ``n`` tokens; its token ids land in ``got`` as they come."""
    req = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=prompt), sampling=pb.SamplingParameters(max_tokens=n, temperature=0, ignore_eos=True)
    )
    with grpc.insecure_channel(target) as ch:
        for m in pbg.GenerationStub(ch).Generate(req, timeout=120):
            got.extend(m.token_ids)


def _created_groups() -> set[str]:
    return {g for g, t in placement_group_table().items() if t["state"] == "CREATED"}


def _ranks(worker) -> tuple[list, list[int]]:
    """A tensor-parallel worker's rank actors (ranks 1..N-1) and their processes (baton/ray_ranks.py)."""
    return ray.get(worker.__ray_call__.remote(lambda w: (w.engine.ranks.actors, w.engine.ranks.pids)), timeout=30)


def _group(worker) -> str:
    """The placement group a worker runs in."""
    return ray.get(worker.__ray_call__.remote(lambda _: ray.get_runtime_context().get_placement_group_id()), timeout=30)


def test_a_killed_rank_of_a_tp_decode_group_is_replaced_under_the_same_id(ray_session, supervisor, tiny_model_dir):
    """Decode TP 2 beside a prefill pool of TP 1: decode-0's rank 1 is SIGKILLed mid-stream. Its
    worker exits with it (baton/ray_ranks.py), the supervisor replaces it under the same id in a new
    placement group (the old one removed, its rank with it), and the stream resumes there with
    every token once; a later request runs on the new group, the prefill worker is undisturbed, and
    no block stays held."""
    sup = supervisor(
        **{
            "model.path": str(tiny_model_dir),  # the reference's own weights
            "pools.prefill.workers": 1,
            "pools.prefill.cpus": 0.5,
            "pools.decode.tensor_parallel_size": 2,
            "engine.kv_cache_memory_gb": 0.05,  # (a quick start: the default is 2 GiB a worker)
        }
    )
    target = ray.get(sup.replicas[0].status.remote(), timeout=30).endpoints.grpc_target
    decode, prefill = sup.fleet.pool.get("decode-0"), sup.fleet.pool.get("prefill-0")
    old_worker, prefill_incarnation = decode.actor, ray.get(prefill.actor.ping.remote(), timeout=30)
    groups_before, old_group = _created_groups(), _group(decode.actor)
    [old_rank], [old_pid] = _ranks(decode.actor)
    first, later = prompts(31, 2, 4096, lo=30, hi=40)
    n = 160
    want = colocated(tiny_model_dir, [first, later], [n, 8])
    got: list[int] = []
    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(_stream, target, first, n, got)
        wait_until(lambda: got or streaming.done(), timeout_s=60, interval_s=0.01, message="the stream's first token")
        os.kill(old_pid, signal.SIGKILL)
        seen = len(got)

        def resumed() -> bool:
            sup.supervise_once()  # (never raises)
            return streaming.done()

        wait_until(
            resumed, timeout_s=120, interval_s=0.2, message=lambda: f"the stream resumed (pending {sup._pending})"
        )
        streaming.result()
    assert got == want[0] and seen < n  # every token once, although the stream was cut
    assert ray.get(sup.replicas[0].__ray_call__.remote(lambda r: r.dispatcher.num_migrations), timeout=30) >= 1
    # The same worker id, a new actor in a new placement group; the old group and its ranks are gone.
    assert [w.worker_id for w in sup.fleet.pool.decode] == ["decode-0"] and decode.actor is not old_worker
    assert not sup._pending and sup.fleet.replacements == 1
    new_group = _group(decode.actor)
    assert placement_group_table()[old_group]["state"] == "REMOVED"
    assert _created_groups() == groups_before - {old_group} | {new_group}
    _wait_dead(ray, old_worker)
    _wait_dead(ray, old_rank)
    [_], [new_pid] = _ranks(decode.actor)  # (in new_group: a rank is placed in its worker's group)
    assert new_pid != old_pid
    later_got: list[int] = []
    _stream(target, later, 8, later_got)  # on the new group: decode-0 is the only decode worker
    assert later_got == want[1]
    assert ray.get(prefill.actor.ping.remote(), timeout=30) == prefill_incarnation  # the other group undisturbed

    def drained() -> bool:
        loads = ray.get([w.actor.load.remote() for w in sup.fleet.pool.all()], timeout=30)
        return all(
            load.num_free_blocks == load.num_total_blocks
            and not (load.num_running or load.num_waiting or load.num_reserved or load.num_transferring)
            for load in loads
        )

    wait_until(drained, timeout_s=30, interval_s=0.2, message="no block held on any worker")
