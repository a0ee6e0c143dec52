"""A real ``redis-server`` for the tests: the one ``.ci/run`` started, or one of our own on loopback.

* the ``redis_url`` fixture (import it into a test module: ``from tests.support.redis_server import
  redis_url``) and :func:`session_redis_url`: the URL of a server for the whole session —
  ``$POLITE_TEST_REDIS_URL`` when set (``.ci/run`` starts one and exports it), else a ``redis-server``
  this module starts on a free loopback port (stopped at the end of the session). Tests
  share it, each under its own key prefix (:func:`unique_prefix`), so they never see each other's rows.
* :class:`RedisServer`: a server a test owns, to stop and restart it (outage tests). It keeps its data
  in an append-only file synced on every write, so a restart loses nothing that was acknowledged.

When neither a URL nor the ``redis-server`` binary is available the tests are skipped on a developer's
machine, and **fail** in CI (``$CI`` set): CI must never pass without running them.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

__all__ = ["RedisServer", "die_with_parent", "free_port", "ping", "redis_binary", "redis_url", "require_redis",
           "SessionService", "session_redis_url", "stop_processes", "stop_session_server", "unique_prefix"]

#: ``redis-server`` as found on the machine (Debian's package installs /usr/bin/redis-server).
REDIS_SERVER = "redis-server"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def redis_binary() -> str | None:
    """The path of ``redis-server``, or None."""
    return shutil.which(REDIS_SERVER) or (f"/usr/bin/{REDIS_SERVER}" if os.path.exists(f"/usr/bin/{REDIS_SERVER}")
                                          else None)


def require_redis(reason: str = "") -> str:
    """The ``redis-server`` binary, or skip the test (fail it in CI) naming how to get one."""
    binary = redis_binary()
    if binary is None:
        message = ("no redis-server: install it (apt-get install -y redis-server) or set POLITE_TEST_REDIS_URL "
                   "to a running server" + (f" ({reason})" if reason else ""))
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def unique_prefix(name: str = "test") -> str:
    """A key prefix no other test uses: ``test:<name>:<random>:``."""
    return f"test:{name}:{uuid.uuid4().hex[:12]}:"


class RedisServer:
    """A ``redis-server`` on ``127.0.0.1:<port>`` in its own directory, for one test.

    Its data is in an append-only file synced on every write (``appendfsync always``), so :meth:`stop` then
    :meth:`start` keeps every row that was acknowledged; with ``persist=False`` a restart starts empty. Use as a
    context manager, or call :meth:`stop`.

    Args:
        port: the port (default: a free one); kept across restarts.
        directory: where the server keeps its files (default: a new temporary directory, removed by
            :meth:`cleanup`).
    """

    def __init__(self, port: int | None = None, directory: str | None = None, *, persist: bool = True) -> None:
        self.binary = require_redis()
        #: Keep the data across a restart (an append-only file synced on every write); False: a restart starts
        #: empty, as a Redis run as a cache does.
        self.persist = persist
        self.port = port or free_port()
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="polite-redis-")
        self.process: subprocess.Popen[bytes] | None = None
        self.log = os.path.join(self.directory, "redis.log")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING. Call it from the main thread: the server is
        stopped when the thread that started it ends (so no server outlives a killed test run).

        Raises:
            RuntimeError: it did not answer within ``timeout`` seconds (its log is in the message).
        """
        if self.process is not None and self.process.poll() is None:
            return self
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
                *persistence, "--save", "", "--daemonize", "no", "--logfile", self.log, "--protected-mode", "yes"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if ping("127.0.0.1", self.port):
                return self
            time.sleep(0.02)
        self.stop()
        log = open(self.log).read()[-2000:] if os.path.exists(self.log) else ""
        raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM; its append-only file is already synced) and wait until it is gone."""
        process, self.process = self.process, None
        if process is not None:
            stop_processes([process], timeout)

    def cleanup(self) -> None:
        """Stop the server and remove its directory (when this object made it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


def stop_processes(processes: Sequence[subprocess.Popen[Any]], timeout: float = 10.0) -> None:
    """SIGTERM each of ``processes`` still running, then wait for each (SIGKILL after ``timeout`` seconds)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when the test process dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def ping(host: str, port: int) -> bool:
    """True when a Redis server on ``host:port`` answers PING (within 0.5 s)."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class SessionService:
    """One service for the whole test session: the URL in the environment variable ``env`` when set, else one
    ``start()`` builds on first use (an object with ``url`` and ``cleanup()``: :class:`RedisServer`, a
    Redis Cluster), cleaned up by :meth:`stop` or at the interpreter's exit."""

    def __init__(self, env: str, start: Callable[[], Any]) -> None:
        self.env = env
        self._start = start
        self._running: Any = None

    def url(self) -> str:
        url = os.environ.get(self.env)
        if url:
            return url
        if self._running is None:
            self._running = self._start()
            atexit.register(self.stop)
        return str(self._running.url)

    def stop(self) -> None:
        """Clean up what :meth:`url` started, if anything."""
        if self._running is not None:
            self._running.cleanup()
            self._running = None


_SESSION = SessionService("POLITE_TEST_REDIS_URL", lambda: RedisServer().start())


def session_redis_url() -> str:
    """The session's server: ``$POLITE_TEST_REDIS_URL``, else a ``redis-server`` started on first use (see
    :func:`stop_session_server`). Skips (fails in CI) when there is neither."""
    return _SESSION.url()


def stop_session_server() -> None:
    """Stop the server :func:`session_redis_url` started, if any (the ``redis_url`` fixture does, at the end of
    the session)."""
    _SESSION.stop()


@pytest.fixture(scope="session")
def redis_url() -> Any:
    """The URL of the session's Redis server (see :func:`session_redis_url`)."""
    yield session_redis_url()
    stop_session_server()
