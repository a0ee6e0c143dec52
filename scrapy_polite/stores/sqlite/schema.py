"""The SQLite pace table's file: its schema, each version's migration, and opening a connection to it
(docs/spec.md §6, "Formats"). The schema version is kept in ``PRAGMA user_version``; an older file is migrated on
open, in one transaction, never discarded; a newer one is refused, and so is another application's database
(:func:`check_ours`), before anything is written to it."""

from __future__ import annotations

import os
import sqlite3
import time

from ..base import StoreBusy, StoreClosed, StoreCorrupt, StoreError

__all__ = [
    "SCHEMA_VERSION", "check_ours", "connect", "file_id", "migrate", "set_up", "set_up_nowait", "store_error",
    "use_wal",
]

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
#: 7: the table's clock (table ``clocks``: the anchor of the process clock every opener of one boot of the machine
#: reads the table's time with, docs/spec.md §6 "One clock per file").
#: 8: the delay each origin of a host publishes in its robots.txt (``hosts.origin_delays``, docs/spec.md §2
#: "Crawl-delay").
SCHEMA_VERSION = 8

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

#: The table's clock (docs/spec.md §6, "One clock per file"): per boot of the machine (``boot``, Linux's boot id),
#: the anchor (``wall0 - mono0``, seconds) of the process clock that the openers of that boot read the table's time
#: with. A file written before it gets one at its next opening.
_SCHEMA_V7 = """
CREATE TABLE IF NOT EXISTS clocks (boot TEXT PRIMARY KEY, anchor REAL NOT NULL) WITHOUT ROWID;
"""

#: Each origin's robots.txt delay (docs/spec.md §2, "Crawl-delay"): rows written before it keep none (''), so the
#: next robots.txt read of the host sets ``crawl_delay`` from what its origins publish from then on.
_SCHEMA_V8 = """
ALTER TABLE hosts ADD COLUMN origin_delays TEXT NOT NULL DEFAULT '';
"""

#: Migrations from version N to N+1, applied in order inside one transaction. Version 0 is an empty file.
MIGRATIONS: dict[int, str] = {0: _SCHEMA_V1, 1: _SCHEMA_V2, 2: _SCHEMA_V3, 3: _SCHEMA_V4, 4: _SCHEMA_V5,
                               5: _SCHEMA_V6, 6: _SCHEMA_V7, 7: _SCHEMA_V8}

#: Version 1's index on ``hosts.updated``, dropped by the opening that finds it (:func:`migrate`): every write of a
#: row paid for it (a second B-tree's page written to the WAL, about half of a one-row write transaction: 18 → 10 µs
#: here), for two statements that run at an opening at most (the expiry of stale rows, the repair after a crash),
#: which read the whole table without it (about 50 ms per million rows of a file in the OS's cache). No version
#: reads it and none creates it again past version 1, so a file with it and one without are the same version:
#: processes of earlier releases open either (a fleet need not be upgraded at once).
UNUSED_INDEX = "hosts_updated"


def file_id(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def connect(path: str, timeout: float) -> sqlite3.Connection:
    """A connection to the file at ``path`` that waits ``timeout`` seconds for another's lock, in autocommit
    (every transaction is the store's own ``BEGIN``), usable from any thread (the store's lock guards it)."""
    return sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False,
                           cached_statements=64)


#: Seconds between two tries of the switch to the WAL journal while another connection holds the file
#: (:func:`use_wal`).
WAL_RETRY = 0.01


def set_up(db: sqlite3.Connection, uri: str, timeout: float) -> None:
    """A connection's set-up: the file checked to be a pace table or an empty one (:func:`check_ours`), the WAL
    journal (:func:`use_wal`, waiting up to ``timeout`` seconds), ``synchronous=NORMAL``, the schema migrated."""
    check_ours(db, uri)
    use_wal(db, timeout)
    db.execute("PRAGMA synchronous=NORMAL")
    migrate(db, uri)


