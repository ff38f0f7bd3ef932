"""The dispatcher's failure handling (a part the ``Dispatcher`` holds): the monitor that pings the
workers, a worker marked dead or seen with a new incarnation, the death announced to the other
pool (``forget_peer``), and the migration of a dead decode worker's requests, each resumed after
exactly the tokens its caller has received."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray import ObjectRef
from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

from engine.kv_events import KVCacheEvent
from kv_transfer.peer import PeerInfo
from router.request_ids import shown_request_id
from router.tracked_request import TrackedRequest
from router.worker_pool import WorkerHandle, WorkerPool

log = logging.getLogger("router.dispatcher")


class WorkerFailures:
    """Shares the dispatcher's table of tracked requests (``tracked``, guarded by ``lock``); places a
    migrated request through ``place`` (on a thread of its own) and gives one up through ``fail``."""

    def __init__(
        self,
        pool: WorkerPool,
        tracked: dict[str, TrackedRequest],
        lock: threading.RLock,
        stop: threading.Event,
        *,
        call: Callable[[ObjectRef[Any]], Any],
        place: Callable[[TrackedRequest, set[str]], None],
        fail: Callable[[TrackedRequest, str], None],
        on_worker_reset: Callable[[str], None],
        on_kv_events: Callable[[str, list[KVCacheEvent]], None],
        monitor_interval_s: float,
        call_timeout_s: float,
        max_migrations: int,
    ) -> None:
        self.pool = pool
        self._tracked = tracked
        self._lock = lock
        self._stop = stop
        self._call = call
        self._place = place
        self._fail = fail
        self.on_worker_reset = on_worker_reset  # its cache is gone
        self.on_kv_events = on_kv_events
        self.monitor_interval_s = monitor_interval_s
        self.call_timeout_s = call_timeout_s
        self.max_migrations = max_migrations
        self._announced_gone: set[str] = set()  # peer keys (worker@incarnation) already announced dead
        self.num_migrations = 0

    def monitor_loop(self) -> None:
        """Ping every worker a poller does not watch, and take the prefill workers' loads and cache events."""
        first = True
        while first or not self._stop.wait(self.monitor_interval_s):
            first = False
            for w in self.pool.all():
                if w.role == "decode" and w.alive:
                    continue  # its poller watches it
                try:
                    incarnation = ray.get(w.actor.ping.remote(), timeout=self.call_timeout_s)
                except (RayError, GetTimeoutError) as e:
                    self.mark_dead(w, e)
                    continue
                if w.info is None or incarnation != w.info.peer.incarnation or not w.alive:
                    self.on_restart(w)
                if w.role == "prefill":
                    try:
                        load, events = ray.get(
                            [w.actor.load.remote(), w.actor.take_kv_events.remote()], timeout=self.call_timeout_s
                        )
                    except (RayError, GetTimeoutError) as e:
                        self.mark_dead(w, e)
                        continue
                    w.update_load(load)
                    if events:
                        self.on_kv_events(w.worker_id, events)

    def mark_dead(self, w: WorkerHandle, error: BaseException) -> None:
        with self.pool.lock:
            was_alive, w.alive = w.alive, False
            w.failures += 1
        if was_alive:
            log.warning("worker %s is down: %s", w.worker_id, type(error).__name__)
            self.on_worker_reset(w.worker_id)
        if w.info is not None and _died_for_good(w, error):
            self._announce_gone(w, w.info.peer)
        if w.role == "decode":
            self._migrate_from(w)

    def on_restart(self, w: WorkerHandle) -> None:
        """A worker answered with a new incarnation (restarted by Ray) or came back: it lost its state."""
        try:
            info = self._call(w.actor.info.remote())
        except (RayError, GetTimeoutError) as e:
            self.mark_dead(w, e)
            return
        old = w.info
        restarted = old is not None and info.peer.incarnation != old.peer.incarnation
        if old is not None and restarted:
            self._announce_gone(w, old.peer)
        w.info = info
        if restarted:
            with self.pool.lock:  # what we sent the old incarnation, and what it said it had, are gone
                w.forget_dispatched()
                if w.role == "prefill":
                    w.load = None  # its received counts start again from zero
            self.on_worker_reset(w.worker_id)
        if restarted and w.role == "decode":
            self._migrate_from(w)
        with self.pool.lock:
            w.alive = True
        log.info("worker %s is up (incarnation %s)", w.worker_id, info.peer.incarnation)

    def _announce_gone(self, w: WorkerHandle, dead: PeerInfo) -> None:
        """Tell the other pool that this incarnation of ``w`` is dead. A transfer agent cannot tell
        a peer that died before their pair formed from one that has not dialed yet: it would wait for
        it and keep what was queued for it (kv_transfer/agent.py, forget_peer)."""
        with self._lock:
            if dead.key in self._announced_gone:  # (the poller marks a dead worker dead every interval)
                return
            self._announced_gone.add(dead.key)
        # Alive or not: one only slow now (a timeout) is alive and must hear it too. Fire and
        # forget: idempotent, and a dead one ignores it.
        for peer in self.pool.prefill if w.role == "decode" else self.pool.decode:
            if peer.info is not None:
                peer.actor.forget_peer.remote(dead)

    def _migrate_from(self, d: WorkerHandle) -> None:
        moving = self._detach(d)
        d.requests.clear()
        self._migrate(moving, d, {d.worker_id})

    def take_back(self, d: WorkerHandle, request_ids: list[str]) -> None:
        """Requests a live ``d`` dropped as orphans (our poller had stalled past its orphan timeout):
        no output is coming for them, so they are placed anew, resuming after what was delivered."""
        moving = self._detach(d, request_ids)
        if moving:
            log.warning("%s dropped %d of our requests as orphans; placing them again", d.worker_id, len(moving))
        self._migrate(moving, d, set())

    def _detach(self, d: WorkerHandle, request_ids: list[str] | None = None) -> list[TrackedRequest]:
        """The requests ``d`` serves (all, or those of ``request_ids``), no longer ``d``'s: outputs still in
        flight from it are stale. One being placed there belongs to its place call, which fails or
        finds ``d`` dead."""
        with self._lock:
            candidates = self._tracked.values() if request_ids is None else map(self._tracked.get, request_ids)
            moving = [t for t in candidates if t is not None and t.decode_id == d.worker_id and not t.placing]
            for t in moving:
                t.decode_id = None
                t.stale_copies.add(d.worker_id)  # (stopped there first if it is ever placed there again)
                d.requests.discard(t.spec.request_id)
        return moving

    def _migrate(self, moving: list[TrackedRequest], d: WorkerHandle, exclude: set[str]) -> None:
        for t in moving:
            p = self.pool.get(t.prefill_id) if t.prefill_id else None
            if p is not None:  # a prefill still running there ships to d's old reservation: stop it
                p.actor.abort.remote(t.spec.request_id)  # (fire and forget; a finished one ignores it)
                t.prefill_id = None
            if t.migrations >= self.max_migrations:
                rid = shown_request_id(t.spec.request_id)  # (the client reads this)
                self._fail(t, f"request {rid} lost its decode worker {self.max_migrations + 1} times")
                continue
            t.migrations += 1
            self.num_migrations += 1
            # Resume after exactly what the caller has received: no gap, no duplicate.
            t.spec = replace(t.spec, resume_token_ids=tuple(t.stream.token_ids), resume_text_chars=len(t.stream.text))
            log.info("migrating %s from %s after %d tokens", t.spec.request_id, d.worker_id, len(t.stream.token_ids))
            threading.Thread(target=self._place, args=(t, exclude), daemon=True).start()


def _died_for_good(w: WorkerHandle, error: BaseException) -> bool:
    """``error`` says that ``w``'s current actor is dead and will not be restarted. A timeout may be
    a slow worker; an ``ActorDiedError`` from a call to an actor since replaced is stale (its
    successor's incarnation may be recorded already, and announcing that one would cut a live
    worker off from its pairs for good)."""
    if not isinstance(error, ActorDiedError) or not error.actor_id:
        return False
    actor_id = getattr(w.actor, "_actor_id", None)
    return actor_id is not None and actor_id.hex() == error.actor_id
