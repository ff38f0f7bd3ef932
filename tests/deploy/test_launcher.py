"""The chart's launcher (deploy/helm/baton/files/launcher.py) against a fake Ray Jobs client: it
attaches to a live Baton job or submits one, follows it, exits 1 when it ends, stops it on SIGTERM,
and `stop` (the head's preStop hook) stops and waits."""

from __future__ import annotations

import asyncio
import enum
import importlib.util
import os
import signal
from dataclasses import dataclass, field

import pytest

from tests.deploy.chart import CHART


def load_launcher(monkeypatch, **env):
    for k, v in {"BATON_RELEASE": "demo-baton", "RAY_JOB_STOP_WAIT_TIME_S": "2", **env}.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("baton_chart_launcher", CHART / "files" / "launcher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Status(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def is_terminal(self) -> bool:
        return self in (Status.STOPPED, Status.SUCCEEDED, Status.FAILED)


@dataclass
class Job:
    submission_id: str
    status: Status
    metadata: dict = field(default_factory=dict)
    message: str = ""


class FakeClient:
    def __init__(self, jobs=(), logs=("starting\n",), on_tail=None):
        self.jobs = {j.submission_id: j for j in jobs}
        self.submitted: list[dict] = []
        self.stopped: list[str] = []
        self.logs = list(logs)
        self.on_tail = on_tail

    def list_jobs(self):
        return list(self.jobs.values())

    def submit_job(self, **kw):
        self.submitted.append(kw)
        self.jobs[kw["submission_id"]] = Job(kw["submission_id"], Status.RUNNING, kw["metadata"])
        return kw["submission_id"]

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.jobs[sid].status = Status.STOPPED
        return True

    def get_job_status(self, sid):
        return self.jobs[sid].status

    def get_job_info(self, sid):
        return self.jobs[sid]

    async def tail_job_logs(self, sid):
        for chunk in self.logs:
            yield chunk
        if self.on_tail:
            await self.on_tail(self, sid)


def test_live_jobs_are_this_releases_unfinished_ones(monkeypatch):
    launcher = load_launcher(monkeypatch)
    mine = {"baton.release": "demo-baton"}
    client = FakeClient(
        [
            Job("a", Status.RUNNING, mine),
            Job("b", Status.FAILED, mine),
            Job("c", Status.RUNNING, {"baton.release": "other"}),
            Job("d", Status.PENDING, mine),
        ]
    )
    assert launcher.live_jobs(client) == ["a", "d"]


def test_run_submits_baton_cluster_and_resubmits_when_it_ends(monkeypatch, capsys):
    launcher = load_launcher(monkeypatch)
    pauses: list[float] = []
    monkeypatch.setattr(launcher.time, "sleep", pauses.append)

    async def end(client, sid):
        client.jobs[sid].status = Status.FAILED

    client = FakeClient(on_tail=end)
    monkeypatch.setattr(launcher, "connect", lambda wait=True: client)
    assert launcher.run(max_jobs=3) == 1
    assert len({s["submission_id"] for s in client.submitted}) == 3
    assert pauses == [10.0, 20.0, 40.0]  # quick failures back off
    out = capsys.readouterr()
    assert "starting" in out.out and "ended" in out.err


def test_submit_runs_baton_cluster_with_the_stop_wait(monkeypatch):
    launcher = load_launcher(monkeypatch)
    client = FakeClient()
    sid = launcher.submit(client)
    [sub] = client.submitted
    assert sub["submission_id"] == sid and sid.startswith("demo-baton-")
    assert sub["entrypoint"] == "python -m baton cluster --config /etc/baton/config.yaml"
    assert sub["metadata"] == {"baton.release": "demo-baton"}
    assert sub["runtime_env"] == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "2"}}


def test_run_follows_a_live_job_instead_of_submitting(monkeypatch):
    launcher = load_launcher(monkeypatch)
    monkeypatch.setattr(launcher.time, "sleep", lambda s: None)

    async def end(client, sid):
        client.jobs[sid].status = Status.SUCCEEDED

    client = FakeClient([Job("demo-baton-1", Status.RUNNING, {"baton.release": "demo-baton"})], on_tail=end)
    monkeypatch.setattr(launcher, "connect", lambda wait=True: client)
    assert launcher.run(max_jobs=1) == 1
    assert client.submitted == []


def test_sigterm_stops_the_job_and_exits_0(monkeypatch):
    launcher = load_launcher(monkeypatch)

    async def sigterm(client, sid):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's loop handles it
        await asyncio.sleep(30)  # a log tail that stays open: the launcher cancels it on the signal

    client = FakeClient(on_tail=sigterm)
    monkeypatch.setattr(launcher, "connect", lambda wait=True: client)
    assert launcher.run() == 0
    assert client.stopped == [client.submitted[0]["submission_id"]]


def test_stop_stops_live_jobs_and_waits(monkeypatch):
    launcher = load_launcher(monkeypatch)
    client = FakeClient(
        [
            Job("x", Status.RUNNING, {"baton.release": "demo-baton"}),
            Job("y", Status.RUNNING, {"baton.release": "other"}),
        ]
    )
    monkeypatch.setattr(launcher, "connect", lambda wait=True: client)
    assert launcher.stop() == 0
    assert client.stopped == ["x"]
    assert client.jobs["y"].status is Status.RUNNING


def test_stop_without_a_dashboard_does_nothing(monkeypatch):
    launcher = load_launcher(monkeypatch)
    monkeypatch.setattr(launcher, "connect", lambda wait=True: None)
    assert launcher.stop() == 0


@pytest.mark.parametrize("argv", [["launcher.py"], ["launcher.py", "go"]])
def test_usage(monkeypatch, argv):
    assert load_launcher(monkeypatch).main(argv) == 2
