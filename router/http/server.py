"""Running the HTTP app under uvicorn without giving uvicorn the process.

The router owns its event loop, its signal handling and its shutdown order (stop taking requests,
drain, then stop the workers), so uvicorn runs as one task of that loop (``HttpServer``) rather
than through ``uvicorn.run``. ``ThreadedHttpServer`` runs one on a private loop in a background
thread, for tests and for synchronous callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import uvicorn
from starlette.types import ASGIApp

T = TypeVar("T")


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the host process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn: a bind failure is then an ``OSError`` from ``start()``
    (uvicorn would ``sys.exit`` inside our loop), and with ``port=0`` the port is known at once."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ]
    except socket.gaierror as e:
        raise OSError(f"cannot bind the HTTP server to {host!r}:{port}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot bind the HTTP server to {host}:{port}: {e.strerror}") from None
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    """uvicorn serving ``app`` on ``host:port`` as a task of the running event loop.

    ``port=0`` picks a free port; read it from ``port`` after ``start()``. ``stop()`` is graceful:
    it stops accepting connections, lets in-flight responses finish for up to
    ``graceful_timeout_s``, then cancels them (which aborts their generations).
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        access_log: bool = False,
        graceful_timeout_s: float = 5.0,
    ) -> None:
        self.app = app
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._log_level = log_level
        self._access_log = access_log
        self._graceful_timeout_s = graceful_timeout_s
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the server has not been started")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Returns once the server accepts connections."""
        if self._task is not None:
            raise RuntimeError("the server is already running")
        sock = _bind(self.host, self._requested_port)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self._port,
            log_level=self._log_level,
            access_log=self._access_log,
            lifespan="off",
            # uvicorn annotates an int, and hands the value to asyncio.wait_for, which takes seconds as a float
            timeout_graceful_shutdown=self._graceful_timeout_s,  # type: ignore[arg-type]
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"http-server:{self._port}")
        while not self._server.started:
            if self._task.done():  # failed to start: surface why
                self._task.result()
                raise RuntimeError("the HTTP server exited during startup")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Graceful shutdown; idempotent."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self._graceful_timeout_s + 5.0)
        except TimeoutError:
            self._server.force_exit = True
            await self._task
        finally:
            self._server, self._task = None, None


class ThreadedHttpServer:
    """An ``HttpServer`` on its own event loop in a daemon thread; a context manager.

    The app (and so the router it wraps) runs on that thread's loop: ``call()`` runs a coroutine
    there, e.g. to inspect router state from a test.
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> None:
        self.server = HttpServer(app, host, port, **kwargs)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout_s: float = 10.0) -> ThreadedHttpServer:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="baton-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the HTTP server did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.server.start()
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            return
        finally:
            self._ready.set()
        await self._stop.wait()
        await self.server.stop()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        assert self._loop is not None, "not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._loop is not None and self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> ThreadedHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
