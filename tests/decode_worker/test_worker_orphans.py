"""A decode worker's orphan check (``DecodeWorker._abort_orphans``) with a scripted engine: a router that
stops polling loses its requests, but a worker that was itself stopped (SIGSTOP, a paused VM) does not
count the routers' silence meanwhile against them (it dropped every request, silently, and the
router waited on them forever). Time is a fake clock: the check's thresholds are fractions of a
second, which a loaded host's scheduler would blur."""

import threading
import types

import pytest

import decode_worker.outbox as outbox_module
import decode_worker.worker as worker_module
from decode_worker.outbox import Outbox
from decode_worker.worker import DecodeWorker


class ScriptedEngine:
    def __init__(self):
        self.aborted = []

    def abort(self, request_id):
        self.aborted.append(request_id)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    fake_time = types.SimpleNamespace(monotonic=lambda: c.now)
    monkeypatch.setattr(worker_module, "time", fake_time)
    monkeypatch.setattr(outbox_module, "time", fake_time)
    return c


def _worker(timeout_s: float, clock: Clock) -> DecodeWorker:
    w = object.__new__(DecodeWorker)  # only the orphan check's state: no model, no transfer agent
    w.worker_id, w.orphan_timeout_s, w.num_orphans_aborted = "decode-0", timeout_s, 0
    w.outbox, w._lock, w._transfer_of = Outbox(), threading.Lock(), {}
    w._last_tick, w._next_orphan_check = clock.now, 0.0
    w._placed, w._placed_at = {}, {}
    return w


def _tick(w: DecodeWorker, engine: ScriptedEngine) -> None:
    w._next_orphan_check = 0.0  # (the real check runs at most once a second)
    w._abort_orphans(engine)


def test_a_worker_that_was_stopped_does_not_orphan_the_requests_of_live_routers(clock):
    w, engine = _worker(0.2, clock), ScriptedEngine()
    w.outbox.register("a", "router-0")
    clock.sleep(0.3)  # no tick for longer than the timeout: the worker was stopped
    _tick(w, engine)
    assert engine.aborted == [] and w.outbox.take_dropped("router-0") == []


def test_a_router_silent_while_the_worker_ticks_loses_its_requests_and_is_told_if_it_returns(clock):
    w, engine = _worker(0.2, clock), ScriptedEngine()
    w.outbox.register("a", "router-0")
    for _ in range(20):  # 0.4 s of ticks every 20 ms
        _tick(w, engine)
        clock.sleep(0.02)
    _tick(w, engine)
    assert engine.aborted == ["a"] and w.num_orphans_aborted == 1
    assert w.outbox.take_dropped("router-0") == ["a"]  # in its next OutputBatch: it places "a" again


def test_the_placed_counts_of_routers_long_gone_are_dropped(clock):
    """Each router start is a new origin; their placed-token counts piled up in every load report
    (41 after 40 restarts). A router gone past the orphan timeout keeps its count for 10 minutes."""
    w, engine = _worker(0.1, clock), ScriptedEngine()
    for origin in ("old", "live"):
        w.outbox.register(f"r-{origin}", origin)
        w._placed[origin], w._placed_at[origin] = 100, clock.now
    w.outbox.forget("r-old")
    for _ in range(8):  # ticking (a worker that did not tick was away, and forgives every silence)
        clock.sleep(0.03)
        w.outbox.poll("live", 0.0)
        _tick(w, engine)
    assert w.outbox.known_origins() == {"live"}  # "old" is gone now, but only just
    assert set(w._placed) == {"old", "live"}
    w._placed_at["old"] -= 601
    w._placed_at["live"] -= 601  # placed nothing for long, but still polling
    _tick(w, engine)
    assert set(w._placed) == {"live"}
