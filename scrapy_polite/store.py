"""The pace table (SPEC §6): one store protocol, several backends.

* :class:`MemoryStore` — ``memory://``, for tests and one-off runs;
* :class:`SQLiteStore` — ``sqlite:///path`` (the embedded default, in the Scrapy project's ``.scrapy/``
  data dir): WAL journal, every read-modify-write one ``BEGIN IMMEDIATE`` transaction, so concurrent
  processes never lose an update; schema version in ``PRAGMA user_version``; stale rows expired.

A store that cannot be opened, read or written raises :class:`StoreError`, whose message names the store
and the fix: the crawl stops (fail closed), it never falls back to unpaced crawling.

:func:`open_store` builds a store from a ``POLITE_STORE`` URI. :class:`AsyncStore` runs a store's calls
off the reactor thread (one dedicated thread per store), so disk I/O never blocks the crawl.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from .policy import HostState

__all__ = [
    "PaceStore",
    "MemoryStore",
    "SQLiteStore",
    "AsyncStore",
    "StoreError",
    "StoreBusy",
    "open_store",
    "SCHEMA_VERSION",
]

T = TypeVar("T")

#: An update function: the host's state (None: no row) in, ``(new state or None to leave the row
#: untouched, a result for the caller)`` out. It must be pure: SQLite may call it more than once.
UpdateFn = Callable[[HostState | None], tuple[HostState | None, T]]

#: A multi-row update function: ``{key: state or None}`` in, ``({key: new state}, result)`` out.
ManyUpdateFn = Callable[[dict[str, HostState | None]], tuple[dict[str, HostState], T]]

#: The on-disk schema this code writes. Older versions are migrated on open, never discarded.
SCHEMA_VERSION = 1

_FIELDS = [f.name for f in fields(HostState)]


class StoreError(RuntimeError):
    """The pace table cannot be opened, read or written. The message names the store and the fix."""


class StoreBusy(StoreError):
    """A no-wait operation found the table locked by another writer; retry it where waiting is allowed."""


class PaceStore(Protocol):
    """What every backend provides. Host keys are :func:`scrapy_polite.policy.host_key` values; times are
    Unix epoch seconds.

    All methods raise :class:`StoreError` when the backend fails.
    """

    uri: str

    def get(self, host: str) -> HostState | None:
        """The host's state, or None."""

    def update(self, host: str, fn: UpdateFn[T]) -> T:
        """Atomically read the host's state, apply ``fn``, write the new state (when not None) and return
        ``fn``'s result. No concurrent update, from any process, is lost."""

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        """Atomically read the rows of ``keys`` (a dict key -> state or None), apply ``fn``, write the
        states it returns (a dict of the rows to write) and return its result. Used to book a request on
        its host and an address in one transaction (SPEC §3)."""

    def delete(self, host: str) -> bool:
        """Remove the host's row; True when there was one."""

    def items(self) -> Iterator[tuple[str, HostState]]:
        """Every ``(host, state)`` row, sorted by host."""

    def expire(self, before: float) -> int:
        """Remove rows last updated before ``before`` whose ``next_allowed`` has passed; return the count."""

    def close(self) -> None:
        """Release the backend."""


class MemoryStore:
    """An in-process pace table (``memory://``). Thread-safe; lost when the process ends."""

    def __init__(self) -> None:
        self.uri = "memory://"
        self._rows: dict[str, HostState] = {}
        self._lock = threading.Lock()

    def get(self, host: str) -> HostState | None:
        with self._lock:
            return self._rows.get(host)

    def update(self, host: str, fn: UpdateFn[T]) -> T:
        with self._lock:
            new, result = fn(self._rows.get(host))
            if new is not None:
                self._rows[host] = new
            return result

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        with self._lock:
            new, result = fn({key: self._rows.get(key) for key in keys})
            self._rows.update(new)
            return result

    def delete(self, host: str) -> bool:
        with self._lock:
            return self._rows.pop(host, None) is not None

    def items(self) -> Iterator[tuple[str, HostState]]:
        with self._lock:
            rows = sorted(self._rows.items())
        return iter(rows)

    def expire(self, before: float) -> int:
        with self._lock:
            stale = [h for h, s in self._rows.items() if s.updated < before and s.next_allowed < before]
            for host in stale:
                del self._rows[host]
            return len(stale)

    def close(self) -> None:
        pass


