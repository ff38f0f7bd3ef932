"""Runs a ``BatonServer`` (the whole ``baton up`` stack) on its own event loop in a thread, so
tests can talk to its real HTTP and gRPC servers with real clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import faulthandler
import sys
import threading

from baton.config import BatonConfig
from baton.serve import BatonServer


class ServerThread:
    def __init__(self, cfg: BatonConfig) -> None:
        self.server = BatonServer(cfg, progress=lambda m: None)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="baton-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as e:  # noqa: BLE001 - surfaced to the test by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def start(self, timeout: float = 300.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the server did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro, timeout: float = 120.0):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            self._dump_stacks()
            raise

    def _dump_stacks(self) -> None:
        """A call that timed out: where every thread and every task of the server's loop stands."""
        print("\n=== server call timed out: threads ===", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        print("=== the server loop's tasks ===", file=sys.stderr)
        for task in asyncio.all_tasks(self.loop):
            task.print_stack(limit=12, file=sys.stderr)

    @property
    def http(self) -> str:
        return self.server.endpoints.http_url

    @property
    def grpc(self) -> str:
        return self.server.endpoints.grpc_target

    @property
    def router(self):
        return self.server.router

    @property
    def cluster(self):
        return self.server.cluster

    def stop(self) -> None:
        try:
            self.call(self.server.stop(drain=False), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
