"""A whole Baton cluster (``baton.serve.BatonServer``: embedded Redis, Ray pools, router with HTTP
and gRPC) for one experiment setup, started from Python and stopped when the setup is done.

The server runs in a child process (spawned, so it starts clean), not in the experiment's own
process: the router's event loop and the load generator's would otherwise share one GIL, and the
client's timestamps would include the router's work. The child reports its endpoints over a pipe
and stops (without draining) when the parent asks or goes away.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from baton.config import BatonConfig, load_config


@dataclass(frozen=True)
class ServerSetup:
    """One server configuration: dotted config overrides (as ``load_config`` takes them) plus the
    engine's scheduling policy, which the config file does not expose (the static-batching
    baseline is an engine option, ``SchedulerConfig(policy="static")``)."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    static_batch_size: int | None = None  # set: every worker batches statically, in batches of this size

    def config(self) -> BatonConfig:
        # Free ports: several experiments (or a developer's `baton up`) may run on one machine.
        cfg = load_config(None, {"router.http_port": 0, "router.grpc_port": 0, **self.overrides})
        if self.static_batch_size is None:
            return cfg
        return StaticBatchingConfig.model_validate({**cfg.model_dump(), "static_batch_size": self.static_batch_size})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "overrides": dict(self.overrides), "static_batch_size": self.static_batch_size}


class StaticBatchingConfig(BatonConfig):
    """A ``BatonConfig`` whose workers run the static-batching scheduler policy."""

    static_batch_size: int = 16

    def engine_config(self):
        e = super().engine_config()
        return replace(e, scheduler=replace(e.scheduler, policy="static", static_batch_size=self.static_batch_size))


@dataclass(frozen=True)
class Endpoints:
    http_url: str
    grpc_target: str
    model: str


def _child(setup: ServerSetup, conn) -> None:
    from baton.serve import BatonServer

    def say(msg: str) -> None:
        print(f"[server {setup.name}] {msg}", file=sys.stderr, flush=True)

    async def main() -> None:
        server = BatonServer(setup.config(), progress=say)
        try:
            ep = await server.start()
            conn.send(("ready", ep.http_url, ep.grpc_target, server.served_name))
            try:  # blocks until the parent says stop or its end of the pipe closes
                await asyncio.to_thread(conn.recv)
            except (EOFError, OSError):
                pass
        except BaseException as e:
            try:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            except (OSError, ValueError):
                pass
            raise
        finally:
            await server.stop(drain=False)

    asyncio.run(main())


class ExperimentServer:
    """``with ExperimentServer(setup) as ep: ...`` — a running cluster for the block's duration."""

    def __init__(
        self,
        setup: ServerSetup,
        start_timeout_s: float = 900.0,
        say: Callable[[str], None] = lambda m: print(f"[experiment] {m}", file=sys.stderr, flush=True),
    ):
        self.setup = setup
        self.start_timeout_s = start_timeout_s
        self.say = say
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self.endpoints: Endpoints | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> Endpoints:
        setup = self.setup
        setup.config()  # validate here: a bad override fails before a process is spawned
        ctx = mp.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        self._conn = conn
        t0 = time.monotonic()
        self._proc = proc = ctx.Process(target=_child, args=(setup, child_conn), name=f"baton-{setup.name}")
        proc.start()
        child_conn.close()
        self.say(
            f"starting server '{setup.name}' ({setup.overrides or 'defaults'}"
            f"{', static batching' if setup.static_batch_size else ''})"
        )
        if not conn.poll(self.start_timeout_s):
            self._stop()
            raise TimeoutError(f"server '{setup.name}' did not start within {self.start_timeout_s:.0f} s")
        try:
            msg = conn.recv()
        except EOFError:
            msg = ("error", f"the server process exited (code {proc.exitcode})")
        if msg[0] != "ready":
            self._stop()
            raise RuntimeError(f"server '{setup.name}' failed to start: {msg[1]}")
        self.startup_s = time.monotonic() - t0
        self.endpoints = Endpoints(msg[1], msg[2], msg[3])
        self.say(f"server '{setup.name}' ready in {self.startup_s:.0f} s at {msg[1]}")
        return self.endpoints

    @property
    def pid(self) -> int | None:
        """The server process's pid (the router runs in it; Redis and Ray are its descendants)."""
        return None if self._proc is None else self._proc.pid

    def _stop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send("stop")
            except (OSError, ValueError):
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.join(120)
            if self._proc.is_alive():  # our own child: stop it by its handle
                self._proc.terminate()
                self._proc.join(30)
            self._proc = None

    def __exit__(self, *exc: object) -> None:
        self.say(f"stopping server '{self.setup.name}'")
        self._stop()
