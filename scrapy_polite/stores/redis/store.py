"""The Redis pace table (docs/spec.md §6): the store, composed of its connection (:mod:`.client`), its keys
(:mod:`.keys`), its scripts (:mod:`.scripts`), its update algorithms (:mod:`.updates`, :mod:`.sharded`) and its
event stream (:mod:`.events`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Literal, TypeVar

import redis
from redis import exceptions as redis_errors
from redis.cluster import RedisCluster

from ...policy import HostState
from ..base import (
    CallThreads,
    Event,
    ExpiringRows,
    KeyPrefixed,
    ManyUpdateFn,
    ServerClock,
    Snapshot,
    SteppedStore,
    StoreError,
    StoreOptions,
    UpdateFn,
    UpdateSteps,
)
from .client import Connection
from .codec import FIELDS, Row, decode
from .events import EventStream
from .keys import Keys
from .scripts import Scripts
from .sharded import ShardedUpdate
from .table import AsyncRedisStore
from .updates import DONE_MARGIN, OptimisticUpdate, PendingWrites, finish
from .uri import CLUSTER_SCHEMES, redact_uri, split_layout

__all__ = ["RedisStore"]

T = TypeVar("T")


class RedisStore(ServerClock, ExpiringRows, CallThreads, KeyPrefixed, SteppedStore):
    """The pace table in a Redis server or a Redis Cluster, shared by every process that uses the same URI
    and prefix (docs/spec.md §6).

    Args:
        uri: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``unix:///path/to/socket?db=N`` (redis-py's URL forms) for one server;
            ``redis+cluster://[[user]:password@]host:port[,host:port…][?options]`` or ``rediss+cluster://…``
            for a Redis Cluster (the nodes listed are where the client first learns the cluster's layout;
            one reachable is enough; database 0 only). Any of them takes the option ``layout=table`` (the
            default: one hash tag for the table) or ``layout=sharded`` (one per row; docs/scale.md).
        options: ``prefix`` (``POLITE_STORE_PREFIX``), ``timeout`` (``POLITE_STORE_TIMEOUT``, seconds; one
            call waits at most ``min(timeout, 5)`` seconds for the server; an idempotence record is kept
            ``timeout`` + :data:`~scrapy_polite.stores.redis.DONE_MARGIN` seconds) and ``expire``
            (``POLITE_STORE_EXPIRE``, seconds).
        client: a ready ``redis.Redis`` or ``redis.cluster.RedisCluster`` (tests); built from ``uri`` when None.

    Attributes:
        server: the connection (:class:`~scrapy_polite.stores.redis.client.Connection`: its ``client``).
        keys: the table's key names (:class:`~scrapy_polite.stores.redis.keys.Keys`).
        scripts: the Lua scripts, registered with the client (:class:`~scrapy_polite.stores.redis.scripts.Scripts`).
        pending: the updates whose write's outcome is unknown, for their retry.

    Raises:
        StoreError: the server cannot be reached, refuses the credentials, or is not a usable Redis (at
            construction: the crawl must not start) — also a cluster node named by ``redis://`` or a single
            server named by ``redis+cluster://``; an unknown ``layout``, or ``layout=sharded`` with a prefix that
            has a hash tag or holds a ``layout=table`` table. The message names the URI (password hidden) and
            the fix.
    """

    #: The table's clock is the server's (``TIME``): the pacer converts its due times to this process's clock.
    server_clock: Literal[True] = True
    #: Rows expire on the server (key TTLs): no sweep at start is needed.
    expires_rows: Literal[True] = True
    #: Threads of its async table: each call waits on the network, so two overlap their round trips; more
    #: only contend for the GIL (bench/distributed.py, 2 cores).
    threads = 2

    def __init__(self, uri: str, options: StoreOptions | None = None, *,
                 client: redis.Redis | RedisCluster | None = None) -> None:
        options = options or StoreOptions()
        self.uri = redact_uri(uri)
        try:
            uri, layout = split_layout(uri)
        except ValueError as exc:
            raise StoreError(f"POLITE_STORE {self.uri!r}: {exc}. Fix: layout=table (the default, one slot) or "
                             "layout=sharded (one slot per row: docs/scale.md).") from None
        #: The key layout (:data:`~scrapy_polite.stores.redis.LAYOUTS`): ``table`` or ``sharded``.
        self.layout = layout
        self.sharded = layout == "sharded"
        if self.sharded and "{" in options.prefix:
            raise StoreError(f"POLITE_STORE {self.uri!r} with layout=sharded and POLITE_STORE_PREFIX "
                             f"{options.prefix!r}: a prefix with a hash tag puts every row in one slot again. "
                             "Fix: a prefix without braces (e.g. 'crawl-a:'), or layout=table.")
        self.prefix = options.prefix
        self.expire_after = options.expire
        #: Seconds an update's idempotence record is kept (``POLITE_STORE_TIMEOUT`` + ``DONE_MARGIN``).
        self.done_ttl = max(0.0, options.timeout) + DONE_MARGIN
        self.events_max = max(0, int(options.events_max))
        #: The URI names a Redis Cluster (``redis+cluster://``): the cluster client, which follows the slots.
        self.cluster = (isinstance(client, RedisCluster) if client is not None
                        else uri.partition(":")[0].lower() in CLUSTER_SCHEMES)
        self.keys = Keys(self.prefix, sharded=self.sharded, cluster=self.cluster)
        self.server = Connection(uri, name=self.uri, cluster=self.cluster, prefix=self.prefix,
                                 wait=max(0.1, min(5.0, options.timeout)), client=client)
        self.scripts = Scripts(self.server.client)
        self.pending = PendingWrites()
        self._events = EventStream(self.server, self.keys.events, self.events_max, self.expire_after)
        self._check_server()

    def _check_server(self) -> None:
        """At construction: the server answers, is what the URI says (one server or a cluster), and a sharded
        table's prefix holds no ``table`` table."""
        client = self.server.client
        try:
            client.ping()
            if not self.cluster:
                self.server.refuse_a_cluster_node()
            if self.sharded and client.exists(self.keys.counter):
                client.close()
                raise StoreError(f"scrapy-polite cannot use its pace table {self.uri} with layout=sharded: the prefix "
                                 f"{self.prefix!r} holds a table of layout=table. Fix: another POLITE_STORE_PREFIX for "
                                 "the sharded table (its rows start empty), or drop layout=sharded.")
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            client.close()
            raise self.server.start_error(exc) from None  # the message says it all: one error, the URL, the fix

    def open_async(self, reactor: Any = None, *, threads: int | None = None) -> AsyncRedisStore:
        """Redis's async table (:class:`~scrapy_polite.stores.redis.AsyncRedisStore`): its calls on threads of
        its own (``threads``; None: :attr:`threads`), its updates step by step."""
        return AsyncRedisStore(self, reactor, threads=threads)

    # -- reads ------------------------------------------------------------------------------------------

    def read_rows(self, keys: Sequence[str], record: str | None = None) -> tuple[list[Row], float, bytes | None]:
        """The rows of ``keys``, the server's clock and, when ``record`` names an idempotence record, its value
        (None: absent), in one round trip (one script: atomic, on the node of the keys' slot)."""
        names = [*map(self.keys.row, keys), record or self.keys.routing(keys)]
        reply = self.server.run("read", partial(self.scripts.read, keys=names, args=["1" if record else "0", *FIELDS]))
        seconds, micros, found, *rows = reply
        return [decode(values) for values in rows], int(seconds) + int(micros) / 1e6, found

    def now(self) -> float:
        """The server's clock (``TIME`` on the node of the table's slot; ``sharded``: of the event log's slot),
        Unix epoch seconds."""
        if self.sharded:
            reply = self.server.run("read", partial(self.scripts.read, keys=[self.keys.events], args=["0", *FIELDS]))
            return int(reply[0]) + int(reply[1]) / 1e6
        return self.read_rows([])[1]

    def get(self, key: str) -> HostState | None:
        return self.read_rows([key])[0][0].state

    def read(self, keys: Sequence[str]) -> Snapshot:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`. ``sharded`` on a cluster: one
        atomic read per slot, in the order of
        :meth:`Keys.slot_groups <scrapy_polite.stores.redis.keys.Keys.slot_groups>`; the clock is that of the first
        key's slot."""
        keys = list(keys)
        if not keys:
            return Snapshot({}, self.now())
        states: dict[str, HostState | None] = {}
        now = 0.0
        for group in self.keys.slot_groups(keys):
            part = [keys[i] for i in group]
            rows, clock, _ = self.read_rows(part)
            if 0 in group:
                now = clock
            states.update({key: row.state for key, row in zip(part, rows)})
        return Snapshot({key: states[key] for key in keys}, now)

    # -- writes -----------------------------------------------------------------------------------------

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`: the steps of
        :meth:`update_steps`, sleeping between two (call it off the reactor)."""
        return finish(self.update_steps(key, fn))

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`: the steps of
        :meth:`update_many_steps`, sleeping between two (call it off the reactor)."""
        return finish(self.update_many_steps(keys, fn))

    def update_steps(self, key: str, fn: UpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`update` as :class:`~scrapy_polite.stores.base.UpdateSteps` that never sleep (docs/spec.md §6,
        "Redis: contention"); no I/O until the first step."""
        def many(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], T]:
            new, result = fn(states[key], now)
            return ({key: new} if new is not None else {}), result

        return (ShardedUpdate if self.sharded else OptimisticUpdate)(self, [key], many, fn)

    def update_many_steps(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`update_many` as :class:`~scrapy_polite.stores.base.UpdateSteps` that never sleep
        (docs/spec.md §6, "Redis: contention"); no I/O until the first step."""
        return (ShardedUpdate if self.sharded else OptimisticUpdate)(self, list(dict.fromkeys(keys)), fn, fn)

    def expiry_ms(self, state: HostState, now: float) -> int:
        """When the row's key expires: ``POLITE_STORE_EXPIRE`` after the later of now, its write and its
        ``next_allowed`` (Unix ms); 0 for never (an expiry beyond what Redis can hold)."""
        at = (max(now, state.updated, state.next_allowed, state.held_until) + self.expire_after) * 1000.0
        return int(at) + 1 if at < 2**62 else 0

    def delete(self, key: str) -> bool:
        return bool(self.server.run("write", lambda: self.server.client.delete(self.keys.row(key))))

    # -- the whole table --------------------------------------------------------------------------------

    def _scan(self) -> Iterator[list[tuple[str, Row]]]:
        """Every row, in batches, as ``(key, row)`` (``sharded`` on a cluster: node after node)."""
        pattern = self.keys.scan_pattern()
        for scanned in self._scanned():
            cursor = 0
            while True:
                cursor, names = self._scan_batch(scanned, cursor, pattern)
                if names:
                    rows = self.server.run("read", partial(self._hmget_all, names))
                    batch = [(self.keys.key_of(name), decode(values)) for name, values in zip(names, rows)]
                    yield [(key, row) for key, row in batch if row.state is not None]
                if cursor == 0:
                    break

    def _scanned(self) -> list[Any]:
        """The clients that ``SCAN`` runs on: on a cluster, the node that holds the table's slot (``sharded``:
        every primary)."""
        client = self.server.client
        if not self.cluster:
            return [client]
        if self.sharded:
            nodes = self.server.run("read", client.get_primaries)
            return [client.get_redis_connection(node) for node in nodes]
        return [client.get_redis_connection(client.get_node_from_key(self.keys.counter))]

    def _scan_batch(self, scanned: Any, cursor: int, pattern: str) -> tuple[int, list[str]]:
        next_cursor, names = self.server.run("read", lambda: scanned.scan(cursor, match=pattern, count=1000))
        return int(next_cursor), [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    def _hmget_all(self, names: list[str]) -> list[Any]:
        pipe = self.server.client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, FIELDS)
        return list(pipe.execute())

    def items(self) -> Iterator[tuple[str, HostState]]:
        rows = sorted((key, row.state) for batch in self._scan() for key, row in batch if row.state is not None)
        return iter(rows)

    def expire(self, before: float) -> int:
        removed = 0
        for batch in self._scan():
            stale = [(key, row) for key, row in batch if row.state is not None
                     and row.state.updated < before and row.state.next_allowed < before]
            for group in self.keys.slot_groups([k for k, _ in stale]) if stale else []:
                part = [stale[i] for i in group]
                removed += int(self.server.run("write", partial(
                    self.scripts.delete_if, keys=[self.keys.row(k) for k, _ in part],
                    args=[row.version for _, row in part])))
        return removed

    # -- the event log --------------------------------------------------------------------------------

    def append_events(self, events: Sequence[Event]) -> None:
        """See :meth:`EventStream.append <scrapy_polite.stores.redis.events.EventStream.append>`."""
        self._events.append(events)

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        """See :meth:`EventStream.read <scrapy_polite.stores.redis.events.EventStream.read>`."""
        return self._events.read(since, host, limit)

    def close(self) -> None:
        self.server.close()