_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS hosts (
    host TEXT PRIMARY KEY,
    next_allowed REAL NOT NULL,
    consec INTEGER NOT NULL,
    crawl_delay REAL NOT NULL,
    ok_seen INTEGER NOT NULL,
    throttled_at REAL NOT NULL,
    updated REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS hosts_updated ON hosts (updated);
"""

# Migrations from version N to N+1, applied in order inside one transaction. Version 0 is an empty file.
_MIGRATIONS: dict[int, str] = {0: _SCHEMA_V1}


class SQLiteStore:
    """The embedded pace table: one SQLite file in WAL mode (SPEC §6).

    Args:
        path: the database file; its directory is created when missing.
        timeout: seconds to wait for another process's write lock before failing.

    Raises:
        StoreError: the file cannot be created, opened, migrated or written (unwritable directory,
            corrupt file, a schema newer than this version knows). The message names the path and the fix.
    """

    def __init__(self, path: str, *, timeout: float = 30.0, _nowait: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.uri = f"sqlite:///{self.path}"
        self._lock = threading.Lock()
        self._nowait = _nowait
        try:
            directory = os.path.dirname(self.path)
            os.makedirs(directory, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=0.0 if _nowait else timeout, isolation_level=None,
                                       check_same_thread=False)
            if _nowait:  # the sibling already set the file up; never checkpoint here (that may fsync)
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA wal_autocheckpoint=0")
                return
            self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            # Prove we can write now, not halfway through the crawl (fail closed at start).
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            raise self._error("open", exc) from exc

    def nowait(self) -> SQLiteStore:
        """A second connection to the same file that never waits for a lock: an operation that would wait
        raises :class:`StoreBusy` instead, and it never checkpoints the WAL (see :meth:`checkpoint`).
        :class:`AsyncStore` runs these on the reactor thread, where they take tens of microseconds."""
        return SQLiteStore(self.path, _nowait=True)

    def checkpoint(self) -> None:
        """Copy the WAL back into the database file (``PRAGMA wal_checkpoint(PASSIVE)``)."""
        try:
            with self._lock:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def _error(self, action: str, exc: BaseException) -> StoreError:
        text = str(exc)
        if self._nowait and isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return StoreBusy(text)
        if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
            fix = (f"the file is not a valid pace table; move it away (e.g. mv {self.path} {self.path}.bad) "
                   "to start a fresh one, or point POLITE_STORE to another file")
        elif isinstance(exc, StoreError):
            return exc
        else:
            fix = (f"make {os.path.dirname(self.path)} writable, or set POLITE_STORE to a writable location, "
                   "e.g. POLITE_STORE = 'sqlite:////var/tmp/polite.sqlite3' (or 'memory://' for a one-off run)")
        return StoreError(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: {fix}.")

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"scrapy-polite cannot open its pace table {self.uri}: schema version {version} is newer than "
                f"this scrapy-polite knows ({SCHEMA_VERSION}). Fix: upgrade scrapy-polite, or point "
                "POLITE_STORE to another file.")
        if version == SCHEMA_VERSION:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            while version < SCHEMA_VERSION:
                for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                    self._db.execute(statement)
                version += 1
                self._db.execute(f"PRAGMA user_version = {version}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    @staticmethod
    def _row_to_state(row: tuple[Any, ...] | None) -> HostState | None:
        if row is None:
            return None
        next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated = row
        return HostState(next_allowed=next_allowed, consec=consec, crawl_delay=crawl_delay,
                         ok_seen=bool(ok_seen), throttled_at=throttled_at, updated=updated)

    _SELECT = ("SELECT next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated "
               "FROM hosts WHERE host = ?")

    def get(self, host: str) -> HostState | None:
        try:
            with self._lock:
                return self._row_to_state(self._db.execute(self._SELECT, (host,)).fetchone())
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    def update(self, host: str, fn: UpdateFn[T]) -> T:
        def many(states: dict[str, HostState | None]) -> tuple[dict[str, HostState], T]:
            new, result = fn(states[host])
            return ({host: new} if new is not None else {}), result

        return self.update_many([host], many)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    states = {key: self._row_to_state(self._db.execute(self._SELECT, (key,)).fetchone())
                              for key in keys}
                    new, result = fn(states)
                    for key, state in new.items():
                        self._db.execute(
                            "INSERT OR REPLACE INTO hosts (host, next_allowed, consec, crawl_delay, ok_seen, "
                            "throttled_at, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (key, state.next_allowed, state.consec, state.crawl_delay, int(state.ok_seen),
                             state.throttled_at, state.updated))
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                return result
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def delete(self, host: str) -> bool:
        try:
            with self._lock:
                return self._db.execute("DELETE FROM hosts WHERE host = ?", (host,)).rowcount > 0
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def items(self) -> Iterator[tuple[str, HostState]]:
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT host, next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated "
                    "FROM hosts ORDER BY host").fetchall()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc
        return iter([(row[0], self._row_to_state(row[1:])) for row in rows])  # type: ignore[misc]

    def expire(self, before: float) -> int:
        try:
            with self._lock:
                return self._db.execute(
                    "DELETE FROM hosts WHERE updated < ? AND next_allowed < ?", (before, before)).rowcount
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_store(uri: str) -> PaceStore:
    """Build the store a ``POLITE_STORE`` URI names.

    Args:
        uri: ``memory://``; ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (SQLAlchemy's
            convention: three slashes, then the path); or a plain filesystem path (taken as SQLite).

    Raises:
        StoreError: an unknown scheme, or the store cannot be opened (see :class:`SQLiteStore`).
    """
    if uri == "memory://" or uri == "memory:":
        return MemoryStore()
    if uri.startswith("sqlite:///"):
        # SQLAlchemy's convention: sqlite:///relative/path, sqlite:////absolute/path
        path = uri[len("sqlite:///"):]
        if not path:
            raise StoreError(f"POLITE_STORE {uri!r} names no file. "
                             "Fix: e.g. POLITE_STORE = 'sqlite:///polite.sqlite3'.")
        return SQLiteStore(path)
    if "://" in uri:
        raise StoreError(f"POLITE_STORE {uri!r} has an unknown scheme. Fix: use 'sqlite:///path' or 'memory://'.")
    return SQLiteStore(uri)


class AsyncStore:
    """A store whose calls never block the reactor, and whose results are Twisted ``Deferred`` objects.

    * :class:`MemoryStore`: called inline (no I/O).
    * :class:`SQLiteStore`: first tried inline on a no-wait connection (a WAL transaction without fsync,
      tens of microseconds); when another writer holds the lock (:class:`StoreBusy`) or earlier calls are
      still queued, the call runs on the store's own thread, which may wait for the lock. The thread also
      checkpoints the WAL every ``checkpoint_every`` inline writes. Calls complete in call order.

    Args:
        store: the backend.
        reactor: the Twisted reactor (defaults to the installed one).
        checkpoint_every: inline writes between two WAL checkpoints.
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, checkpoint_every: int = 1000) -> None:
        from twisted.python.threadpool import ThreadPool

        if reactor is None:
            from twisted.internet import reactor as installed

            reactor = installed
        self.store = store
        self._reactor = reactor
        self._pool: ThreadPool | None = None
        self._inline: Any = None
        self._queued = 0
        self._writes = 0
        self._checkpoint_every = checkpoint_every
        if isinstance(store, MemoryStore):
            self._inline = store
        else:
            nowait = getattr(store, "nowait", None)
            if nowait is not None:
                self._inline = nowait()
            self._pool = ThreadPool(minthreads=1, maxthreads=1, name="scrapy-polite-store")
            self._pool.start()

    def call(self, name: str, *args: Any) -> Any:
        """Run the store's method ``name(*args)``; a Deferred of its result."""
        from twisted.internet import defer

        if self._inline is not None and not self._queued:
            try:
                result = getattr(self._inline, name)(*args)
            except StoreBusy:
                pass
            except Exception:
                return defer.fail()
            else:
                if name != "get" and self._pool is not None:
                    self._writes += 1
                    if self._writes % self._checkpoint_every == 0:
                        self._threaded("checkpoint").addErrback(lambda f: None)
                return defer.succeed(result)
        return self._threaded(name, *args)

    def _threaded(self, name: str, *args: Any) -> Any:
        from twisted.internet import threads

        assert self._pool is not None
        self._queued += 1

        def done(result: Any) -> Any:
            self._queued -= 1
            return result

        d = threads.deferToThreadPool(self._reactor, self._pool, getattr(self.store, name), *args)
        return d.addBoth(done)

    def get(self, host: str) -> Any:
        return self.call("get", host)

    def update(self, host: str, fn: UpdateFn[T]) -> Any:
        return self.call("update", host, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> Any:
        return self.call("update_many", keys, fn)

    def close(self) -> None:
        """Stop the thread (after the calls already queued), checkpoint and close the backend."""
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
            checkpoint = getattr(self.store, "checkpoint", None)
            if checkpoint is not None:
                try:
                    checkpoint()
                except StoreError:
                    pass
        if self._inline is not None and self._inline is not self.store:
            self._inline.close()
        self.store.close()


def now() -> float:
    """The wall clock, Unix epoch seconds (the one clock every process sharing a table agrees on)."""
    return time.time()