def check_ours(db: sqlite3.Connection, uri: str) -> None:
    """Refuse a database of another application before anything is written to it (not even the WAL journal's mark):
    a file is a pace table, or one to make, when its schema version is 0 and it holds nothing (a new or empty file),
    or its version is not 0 and it holds our ``hosts`` table (and, from version 6, our ``identity``). Read in
    one transaction, so a new file another process is setting up meanwhile is seen before or after, never between.

    Raises:
        StoreError: another application's database (the message names its tables).
        sqlite3.Error: the file cannot be read.
    """
    db.execute("BEGIN")
    try:
        foreign = _foreign(db, uri)
    finally:
        db.execute("COMMIT")
    if foreign is not None:
        raise foreign


def _foreign(db: sqlite3.Connection, uri: str) -> StoreError | None:
    """The error for a file that is not a pace table nor an empty one (:func:`check_ours`), or None; read inside
    the caller's transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = [name for (name,) in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    if version == 0:
        ours = not tables
    else:
        columns = {row[1] for row in db.execute("PRAGMA table_info(hosts)")}
        ours = {"host", "next_allowed", "consec"} <= columns and (version < 6 or "identity" in tables)
    if ours:
        return None
    shown = ", ".join(tables[:10]) + (", ..." if len(tables) > 10 else "") if tables else "none"
    return StoreError(
        f"scrapy-polite cannot open its pace table {uri}: the file is not a scrapy-polite pace table (schema "
        f"version {version}, its tables: {shown}); nothing was written to it. Fix: point POLITE_STORE to another "
        "file (a new one is created), or move this one away.")


def use_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch the file to the WAL journal, trying again every :data:`WAL_RETRY` s for up to ``timeout`` seconds
    while another connection holds it. SQLite does not always wait on its busy timeout here: while another
    connection holds the file's write lock (another process setting up a new table at the same moment: a fleet
    started together), the switch answers "database is locked" at once, since waiting could deadlock
    (sqlite.org/c3ref/busy_handler.html). Seen in about 1 of 6 openings of a new file by 3 processes at once.

    The wait (``time.sleep``) never blocks a running crawl's reactor: it runs when the pace table is opened, before
    the crawl's first request (where SQLite's own busy wait already blocks as long), or on the store's or the event
    log's own thread (a file replaced under the crawl, the event log's connection); the reactor's no-wait
    connection has a ``timeout`` of 0, so it tries once and never sleeps.

    Raises:
        sqlite3.OperationalError: the file is still locked after ``timeout`` seconds, or cannot be read.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(WAL_RETRY)


def set_up_nowait(db: sqlite3.Connection) -> None:
    """A no-wait connection's set-up (the connection it was made beside set the file up):
    ``synchronous=NORMAL``, and it never checkpoints the WAL (a checkpoint may fsync) nor waits for a lock."""
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("PRAGMA busy_timeout = 0")


def open_new_file(path: str, uri: str, timeout: float, *, nowait: bool) -> sqlite3.Connection:
    """A connection to the file now at ``path`` (one that replaced the file a connection had open), set up and
    migrated like a new one (:func:`set_up`), and set up as a no-wait connection when ``nowait``: it then never
    waits for another connection's lock (``timeout`` is not used), and the set-up raises instead.

    Raises:
        sqlite3.Error: the file cannot be opened or set up (the connection is closed again).
    """
    db = connect(path, 0.0 if nowait else timeout)
    try:
        set_up(db, uri, 0.0 if nowait else timeout)
        if nowait:
            set_up_nowait(db)
    except BaseException:
        db.close()
        raise
    return db


def migrate(db: sqlite3.Connection, uri: str) -> None:
    """Bring the file's schema to :data:`SCHEMA_VERSION`, every step in one transaction, and drop
    :data:`UNUSED_INDEX` when the file has it.

    Raises:
        StoreError: the file's schema is newer than this version knows.
        sqlite3.Error: the file cannot be read or written.
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"scrapy-polite cannot open its pace table {uri}: schema version {version} is newer than "
            f"this scrapy-polite knows ({SCHEMA_VERSION}). Fix: upgrade scrapy-polite, or point "
            "POLITE_STORE to another file.")
    if version < SCHEMA_VERSION:
        _step_up(db, uri)
    _drop_unused_index(db)
    _add_behind_column(db)


