"""A local drain trigger for a router replica: a Unix socket the replica listens on, and the client
that asks it to drain (``python -m baton.drain_socket``, the Helm chart's router preStop hook).

Kubernetes stops a router pod by running its preStop hook, then sending SIGTERM to the container;
the replica is a Ray actor in that container, and SIGTERM stops its Ray node without draining.
So the hook first waits while the Service drops the pod's endpoints, then connects here: the
replica drains (new requests 503 + Retry-After, ``/ready`` 503, gRPC GOAWAY, in-flight streams
finish for up to ``router.drain_timeout_s``) and answers once it is done, so the hook returns only
after the drain. A Unix socket, not a port: only processes in the pod can reach it, and it needs no
configuration beyond its path (``BATON_DRAIN_SOCKET``).

The client imports only the standard library: the hook runs it in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

REQUEST = b"drain\n"


class DrainSocket:
    """Serves drain requests on ``path``; every request waits for the one drain (run once)."""

    def __init__(self, path: str, drain: Callable[[], Coroutine[Any, Any, int]]) -> None:
        self.path = path
        self._drain = drain
        self._server: asyncio.AbstractServer | None = None
        self._task: asyncio.Task[int] | None = None

    async def start(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).unlink(missing_ok=True)  # left by a replica that died before this one
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            Path(self.path).unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if await reader.readline() != REQUEST:
                writer.write(b"error: unknown request\n")
                return
            if self._task is None:
                self._task = asyncio.create_task(self._drain(), name="drain-on-request")
            aborted = await asyncio.shield(self._task)
            writer.write(f"drained, {aborted} aborted\n".encode())
        finally:
            await writer.drain()
            writer.close()


def request_drain(path: str, timeout_s: float) -> str:
    """Ask the replica listening on ``path`` to drain and wait for its answer (at most
    ``timeout_s``). Returns what happened, in words; never raises for a missing replica."""
    if not os.path.exists(path):
        return f"no router replica listens on {path}: nothing to drain"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
            s.sendall(REQUEST)
            answer = s.makefile("rb").readline().decode().strip()
        except ConnectionRefusedError:
            return f"no router replica listens on {path}: nothing to drain"
        except TimeoutError:
            return f"the router replica did not finish draining within {timeout_s:.0f}s"
        except OSError as e:
            return f"could not reach the router replica on {path}: {e}"
    return answer or "the router replica closed the connection without answering"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m baton.drain_socket", description="Drain this pod's router replica (a preStop hook)."
    )
    parser.add_argument("--socket", default=os.environ.get("BATON_DRAIN_SOCKET", "/tmp/baton/router-drain.sock"))
    parser.add_argument(
        "--sleep", type=float, default=0.0, help="seconds to wait first, while the Service drops this pod's endpoints"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the drain")
    args = parser.parse_args(argv)
    if args.sleep > 0:
        time.sleep(args.sleep)
    print(f"[baton preStop] {request_drain(args.socket, args.timeout)}", file=sys.stderr, flush=True)
    return 0  # a failed hook only delays the pod's stop: never fail it


if __name__ == "__main__":
    sys.exit(main())
