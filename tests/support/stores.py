"""The pace-table backends the shared store suite (``tests/test_store_protocol.py``) runs over: memory,
SQLite, Redis (the session's ``redis-server``) and a Redis Cluster (the session's three nodes).

:data:`BACKENDS` lists one :class:`Backend` per store; every test of the suite runs once per entry. To
add a backend (Redis), add one entry to that list, in this module (the fixtures' parameters are read
from it when this module is imported)::

    Backend("redis", _open_redis, persistent=True, injectable_clock=False, inline_async=False,
            cleanup=_flush_redis_prefix),

``open(location, clock, events_max)`` builds a store at ``location`` (a directory unique to the test; a server
backend can derive a unique key prefix from it) on ``clock`` (None: the backend's default clock), whose event
log keeps at most ``events_max`` events (None: the default cap). A
backend that cannot run here may call ``pytest.skip`` inside ``open``; ``cleanup(location)``, when
given, runs after the test (delete a server's keys).

Fixtures (import them into the test module: ``from tests.support.stores import any_store``):

* ``any_store`` — a :class:`StoreUnderTest` per backend;
* ``clocked_store`` — the backends whose clock can be injected (exact clock values);
* ``persistent_store`` — the backends that keep their rows when reopened.

:func:`write_version_1_file` writes an SQLite file as the first schema did, for the migration tests;
:func:`write_sqlite_file` one made by the statements given (another application's database);
:func:`set_up_under_way` holds a new table's set-up open, as another process opening it does.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from scrapy_polite.policy import HostState
from scrapy_polite.stores import DEFAULT_EVENTS_MAX, MemoryStore, PaceStore, SQLiteStore, StoreOptions

__all__ = ["T0", "FakeClock", "Backend", "BACKENDS", "StoreUnderTest", "any_store", "clocked_store",
           "persistent_store", "set_up_under_way", "write_sqlite_file",
           "write_version_1_file"]

#: The fake clock's start, Unix epoch seconds (2033): far from today's time.time(), so a store that reads
#: the real clock instead of the injected one is caught.
T0 = 2_000_000_000.0


def write_version_1_file(path: Any) -> HostState:
    """Write at ``path`` a pace-table file as schema version 1 wrote it (the ``hosts`` table only, without the
    quota's, the hold's or the event log's columns and tables) holding one row, of ``a.example``; returns that row
    as it reads once migrated."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE hosts (host TEXT PRIMARY KEY, next_allowed REAL NOT NULL, consec INTEGER NOT NULL,
            crawl_delay REAL NOT NULL, ok_seen INTEGER NOT NULL, throttled_at REAL NOT NULL,
            updated REAL NOT NULL) WITHOUT ROWID;
        CREATE INDEX hosts_updated ON hosts (updated);
        INSERT INTO hosts VALUES ('a.example', 1800000005.5, 3, 2.5, 1, 1800000001.0, 1800000002.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    return HostState(next_allowed=1800000005.5, consec=3, crawl_delay=2.5, ok_seen=True, throttled_at=1800000001.0,
                     updated=1800000002.0)


def write_sqlite_file(path: Any, *statements: str) -> bytes:
    """Write at ``path`` an SQLite database made by ``statements`` (another application's, or a pace table with a
    table of another beside it); returns the file's bytes."""
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()
    with open(path, "rb") as f:
        return f.read()


def set_up_under_way(path: Any) -> sqlite3.Connection:
    """A connection setting up a new pace table at ``path`` as another process's opening does: its write
    transaction (``BEGIN IMMEDIATE``) holds every table of the schema and its version, not committed yet (the caller
    commits it, or closes the connection to roll it back)."""
    from scrapy_polite.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")
    for version in range(SCHEMA_VERSION):
        for statement in filter(str.strip, MIGRATIONS[version].split(";")):
            db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return db


class FakeClock:
    """A clock that moves only when told: ``clock()`` is the time (epoch s); ``advance(seconds)``."""

    def __init__(self, t: float = T0) -> None:
        self.t = t
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass(frozen=True)
class Backend:
    """One pace-table backend of the suite.

    Attributes:
        name: the test id.
        open: ``open(location, clock, events_max) -> PaceStore``; ``clock`` None: the backend's own clock;
            ``events_max`` None: the default cap of the event log.
        persistent: a store reopened at the same location sees what an earlier one wrote.
        injectable_clock: ``open`` honours ``clock`` (False: the backend has a clock of its own, a server's).
        inline_async: its async table (``open_async()``) calls it on the reactor thread when it is
            not contended, so its Deferreds have fired when the call returns (but see ``grouped``).
        grouped: its updates are group-committed (docs/spec.md §6, "Group commit"): the calls of one reactor
            turn run in one transaction on the next turn, so their Deferreds fire then.
        cleanup: ``cleanup(location)`` after the test, or None.
    """

    name: str
    open: Callable[[str, Callable[[], float] | None, int | None], PaceStore]
    persistent: bool = False
    injectable_clock: bool = True
    inline_async: bool = False
    grouped: bool = False
    cleanup: Callable[[str], None] | None = None


def _open_memory(location: str, clock: Callable[[], float] | None, events_max: int | None = None) -> PaceStore:
    cap = DEFAULT_EVENTS_MAX if events_max is None else events_max
    return MemoryStore(clock=clock, events_max=cap) if clock is not None else MemoryStore(events_max=cap)


def _open_sqlite(location: str, clock: Callable[[], float] | None, events_max: int | None = None) -> PaceStore:
    path = os.path.join(location, "pace.sqlite3")
    cap = DEFAULT_EVENTS_MAX if events_max is None else events_max
    return SQLiteStore(path, clock=clock, events_max=cap) if clock is not None else SQLiteStore(path, events_max=cap)


def _redis_prefix(location: str) -> str:
    return f"test:{hashlib.sha1(location.encode()).hexdigest()[:16]}:"


def _open_redis(location: str, clock: Callable[[], float] | None, events_max: int | None = None) -> PaceStore:
    # The session's real redis-server (tests/support/redis_server.py); one key prefix per location.
    from scrapy_polite.stores.redis import RedisStore
    from tests.support.redis_server import session_redis_url

    return RedisStore(session_redis_url(), StoreOptions(
        prefix=_redis_prefix(location), events_max=DEFAULT_EVENTS_MAX if events_max is None else events_max))


def _flush_redis_prefix(location: str) -> None:
    import redis

    from tests.support.redis_server import session_redis_url

    client = redis.Redis.from_url(session_redis_url())
    try:
        for prefix in (_redis_prefix(location), _redis_prefix(location + "-other")):
            names = list(client.scan_iter(match=prefix + "*", count=1000))
            if names:
                client.delete(*names)
    finally:
        client.close()


def _open_redis_cluster(location: str, clock: Callable[[], float] | None, events_max: int | None = None
                        ) -> PaceStore:
    # The session's real Redis Cluster (tests/support/redis_cluster.py); one key prefix per location, whose
    # own hash tag spreads the tests' tables over the nodes (each table in one slot).
    from scrapy_polite.stores.redis import RedisStore
    from tests.support.redis_cluster import session_cluster_url

    return RedisStore(session_cluster_url(), StoreOptions(
        prefix=_cluster_prefix(location), events_max=DEFAULT_EVENTS_MAX if events_max is None else events_max))


def _cluster_prefix(location: str) -> str:
    return "{" + _redis_prefix(location).rstrip(":") + "}:"


def _flush_redis_cluster_prefix(location: str) -> None:
    from redis.cluster import RedisCluster

    from tests.support.redis_cluster import node_ports, session_cluster_url

    host, port = node_ports(session_cluster_url())[0]
    client = RedisCluster(host=host, port=port)  # the tests' clusters: loopback, no TLS
    try:
        for prefix in (_cluster_prefix(location), _cluster_prefix(location + "-other")):
            node = client.get_node_from_key(prefix)
            conn = client.get_redis_connection(node)
            names = list(conn.scan_iter(match=prefix + "*", count=1000))  # braces are no wildcard
            if names:
                conn.delete(*names)  # one tag: one slot, one node
    finally:
        client.close()


def _open_redis_sharded(location: str, clock: Callable[[], float] | None, events_max: int | None = None
                        ) -> PaceStore:
    # The session's redis-server, the table in the sharded layout (docs/scale.md): one hash tag per row.
    from scrapy_polite.stores.redis import RedisStore
    from tests.support.redis_server import session_redis_url

    return RedisStore(session_redis_url() + "?layout=sharded", StoreOptions(
        prefix=_redis_prefix(location), events_max=DEFAULT_EVENTS_MAX if events_max is None else events_max))


def _open_redis_cluster_sharded(location: str, clock: Callable[[], float] | None, events_max: int | None = None
                                ) -> PaceStore:
    # The session's Redis Cluster, the sharded layout: a table's rows on every node, a booking over two slots.
    from scrapy_polite.stores.redis import RedisStore
    from tests.support.redis_cluster import session_cluster_url

    return RedisStore(session_cluster_url() + "?layout=sharded", StoreOptions(
        prefix=_redis_prefix(location), events_max=DEFAULT_EVENTS_MAX if events_max is None else events_max))


def _flush_redis_cluster_sharded(location: str) -> None:
    from tests.support.redis_cluster import flush_cluster_prefix, session_cluster_url

    for prefix in (_redis_prefix(location), _redis_prefix(location + "-other")):
        flush_cluster_prefix(session_cluster_url(), prefix)


#: Every backend the shared suite runs over. Append one entry to add a backend.
BACKENDS: list[Backend] = [
    Backend("memory", _open_memory, persistent=False, injectable_clock=True, inline_async=True),
    Backend("sqlite", _open_sqlite, persistent=True, injectable_clock=True, inline_async=True, grouped=True),
    Backend("redis", _open_redis, persistent=True, injectable_clock=False, inline_async=False,
            cleanup=_flush_redis_prefix),
    Backend("redis-cluster", _open_redis_cluster, persistent=True, injectable_clock=False, inline_async=False,
            cleanup=_flush_redis_cluster_prefix),
    Backend("redis-sharded", _open_redis_sharded, persistent=True, injectable_clock=False, inline_async=False,
            cleanup=_flush_redis_prefix),
    Backend("redis-cluster-sharded", _open_redis_cluster_sharded, persistent=True, injectable_clock=False,
            inline_async=False, cleanup=_flush_redis_cluster_sharded),
]


@dataclass
class StoreUnderTest:
    """One backend opened for one test.

    Attributes:
        backend: the :class:`Backend`.
        location: where its rows live (a directory unique to the test).
        clock: the injected :class:`FakeClock`, or None when the backend keeps its own clock.
        store: the open store (the latest one after :meth:`reopen`).
    """

    backend: Backend
    location: str
    clock: FakeClock | None
    store: PaceStore = field(init=False)
    _opened: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = self.open()

    def open(self, *, clock: Callable[[], float] | None = None, location: str | None = None,
             events_max: int | None = None) -> PaceStore:
        """Another store on the same rows (or at ``location``), on this test's clock unless ``clock`` is
        given, with an event log capped at ``events_max`` (None: the default); closed at the end of the test."""
        where = location or self.location
        os.makedirs(where, exist_ok=True)
        store = self.backend.open(where, clock if clock is not None else self.clock, events_max)
        self._opened.append(store)
        return store

    def open_on_own_clock(self) -> PaceStore:
        """Another store on the same rows on the backend's default clock (``time.time()``, a server's)."""
        store = self.backend.open(self.location, None, None)
        self._opened.append(store)
        return store

    def reopen(self) -> PaceStore:
        """Close the store and open a new one at the same location (see :attr:`Backend.persistent`)."""
        self.store.close()
        self._opened.remove(self.store)
        self.store = self.open()
        return self.store

    def adopt(self, closer: Any) -> None:
        """Close ``closer`` (an AsyncStore, which also closes its backend) at the end, instead of the store."""
        if self.store in self._opened:
            self._opened.remove(self.store)
        self._opened.append(closer)

    def close(self) -> None:
        while self._opened:
            self._opened.pop().close()
        if self.backend.cleanup is not None:
            self.backend.cleanup(self.location)


def _handle(request: Any, tmp_path: Any) -> Any:
    backend: Backend = request.param
    clock = FakeClock() if backend.injectable_clock else None
    handle = StoreUnderTest(backend, str(tmp_path / backend.name), clock)
    return handle


def _ids(backend: Backend) -> str:
    return backend.name


@pytest.fixture(params=BACKENDS, ids=_ids)
def any_store(request: Any, tmp_path: Any) -> Any:
    """Every backend in turn, as a :class:`StoreUnderTest`."""
    handle = _handle(request, tmp_path)
    yield handle
    handle.close()


@pytest.fixture(params=[b for b in BACKENDS if b.injectable_clock], ids=_ids)
def clocked_store(request: Any, tmp_path: Any) -> Any:
    """The backends whose clock is the injected :class:`FakeClock` (``handle.clock``)."""
    handle = _handle(request, tmp_path)
    yield handle
    handle.close()


@pytest.fixture(params=[b for b in BACKENDS if b.persistent], ids=_ids)
def persistent_store(request: Any, tmp_path: Any) -> Any:
    """The backends whose rows outlive the store object (reopen sees them)."""
    handle = _handle(request, tmp_path)
    yield handle
    handle.close()
