"""``PlacementWatch``: names the actors Ray has not placed, and what they lack.

A worker or router replica whose resources no node offers, or no node has free, stays pending and
Ray says nothing in the job log: the supervisor's start only timed out minutes later, naming no
actor. The watch is told each actor as it is created (its label, Ray name and resource demand) and
looks at Ray's actor table every few seconds; one still waiting for a node after ``report_after_s``
is said once, with its demand and why no node fits it, and listed in ``unplaced`` (the
supervisor's Redis record) until Ray places it.

The actor table is read from the GCS (``ray._private.state``): Ray's public state API goes through
the dashboard, which a cluster may run without.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import ray

log = logging.getLogger(__name__)

# Ray's actor states before the actor runs on a node (a restarting one waits for a node again).
WAITING_STATES = frozenset({"PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING"})


@dataclass(frozen=True)
class WatchedActor:
    label: str  # what the operator calls it: "router-0", "decode-1"
    name: str  # its Ray actor name
    demand: Mapping[str, float]  # what it asked Ray for (CPU, GPU, custom resources)


@dataclass(frozen=True)
class NodeResources:
    node: str  # its address
    total: Mapping[str, float]
    free: Mapping[str, float]


def describe_demand(demand: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in demand.items() if v) + "}"


def why_unplaced(demand: Mapping[str, float], nodes: list[NodeResources]) -> str:
    """Why no node takes ``demand``: a resource no node offers, none offering it all at once, or
    every node that offers it all has too little free (other actors hold it)."""
    need = {k: v for k, v in demand.items() if v}
    missing = [k for k, v in need.items() if not any(n.total.get(k, 0.0) >= v for n in nodes)]
    if missing:
        return "no node offers " + ", ".join(f"{k}: {need[k]:g}" for k in missing)
    fitting = [n for n in nodes if all(n.total.get(k, 0.0) >= v for k, v in need.items())]
    if not fitting:
        return f"no single node offers all of {describe_demand(need)}"
    held = "; ".join(
        f"{n.node} has " + ", ".join(f"{k} {n.free.get(k, 0.0):g} of {n.total.get(k, 0.0):g} free" for k in need)
        for n in fitting
    )
    return f"the nodes that offer it have too little free ({held})"


def cluster_nodes() -> list[NodeResources]:
    """The live nodes' total and free resources."""
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node()
    return [
        NodeResources(
            n.get("NodeManagerAddress", n["NodeID"][:8]), dict(n.get("Resources", {})), dict(free.get(n["NodeID"], {}))
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def waiting_actor_names() -> set[str]:
    """Names of the cluster's actors that wait for a node. Ray says PENDING_CREATION until the
    constructor returns, so one with a worker process (``Pid``) is placed and loading, not waiting:
    a model load longer than ``report_after_s`` was named as unplaced."""
    from ray._private.state import actors

    return {
        a["Name"]
        for a in actors().values()
        if a.get("Name")
        and a.get("State") in WAITING_STATES
        and not (a.get("State") == "PENDING_CREATION" and a.get("Pid"))
    }


class PlacementWatch:
    def __init__(
        self,
        say: Callable[[str], None],
        report_after_s: float = 20.0,
        waiting: Callable[[], set[str]] = waiting_actor_names,
        nodes: Callable[[], list[NodeResources]] = cluster_nodes,
    ) -> None:
        self.say = say
        self.report_after_s = report_after_s
        self._waiting = waiting
        self._nodes = nodes
        self._lock = threading.Lock()
        self._watched: dict[str, WatchedActor] = {}  # by Ray name
        self._since: dict[str, float] = {}  # Ray name -> when first seen waiting
        self._reported: dict[str, str] = {}  # label -> what was said
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, actor: WatchedActor) -> None:
        """Watch ``actor`` (from now on, instead of an earlier one under its label: a replacement)."""
        with self._lock:
            for name in [n for n, a in self._watched.items() if a.label == actor.label]:
                del self._watched[name]
                self._since.pop(name, None)
            self._watched[actor.name] = actor

    @property
    def unplaced(self) -> dict[str, str]:
        """label -> why it is not placed, for the actors reported and still waiting."""
        with self._lock:
            return dict(self._reported)

    def check(self, now: float | None = None) -> None:
        """One look: report the actors waiting past ``report_after_s``, forget the placed ones."""
        now = time.monotonic() if now is None else now
        waiting = self._waiting()
        due: list[WatchedActor] = []
        placed: list[str] = []
        with self._lock:
            for name, actor in self._watched.items():
                if name not in waiting:
                    self._since.pop(name, None)
                    if self._reported.pop(actor.label, None) is not None:
                        placed.append(actor.label)
                    continue
                since = self._since.setdefault(name, now)
                if now - since >= self.report_after_s and actor.label not in self._reported:
                    due.append(actor)
        for label in placed:
            self.say(f"{label} is placed now")
        if not due:
            return
        nodes = self._nodes()
        for actor in due:
            why = why_unplaced(actor.demand, nodes)
            text = f"needs {describe_demand(actor.demand)}; {why}"
            with self._lock:
                self._reported[actor.label] = text
            self.say(
                f"{actor.label} ({actor.name}) is still waiting for a node after "
                f"{now - self._since[actor.name]:.0f}s: it {text}"
            )

    # -- background ---------------------------------------------------------------------------
    def start(self, interval_s: float = 5.0) -> PlacementWatch:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.check()
                except Exception as e:  # noqa: BLE001 - the GCS away for a moment: look again next time
                    log.debug("placement check failed: %s", e)

        self._thread = threading.Thread(target=loop, name="placement-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
