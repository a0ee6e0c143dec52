"""``sqlite:///path``: the embedded pace table, one SQLite file in WAL mode (docs/spec.md §6): the store.

Every read-modify-write runs inside a ``BEGIN IMMEDIATE`` transaction (alone, or with the others of its
group: :meth:`SQLiteStore.run_group`, docs/spec.md §6 "Group commit"), so concurrent processes on one machine
never lose an update; the clock (the monotonic process clock, :data:`~scrapy_polite.clock.process_clock`, on
the anchor every opener of this boot shares: docs/spec.md §6, "One clock per file") is read inside the
transaction.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ...clock import process_clock
from ...policy import HostState
from ..base import (
    DEFAULT_EVENTS_MAX,
    Event,
    ManyUpdateFn,
    Snapshot,
    StoreError,
    UpdateFn,
)
from . import checkpoints, rows, schema
from .marks import Mark, Recovery, WriteBehind, keep_clock, table_clock
from .table import GROUP_MAX, WRITE_BEHIND, AsyncSQLiteStore

__all__ = ["FOLLOW_EVERY", "SQLiteStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two looks at the path (one ``stat``), to find a file deleted or replaced under the crawl.
FOLLOW_EVERY = 0.25


class _Statements:
    """The pace table's statements outside the operations of :mod:`.rows` (the ``hosts`` table's queries, deletions
    and expiry) and the event log's, on :class:`SQLiteStore`'s connection under its lock."""

    _lock: threading.Lock
    _db: sqlite3.Connection
    _rows: rows.Rows

    events_max: int

    if TYPE_CHECKING:
        def _error(self, action: str, exc: BaseException) -> StoreError: ...

        def _write(self, body: Callable[..., T], *args: Any, group: bool = False) -> T: ...

    def _query(self, sql: str, *args: Any) -> list[Any]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    def _change(self, sql: str, *args: Any) -> int:
        """Run ``sql`` that changes rows (its own transaction); the rows' cache is dropped."""
        try:
            with self._lock:
                self._rows.forget()
                return int(self._db.execute(sql, args).rowcount)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def backing_off(self, now: float) -> Iterator[tuple[str, HostState]]:
        """The host rows (not ``ip:`` rows) still backing off at ``now`` (``consec > 0`` and ``next_allowed >
        now``), sorted by host: one query, without reading the rest of the table into memory.

        Raises:
            StoreError: the file cannot be read.
        """
        return iter(rows.keyed(self._query(f"SELECT host, {rows.COLUMNS} FROM hosts WHERE consec > 0 AND "
                                           "next_allowed > ? AND host NOT LIKE 'ip:%' ORDER BY host", now)))

    def delete(self, key: str) -> bool:
        return self._change("DELETE FROM hosts WHERE host = ?", key) > 0

    def items(self) -> Iterator[tuple[str, HostState]]:
        return iter(rows.keyed(self._query(f"SELECT host, {rows.COLUMNS} FROM hosts ORDER BY host")))

    def expire(self, before: float) -> int:
        return self._change("DELETE FROM hosts WHERE updated < ? AND next_allowed < ?", before, before)

    def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        try:
            self._write(rows.append_events, events, self.events_max)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        if limit <= 0:
            return []
        try:
            with self._lock:
                return rows.select_events(self._db, since, host, limit)
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc


