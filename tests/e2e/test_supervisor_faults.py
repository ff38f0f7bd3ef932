"""``baton cluster``'s supervisor (baton/supervisor.py) under faults, in process over the session's
Ray (which offers Baton's custom resources): a dead replica and a dead worker in one round, a
replacement that loads slowly, and a drain with one replica dead. Each once stopped the cluster
or its routers (the audit's repros: the round raised, the replacement was never handed over, the
live replicas were killed mid-request)."""

from __future__ import annotations

import threading

import httpx
import pytest

from baton.config import load_config
from baton.supervisor import ClusterSupervisor
from tests.waiting import wait_until


@pytest.fixture
def supervisor(ray_session):
    made: list[ClusterSupervisor] = []

    def start(replicas: int = 1, **overrides) -> ClusterSupervisor:
        ov = {"model.path": "tiny", "pools.prefill.workers": 0, "pools.decode.workers": 1, "pools.max_restarts": 0,
              "router.replicas": replicas, "router.http_port": 0, "router.grpc_port": 0, "cluster.router_cpus": 0.5,
              "pools.decode.cpus": 0.5, "router.drain_timeout_s": 20, "redis.cluster_name": f"sup{len(made)}",
              **overrides}
        sup = ClusterSupervisor(load_config(None, ov), lambda m: None)
        made.append(sup)
        sup.start()
        return sup

    yield start
    for sup in made:
        sup.drain_and_stop()


def _complete(url: str, timeout: float = 30) -> int | None:
    try:
        return httpx.post(f"{url}/v1/completions", timeout=timeout,
                          json={"prompt": "hello", "max_tokens": 4, "temperature": 0}).status_code
    except httpx.HTTPError:
        return None


def _serve_after_rounds(sup: ClusterSupervisor, url: str, within_s: float) -> None:
    def served() -> bool:
        sup.supervise_once()  # never raises
        return _complete(url, timeout=10) == 200

    wait_until(served, timeout_s=within_s, interval_s=0.5,
               message=lambda: f"a completion from {url} (replacements pending: {sorted(sup._pending)})")


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
        with httpx.stream("POST", f"{sup.endpoints['router-0']}/v1/completions", timeout=120,
                          json={"prompt": "drain me", "max_tokens": 1500, "ignore_eos": True, "stream": True}) as r:
            lines.extend(line for line in r.iter_lines() if line)

    reader = threading.Thread(target=stream)
    reader.start()
    wait_until(lambda: len(lines) >= 3, timeout_s=60, interval_s=0.02, message="the stream's first lines")
    assert sup.drain_and_stop() == 0
    reader.join(120)
    assert any('"finish_reason":"length"' in line for line in lines), lines[-2:]