def _step_up(db: sqlite3.Connection, uri: str) -> None:
    """:data:`MIGRATIONS` from the file's version to :data:`SCHEMA_VERSION`, in one transaction, on a file still
    found to be a pace table (or an empty one) in it: another application may have written it since the look
    before (:func:`check_ours`)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        foreign = _foreign(db, uri)
        if foreign is not None:
            raise foreign
        version = db.execute("PRAGMA user_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            for statement in filter(str.strip, MIGRATIONS[version].split(";")):
                try:
                    db.execute(statement)
                except sqlite3.OperationalError as exc:
                    # A column this step adds may be there already (a development version numbered its
                    # steps differently): keep it.
                    if "duplicate column name" not in str(exc):
                        raise
            version += 1
            db.execute(f"PRAGMA user_version = {version}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _add_behind_column(db: sqlite3.Connection) -> None:
    """Give the ``openers`` table its ``behind`` column when it has none: 1 in the mark of an opener that writes
    behind (docs/spec.md §6, "Write-behind"), whose unclean stop treats every row as just booked. No new schema
    version: an earlier release reads and writes the table by column name, and leaves 0 in its own marks."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(openers)")}
    if columns and "behind" not in columns:
        try:
            db.execute("ALTER TABLE openers ADD COLUMN behind INTEGER NOT NULL DEFAULT 0")
        except sqlite3.OperationalError as exc:  # another opener added it meanwhile
            if "duplicate column name" not in str(exc):
                raise


def _drop_unused_index(db: sqlite3.Connection) -> None:
    """Drop :data:`UNUSED_INDEX` when the file has it (once per file; a read of the schema otherwise)."""
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (UNUSED_INDEX,)).fetchone()
    if found:
        db.execute(f"DROP INDEX IF EXISTS {UNUSED_INDEX}")


def store_error(path: str, action: str, exc: BaseException, *, closed: bool, nowait: bool) -> StoreError:
    """The store's error for ``exc``, met by ``action`` on the file at ``path``: the message names it and the fix
    (:class:`StoreClosed` after the close, :class:`StoreBusy` for a no-wait connection that met a lock,
    :class:`StoreCorrupt` for a damaged file, a fix naming the lock for a waiting connection's lock held too long)."""
    uri, text = f"sqlite:///{path}", str(exc)
    if isinstance(exc, StoreError):
        return exc
    if closed:
        return StoreClosed(f"scrapy-polite's pace table {uri} is closed")
    if nowait and isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return StoreBusy(text)
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        fix = (f"the file is not a valid pace table; move it away (e.g. mv {path} {path}.bad) "
               "to start a fresh one, or point POLITE_STORE to another file")
        return StoreCorrupt(f"scrapy-polite cannot {action} its pace table {uri}: {text}. Fix: {fix}.")
    if isinstance(exc, sqlite3.OperationalError) and "database is locked" in text:
        fix = ("another connection kept the file locked longer than the store waits; stop the process that holds "
               "it (a crawl or `scrapy polite` command stuck at its close, a `sqlite3` shell), or point POLITE_STORE "
               "to another file")
        return StoreError(f"scrapy-polite cannot {action} its pace table {uri}: {text}. Fix: {fix}.")
    if os.path.isdir(path):
        return StoreError(f"scrapy-polite cannot {action} its pace table {uri}: {path} is a directory, not a file. "
                          f"Fix: point POLITE_STORE to a file, e.g. sqlite:///{os.path.join(path, 'polite.sqlite3')}.")
    fix = (f"make {os.path.dirname(path)} writable, or set POLITE_STORE to a writable location, "
           "e.g. POLITE_STORE = 'sqlite:////var/tmp/polite.sqlite3' (or 'memory://' for a one-off run)")
    return StoreError(f"scrapy-polite cannot {action} its pace table {uri}: {text}. Fix: {fix}.")