class SQLiteStore(_Statements):
    """The embedded pace table: one SQLite file in WAL mode.

    Args:
        path: the database file; its directory is created when missing.
        timeout: seconds to wait for another process's write lock before failing.
        nowait: a connection that never waits for a lock (an operation that would wait raises
            :class:`StoreBusy`) and never checkpoints the WAL; use :meth:`nowait` to make one.
        clock: this process's clock, epoch seconds: the monotonic process clock by default. The table's clock,
            read inside each transaction, is this clock minus :attr:`clock_offset`, so the store's ``now`` never
            goes backwards in a process, ignores steps of the wall clock, and is one clock for every process of
            this machine's boot that opens the file (docs/spec.md §6, "One clock per file"; tests inject one).
        events_max: the most events the event log keeps (``POLITE_EVENT_LOG_SIZE``); an append beyond it
            deletes the oldest.
        mark: leave a "running" mark in the file while open, removed by :meth:`close` (docs/spec.md §6,
            "After a crash"); the connection :meth:`nowait` makes beats its opener's.

    Attributes:
        clock_offset: seconds, this process's clock minus the table's (:func:`~.marks.table_clock`), fixed while
            the store is open: 0 for the first crawl to open the file, the wall clock's steps between its
            anchor and this process's for a process started after them.
        recovery: what the opening found of an unclean stop (:class:`Recovery`), or None (every earlier
            opener closed cleanly, or is still running).
        write_transactions: (class attribute) the write transactions of every SQLiteStore of this process, about
            (not locked): ``bench/overhead.py`` prints it per page.

    Raises:
        StoreError: the file cannot be created, opened, migrated or written (unwritable directory,
            corrupt file, a schema newer than this version knows, another connection's lock held past
            ``timeout`` seconds). The message names the path and the fix.
    """

    write_transactions: ClassVar[int] = 0

    def __init__(self, path: str, *, timeout: float = 30.0, nowait: bool = False,
                 clock: Callable[[], float] = process_clock, events_max: int = DEFAULT_EVENTS_MAX,
                 mark: bool = False, _token: str | None = None, _offset: float | None = None) -> None:
        self.path = os.path.abspath(path)
        self.uri = f"sqlite:///{self.path}"
        self.recovery: Recovery | None = None
        #: This connection's "running" mark (a no-wait connection beats its opener's).
        self._mark = Mark(_token)
        #: Held by every use of the connection, and by :meth:`close`: a call never meets a connection being
        #: closed on another thread, and a call after the close raises :class:`StoreClosed`.
        self._lock = threading.Lock()
        self._closed = False
        self._nowait = nowait
        self._timeout = timeout
        self._process_clock = clock
        self._shift(_offset or 0.0)
        #: The file the connection has open (device, inode), and when the path was last looked at
        #: (:meth:`_follow`, ``time.monotonic``).
        self._file: tuple[int, int] | None = None
        self._looked = time.monotonic()
        #: The connection's write-behind window (:class:`~.marks.WriteBehind`; off until the crawl's async table sets
        #: its ``seconds`` on its no-wait connection).
        self.behind = WriteBehind(self._mark)
        self.events_max = max(0, int(events_max))
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._db = schema.connect(self.path, 0.0 if nowait else timeout)
            #: The connection's rows, read through its cache (:class:`~.rows.Rows`).
            self._rows = rows.Rows(self._db)
            #: The database's page size, bytes (a WAL frame holds one page).
            self.page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
            self._file = schema.file_id(self.path)
            if nowait:  # the connection it was made beside already set the file up
                schema.set_up_nowait(self._db)
                return
            schema.set_up(self._db, self.uri, timeout)
            # Prove we can write now, not halfway through the crawl (fail closed at start); read the table's
            # clock, look for the marks of unclean stops and leave ours, in the same transaction.
            with self._opening():
                owner = mark and _token is None
                if _offset is None:
                    self._shift(table_clock(self._db, clock, owner=owner))
                if owner:
                    self.recovery = self._mark.leave(self._db, self._clock(), self.uri)
            self._rows.forget()  # (the repair wrote rows on this connection: nothing is cached from before it)
        except (sqlite3.Error, OSError) as exc:
            raise self._error("open", exc) from exc

    def _shift(self, offset: float) -> None:
        """Read the table's clock ``offset`` seconds behind this process's (:attr:`clock_offset`)."""
        clock = self._process_clock
        self.clock_offset = offset
        self._clock: Callable[[], float] = clock if offset == 0 else (lambda: clock() - offset)

    @contextlib.contextmanager
    def _opening(self, db: sqlite3.Connection | None = None) -> Iterator[None]:
        """The opening's write transaction on ``db`` (the store's connection, or one to a new file at its path):
        ``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back when it raises."""
        db = db or self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def nowait(self) -> SQLiteStore:
        """A second connection to the same file that never waits for a lock: an operation that would wait
        raises :class:`StoreBusy` instead, and it never checkpoints the WAL (see :meth:`checkpoint`).
        :class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore` runs these on the reactor thread (tens of µs)."""
        return SQLiteStore(self.path, nowait=True, clock=self._process_clock, events_max=self.events_max,
                           _token=self._mark.token, _offset=self.clock_offset)

    def sibling(self) -> SQLiteStore:
        """Another connection to the same file that waits for the lock like this one (for a thread of its
        own: :class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore` writes the event log through one)."""
        return SQLiteStore(self.path, clock=self._process_clock, events_max=self.events_max, mark=False,
                           _offset=self.clock_offset)

    def open_async(self, reactor: Any = None, *, restart_frames: int = 8192, event_chunk: int = 250,
                   group_max: int = GROUP_MAX, write_behind: float = WRITE_BEHIND) -> AsyncSQLiteStore:
        """SQLite's async table (:class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore`: group commit, write-behind,
        its own thread and WAL checkpoints, with its options)."""
        return AsyncSQLiteStore(self, reactor, restart_frames=restart_frames, event_chunk=event_chunk,
                                group_max=group_max, write_behind=write_behind)

    def wal_pages(self) -> int:
        """The most pages the WAL has held since its file was made: its file's size (one ``stat``; the
        file is reused, not cut, when the WAL starts over), read beside the real file SQLite opened (a
        symbolic link is followed). 0 when there is no WAL file."""
        try:
            size = os.stat(os.path.realpath(self.path) + "-wal").st_size
        except OSError:
            return 0
        return max(0, size - 32) // (self.page_size + 24)  # a 32-byte header, a 24-byte one per frame

    def checkpoint(self, *, restart_wait: float | None = None) -> tuple[int, int]:
        """Copy the WAL back into the database file and sync it (:func:`~.checkpoints.checkpoint`, whose
        ``restart_wait`` and result it has), under the connection's lock.

        Raises:
            StoreError: the file cannot be written.
        """
        try:
            with self._lock:
                return checkpoints.checkpoint(self._db, restart_wait,
                                              busy_timeout=0.0 if self._nowait else self._timeout)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def _error(self, action: str, exc: BaseException) -> StoreError:
        # (self._closed is set under the lock before the connection was closed: the call found it closed)
        return schema.store_error(self.path, action, exc, closed=self._closed, nowait=self._nowait)

    def _follow(self) -> None:
        """Under the connection's lock: when the path names another file than the one open (deleted, or replaced
        under the crawl), open the file at the path (:func:`~scrapy_polite.stores.sqlite.schema.open_new_file`;
        docs/spec.md §6, "A table that comes back empty": the crawl's TableWatch then writes back what it knows).
        Callers look once per :data:`FOLLOW_EVERY` s at most (one ``stat``); a failed switch is looked at again at
        the next call, so nothing is written to the old file (a no-wait connection: StoreBusy meanwhile)."""
        if self._closed:
            return
        found = schema.file_id(self.path)
        if found != self._file:
            db = None
            try:
                db = schema.open_new_file(self.path, self.uri, self._timeout, nowait=self._nowait)
                if not self._nowait and self._mark.owned:  # our mark and clock in it, before any write of ours
                    with self._opening(db):
                        keep_clock(db, self._process_clock, self.clock_offset, replace=False)
                        self._mark.write(db, self._clock())
            except BaseException:
                if db is not None:
                    db.close()
                self._looked = -math.inf  # owed: looked at again at the next call, nothing written to the old file
                raise
            logger.warning("scrapy-polite: the pace table file %s was %s under the running crawl; opening the file "
                           "now at that path", self.path, "deleted" if found is None else "replaced")
            self._db.close()
            self._db, self._rows, self._file = db, rows.Rows(db), schema.file_id(self.path)
        self._looked = time.monotonic()

    def _write(self, body: Callable[..., T], *args: Any, group: bool = False) -> T:
        """``body(*args, rows, clock)`` (:class:`~.rows.Rows`) in ``BEGIN IMMEDIATE`` … ``COMMIT`` under the lock
        (after a look at the path, at most every :data:`FOLLOW_EVERY` seconds); rolled back when it raises, and then
        the rows' cache is dropped. A ``group`` may be written behind (:class:`~.marks.WriteBehind`); anything else
        commits an open window first."""
        with self._lock:
            behind = self.behind
            if behind.open and not group:
                self._commit_window()
            db, table = self._db, self._rows
            if not behind.open:
                if time.monotonic() - self._looked >= FOLLOW_EVERY:
                    self._follow()
                    db, table = self._db, self._rows
                db.execute("BEGIN IMMEDIATE")
                SQLiteStore.write_transactions += 1
                table.begin()
            table.holds = False
            try:
                if group and not behind.open:  # (a transaction this group began: its mark beaten once in it)
                    if self._mark.token is not None:
                        self._mark.beat(db, self._clock)
                    behind.begin(db, table)
                result = body(*args, table, self._clock)
                if not behind.open:
                    db.execute("COMMIT")
                else:
                    behind.after(db, table)
            except BaseException:
                behind.abort()
                self._roll_back()
                raise
        return result

    def _roll_back(self) -> None:
        """Roll the connection's transaction back, if one is open, and drop the rows' cache."""
        self._rows.forget()
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _commit_window(self) -> bool:
        """Under the lock: commit the write-behind window, if one is open (True when it did); one whose commit fails
        is rolled back, and lost."""
        try:
            return self.behind.commit(self._db)
        except BaseException:
            self._roll_back()
            raise

    def commit_window(self) -> bool:
        """Commit the write-behind window, if one is open: True when it did.

        Raises:
            StoreError: the file cannot be written (the window is lost: :attr:`WriteBehind.lost
                <.marks.WriteBehind.lost>`).
        """
        try:
            with self._lock:
                return self._commit_window()
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def keep_mark(self) -> None:
        """Leave this opener's mark at the close, as an unclean stop leaves it: a write-behind window was lost, so
        the next opening treats every row as just booked (docs/spec.md §6, "Write-behind")."""
        self._mark.kept = True

    # -- running operations ------------------------------------------------------------------------------------

    def run_group(self, ops: Sequence[rows.Op[Any]]) -> list[tuple[bool, Any]]:
        """Run several callers' operations (:data:`~scrapy_polite.stores.sqlite.rows.Op`) in **one** ``BEGIN
        IMMEDIATE`` transaction, in order: the group commit of docs/spec.md §6 ("Group commit"). Each row is read
        inside the transaction (after the writes of the operations before it in the group), so no other
        process's write is overwritten with stale data; each caller's function gets the store's clock read at
        its turn. The opener's mark is beaten in the transaction the group begins (at most once a second).

        Returns:
            One ``(True, result)`` or ``(False, exception)`` per operation, in order. An operation whose function
            raises (or an ``update_many`` writing a key it did not read, or a row SQLite refuses: a
            :class:`StoreError`) writes nothing and gets its own exception; the others' writes commit.

        Raises:
            StoreBusy: a no-wait connection found another writer's lock (nothing ran; retry on a waiting one).
            StoreError: the file cannot be written (the whole group is rolled back: no call took effect).
        """
        try:
            return self._write(self._group, ops, group=True)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def _group(self, ops: Sequence[rows.Op[Any]], table: rows.Rows,
               clock: Callable[[], float]) -> list[tuple[bool, Any]]:
        """:meth:`run_group` in its transaction (a failure of the file propagates: all is rolled back)."""
        outcomes: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                outcomes.append((True, op(table, clock)))
            except rows.REFUSALS as exc:  # a row SQLite refuses (a NaN in a NOT NULL column...): this call's own
                outcomes.append((False, StoreError(f"the pace table {self.path} refused a row: {exc}")))
            except sqlite3.Error:
                raise  # the file's failure (locked, full, damaged): the whole group is rolled back
            except Exception as exc:  # the caller's own failure: handed to its caller, the group goes on
                outcomes.append((False, exc))
        return outcomes

    def run_alone(self, op: Callable[..., T], *args: Any) -> T:
        """``op(*args, rows, clock)`` (an :data:`~scrapy_polite.stores.sqlite.rows.Op`, or the body of one
        and its arguments) in a transaction of its own: its result, or its exception (nothing written).

        Raises:
            StoreError: the file cannot be written, or it refused a row (as in :meth:`run_group`).
        """
        try:
            return self._write(op, *args)
        except rows.REFUSALS as exc:
            if self._closed:  # (the transaction's start found the connection closed: not a row's refusal)
                raise self._error("write", exc) from exc
            raise StoreError(f"the pace table {self.path} refused a row: {exc}") from exc
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def run_read(self, op: Callable[..., T], *args: Any) -> T:
        """``op(*args, rows, clock)``, an operation that only reads (:class:`~.rows.Rows`), outside a transaction.

        Raises:
            StoreError: the file cannot be read (:class:`StoreBusy` on a no-wait connection that met a lock).
        """
        try:
            with self._lock:
                if not self.behind.open and time.monotonic() - self._looked >= FOLLOW_EVERY:
                    self._follow()
                self._rows.begin()
                return op(*args, self._rows, self._clock)
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    # -- the protocol ------------------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def get(self, key: str) -> HostState | None:
        return self.run_read(rows.get_op, key)

    def read(self, keys: Sequence[str]) -> Snapshot:
        return self.run_read(rows.read_op, keys)

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        result: T = self.run_alone(rows.update_op, key, fn)
        return result

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        result: T = self.run_alone(rows.update_many_op, keys, fn)
        return result

    def close(self) -> None:
        """Close the connection (idempotent), first removing this opener's "running" mark (a clean stop;
        another opener's mark stays: docs/spec.md §6, "After a crash"). It waits for a call in progress on
        another thread; a call after it raises :class:`StoreClosed` and writes nothing. A mark that cannot be
        removed (the file is locked for ``timeout`` seconds, or unwritable) is left: the next opening then
        treats the last rows as just booked, which is only more polite."""
        with self._lock:
            if self._closed:
                return
            try:
                self._commit_window()  # (the async table commits it first: a last resort)
            except sqlite3.Error as exc:
                raise self._error("write", exc) from exc
            finally:
                self._mark.remove(self._db, self.uri)
                self._closed = True
                self._db.close()

