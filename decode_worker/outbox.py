"""Per-router outboxes: every router replica long-polls a decode worker for *its* requests' outputs.

With several routers sharing the decode pool, one shared buffer would hand one router's tokens to
another. Outputs are filed by the origin router recorded when the request arrived; each poll
drains that origin's box (all the steps since its last poll: one message per poll, never per token).
"""

from __future__ import annotations

import threading
import time

from engine.outputs import RequestOutput

_MAX_DROPPED = 4096  # per router: ids kept to tell a router that never polls again cost bounded memory


class Outbox:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._boxes: dict[str, list[RequestOutput]] = {}
        self._origin_of: dict[str, str] = {}
        self._last_seen: dict[str, float] = {}  # origin -> its latest poll (or request)
        self._dropped: dict[str, list[str]] = {}  # origin -> its requests dropped as orphans, not yet told
        self._closed = False

    def register(self, request_id: str, origin: str) -> str | None:
        """File ``request_id``'s outputs under ``origin`` from now on; returns the other router that
        held the id until now, if any (the caller takes the request over from it)."""
        with self._cv:
            previous = self._origin_of.get(request_id)
            self._origin_of[request_id] = origin
            self._last_seen[origin] = time.monotonic()
            return previous if previous != origin else None

    def orphans(self, timeout_s: float) -> list[str]:
        """Requests whose router has not polled for ``timeout_s``: it is gone, nobody will read them."""
        now = time.monotonic()
        with self._cv:
            gone = {o for o, t in self._last_seen.items() if now - t > timeout_s}
            out = [rid for rid, o in self._origin_of.items() if o in gone]
            for rid in out:  # told to the origin if it polls again after all (it was only stalled)
                told = self._dropped.setdefault(self._origin_of[rid], [])
                told.append(rid)
                del told[:-_MAX_DROPPED]
            for o in gone:
                self._boxes.pop(o, None)
                if not any(v == o for v in self._origin_of.values() if v not in gone):
                    self._last_seen.pop(o, None)
            return out

    def known_origins(self) -> set[str]:
        """Routers still counted as alive, or with requests here."""
        with self._cv:
            return set(self._last_seen)

    def touch_all(self) -> None:
        """Every router counts as just seen: the worker itself was away (paused, stopped by a signal),
        so their silence meanwhile says nothing about them."""
        now = time.monotonic()
        with self._cv:
            for origin in self._last_seen:
                self._last_seen[origin] = now

    def take_dropped(self, origin: str) -> list[str]:
        with self._cv:
            return self._dropped.pop(origin, [])

    def put(self, outputs: list[RequestOutput]) -> None:
        if not outputs:
            return
        with self._cv:
            for out in outputs:
                origin = self._origin_of.get(out.request_id, "")
                self._boxes.setdefault(origin, []).append(out)
                if out.finished:
                    self._origin_of.pop(out.request_id, None)
            self._cv.notify_all()

    def put_for(self, origin: str, output: RequestOutput) -> None:
        """File one output under ``origin`` whatever the request's current reader (a taken-over
        request's final abort goes to the router that lost it)."""
        with self._cv:
            self._boxes.setdefault(origin, []).append(output)
            self._cv.notify_all()

    def forget(self, request_id: str) -> None:
        with self._cv:
            self._origin_of.pop(request_id, None)

    def poll(self, origin: str, timeout_s: float) -> list[RequestOutput]:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._last_seen[origin] = time.monotonic()
            while not self._boxes.get(origin) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            return self._boxes.pop(origin, [])

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
