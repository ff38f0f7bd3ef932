"""The router pod's preStop drain trigger (baton/drain_socket.py): the replica's Unix socket and the
hook's client, over a real socket, and the replica's drain on a pod stop (drain + gRPC GOAWAY)."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from baton.config import BatonConfig
from baton.drain_socket import DrainSocket, main, request_drain
from baton.router_replica import RouterReplica


def test_no_replica_means_nothing_to_drain(tmp_path):
    path = str(tmp_path / "drain.sock")
    assert "nothing to drain" in request_drain(path, 1.0)
    (tmp_path / "drain.sock").touch()  # a stale file where nobody listens
    assert "nothing to drain" in request_drain(path, 1.0)
    assert main(["--socket", path, "--timeout", "1"]) == 0  # a hook never fails the pod's stop


def test_the_hook_returns_once_the_replica_has_drained(tmp_path):
    path = str(tmp_path / "sub" / "drain.sock")

    async def scenario():
        release = asyncio.Event()
        calls = []

        async def drain() -> int:
            calls.append(1)
            await release.wait()
            return 2

        sock = DrainSocket(path, drain)
        await sock.start()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # only the pod's own user
        first = asyncio.create_task(asyncio.to_thread(request_drain, path, 10.0))
        second = asyncio.create_task(asyncio.to_thread(request_drain, path, 10.0))
        done, _ = await asyncio.wait({first, second}, timeout=0.3)
        assert not done  # the hooks wait for the drain
        release.set()
        answers = await asyncio.gather(first, second)
        await sock.stop()
        return calls, answers

    calls, answers = asyncio.run(scenario())
    assert calls == [1]  # one drain, however many hooks ask
    assert answers == ["drained, 2 aborted", "drained, 2 aborted"]
    assert not os.path.exists(path)


def test_a_drain_longer_than_the_hooks_timeout_is_reported(tmp_path):
    path = str(tmp_path / "drain.sock")

    async def scenario():
        async def drain() -> int:
            await asyncio.sleep(30)
            return 0

        sock = DrainSocket(path, drain)
        await sock.start()
        answer = await asyncio.to_thread(request_drain, path, 0.2)
        await sock.stop()
        return answer

    assert "did not finish draining within" in asyncio.run(scenario())


def test_a_new_replica_replaces_a_dead_ones_socket(tmp_path):
    path = str(tmp_path / "drain.sock")

    async def scenario():
        (tmp_path / "drain.sock").write_text("left by a replica that died")

        async def drain() -> int:
            return 0

        sock = DrainSocket(path, drain)
        await sock.start()
        answer = await asyncio.to_thread(request_drain, path, 5.0)
        await sock.stop()
        return answer

    assert asyncio.run(scenario()) == "drained, 0 aborted"


class _FakeGrpc:
    def __init__(self, log):
        self.log = log

    async def stop(self, grace=5.0):
        self.log.append(("goaway", grace))


class _FakeFrontend:
    def __init__(self, log):
        self.log = log
        self.grpc = _FakeGrpc(log)

    async def drain(self) -> int:
        self.log.append(("drain",))
        await asyncio.sleep(0)
        return 3


@pytest.mark.parametrize("drain_timeout_s", [7.5, 30.0])
def test_a_pod_stop_drains_and_sends_grpc_goaway(drain_timeout_s):
    """gRPC clients get GOAWAY at once (they reconnect elsewhere), in-flight RPCs get the drain
    timeout, and the HTTP side drains (503 + Retry-After, /ready 503) at the same time."""
    replica = RouterReplica.__new__(RouterReplica)  # no Ray: only the drain path
    replica.cfg = BatonConfig.model_validate({"router": {"drain_timeout_s": drain_timeout_s}})
    log: list[tuple[object, ...]] = []
    replica.frontend = _FakeFrontend(log)
    assert asyncio.run(replica.drain_for_pod_stop()) == 3
    assert sorted(log) == [("drain",), ("goaway", drain_timeout_s)]
    replica.frontend = None
    assert asyncio.run(replica.drain_for_pod_stop()) == 0
