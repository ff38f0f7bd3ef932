"""A minimal actor in a spawned process, for benches that must run where Ray is not installed (the
GPU machines this project borrows have torch and Triton but no Ray, and a Ray wheel is over the
size that can be carried there). The object lives in a child process started with ``spawn`` (CUDA
contexts and IPC handles do not survive ``fork``); calls go over a pipe and come back in order.

    a = ProcActor(BenchPeer, "prefill", ...)      # the constructor runs in the child
    b = ProcActor(BenchPeer, "decode", ...)
    gather([a.call("connect", b_info), b.call("connect", a_info)])   # both run at once
    a.stop()

Same shape as ``ray.get([a.m.remote(x), ...])``; an exception in the child comes back as
``ActorError`` with the child's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections import deque
from typing import Any


class ActorError(RuntimeError):
    pass


def _serve(conn, cls, args: tuple, kwargs: dict) -> None:
    try:
        obj = cls(*args, **kwargs)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            conn.send(("ok", None))
            # Skip interpreter teardown: process groups' C++ threads abort it ("terminate called ...").
            os._exit(0)
        method, margs = msg
        try:
            conn.send(("ok", getattr(obj, method)(*margs)))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))


class Pending:
    """One call's result; ``result()`` waits for it (and for the calls before it on the same actor)."""

    def __init__(self, actor: ProcActor) -> None:
        self._actor = actor
        self._done = False
        self._value: Any = None

    def result(self, timeout_s: float = 600.0) -> Any:
        while not self._done:
            self._actor._receive_one(timeout_s)
        return self._value


class ProcActor:
    def __init__(self, cls: type, *args: Any, start_timeout_s: float = 120.0, **kwargs: Any) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, cls, args, kwargs), daemon=True)
        self._proc.start()
        child.close()
        self._pending: deque[Pending] = deque()
        self._name = cls.__name__
        status, detail = self._recv(start_timeout_s)
        if status != "ok":
            self.stop()
            raise ActorError(f"{self._name} failed to start:\n{detail}")

    def call(self, method: str, *args: Any) -> Pending:
        self._conn.send((method, args))
        p = Pending(self)
        self._pending.append(p)
        return p

    def _recv(self, timeout_s: float) -> tuple[str, Any]:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"{self._name} did not answer within {timeout_s:.0f} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise ActorError(f"{self._name}'s process died (exit code {self._proc.exitcode})") from None

    def _receive_one(self, timeout_s: float) -> None:
        status, value = self._recv(timeout_s)
        p = self._pending.popleft()
        if status != "ok":
            raise ActorError(f"{self._name} raised:\n{value}")
        p._value, p._done = value, True

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._proc.is_alive():
            try:
                while self._pending:  # answers still owed to calls nobody waited for
                    self._receive_one(timeout_s)
                self._conn.send(None)
                self._recv(timeout_s)
            except (ActorError, TimeoutError, BrokenPipeError, OSError):
                pass
            self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout_s)


def gather(pending: list[Pending], timeout_s: float = 600.0) -> list[Any]:
    return [p.result(timeout_s) for p in pending]
