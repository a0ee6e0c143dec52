"""A Redis pace table's connection (docs/spec.md §6, "Outages"): the redis-py client built from the URI, every
call retried once at once on a lost connection, redis errors turned into :class:`~scrapy_polite.stores.base.
StoreError` (:class:`~scrapy_polite.stores.base.StoreUnavailable` when transient, waited out by the crawl),
scripts pipelined to their slots' nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis import exceptions as redis_errors
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from ..base import StoreError, StoreUnavailable
from .scripts import Script
from .uri import cluster_nodes

__all__ = ["Connection", "transient"]

T = TypeVar("T")

#: Error replies that mean "not now" rather than "never": the server is loading its data after a restart
#: (a ``BusyLoadingError``, a connection error), is a read-only replica or lost its master (a failover in
#: progress), its cluster is reconfiguring or unreachable, it cannot persist (``MISCONF``), or a script holds
#: it (``BUSY``). redis-py maps some replies to classes (and strips their code from the message), the others
#: by their code.
_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis_errors.ReadOnlyError, redis_errors.MasterDownError,
                                                  redis_errors.TryAgainError, redis_errors.ClusterError,
                                                  redis_errors.RedisClusterException)
_TRANSIENT_REPLIES = ("MISCONF", "BUSY ")


def transient(exc: BaseException) -> bool:
    """The error means the server cannot be reached right now (an outage to wait out), not a wrong setting."""
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError,
                        TimeoutError)):
        return not isinstance(exc, redis_errors.AuthenticationError)
    return isinstance(exc, _TRANSIENT_ERRORS) or (isinstance(exc, redis_errors.ResponseError)
                                                  and str(exc).startswith(_TRANSIENT_REPLIES))


def _node(host: str, port: int) -> ClusterNode:
    return ClusterNode(host, port)  # type: ignore[no-untyped-call]


class Connection:
    """The table's connection: its client and how a call runs on it.

    Args:
        uri: the table's URI without its ``layout=`` option.
        name: the table's URI as messages show it (its password hidden).
        cluster: the URI names a Redis Cluster.
        prefix: the table's key prefix (for messages).
        wait: seconds each call waits at most for the server.
        client: a ready ``redis.Redis`` or ``redis.cluster.RedisCluster`` (tests); built from ``uri`` when None
            (no I/O with one server; a cluster client learns the slots from the nodes).

    Attributes:
        client: the redis-py client (tests reach the server through it).
        cluster: a Redis Cluster.

    Raises:
        StoreError: the client cannot be built from the URI (the message says what to do).
    """

    def __init__(self, uri: str, *, name: str, cluster: bool, prefix: str, wait: float, client: Any = None) -> None:
        self.cluster = cluster
        self._uri = name
        self._prefix = prefix
        try:
            self.client = client if client is not None else self._connect(uri, wait)
        except (ValueError, redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            if cluster and not isinstance(exc, ValueError) and "db" not in str(exc):
                raise self.start_error(exc) from None
            raise StoreError(f"POLITE_STORE {self._uri!r} is not a Redis URL scrapy-polite can use: {exc}. Fix: "
                             "use redis://host:port/db, rediss://host:port/db or unix:///path/to/redis.sock?db=0 for "
                             "one server, redis+cluster://host:port[,host:port...] for a Redis Cluster.") from exc

    def _connect(self, uri: str, wait: float) -> Any:
        if self.cluster:
            first, others = cluster_nodes(uri)
            # The cluster client resends a command after a lost connection (to the slot's new owner after a
            # failover; once without waiting, redis-py >= 6; its default count in 5): safe, since every write
            # carries its idempotence record.
            return RedisCluster(url=first, startup_nodes=[_node(h, p) for h, p in others],
                                retry=Retry(NoBackoff(), 1), socket_timeout=wait, socket_connect_timeout=wait,
                                client_name="scrapy-polite")
        return redis.Redis.from_url(uri, socket_timeout=wait, socket_connect_timeout=wait,
                                    retry=Retry(NoBackoff(), 0), health_check_interval=30,
                                    client_name="scrapy-polite")

    def run(self, action: str, call: Callable[[], T]) -> T:
        """``call()``, retried once at once on a lost connection (a pooled connection the server closed);
        redis errors become :class:`StoreError` (:class:`StoreUnavailable` when transient). ``action``: the
        verb of the message (``read``, ``write``)."""
        try:
            try:
                return call()
            except (redis_errors.ConnectionError, ConnectionError) as exc:
                if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.BusyLoadingError)):
                    raise
                return call()
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            raise self.error(action, exc) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise self.error(action, exc) from exc

    def run_scripts(self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` of ``calls`` in one pipelined round trip (on a cluster, to each
        slot's node in parallel; each call atomic on its node) and return the replies (an error reply raises,
        after the others ran). A node that does not know the script gets it loaded, and the calls are sent
        again (each script is idempotent for its update)."""
        def call() -> list[Any]:
            for _ in range(2):
                pipe = self.client.pipeline(transaction=False)
                for keys, args in calls:  # execute_command: redis-py blocks pipe.evalsha on a cluster
                    # On a cluster, the slot's node named: else redis-py >= 6 asks a node for the keys first.
                    route = {"target_nodes": self.client.get_node_from_key(keys[0])} if self.cluster else {}
                    pipe.execute_command("EVALSHA", script.script.sha, len(keys), *keys, *args, **route)
                replies = list(pipe.execute(raise_on_error=False))
                if not any(isinstance(r, redis_errors.NoScriptError) for r in replies):
                    break
                self.client.script_load(script.text)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

        return self.run("write", call)

    def error(self, action: str, exc: BaseException) -> StoreError:
        """The store's error for a redis error met by ``action``: the message names the URI and the fix."""
        text = (str(exc) or type(exc).__name__).rstrip(".")
        if isinstance(exc, (redis_errors.AuthenticationError, redis_errors.AuthorizationError,
                            redis_errors.NoPermissionError)):
            return StoreError(f"scrapy-polite cannot {action} its pace table {self._uri}: {text}. Fix: give the "
                              "right user and password in POLITE_STORE (redis://user:password@host:port/db).")
        if transient(exc):
            cls = StoreUnavailable if action != "reach" else StoreError
            start = ("start the cluster's nodes there or point POLITE_STORE to reachable nodes "
                     "(redis+cluster://host:port,host:port)" if self.cluster else
                     "start Redis there (e.g. redis-server --port 6379) or point POLITE_STORE to a reachable "
                     "server (redis://host:port/db)")
            return cls(f"scrapy-polite cannot {action} its pace table {self._uri}: {text}. Fix: {start}.")
        return StoreError(f"scrapy-polite cannot {action} its pace table {self._uri}: {text}. Fix: point "
                          "POLITE_STORE to a Redis server (version 5 or later) whose keys under "
                          f"{self._prefix!r} only scrapy-polite writes, or change POLITE_STORE_PREFIX.")

    def start_error(self, exc: BaseException) -> StoreError:
        """The error of a server that cannot be used at start."""
        if self.cluster and "cluster mode is not enabled" in str(exc).lower():
            return StoreError(f"scrapy-polite cannot use its pace table {self._uri}: the server is not part of a "
                              "Redis Cluster. Fix: use redis://host:port/db for a single server.")
        return self.error("reach", exc)

    def refuse_a_cluster_node(self) -> None:
        """A ``redis://`` URL naming one node of a cluster would fail on every key of another node's slot:
        refused at start (a server that does not answer ``INFO cluster`` is taken for a single server)."""
        try:
            info = self.client.info("cluster")
        except redis_errors.ResponseError:
            return
        if str(info.get("cluster_enabled", "0")) == "1":
            self.client.close()
            raise StoreError(f"scrapy-polite cannot use its pace table {self._uri}: the server is a node of a Redis "
                             "Cluster, and a redis:// URL reaches that node only. Fix: name the cluster, "
                             "redis+cluster://host:port[,host:port...] (POLITE_STORE).")

    def close(self) -> None:
        self.client.close()
