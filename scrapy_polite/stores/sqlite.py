"""``sqlite:///path``: the embedded pace table, one SQLite file in WAL mode (docs/spec.md §6).

Every read-modify-write runs inside a ``BEGIN IMMEDIATE`` transaction (alone, or with the others of its
group: :meth:`SQLiteStore.run_group`, docs/spec.md §6 "Group commit"), so concurrent processes on one machine
never lose an update; the clock (the monotonic process clock, :data:`~scrapy_polite.clock.process_clock`)
is read inside the transaction. The schema version is
kept in ``PRAGMA user_version`` and older files are migrated on open, never discarded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from scrapy.utils.asyncio import CallLaterResult
from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..clock import process_clock
from ..policy import HostState, state_from_fields
from ..reactor import next_turn_scheduler
from .asyncstore import ThreadedStore
from .base import (
    DEFAULT_EVENTS_MAX,
    Event,
    ManyUpdateFn,
    PaceStore,
    Snapshot,
    StoreBusy,
    StoreClosed,
    StoreCorrupt,
    StoreError,
    UpdateFn,
)

__all__ = ["AsyncSQLiteStore", "CRASH_WINDOW", "GROUP_MAX", "RESTART_WAIT", "Recovery", "SQLiteStore", "SCHEMA_VERSION"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The on-disk schema this code writes. Older versions are migrated on open, never discarded.
#: 1: the ``hosts`` table; 2: the ``events`` table beside it (the event log); 3: the hosts' announced quotas
#: (``ratelimit_interval``, ``ratelimit_until``); 4: what ``scrapy polite audit`` checks, in the event log
#: (``interval``, ``ip_interval``, ``hold``, ``seq``; None in the events written before), and the quota booking
#: (``quota_left``, ``quota_reset``, ``quota_limit``, ``quota_window``, ``quota_serial``, ``booked``),
#: adaptive pacing's ``latency`` and ``strain``, and the largest Retry-After of a host's throttle run
#: (``run_retry_after``).
#: 5: the ``openers`` table, one "running" mark per connection that opened the file (the crash window,
#: docs/spec.md §6 "After a crash").
#: 6: the in-flight hold of a host's and an address's row (``held_until``, ``held_by``: docs/spec.md §3, "In
#: flight"), and the table's identity (table ``identity``, one random id written when the file is created:
#: docs/spec.md §6, "A table that comes back empty").
SCHEMA_VERSION = 6

#: Seconds before an unclean stop within which a row's change may have been lost with it (docs/spec.md §6,
#: "After a crash"): such rows are treated as just booked when the table is next opened.
CRASH_WINDOW = 5.0

#: Seconds between two heartbeats of an opener's mark (written inside a group commit, at most this often).
BEAT_EVERY = 1.0

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

#: The event log (:class:`~scrapy_polite.stores.base.Event`): ids grow with each append, and only the oldest
#: (lowest ids) are ever deleted, so ``max(id) - cap`` is where the cap cuts. No other index: each would cost
#: every append more than it saves the operator's reads (a scan of the 100,000 events of a full log by id).
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    host TEXT NOT NULL,
    url TEXT,
    status INTEGER,
    delay REAL,
    due REAL,
    reason TEXT,
    retry_after REAL,
    steps INTEGER,
    address TEXT,
    started REAL,
    source TEXT NOT NULL
);
"""

#: The hosts' announced quotas (docs/spec.md §2): rows written before them have none (0).
_SCHEMA_V3 = """
ALTER TABLE hosts ADD COLUMN ratelimit_interval REAL NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN ratelimit_until REAL NOT NULL DEFAULT 0;
"""

#: What ``scrapy polite audit`` checks (:class:`~scrapy_polite.stores.base.Event`): events written before have
#: none (NULL). The quota booking (docs/spec.md §2, "Quota booking"): rows written before it know no quota (-1
#: left). Adaptive pacing (docs/spec.md §2, "Adaptive pacing"): rows written before it have no latency
#: measured (0). The largest Retry-After of a host's throttle run (docs/spec.md §2): rows written before it have
#: none (0: the backoff is not capped by a Retry-After, as before).
_SCHEMA_V4 = """
ALTER TABLE events ADD COLUMN interval REAL;
ALTER TABLE events ADD COLUMN ip_interval REAL;
ALTER TABLE events ADD COLUMN hold REAL;
ALTER TABLE events ADD COLUMN seq INTEGER;
ALTER TABLE hosts ADD COLUMN quota_left INTEGER NOT NULL DEFAULT -1;
ALTER TABLE hosts ADD COLUMN quota_reset REAL NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN quota_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN quota_window REAL NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN quota_serial INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN booked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN latency REAL NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN strain INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN run_retry_after REAL NOT NULL DEFAULT 0;
"""

#: The "running" marks (docs/spec.md §6, "After a crash"): one row per connection that opened the file (a
#: crawl, a command), removed by its clean close; ``beat`` is its last heartbeat (the store's clock).
_SCHEMA_V5 = """
CREATE TABLE IF NOT EXISTS openers (
    token TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    machine TEXT NOT NULL,
    boot TEXT NOT NULL DEFAULT '',
    started INTEGER NOT NULL DEFAULT 0,
    opened REAL NOT NULL,
    beat REAL NOT NULL
) WITHOUT ROWID;
"""

#: The in-flight hold (rows written before it are not held) and the table's identity, one random id (docs/spec.md
#: §6, "A table that comes back empty"): a file that existed before it gets its id when it is migrated.
_SCHEMA_V6 = """
ALTER TABLE hosts ADD COLUMN held_until REAL NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN held_by INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS identity (id TEXT NOT NULL);
INSERT INTO identity (id) SELECT lower(hex(randomblob(16))) WHERE NOT EXISTS (SELECT 1 FROM identity)
"""

#: Seconds between two looks at the path (one ``stat``), to find a file deleted or replaced under the crawl.
FOLLOW_EVERY = 0.25


