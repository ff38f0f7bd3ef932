"""Dispatch to the pools: place each request on a decode worker (and, when disaggregated, a
prefill worker), collect outputs from every decode worker in per-step batches (one long-poll
thread per worker), and recover from failures.

Request flow (disaggregated)::

    pick D ──D.reserve(spec, P)──► D allocates blocks for what it does not cache
           ──P.prefill(task)────► P computes chunks, ships KV after each ──► D decodes, streams back
Conditional disaggregation (``router.placement.prefill_on_decode``): D prefills a request itself
when it is migrated (resumed there), asks for prompt logprobs, has at least half its prompt cached
on D, or no prefill worker is live; a prompt shorter than ``local_prefill_threshold`` too, unless
a prefill worker has room for it now (``short_prompts_to_idle_prefill``, on by default).

Failures: a decode worker that dies (or restarts, losing its state) has its requests *migrated*:
each is resubmitted to another decode worker with the tokens the caller has already received as
``resume_token_ids`` (recomputed there, not re-sent), so the stream has no gap and no duplicate.
A prefill worker that dies is noticed by the decode side (its pair channel drops, or the transfer
deadline passes), which then prefills locally. The failure handling is a part of its own
(router/worker_failures.py), sharing the table of tracked requests.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray import ObjectRef
from ray.exceptions import GetTimeoutError, RayError, RayTaskError, UnserializableException

from decode_worker.messages import OutputBatch, ReserveResult
from engine.kv_events import KVCacheEvent
from engine.lane_shares import LaneDemand
from engine.outputs import RequestOutput
from engine.request import FinishReason
from engine.request_spec import RequestSpec
from prefill_worker.messages import PrefillTask
from router.placement import (
    NO_HINT,
    PlacementHint,
    choose_decode,
    choose_prefill,
    prefill_on_decode,
    short_prompt_still_fits,
)
from router.stream import RequestStream
from router.tracked_request import TrackedRequest
from router.worker_failures import WorkerFailures
from router.worker_pool import WorkerHandle, WorkerPool

log = logging.getLogger(__name__)


# The worker is up and raised: a refusal of this request, not a dead worker (an exception Ray
# cannot pickle arrives as UnserializableException; taking that for a death cost a worker's requests).
_REFUSED = (RayTaskError, UnserializableException)


class Dispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        *,
        router_id: str = "",
        origin: str | None = None,
        on_kv_events: Callable[[str, list[KVCacheEvent]], None] | None = None,
        local_prefill_threshold: int = 0,
        short_prompts_to_idle_prefill: bool = True,
        poll_timeout_s: float = 0.5,
        call_timeout_s: float = 60.0,
        max_migrations: int = 3,
        monitor_interval_s: float = 0.5,
        placement_wait_s: float = 30.0,
    ) -> None:
        self.pool = pool
        self.router_id = router_id
        # What workers file this dispatcher's requests (and their outputs and counts) under: the
        # replica's id plus this start's own tag. A replica restarted under the same id is then a
        # new reader, not the old one: the old start's copies are orphans (or taken over by an id
        # sent again), never "duplicate request id" refusals of the new start's requests.
        self.origin = origin if origin is not None else f"{router_id}~{uuid.uuid4().hex[:8]}"
        self.on_kv_events = on_kv_events or (lambda worker_id, events: None)
        self.on_worker_reset: Callable[[str], None] = lambda worker_id: None  # its cache is gone
        self.local_prefill_threshold = local_prefill_threshold
        self.short_prompts_to_idle_prefill = short_prompts_to_idle_prefill
        self.poll_timeout_s = poll_timeout_s
        # The lanes' demand, sent to the decode workers with each poll (router/lane_pressure.py; None: not sent).
        self.lane_pressure: Callable[[], tuple[LaneDemand, ...]] | None = None
        self.call_timeout_s = call_timeout_s
        self.max_migrations = max_migrations
        self.monitor_interval_s = monitor_interval_s
        self.placement_wait_s = placement_wait_s  # how long a request waits for a decode worker to be back
        self._tracked: dict[str, TrackedRequest] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # (the callables read this dispatcher's callbacks and methods when called: a router sets the
        # callbacks after construction, and a test double may override _call)
        self.failures = WorkerFailures(
            pool,
            self._tracked,
            self._lock,
            self._stop,
            call=lambda ref: self._call(ref),
            place=self._place,
            fail=self._fail,
            on_worker_reset=lambda worker_id: self.on_worker_reset(worker_id),
            on_kv_events=lambda worker_id, events: self.on_kv_events(worker_id, events),
            monitor_interval_s=monitor_interval_s,
            call_timeout_s=call_timeout_s,
            max_migrations=max_migrations,
        )
        self.num_local_prefills = 0
        self.num_disaggregated = 0
        self.num_stale_outputs = 0  # outputs of a copy given up on, dropped (_deliver)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        for w in self.pool.decode:
            self._spawn(self._poll_loop, w, f"poll-{w.worker_id}")
        self._spawn(self.failures.monitor_loop, None, "pool-monitor")

    def _spawn(self, target: Callable[..., None], arg: WorkerHandle | None, name: str) -> None:
        t = threading.Thread(target=target, args=(arg,) if arg is not None else (), name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.poll_timeout_s + 2)
        with self._lock:
            for tracked in self._tracked.values():
                tracked.stream.fail("the cluster is shutting down")
            self._tracked.clear()

    def placement(self, request_id: str) -> tuple[str | None, str | None]:
        """(decode worker, prefill worker) currently serving a request."""
        with self._lock:
            t = self._tracked.get(request_id)
            return (t.decode_id, t.prefill_id) if t else (None, None)

    @property
    def num_migrations(self) -> int:
        return self.failures.num_migrations

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._tracked)

    # -- requests -----------------------------------------------------------------------------
    def submit(
        self, spec: RequestSpec, stream: RequestStream | None = None, hint: PlacementHint = NO_HINT
    ) -> RequestStream:
        """Place and start a request (blocking Ray calls: run it off the event loop)."""
        if spec.origin != self.origin:
            spec = replace(spec, origin=self.origin)
        stream = stream or RequestStream(spec.request_id, spec.num_prompt_tokens)
        t = TrackedRequest(spec, stream, hint)
        with self._lock:
            if spec.request_id in self._tracked:
                raise ValueError(f"duplicate request id {spec.request_id!r}")
            self._tracked[spec.request_id] = t
        self._place(t, exclude=set())
        return stream

    def abort(self, request_id: str) -> bool:
        with self._lock:
            t = self._tracked.pop(request_id, None)
        if t is None:
            return False
        for wid in (t.decode_id, t.prefill_id):
            w = self.pool.get(wid) if wid else None
            if w is not None:
                w.requests.discard(request_id)
                w.actor.abort.remote(request_id)  # fire and forget: the worker frees the blocks
        self._stop_stale_copies(t)
        t.stream.put(RequestOutput(request_id, [], "", finished=True, finish_reason=FinishReason.ABORT))
        return True

    def _stop_stale_copies(self, t: TrackedRequest) -> None:
        """Once a request has ended: stop its copies on workers it left when they were taken for dead.
        One only slow (a stalled host, SIGSTOP) would otherwise run its copy to the copy's own end,
        its outputs dropped. Not before the end: the request may still be placed on such a worker
        again, and an abort racing that placement (the workers serve calls on several threads) could
        stop the new copy. Fire and forget: a dead worker ignores it, a new incarnation has no copy."""
        for wid in tuple(t.stale_copies):
            w = self.pool.get(wid)
            if w is not None:
                w.actor.abort.remote(t.spec.request_id)
        t.stale_copies.clear()

    def _place(self, t: TrackedRequest, exclude: set[str]) -> None:
        """Place ``t`` on a live decode worker, trying the next one while they die under the call. It
        owns ``t`` meanwhile (``placing``): a death noticed by a poller is not a second migration.

        A worker tried (or excluded) is tried again once it is back as a new incarnation (Ray restarted
        it). With none live, it waits up to ``placement_wait_s`` for one: Ray restarts a killed worker
        in seconds, and two killed at once failed every request they served."""
        tried = {w: self._incarnation(w) for w in exclude}  # worker id -> the incarnation tried
        give_up = time.monotonic() + self.placement_wait_s
        while True:
            d = choose_decode(self.pool, {w for w, inc in tried.items() if self._incarnation(w) == inc})
            if d is None:
                if time.monotonic() < give_up and not self._stop.is_set() and t.spec.request_id in self._tracked:
                    self._stop.wait(0.2)
                    continue
                self._fail(t, "no live decode worker")
                return
            with self._lock:
                if t.spec.request_id not in self._tracked:
                    return  # aborted meanwhile
                if set(tried) - exclude and t.stream.token_ids:  # an earlier try delivered tokens: resume after them
                    t.spec = replace(
                        t.spec, resume_token_ids=tuple(t.stream.token_ids), resume_text_chars=len(t.stream.text)
                    )
                t.decode_id, t.prefill_id, t.placing = d.worker_id, None, True
                d.requests.add(t.spec.request_id)
            spec = t.spec
            # Counted before the calls (each waits for a decode step): placements made meanwhile
            # must see the blocks this request will take there.
            self._count_placed(d, spec.num_prompt_tokens)
            try:
                if d.worker_id in t.stale_copies:
                    # It left d when d was taken for dead; a copy may still run there (d was only slow).
                    # Stopped first, or this placement is refused as a duplicate id (request failed).
                    self._call(d.actor.abort.remote(spec.request_id))
                    t.stale_copies.discard(d.worker_id)
                if not self._disaggregate(t, d):
                    self._call(d.actor.generate_local.remote(spec))
                    self.num_local_prefills += 1
                with self._lock:
                    if d.alive:  # else its death came while the call ran: try the next worker here
                        t.placing = False
                        return
                d.actor.abort.remote(spec.request_id)  # in case d was only slow: never two copies running
                t.stale_copies.add(d.worker_id)
                d.requests.discard(spec.request_id)
                tried[d.worker_id] = self._incarnation(d.worker_id)
                continue
            except _REFUSED as e:  # the worker is up and refused this request: not a dead worker
                d.requests.discard(spec.request_id)
                self._count_placed(d, -spec.num_prompt_tokens)
                self._fail(t, f"{d.worker_id} refused the request: {_cause(e)}")
                return
            except RayError as e:
                d.requests.discard(spec.request_id)
                self._count_placed(d, -spec.num_prompt_tokens)
                self.failures.mark_dead(d, e)
                tried[d.worker_id] = self._incarnation(d.worker_id)

    def _incarnation(self, worker_id: str) -> str | None:
        w = self.pool.get(worker_id)
        return w.info.peer.incarnation if w is not None and w.info is not None and w.info.peer is not None else None

    def _disaggregate(self, t: TrackedRequest, d: WorkerHandle) -> bool:
        """Reserve on D and start the prefill on P. False: prefill on D instead."""
        spec = t.spec
        if prefill_on_decode(
            self.pool,
            spec,
            d,
            t.hint,
            self.local_prefill_threshold,
            short_to_idle_prefill=self.short_prompts_to_idle_prefill,
        ):
            return False
        p = choose_prefill(self.pool, spec, t.hint)
        if p is None:
            return False
        # Counted on P before the reserve returns (a decode step's wait): placements made meanwhile
        # must see this prompt queued there, or a short prompt sent to a "free" P waits behind it.
        self._count_dispatched(p, spec.num_prompt_tokens)
        try:
            res: ReserveResult = self._call(d.actor.reserve.remote(spec, p.peer))
        except BaseException:
            self._count_dispatched(p, -spec.num_prompt_tokens)
            raise
        if not res.accepted:
            self._count_dispatched(p, -spec.num_prompt_tokens)
            log.debug(
                "%s refused %s (%s); prefilling it there when blocks free up", d.worker_id, spec.request_id, res.reason
            )
            return False
        if spec.num_prompt_tokens < self.local_prefill_threshold and not short_prompt_still_fits(
            p, self.local_prefill_threshold
        ):
            self._count_dispatched(p, -spec.num_prompt_tokens)  # P got busy: prefill it on D after all
            self._call(d.actor.prefill_locally.remote(spec.request_id, False))
            self.num_local_prefills += 1
            return True
        t.prefill_id = p.worker_id
        try:
            self._call(p.actor.prefill.remote(PrefillTask(spec, d.peer, res.transfer_id, res.num_cached_blocks)))
            self.num_disaggregated += 1
        except RayError as e:
            if isinstance(e, _REFUSED):  # it refused this prefill; it is not down
                self._count_dispatched(p, -spec.num_prompt_tokens)  # and did not queue it
                log.warning(
                    "%s refused the prefill of %s (%s); prefilling on %s",
                    p.worker_id,
                    spec.request_id,
                    _cause(e),
                    d.worker_id,
                )
            else:
                self.failures.mark_dead(p, e)
            self._call(d.actor.prefill_locally.remote(spec.request_id))
        return True

    def _count_placed(self, d: WorkerHandle, tokens: int) -> None:
        with self.pool.lock:
            d.count_placed(self.origin, tokens)

    def _count_dispatched(self, p: WorkerHandle, tokens: int) -> None:
        with self.pool.lock:
            p.count_dispatched(self.origin, tokens)

    def _call(self, ref: ObjectRef[Any]) -> Any:
        return ray.get(ref, timeout=self.call_timeout_s)

    def _fail(self, t: TrackedRequest, reason: str) -> None:
        with self._lock:
            self._tracked.pop(t.spec.request_id, None)
        self._stop_stale_copies(t)
        t.stream.fail(reason)

    # -- outputs ------------------------------------------------------------------------------
    def _poll_loop(self, d: WorkerHandle) -> None:
        while not self._stop.is_set():
            try:
                pressure = self.lane_pressure() if self.lane_pressure is not None else None
                batch: OutputBatch = ray.get(
                    d.actor.poll.remote(self.poll_timeout_s, self.origin, pressure),
                    timeout=self.poll_timeout_s + self.call_timeout_s,
                )
            except (RayError, GetTimeoutError) as e:
                if not self._stop.is_set():
                    self.failures.mark_dead(d, e)
                    self._stop.wait(self.monitor_interval_s)
                continue
            if d.info is not None and batch.incarnation != d.info.peer.incarnation:
                self.failures.on_restart(d)
            d.update_load(batch.load)
            if batch.kv_events:
                self.on_kv_events(d.worker_id, batch.kv_events)
            self._deliver(d, batch.outputs)
            if batch.dropped:
                self.failures.take_back(d, batch.dropped)

    def _deliver(self, d: WorkerHandle, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            with self._lock:
                t = self._tracked.get(out.request_id)
                if t is None or t.decode_id != d.worker_id:
                    continue  # aborted, or a stale output from before a migration
                if out.first_index >= 0 and out.first_index != len(t.stream.token_ids):
                    # Not the continuation of what the caller has: the output of a copy given up on
                    # here (this worker was taken for dead, then the request came back to it).
                    self.num_stale_outputs += 1
                    continue
                if out.finished:
                    del self._tracked[out.request_id]
                    d.requests.discard(out.request_id)
            t.stream.put(out)
            if out.finished and t.stale_copies:
                self._stop_stale_copies(t)


def _cause(error: RayError) -> str:
    """The worker's own exception, not Ray's wrapping of it."""
    cause = getattr(error, "cause", None)
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error).splitlines()[0]
