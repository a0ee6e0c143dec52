"""A real Redis Cluster for the tests: the one ``.ci/run`` started, or three nodes of our own on loopback.

* the ``redis_cluster_url`` fixture (import it into a test module: ``from tests.support.redis_cluster import
  redis_cluster_url``) and :func:`session_cluster_url`: the ``redis+cluster://`` URL of a cluster for the
  whole session — ``$POLITE_TEST_REDIS_CLUSTER_URL`` when set (``.ci/run`` starts one and exports it), else
  a cluster this module starts (stopped at the end of the session). Tests share it, each under its own key
  prefix.
* :class:`LocalCluster`: three ``redis-server --cluster-enabled yes`` on free loopback ports, each in its own
  temporary directory, joined by ``redis-cli --cluster create … --cluster-replicas 0`` (every slot covered,
  no replica), ready once every node's ``CLUSTER INFO`` says ``cluster_state:ok``.

Without ``redis-server`` and ``redis-cli`` (Debian's ``redis-server`` package installs both) the tests are
skipped on a developer's machine and **fail** in CI (``$CI`` set), as :mod:`tests.support.redis_server` does.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import pytest

from tests.support.redis_server import SessionService, die_with_parent, ping, require_redis, stop_processes

__all__ = ["LocalCluster", "cluster_port", "flush_cluster_prefix", "node_ports", "redis_cluster_url", "session_cluster_url", "stop_session_cluster"]


def cluster_port() -> int:
    """A free loopback port for a cluster node: at most 55535, and its bus port (10000 higher) free too."""
    for _ in range(1000):
        port = random.randint(20000, 55535)
        if all(_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _require_cli() -> str:
    cli = shutil.which("redis-cli") or ("/usr/bin/redis-cli" if os.path.exists("/usr/bin/redis-cli") else None)
    if cli is None:
        message = "no redis-cli: install it (apt-get install -y redis-server) or set POLITE_TEST_REDIS_CLUSTER_URL"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return cli


class LocalCluster:
    """Three cluster nodes on ``127.0.0.1``, all primaries (no replica), for a session or one test.

    Args:
        nodes: how many nodes (3: the least ``redis-cli --cluster create`` accepts without replicas; 1: one node
            given every slot with ``CLUSTER ADDSLOTSRANGE``, a cluster of one master).
    """

    def __init__(self, nodes: int = 3) -> None:
        self.binary = require_redis("a Redis Cluster")
        self.cli = _require_cli()
        self.ports: list[int] = []
        while len(self.ports) < nodes:
            port = cluster_port()
            if port not in self.ports:
                self.ports.append(port)
        self.directory = tempfile.mkdtemp(prefix="polite-cluster-")
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start the nodes, create the cluster, wait until every node says ``cluster_state:ok``.

        Raises:
            RuntimeError: it was not ready within ``timeout`` seconds (the nodes' logs are in the message).
        """
        deadline = time.monotonic() + timeout
        self._spawn(fresh=True)
        try:
            self._wait_up(deadline)
            if len(self.ports) == 1:
                self._cli(self.ports[0], "cluster", "addslotsrange", "0", "16383")
                self._wait_ok(deadline)
                return self
            create = subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                                     "--cluster-replicas", "0", "--cluster-yes"],
                                    capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()))
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
            self._wait_ok(deadline)
        except BaseException as exc:
            logs = self._logs()
            self.cleanup()
            if isinstance(exc, RuntimeError):
                raise RuntimeError(f"{exc}\n{logs}") from None
            raise
        return self

    def restart(self, timeout: float = 30.0) -> None:
        """Start the stopped nodes again (each keeps its cluster configuration, ``nodes.conf``; the data is
        not persisted) and wait until every node says ``cluster_state:ok``."""
        self.stop()
        deadline = time.monotonic() + timeout
        self._spawn(fresh=False)
        self._wait_up(deadline)
        self._wait_ok(deadline)

    def _spawn(self, fresh: bool) -> None:
        for port in self.ports:
            where = os.path.join(self.directory, str(port))
            if fresh:
                os.makedirs(where)
            args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", where,
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000", "--save", "", "--appendonly", "no", "--daemonize", "no",
                    "--logfile", os.path.join(where, "redis.log")]
            self.processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                   stdin=subprocess.DEVNULL, preexec_fn=die_with_parent))

    def _wait_up(self, deadline: float) -> None:
        for port in self.ports:
            while not ping("127.0.0.1", port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not start")
                time.sleep(0.02)

    def _wait_ok(self, deadline: float) -> None:
        for port in self.ports:
            while "cluster_state:ok" not in self._cli(port, "cluster", "info"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} never said cluster_state:ok")
                time.sleep(0.05)

    def _cli(self, port: int, *args: str) -> str:
        try:
            return subprocess.run([self.cli, "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True,
                                  text=True, timeout=5).stdout
        except subprocess.TimeoutExpired:
            return ""

    def _logs(self) -> str:
        out = []
        for port in self.ports:
            path = os.path.join(self.directory, str(port), "redis.log")
            if os.path.exists(path):
                out.append(f"--- node {port}:\n" + open(path).read()[-1500:])
        return "\n".join(out)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait until they are gone."""
        processes, self.processes = self.processes, []
        stop_processes(processes, timeout)

    def cleanup(self) -> None:
        """Stop the nodes and remove their directories."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


def node_ports(url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each node a ``redis+cluster://h:p,h:p`` URL names."""
    nodes = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    out = []
    for item in nodes.split(","):
        host, _, port = item.rpartition(":")
        out.append((host, int(port)))
    return out


def flush_cluster_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` on every primary of the cluster at ``url`` (a sharded table's rows are
    on all of them)."""
    from redis.cluster import RedisCluster  # noqa: PLC0415  (the tests' optional client)

    host, port = node_ports(url)[0]
    client = RedisCluster(host=host, port=port)  # the tests' clusters: loopback, no TLS
    try:
        for node in client.get_primaries():
            conn = client.get_redis_connection(node)
            for name in list(conn.scan_iter(match=prefix + "*", count=1000)):
                conn.delete(name)  # one by one: the names are in many slots
    finally:
        client.close()


_SESSION = SessionService("POLITE_TEST_REDIS_CLUSTER_URL", lambda: LocalCluster().start())


def session_cluster_url() -> str:
    """The session's cluster: ``$POLITE_TEST_REDIS_CLUSTER_URL``, else a :class:`LocalCluster` started on first
    use (see :func:`stop_session_cluster`). Skips (fails in CI) when there is neither."""
    return _SESSION.url()


def stop_session_cluster() -> None:
    """Stop the cluster :func:`session_cluster_url` started, if any."""
    _SESSION.stop()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Any:
    """The ``redis+cluster://`` URL of the session's Redis Cluster (see :func:`session_cluster_url`)."""
    yield session_cluster_url()
    stop_session_cluster()