def _file_id(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


#: Migrations from version N to N+1, applied in order inside one transaction. Version 0 is an empty file.
_MIGRATIONS: dict[int, str] = {0: _SCHEMA_V1, 1: _SCHEMA_V2, 2: _SCHEMA_V3, 3: _SCHEMA_V4, 4: _SCHEMA_V5,
                               5: _SCHEMA_V6}

#: An unclean stop's repair: every row changed since ``?`` (the window's start) is treated as just booked at
#: ``?`` (the opening): its next allowed moment is at least the opening plus its interval as the row knows
#: it (the wait its last change left, its Crawl-delay, its announced quota's interval).
_REPAIR = ("UPDATE hosts SET next_allowed = MAX(next_allowed, :now + MAX(next_allowed - updated, crawl_delay, "
           "ratelimit_interval, 0)), updated = MAX(updated, :now) WHERE updated >= :since")


_EVENT_COLUMNS = ("at, kind, host, url, status, delay, due, reason, retry_after, steps, address, started, source, "
                  "interval, ip_interval, hold, seq")
_EVENT_INSERT = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES ({', '.join('?' * len(Event._fields))})"
_EVENT_TRIM = "DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?"

#: The ``hosts`` columns after ``host``, one per :class:`HostState` field, in this order.
_HOST_FIELDS = ("next_allowed", "consec", "crawl_delay", "ok_seen", "throttled_at", "updated", "ratelimit_interval",
                "ratelimit_until", "quota_left", "quota_reset", "quota_limit", "quota_window", "quota_serial", "booked",
                "latency", "strain", "run_retry_after", "held_until", "held_by")
if set(_HOST_FIELDS) != {f.name for f in dataclasses.fields(HostState)}:  # pragma: no cover - a development error
    raise AssertionError("every HostState field needs a column in _HOST_FIELDS (and a migration)")
_COLUMNS = ", ".join(_HOST_FIELDS)
_SELECT_ONE = f"SELECT {_COLUMNS} FROM hosts WHERE host = ?"
_WRITE = f"INSERT OR REPLACE INTO hosts (host, {_COLUMNS}) VALUES ({', '.join(['?'] * (len(_HOST_FIELDS) + 1))})"


@dataclasses.dataclass(frozen=True)
class Recovery:
    """What :class:`SQLiteStore` found and did when it opened a table left by an unclean stop (docs/spec.md
    §6, "After a crash").

    Attributes:
        pids: the processes (on this machine) whose mark was left: they stopped without closing the table.
        last_seen: the earliest last heartbeat of those marks (the store's clock, epoch seconds).
        since: the window's start, ``last_seen - CRASH_WINDOW``: every row changed since was treated as just
            booked.
        opened: the opening moment (the store's clock).
        rows: how many rows were treated as just booked.
    """

    pids: tuple[int, ...]
    last_seen: float
    since: float
    opened: float
    rows: int


#: This process's open marks (tokens): a mark with this process's pid and start time that is not among them
#: was left by a store of this process that was never closed, which is still running.
_OPEN_TOKENS: set[str] = set()


def _boot_id() -> str:
    """This boot of the machine's kernel (Linux ``/proc/sys/kernel/random/boot_id``), or ``""`` when unknown:
    a mark of another boot was left by a process that is gone (a reboot, a power loss)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), 0 when this
    system does not say (no ``/proc``), None when ``pid`` runs no process or a zombie (killed, not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else 0
    except OSError:
        return 0
    try:
        return None if fields[0] == "Z" else int(fields[19])
    except (IndexError, ValueError):
        return 0


def _gone(pid: int, boot: str, started: int, my_boot: str) -> bool:
    """A mark's process is gone: another boot of this machine left it, or no process ``pid`` runs, or the
    one that runs started at another moment (the pid was reused: a restarted container's pid 1 too). Two
    processes whose pids live in different PID namespaces (containers) must not share one file on one
    hostname: each would take the other's live mark for gone (the harm: a host held an interval, a warning)."""
    if boot and my_boot and boot != my_boot:
        return True
    now_started = _start_time(pid)
    if now_started is None:
        return True
    return bool(started and now_started and now_started != started)


_GET_FIELDS = operator.attrgetter(*_HOST_FIELDS)


def _state(row: Sequence[Any] | None) -> HostState | None:
    """A ``hosts`` row (the columns of :data:`_HOST_FIELDS`) as its :class:`HostState`: the same value
    ``HostState(**fields)`` makes (:func:`~scrapy_polite.policy.state_from_fields`; two or three per booking)."""
    if row is None:
        return None
    fields = dict(zip(_HOST_FIELDS, row))
    fields["ok_seen"] = bool(fields["ok_seen"])
    return state_from_fields(fields)


def _row(key: str, state: HostState) -> tuple[Any, ...]:
    """The ``hosts`` row of ``key`` (``ok_seen``, a bool, is stored as SQLite's integer 1 or 0).

    Raises:
        sqlite3.IntegrityError: a field is NaN: refused as SQLite refuses a NaN in a NOT NULL column, in every
            column. SQLite itself would not: ``INSERT OR REPLACE`` puts a column's default in place of the NULL
            a NaN becomes, so a NaN ``ratelimit_until`` would be stored as 0 (the quota no longer held).
    """
    values = _GET_FIELDS(state)
    try:
        total = sum(values)  # one C loop over the fields: a NaN in any of them makes the sum NaN
    except TypeError:  # a field that is no number: SQLite's own refusal of its type says which
        return (key, *values)
    if total != total:
        bad = [name for name, value in zip(_HOST_FIELDS, values) if value != value]
        if bad:  # (not when only an infinity and its opposite made the NaN: SQLite stores those)
            raise sqlite3.IntegrityError(f"the row of {key!r} has {', '.join(bad)} NaN, not a number")
    return (key, *values)


class SQLiteStore:
    """The embedded pace table: one SQLite file in WAL mode.

    Args:
        path: the database file; its directory is created when missing.
        timeout: seconds to wait for another process's write lock before failing.
        nowait: a connection that never waits for a lock (an operation that would wait raises
            :class:`StoreBusy`) and never checkpoints the WAL; use :meth:`nowait` to make one.
        clock: the store's clock, epoch seconds, read inside each transaction: the monotonic process clock by
            default, so the store's ``now`` never goes backwards in a process and ignores steps of the wall
            clock (docs/spec.md §6; tests inject one).
        events_max: the most events the event log keeps (``POLITE_EVENT_LOG_SIZE``); an append beyond it
            deletes the oldest.
        mark: leave a "running" mark in the file while open, removed by :meth:`close` (docs/spec.md §6,
            "After a crash"); the connections :meth:`nowait` and :meth:`sibling` make share their opener's.

    Attributes:
        recovery: what the opening found of an unclean stop (:class:`Recovery`), or None (every earlier
            opener closed cleanly, or is still running).
        write_transactions: (class attribute) about how many write transactions every SQLiteStore of this
            process has run, a counter for the benches (``bench/overhead.py`` prints it per page); not
            exact when several threads write at once.

    Raises:
        StoreError: the file cannot be created, opened, migrated or written (unwritable directory,
            corrupt file, a schema newer than this version knows). The message names the path and the fix.
    """

    write_transactions: ClassVar[int] = 0

    def __init__(self, path: str, *, timeout: float = 30.0, nowait: bool = False,
                 clock: Callable[[], float] = process_clock, events_max: int = DEFAULT_EVENTS_MAX,
                 mark: bool = False, _token: str | None = None) -> None:
        self.path = os.path.abspath(path)
        self.recovery: Recovery | None = None
        #: This opener's mark in ``openers`` (None: no mark), and when its heartbeat was last written.
        self._token = _token
        self._owns_mark = False
        self._beat = 0.0
        self.uri = f"sqlite:///{self.path}"
        #: Held by every use of the connection, and by :meth:`close`: a call never meets a connection being
        #: closed on another thread, and a call after the close raises :class:`StoreClosed`.
        self._lock = threading.Lock()
        self._closed = False
        self._nowait = nowait
        self._timeout = timeout
        self._clock = clock
        #: The file the connection has open (device, inode), and when the path was last looked at
        #: (:meth:`_follow`, ``time.monotonic``).
        self._file: tuple[int, int] | None = None
        self._looked = time.monotonic()
        self.events_max = max(0, int(events_max))
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=0.0 if nowait else timeout, isolation_level=None,
                                       check_same_thread=False, cached_statements=64)
            #: The database's page size, bytes (a WAL frame holds one page).
            self.page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
            if nowait:  # the sibling already set the file up; never checkpoint here (that may fsync)
                self._file = _file_id(self.path)
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA wal_autocheckpoint=0")
                return
            self._file = _file_id(self.path)
            self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            # Prove we can write now, not halfway through the crawl (fail closed at start); look for the
            # marks of unclean stops and leave ours, in the same transaction.
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if mark and self._token is None:
                    self._open_mark()
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            raise self._error("open", exc) from exc

    def _open_mark(self) -> None:
        """Inside the opening transaction: find the marks left by processes of this machine that are gone
        (an unclean stop: ``kill -9``, a crash, a power loss), treat every row changed within
        :data:`CRASH_WINDOW` seconds before the earliest of their last heartbeats, or since, as just booked
        (:data:`_REPAIR`), remove those marks and leave this opener's (docs/spec.md §6, "After a crash")."""
        db, now, machine, boot = self._db, self._clock(), socket.gethostname(), _boot_id()
        mine = _start_time(os.getpid()) or 0
        dead = [(token, pid, beat) for token, pid, beat, their_boot, started in
                db.execute("SELECT token, pid, beat, boot, started FROM openers WHERE machine = ?",
                           (machine,)).fetchall()
                if token not in _OPEN_TOKENS and _gone(pid, their_boot, started, boot)]
        if dead:
            last_seen = min(beat for _, _, beat in dead)
            since = last_seen - CRASH_WINDOW
            rows = db.execute(_REPAIR, {"now": now, "since": since}).rowcount
            db.executemany("DELETE FROM openers WHERE token = ?", [(token,) for token, _, _ in dead])
            pids = tuple(sorted({pid for _, pid, _ in dead}))
            self.recovery = Recovery(pids, last_seen, since, now, int(rows))
            logger.warning(
                "scrapy-polite: the pace table %s was not closed by process %s (an unclean stop, last seen %.1f s "
                "ago): %d rows changed within %g s before it are treated as just booked (docs/spec.md §6, "
                "\"After a crash\")", self.uri, ", ".join(map(str, pids)), max(0.0, now - last_seen), rows,
                CRASH_WINDOW)
        self._token = uuid.uuid4().hex
        self._owns_mark = True
        self._beat = now
        db.execute("INSERT INTO openers (token, pid, machine, boot, started, opened, beat) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", (self._token, os.getpid(), machine, boot, mine, now, now))
        _OPEN_TOKENS.add(self._token)

    def _heartbeat(self, db: sqlite3.Connection) -> None:
        """Inside a write transaction: refresh this opener's mark, at most every :data:`BEAT_EVERY` seconds."""
        if self._token is None:
            return
        now = self._clock()
        if now - self._beat >= BEAT_EVERY or now < self._beat:
            self._beat = now
            db.execute("UPDATE openers SET beat = ? WHERE token = ?", (now, self._token))

    def nowait(self) -> SQLiteStore:
        """A second connection to the same file that never waits for a lock: an operation that would wait
        raises :class:`StoreBusy` instead, and it never checkpoints the WAL (see :meth:`checkpoint`).
        :class:`~scrapy_polite.stores.AsyncStore` runs these on the reactor thread (tens of µs)."""
        return SQLiteStore(self.path, nowait=True, clock=self._clock, events_max=self.events_max, _token=self._token)

    def sibling(self) -> SQLiteStore:
        """Another connection to the same file that waits for the lock like this one (for a thread of its
        own: :class:`~scrapy_polite.stores.AsyncStore` writes the event log through one)."""
        return SQLiteStore(self.path, clock=self._clock, events_max=self.events_max, mark=False)

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
        """Copy the WAL back into the database file and sync it (``synchronous=NORMAL``).

        Args:
            restart_wait: None: ``PRAGMA wal_checkpoint(PASSIVE)``, which never waits for, nor stops, other
                connections' writes. Seconds: ``PRAGMA wal_checkpoint(TRUNCATE)``, which waits up to that long
                for the write lock (holding it, other connections' writes wait) and for the readers of the
                WAL to finish, copies the whole WAL back, then starts the WAL over itself (its file cut to
                nothing); a PASSIVE copy when the wait runs out. Without it, processes sharing the file and
                writing all the time may never let the WAL start over (one writes between another's complete
                copy and its own next write, which alone would start it over): its file grows without bound
                (docs/spec.md §6, "The WAL's bound"). RESTART, which leaves the start-over to the next
                writer, was measured to start it over in only 23 of 96 checkpoints for two processes.

        Returns:
            ``(frames, copied)``: the frames (pages) in the WAL, and how many of them are now copied back
            (``frames == copied``: the next write starts the WAL over from its beginning, unless a reader of
            another connection still reads it; ``(0, 0)`` after a TRUNCATE that did it); ``(-1, -1)`` when
            the file is not in WAL mode, another connection's checkpoint is running, or a TRUNCATE's wait ran
            out (SQLite's busy flag: the WAL was not started over).

        Raises:
            StoreError: the file cannot be written.
        """
        try:
            with self._lock:
                if restart_wait is None:
                    row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                else:
                    self._db.execute(f"PRAGMA busy_timeout = {max(0, int(restart_wait * 1000))}")
                    try:
                        row = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    finally:
                        wait = 0 if self._nowait else int(self._timeout * 1000)
                        self._db.execute(f"PRAGMA busy_timeout = {wait}")
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc
        if row is None:
            return (-1, -1)
        if restart_wait is not None and int(row[0]):
            # Busy: the wait ran out (another connection's write or read went on), SQLite copied what it could
            # and did not start the WAL over: said as "could not run", so the WAL's length is watched again.
            return (-1, -1)
        return (int(row[1]), int(row[2]))

    def _error(self, action: str, exc: BaseException) -> StoreError:
        text = str(exc)
        if isinstance(exc, StoreError):
            return exc
        if self._closed:  # set under the lock before the connection was closed: the call found it closed
            return StoreClosed(f"scrapy-polite's pace table {self.uri} is closed")
        if self._nowait and isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return StoreBusy(text)
        if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
            fix = (f"the file is not a valid pace table; move it away (e.g. mv {self.path} {self.path}.bad) "
                   "to start a fresh one, or point POLITE_STORE to another file")
            return StoreCorrupt(f"scrapy-polite cannot {action} its pace table {self.uri}: {text}. Fix: {fix}.")
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
                    try:
                        self._db.execute(statement)
                    except sqlite3.OperationalError as exc:
                        # A column this step adds may be there already (a development version numbered its
                        # steps differently): keep it.
                        if "duplicate column name" not in str(exc):
                            raise
                version += 1
                self._db.execute(f"PRAGMA user_version = {version}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _follow(self) -> None:
        """Under the connection's lock: when the path no longer names the file the connection has open (the file
        was deleted, or another put in its place, under the running crawl), open the file at the path — set up
        and migrated like a new one — so this process shares the table the others now open (docs/spec.md §6, "A
        table that comes back empty": the crawl's :class:`~scrapy_polite.outage.TableWatch` then finds the
        table's identity gone and writes back what it knows). The path is looked at once per
        :data:`FOLLOW_EVERY` seconds at most (one ``stat``)."""
        now = time.monotonic()
        if now - self._looked < FOLLOW_EVERY or self._closed:
            return
        self._looked = now
        if _file_id(self.path) == self._file:
            return
        logger.warning("scrapy-polite: the pace table file %s was %s under the running crawl; opening the file now "
                       "at that path", self.path, "deleted" if not os.path.exists(self.path) else "replaced")
        old = self._db
        self._db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False,
                                   cached_statements=64)
        old.close()
        self._file = _file_id(self.path)
        self._db.execute("PRAGMA journal_mode=WAL").fetchone()
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()
        if self._nowait:
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._db.execute("PRAGMA busy_timeout = 0")
        elif self._owns_mark:
            now_store = self._clock()
            self._db.execute("INSERT OR REPLACE INTO openers (token, pid, machine, boot, started, opened, beat) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", (self._token, os.getpid(), socket.gethostname(),
                                                              _boot_id(), _start_time(os.getpid()) or 0, now_store,
                                                              now_store))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` under the connection's lock; rolled back when the body raises."""
        with self._lock:
            self._follow()
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            SQLiteStore.write_transactions += 1
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def now(self) -> float:
        return self._clock()

    def get(self, key: str) -> HostState | None:
        try:
            with self._lock:
                return _state(self._db.execute(_SELECT_ONE, (key,)).fetchone())
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    def read(self, keys: Sequence[str]) -> Snapshot:
        try:
            with self._lock:
                self._follow()
                db = self._db
                if len(keys) == 1:  # autocommit: one statement is its own consistent read
                    return Snapshot({keys[0]: _state(db.execute(_SELECT_ONE, (keys[0],)).fetchone())},
                                    self._clock())
                db.execute("BEGIN")
                try:
                    states = {key: _state(db.execute(_SELECT_ONE, (key,)).fetchone()) for key in keys}
                    now = self._clock()
                finally:
                    db.execute("COMMIT")
                return Snapshot(states, now)
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        try:
            with self._transaction() as db:
                new, result = fn(_state(db.execute(_SELECT_ONE, (key,)).fetchone()), self._clock())
                if new is not None:
                    db.execute(_WRITE, _row(key, new))
            return result
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        try:
            with self._transaction() as db:
                states = {key: _state(db.execute(_SELECT_ONE, (key,)).fetchone()) for key in keys}
                new, result = fn(states, self._clock())
                for key, state in new.items():
                    if key not in states:
                        raise ValueError(f"update function wrote {key!r}, which it did not read")
                    db.execute(_WRITE, _row(key, state))
            return result
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def run_group(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[tuple[bool, Any]]:
        """Run several callers' calls in **one** ``BEGIN IMMEDIATE`` transaction, in order: the group commit
        of docs/spec.md §6 ("Group commit"). Each row is read inside the transaction (after the writes of the
        calls before it in the group), so no other process's write is overwritten with stale data; each
        caller's function gets the store's clock read at its turn.

        Args:
            calls: ``(name, args)`` pairs, ``name`` one of ``update`` ``(key, fn)``, ``update_many``
                ``(keys, fn)``, ``get`` ``(key,)``, ``read`` ``(keys,)``.

        Returns:
            One ``(True, result)`` or ``(False, exception)`` per call, in order. A call whose function raises
            (or an ``update_many`` writing a key it did not read) writes nothing and gets its own exception;
            the others' writes commit: each function runs before its call writes anything.

        Raises:
            StoreBusy: a no-wait connection found another writer's lock (nothing ran; retry on a waiting one).
            StoreError: the file cannot be written (the whole group is rolled back: no call took effect).
        """
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self._transaction() as db:
                for name, args in calls:
                    outcomes.append(self._one(db, name, args))
                self._heartbeat(db)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc
        return outcomes

    def _one(self, db: sqlite3.Connection, name: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
        """One call of :meth:`run_group`, inside its transaction. A failure of the file (``sqlite3.Error``)
        propagates: the group is rolled back."""
        try:
            if name == "update":
                key, fn = args
                new, result = fn(_state(db.execute(_SELECT_ONE, (key,)).fetchone()), self._clock())
                if new is not None:
                    db.execute(_WRITE, _row(key, new))
                return True, result
            if name == "update_many":
                keys, many = args
                found = {k: db.execute(_SELECT_ONE, (k,)).fetchone() for k in keys}
                writes, result = many({k: _state(row) for k, row in found.items()}, self._clock())
                stray = [k for k in writes if k not in found]
                if stray:
                    raise ValueError(f"update function wrote {stray[0]!r}, which it did not read")
                rows = [_row(k, state) for k, state in writes.items()]  # a bad state raises before any write
                if len(rows) == 1:
                    db.execute(_WRITE, rows[0])  # one statement: it writes whole or not at all
                elif rows:
                    self._write_rows(db, rows, found)
                return True, result
            if name == "get":
                return True, _state(db.execute(_SELECT_ONE, (args[0],)).fetchone())
            if name == "read":
                found = {k: _state(db.execute(_SELECT_ONE, (k,)).fetchone()) for k in args[0]}
                return True, Snapshot(found, self._clock())
            raise ValueError(f"a group cannot run {name!r}")
        except _REFUSALS as exc:  # a row SQLite refuses (a NaN in a NOT NULL column...): this call's own
            return False, StoreError(f"the pace table {self.path} refused a row: {exc}")
        except sqlite3.Error:
            raise  # the file's failure (locked, full, damaged): the whole group is rolled back
        except Exception as exc:  # the caller's own failure: its call wrote nothing, the group goes on
            return False, exc

    @staticmethod
    def _write_rows(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]],
                    found: dict[str, Sequence[Any] | None]) -> None:
        """Write one call's rows (inside its group's transaction) whole or not at all: when SQLite refuses one
        of them (a NaN in a NOT NULL column, an integer beyond 64 bits, a value of a type it cannot store),
        the rows written before it are put back as ``found`` holds them (read in this transaction, which holds
        the write lock: nothing else changed them since; None: the row was absent, so it is deleted), and the
        refusal is raised. Without a savepoint: the rule costs nothing until a row is refused (docs/spec.md
        §6, "After a crash"). A failure of the file (``sqlite3.Error`` other than a refusal) propagates: the
        whole group is rolled back."""
        try:
            db.executemany(_WRITE, rows)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and not isinstance(exc, _CALLER_ERRORS):
                raise
            for row in rows:  # every key this call writes (the refused row and those after it are unchanged)
                old = found[row[0]]
                if old is None:
                    db.execute("DELETE FROM hosts WHERE host = ?", (row[0],))
                else:
                    db.execute(_WRITE, (row[0], *old))
            raise

    def backing_off(self, now: float) -> Iterator[tuple[str, HostState]]:
        """The host rows (not ``ip:`` rows) still backing off at ``now`` (``consec > 0`` and ``next_allowed >
        now``), sorted by host: one query, without reading the rest of the table into memory.

        Raises:
            StoreError: the file cannot be read.
        """
        try:
            with self._lock:
                rows = self._db.execute(
                    f"SELECT host, {_COLUMNS} FROM hosts WHERE consec > 0 AND next_allowed > ? "
                    "AND host NOT LIKE 'ip:%' ORDER BY host", (now,)).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc
        return iter([(row[0], state) for row in rows if (state := _state(row[1:])) is not None])

    def delete(self, key: str) -> bool:
        try:
            with self._lock:
                return self._db.execute("DELETE FROM hosts WHERE host = ?", (key,)).rowcount > 0
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def items(self) -> Iterator[tuple[str, HostState]]:
        try:
            with self._lock:
                rows = self._db.execute(f"SELECT host, {_COLUMNS} FROM hosts ORDER BY host").fetchall()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc
        return iter([(row[0], state) for row in rows if (state := _state(row[1:])) is not None])

    def expire(self, before: float) -> int:
        try:
            with self._lock:
                return int(self._db.execute(
                    "DELETE FROM hosts WHERE updated < ? AND next_allowed < ?", (before, before)).rowcount)
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        try:
            with self._transaction() as db:
                db.executemany(_EVENT_INSERT, events)
                db.execute(_EVENT_TRIM, (self.events_max,))
        except sqlite3.Error as exc:
            raise self._error("write", exc) from exc

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        if limit <= 0:
            return []
        where: list[str] = []
        args: list[Any] = []
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        if host is not None:
            where.append("host = ?")
            args.append(host)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        query = (f"SELECT {_EVENT_COLUMNS} FROM (SELECT id, {_EVENT_COLUMNS} FROM events {clause} "
                 "ORDER BY id DESC LIMIT ?) ORDER BY at, id")
        try:
            with self._lock:
                rows = self._db.execute(query, (*args, limit)).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read", exc) from exc
        return [Event._make(row) for row in rows]

    def close(self) -> None:
        """Close the connection (idempotent), first removing this opener's "running" mark (a clean stop;
        another opener's mark stays: docs/spec.md §6, "After a crash"). It waits for a call in progress on
        another thread; a call after it raises :class:`StoreClosed` and writes nothing. A mark that cannot be
        removed (the file is locked for ``timeout`` seconds, or unwritable) is left: the next opening then
        treats the last rows as just booked, which is only more polite."""
        with self._lock:
            if self._closed:
                return
            if self._owns_mark:
                try:
                    self._db.execute("DELETE FROM openers WHERE token = ?", (self._token,))
                except sqlite3.Error:
                    logger.debug("scrapy-polite: could not remove the running mark of %s", self.uri, exc_info=True)
                _OPEN_TOKENS.discard(str(self._token))
            self._closed = True
            self._db.close()


#: What SQLite raises for one call's own bad row or argument (not for the file): in a group commit that call
#: fails alone (:meth:`SQLiteStore.run_group`).
_CALLER_ERRORS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError)
#: Those, and Python's ``sqlite3`` refusing an integer beyond SQLite's 64 bits (``OverflowError``).
_REFUSALS = (*_CALLER_ERRORS, OverflowError)

#: The most calls one group commit runs in one transaction (docs/spec.md §6, "Group commit").
GROUP_MAX = 512

#: Seconds a checkpoint's second phase waits for other processes' writes and reads of the WAL to end, so the
#: WAL starts over (docs/spec.md §6, "The WAL's bound"); the calls of this process wait meanwhile.
RESTART_WAIT = 0.05

#: A call waiting for its group: ``(method name, args, Deferred of the result)``.
_Held = tuple[str, tuple[Any, ...], "defer.Deferred[Any]"]


class AsyncSQLiteStore(ThreadedStore):
    """SQLite's own async adapter (``AsyncStore(SQLiteStore(...))`` builds it; docs/spec.md §6, "Group commit"
    and "Never blocking the crawl"): calls never block the reactor, every method returns a ``Deferred``.

    * **Group commit**: the updates (and the reads behind them) made in one reactor turn wait for the next
      turn (:func:`~scrapy_polite.reactor.next_turn_scheduler`), then run in call order in **one**
      ``BEGIN IMMEDIATE`` transaction (:meth:`SQLiteStore.run_group`, at most ``group_max`` calls), each
      caller getting its own result or its own exception; a read with nothing waiting before it runs inline
      at once. The group is first tried inline on a no-wait connection (a WAL transaction without fsync, tens
      of microseconds); when another writer holds the lock (:class:`~scrapy_polite.stores.base.StoreBusy`),
      the whole group runs on the store's own thread, which may wait for the lock; the calls made meanwhile
      wait on the reactor's side and then run inline again. Calls complete in call order.
    * **Checkpoints**: the store's thread checkpoints the WAL in two phases: first while the calls go on
      (the bulk of the WAL is copied back: the crawl is not held), then, when writes landed meanwhile, once
      more while the calls made meanwhile wait on the reactor's side (it copies only those few pages, then
      starts the WAL over and cuts its file: SQLite's TRUNCATE, waiting at most :data:`RESTART_WAIT` for
      other processes' writes; the calls then form one group). A checkpoint comes when the WAL's file has
      grown past ``restart_frames`` pages (looked at every 250 inline writes): the first one, and every one
      after a cut or after a checkpoint that could not run; after a checkpoint that copied the WAL back
      without a second phase (the file not cut), after as many writes as made the WAL that long, going by
      the pages per write it found (never more often than every 1000 writes).
    * **The event log** (:meth:`append_events`): inline on the no-wait connection too, in transactions of at
      most ``event_chunk`` events, one per reactor turn (under a millisecond each), so it never holds the
      file's write lock while the pace table's calls want it. A batch that finds another process's write
      under way, or is still waiting at the close, is written on a connection and a thread of its own, which
      waits for the lock. During a checkpoint the batches wait with the calls.

    Args: see :class:`~scrapy_polite.stores.asyncstore.AsyncStore`; ``store`` must be a :class:`SQLiteStore`.

    Attributes:
        checkpoints: the checkpoints run on the store's thread so far (each counted once, whether it needed
            its second phase or not), for ``bench/wal.py``.
        second_phases: how many of them needed the second phase (the one that holds the calls).
        cuts: how many second phases started the WAL over and cut its file (SQLite's TRUNCATE; docs/spec.md
            §6, "The WAL's bound").
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, restart_frames: int = 8192,
                 event_chunk: int = 250, threads: int = 1, group_max: int = GROUP_MAX) -> None:
        super().__init__(store, reactor, restart_frames=restart_frames, event_chunk=event_chunk,
                         threads=threads, group_max=group_max)
        if not isinstance(store, SQLiteStore):
            raise TypeError(f"AsyncSQLiteStore needs a SQLiteStore, not {type(store).__name__}")
        self._sqlite = store
        self._inline = store.nowait()
        self.checkpoints = 0
        self.second_phases = 0
        self.cuts = 0
        #: Calls waiting for the next group (the calls of this turn, or held behind a checkpoint or a busy
        #: group on the thread), in call order.
        self._held: deque[_Held] = deque()
        self._group_max = max(1, group_max)
        #: Schedules a call on the reactor's next turn (straight on the asyncio loop when it is the reactor's).
        self._next_turn = next_turn_scheduler(self._reactor)
        self._flush_turn: CallLaterResult | None = None  # the reactor turn scheduled for the next group
        #: A checkpoint runs on the thread (either phase: see :meth:`_checkpoint`).
        self._checkpoint_running = False
        #: Its second phase runs: calls (and event batches) wait.
        self._checkpointing = False
        self._restart_frames = max(1, restart_frames)
        #: Inline writes between two checkpoints (set from the WAL's pages per write at each one), and the
        #: writes since the last one.
        self._checkpoint_every = restart_frames
        self._since_checkpoint = 0
        self._learned = False  # no checkpoint yet: the WAL file's length decides the first
        self._frames_after = 0  # the WAL's length at the last checkpoint
        self._event_chunk = max(1, event_chunk)
        #: Event batches waiting for the inline writer, in order: ``[events not yet written, Deferred]``.
        self._events_waiting: deque[tuple[list[Event], defer.Deferred[None]]] = deque()
        self._events_turn: CallLaterResult | None = None  # the reactor turn scheduled for the next chunk
        self._events_writing = False  # a chunk is being written (a batch appended meanwhile waits its turn)
        self._events_on_thread = 0  # batches on the event log's thread: later ones follow them there, in order
        self._events_pool: ThreadPool | None = None
        self._events_store: SQLiteStore | None = None

    def _call(self, name: str, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        if name in ("update", "update_many") or self._held or self._checkpointing or self._queued:
            # Group commit: behind the calls already waiting, in the next group.
            d: defer.Deferred[Any] = defer.Deferred()
            self._held.append((name, args, d))
            self._schedule_flush()
            return d
        # A read with nothing waiting before it: inline at once (it sees every write already delivered).
        try:
            result = getattr(self._inline, name)(*args)
        except StoreBusy:
            return self._threaded(name, *args)
        except Exception:
            return defer.fail()
        return defer.succeed(result)

    def _schedule_flush(self) -> None:
        """The next group runs on the next reactor turn, unless one is scheduled, or a checkpoint or a busy
        group on the thread holds them (its end schedules it)."""
        if self._flush_turn is None and not self._closed and not self._checkpointing and not self._queued:
            self._flush_turn = self._next_turn(self._flush)

    def _flush(self) -> None:
        """Run the waiting calls (at most ``group_max``) as one group, one transaction, inline on the no-wait
        connection; a group that finds another writer's lock goes whole to the store's thread, which waits
        for it. Each caller's Deferred fires in call order."""
        self._flush_turn = None
        if self._closed or self._checkpointing or self._queued or not self._held:
            return
        batch = [self._held.popleft() for _ in range(min(self._group_max, len(self._held)))]
        calls = [(name, args) for name, args, _ in batch]
        try:
            outcomes = self._inline.run_group(calls)
        except StoreBusy:
            self._group_threaded(batch, calls)
            return
        except Exception as exc:
            self._fail_all(batch, exc)
        else:
            if any(name in ("update", "update_many") for name, _ in calls):
                self._wrote()
            self._deliver(batch, outcomes)
        if self._held:
            self._schedule_flush()

    @staticmethod
    def _deliver(batch: Sequence[_Held], outcomes: Sequence[tuple[bool, Any]]) -> None:
        """Each caller its own result or its own exception, in call order."""
        for (_, _, d), (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                d.callback(value)
            else:
                d.errback(value)

    @staticmethod
    def _fail_all(batch: Sequence[_Held], failure: Failure | Exception) -> None:
        """The group's transaction failed (nothing of it was written): every caller gets the error."""
        for _, _, d in batch:
            d.errback(failure)

    def _group_threaded(self, batch: list[_Held], calls: list[tuple[str, tuple[Any, ...]]]) -> None:
        """A group that met another writer's lock: whole on the store's thread (it waits for the lock); the
        calls made meanwhile wait, then run inline again."""
        self._queued += 1
        d: defer.Deferred[list[tuple[bool, Any]]] = threads.deferToThreadPool(
            self._reactor, self._start_pool(), self._sqlite.run_group, calls)

        def done(result: Any) -> None:
            self._queued -= 1
            if isinstance(result, Failure):
                self._fail_all(batch, result)
            else:
                self.transactions += 1
                self._deliver(batch, result)
            if not self._queued:
                self._after_thread()

        d.addBoth(done)

    def _after_thread(self) -> None:
        self._schedule_flush()

    def _wrote(self) -> None:
        """One inline write landed in the WAL. Until the first checkpoint, every 250 writes the WAL file's
        length is looked at (a fresh file is as long as the WAL); a checkpoint when it passes
        ``restart_frames`` pages. After it, a checkpoint every ``_checkpoint_every`` writes."""
        self._since_checkpoint += 1
        self.transactions += 1
        if self._checkpoint_running:
            return
        if self._learned:
            if self._since_checkpoint >= self._checkpoint_every:
                self._checkpoint()
        elif self._since_checkpoint % 250 == 0 and self._sqlite.wal_pages() > self._restart_frames:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Checkpoint the WAL on the store's thread, in two phases (docs/spec.md §6, "Never blocking the
        crawl"): first while the calls go on (the bulk of the WAL is copied back, the crawl is not held),
        then, when writes landed meanwhile, once more with the calls waiting on the reactor's side: it copies
        only those few pages, and since no write lands in the WAL meanwhile, the next write starts it over."""
        if self._closed or self._checkpoint_running:
            return
        self._checkpoint_running = True
        d: defer.Deferred[tuple[int, int] | None] = threads.deferToThreadPool(
            self._reactor, self._start_pool(), self._sqlite.checkpoint)
        d.addErrback(lambda _failure: None)  # a failed checkpoint leaves the WAL as it was; the next one retries
        d.addCallback(self._checkpointed_once, self._since_checkpoint)

    def _checkpointed_once(self, frames: tuple[int, int] | None, writes_before: int) -> None:
        """The first phase is done: when writes landed meanwhile (or it could not copy the whole WAL back),
        the second phase, holding the calls; else the checkpoint is done."""
        if frames is None or self._closed or (frames[1] >= frames[0] and self._since_checkpoint == writes_before):
            self._checkpointed(frames)
            return
        self._checkpointing = True
        self.second_phases += 1
        d: defer.Deferred[tuple[int, int] | None] = threads.deferToThreadPool(
            self._reactor, self._start_pool(), self._restart_checkpoint)
        d.addErrback(lambda _failure: None)
        d.addCallback(self._checkpointed, True)

    def _restart_checkpoint(self) -> tuple[int, int]:
        """The second phase, on the store's thread: a checkpoint that lets the WAL start over."""
        return self._sqlite.checkpoint(restart_wait=RESTART_WAIT)

    def _checkpointed(self, frames: tuple[int, int] | None, second: bool = False) -> None:
        """The checkpoint is done (``second``: its second phase, a TRUNCATE, ran): set the writes until the
        next one from the pages per write it found, then run the calls (and event batches) held meanwhile, in
        order, inline while they can be."""
        self._checkpointing = self._checkpoint_running = False
        self.checkpoints += 1
        self.cuts += second and frames == (0, 0)  # a first phase that found the WAL empty cut nothing
        if frames is None or frames == (0, 0) or frames[0] < 0:
            # The second phase cut the WAL's file (its length is the WAL's again, every process's pages), or
            # the checkpoint could not run (another process's was running, or its writes went on past
            # RESTART_WAIT): the file's length is watched every 250 writes, as before the first checkpoint,
            # so a checkpoint that could not cut it is tried again soon.
            self._learned = False
            self._frames_after = 0
        elif frames is not None and frames[0] > 0 and self._since_checkpoint > 0:
            # Pages added since the last checkpoint: all of them when that one copied the whole WAL back
            # (the WAL started over after it), else those past its length (it could not: it kept growing).
            added = frames[0] - self._frames_after if frames[0] > self._frames_after else frames[0]
            per_write = max(1.0, added / self._since_checkpoint)  # a write appends at least one page
            # Never more often than every 1000 writes: other processes' pages count in the WAL's length.
            self._checkpoint_every = max(1000, min(100_000, int(self._restart_frames / per_write)))
            self._frames_after = frames[0] if frames[1] < frames[0] else 0
            self._learned = True
        self._since_checkpoint = 0
        if self._closed:  # closed meanwhile: the held calls went to the thread
            return
        self._schedule_flush()
        self._write_events()

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """Inline in chunks, one per reactor turn; a batch meeting another writer on its own thread (see the
        class)."""
        if self._closed:
            return defer.fail(self._closed_error())
        d: defer.Deferred[None] = defer.Deferred()
        self._events_waiting.append((list(events), d))
        if self._events_turn is None and not self._events_writing:
            self._write_events()
        return d

    def _write_events(self) -> None:
        """Write one chunk of the waiting event batches inline, and schedule the next reactor turn for the
        rest. A batch that finds the lock held goes to the event log's thread, and the batches after it
        follow it there until it is written (in order). During a checkpoint they wait for it."""
        if self._events_turn is not None:  # called before its turn came (a cancel after it is harmless)
            self._events_turn.cancel()
        self._events_turn = None
        if self._events_writing or self._checkpointing or self._closed:
            return
        self._events_writing = True
        try:
            while self._events_waiting:
                events, d = self._events_waiting[0]
                if self._events_on_thread:
                    self._events_waiting.popleft()
                    self._events_threaded(events).chainDeferred(d)
                    continue
                chunk = events[:self._event_chunk]
                try:
                    self._inline.append_events(chunk)
                except StoreBusy:
                    self._events_waiting.popleft()
                    self._events_threaded(events).chainDeferred(d)
                    continue
                except Exception:
                    self._events_waiting.popleft()
                    d.errback()
                    continue
                del events[:len(chunk)]
                if not events:
                    self._events_waiting.popleft()
                    d.callback(None)  # a batch its callbacks append waits for the next turn
                self._wrote()
                break
        finally:
            self._events_writing = False
        if self._events_waiting and not self._checkpointing and not self._events_on_thread:
            self._events_turn = self._next_turn(self._write_events)

    def _events_threaded(self, events: list[Event]) -> defer.Deferred[None]:
        """Write a batch on the event log's own connection and thread (it waits for the lock; the
        connection is opened there too, since opening it also waits)."""
        if self._events_pool is None:
            self._events_pool = ThreadPool(minthreads=1, maxthreads=1, name="scrapy-polite-events")
            self._events_pool.start()
        self._events_on_thread += 1
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._events_pool,
                                                            self._append_on_thread, events)

        def written(result: Any) -> Any:
            self._events_on_thread -= 1
            if not self._events_on_thread and self._events_waiting and self._events_turn is None:
                self._write_events()  # the thread is done: inline again
            return result

        d.addBoth(written)
        return d

    def _append_on_thread(self, events: list[Event]) -> None:
        """On the event log's thread: open its connection the first time, then append."""
        if self._events_store is None:
            self._events_store = self._sqlite.sibling()
        self._events_store.append_events(events)

    def _queue_held(self) -> None:
        if self._closed:
            return
        self._checkpointing = False
        if self._flush_turn is not None:
            self._flush_turn.cancel()
        self._flush_turn = None
        while self._held:  # calls waiting for their group: queued on the thread, one by one, in order
            name, args, d = self._held.popleft()
            self._threaded(name, *args).chainDeferred(d)
        if self._events_turn is not None:
            self._events_turn.cancel()
        self._events_turn = None
        while self._events_waiting:  # event batches not written yet: on the event log's thread, in order
            events, ed = self._events_waiting.popleft()
            self._events_threaded(events).chainDeferred(ed)

    def _detach(self) -> tuple[ThreadPool | None, ...]:
        pools = super()._detach()
        events_pool, self._events_pool = self._events_pool, None
        return (*pools, events_pool)

    def _close_parts(self, *pools: ThreadPool | None) -> None:
        """Join the threads (the event log's first, after the batches already queued), checkpoint, close
        every connection; each step runs even when an earlier one failed (the first error is raised at the
        end)."""
        pool, events_pool = pools
        try:
            if events_pool is not None:
                events_pool.stop()
        finally:
            try:
                events_store, self._events_store = self._events_store, None  # its thread is done
                if events_store is not None:
                    events_store.close()
            finally:
                try:
                    if pool is not None:
                        pool.stop()
                    try:
                        self._sqlite.checkpoint()
                    except StoreError:
                        pass
                finally:
                    try:
                        self._inline.close()
                    finally:
                        self._sqlite.close()
