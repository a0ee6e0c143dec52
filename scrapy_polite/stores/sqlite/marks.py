"""The openers of the SQLite pace table: the crash window (docs/spec.md §6, "After a crash") and the table's clock
(§6, "One clock per file").

Every crawl that opens the file leaves a "running" mark in its ``openers`` table, beats it while it writes and
removes it at its clean close; an opening that finds the mark of a process of this machine that is gone treats
every row changed within :data:`CRASH_WINDOW` seconds before that process's last heartbeat, or since, as just
booked. Every opener of one boot of the machine reads the table's time on one anchor (:func:`table_clock`), so
processes started before and after a step of the wall clock agree on it."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...clock import ProcessClock

__all__ = ["BEAT_EVERY", "CRASH_WINDOW", "Mark", "Recovery", "WriteBehind", "keep_clock", "table_clock"]

logger = logging.getLogger(__name__)

#: Seconds before an unclean stop within which a row's change may have been lost with it (docs/spec.md §6,
#: "After a crash"): such rows are treated as just booked when the table is next opened.
CRASH_WINDOW = 5.0

#: Seconds between two heartbeats of an opener's mark (written inside a group commit, at most this often).
BEAT_EVERY = 1.0

#: An unclean stop's repair: every row changed since ``?`` (the window's start) is treated as just booked at
#: ``?`` (the opening): its next allowed moment is at least the opening plus its interval as the row knows
#: it (the wait its last change left, its Crawl-delay, its announced quota's interval).
REPAIR = ("UPDATE hosts SET next_allowed = MAX(next_allowed, :now + MAX(next_allowed - updated, crawl_delay, "
           "ratelimit_interval, 0)), updated = MAX(updated, :now) WHERE updated >= :since")



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
OPEN_TOKENS: set[str] = set()

#: The marks this process's stores left because they lost writes (a write-behind window rolled back): gone, as an
#: unclean stop's, for an opening of this process too (:class:`WriteBehind`).
LOST_TOKENS: set[str] = set()


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
    system does not say (no ``/proc``, or another user's process it hides: ``hidepid``), None when ``pid`` runs
    no process or a zombie (killed, not reaped)."""
    others = False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: it runs
        others = True
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0 if others or not os.path.isdir("/proc/self") else None
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



def _machine_marks(db: sqlite3.Connection) -> list[tuple[str, int, float, bool, bool]]:
    """The marks left by openers of this machine name: ``(token, pid, beat, behind, gone)``, ``behind`` when the
    opener wrote behind, ``gone`` when the process that left it is gone (:func:`_gone`; never for a mark of this
    process's open stores)."""
    boot = _boot_id()
    return [(token, pid, beat, bool(behind),
             token in LOST_TOKENS or (token not in OPEN_TOKENS and _gone(pid, their_boot, started, boot)))
            for token, pid, beat, their_boot, started, behind in
            db.execute("SELECT token, pid, beat, boot, started, behind FROM openers WHERE machine = ?",
                       (socket.gethostname(),)).fetchall()]


def _clock_key() -> str:
    """Which monotonic clock this process reads: the boot (:func:`_boot_id`, ``""`` when unknown), and the
    offsets of its Linux time namespace when it is in one (``/proc/self/timens_offsets``: a container whose
    monotonic clock is shifted shares the boot but not the clock)."""
    boot = _boot_id()
    try:
        with open("/proc/self/timens_offsets") as f:
            offsets = " ".join(f.read().split())
    except OSError:
        return boot
    return boot if not boot or not offsets or set(offsets.split()[1::3] + offsets.split()[2::3]) <= {"0"} \
        else f"{boot} {offsets}"


def table_clock(db: sqlite3.Connection, clock: Callable[[], float], *, owner: bool) -> float:
    """Inside the opening transaction, before the opener leaves its mark: how far this process's clock is ahead
    of the table's, seconds (the table's time is ``clock() - offset``), so that every opener of the file on one
    boot of this machine reads one clock (docs/spec.md §6, "One clock per file").

    The processes of one boot share the monotonic clock; the table's clock is ``anchor + monotonic()`` with the
    anchor kept in the file for that clock (table ``clocks``, :func:`_clock_key`). An opener adopts it while the
    file holds a "running" mark of this boot (of any machine name, live or left by a crash), or when it leaves no
    mark itself (a command); a crawl (``owner``) that opens the file when every earlier opener of this boot closed
    cleanly writes its own process clock's anchor (offset 0), so the table's clock stays within the steps of the
    wall clock made while the file was in use. A ``clock`` that is not a
    :class:`~scrapy_polite.clock.ProcessClock` (a test's), or a system that does not say which boot this is,
    reads its own clock (offset 0).
    """
    boot, key = _boot_id(), _clock_key()
    if not isinstance(clock, ProcessClock) or not boot:
        return 0.0
    row = db.execute("SELECT anchor FROM clocks WHERE boot = ?", (key,)).fetchone()
    marked = db.execute("SELECT 1 FROM openers WHERE boot = ? LIMIT 1", (boot,)).fetchone() is not None
    if row is not None and (marked or not owner):
        return clock.anchor - float(row[0])
    if owner:  # every opener of this boot closed cleanly: the table's clock is this process's
        keep_clock(db, clock, 0.0, replace=True)
    return 0.0


def keep_clock(db: sqlite3.Connection, clock: Callable[[], float], offset: float, *, replace: bool) -> None:
    """Inside a write transaction: keep the anchor of the table's clock this opener reads (``clock`` minus
    ``offset`` seconds, :func:`table_clock`) as its clock's, and forget the anchors of other boots: at the
    opening of a crawl that sets the clock (``replace``), and in a new file found at the table's path, where an
    anchor already written by another opener of this clock is kept (``replace`` False)."""
    boot, key = _boot_id(), _clock_key()
    if isinstance(clock, ProcessClock) and boot:
        db.execute("DELETE FROM clocks WHERE substr(boot, 1, length(?)) != ?", (boot, boot))
        db.execute(f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO clocks (boot, anchor) VALUES (?, ?)",
                   (key, clock.anchor - offset))


_INSERT = ("INSERT OR REPLACE INTO openers (token, pid, machine, boot, started, opened, beat) "
           "VALUES (?, ?, ?, ?, ?, ?, ?)")


class Mark:
    """This connection's part in the "running" marks: the token of the mark it beats (None: none) and
    whether it owns it (left it at the opening, rewrites it when the store follows its path to a new file,
    removes it at the close). The crawl's no-wait connection shares its token without owning it and beats it
    inside its group commits.

    Args:
        token: the mark's token (None: no mark).
        owned: this connection left it.
    """

    def __init__(self, token: str | None = None, *, owned: bool = False) -> None:
        self.token = token
        self.owned = owned
        self._beat = 0.0
        #: Left at the close, as an unclean stop's (a write-behind window was lost: the next opening repairs it).
        self.kept = False

    def alone(self, db: sqlite3.Connection) -> bool | None:
        """Inside a write transaction: whether this opener's mark is the only one in the file (None: it is not, or
        there is none, e.g. in a new file found at the path), and says that it writes behind (docs/spec.md §6,
        "Write-behind")."""
        found = db.execute("SELECT token, behind FROM openers LIMIT 2").fetchall()
        if self.token is None or len(found) != 1 or found[0][0] != self.token:
            return None
        return bool(found[0][1])

    def say_behind(self, db: sqlite3.Connection) -> None:
        """Inside a write transaction: mark this opener as one that writes behind (to be committed before the first
        window's writes, so that an unclean stop within it finds the mark saying so)."""
        db.execute("UPDATE openers SET behind = 1 WHERE token = ?", (self.token,))

    def leave(self, db: sqlite3.Connection, now: float, uri: str) -> Recovery | None:
        """Inside the opening transaction: find the marks left by processes of this machine that are gone
        (an unclean stop: ``kill -9``, a crash, a power loss), treat every row changed within
        :data:`CRASH_WINDOW` seconds before the earliest of their last heartbeats, or since, as just booked
        (:data:`REPAIR`), remove those marks and leave this opener's. Returns what was found (None: no
        unclean stop)."""
        marks = [mark for mark in _machine_marks(db) if mark[4]]
        dead = [(token, pid, beat) for token, pid, beat, _, _ in marks]
        recovery = _repair(db, dead, now, uri, behind=any(mark[3] for mark in marks)) if dead else None
        self.token, self.owned, self._beat = uuid.uuid4().hex, True, now
        self.write(db, now)
        OPEN_TOKENS.add(self.token)
        return recovery

    def write(self, db: sqlite3.Connection, now: float) -> None:
        """Write this mark (the opening; a new file found at the store's path), opened and beaten ``now``."""
        db.execute(_INSERT, (self.token, os.getpid(), socket.gethostname(), _boot_id(),
                             _start_time(os.getpid()) or 0, now, now))

    def beat(self, db: sqlite3.Connection, clock: Callable[[], float]) -> None:
        """Inside a write transaction: refresh the mark, at most every :data:`BEAT_EVERY` seconds (``clock``:
        the store's, read only when there is a mark)."""
        if self.token is None:
            return
        now = clock()
        if now - self._beat >= BEAT_EVERY or now < self._beat:
            self._beat = now
            db.execute("UPDATE openers SET beat = ? WHERE token = ?", (now, self.token))

    def remove(self, db: sqlite3.Connection, uri: str) -> None:
        """At the clean close: remove the mark this connection owns (another opener's stays). A mark that
        cannot be removed (the file locked or unwritable) is left, logged at DEBUG: the next opening then
        treats the last rows as just booked, which is only more polite."""
        if self.kept:  # gone, for an opening of this process too
            OPEN_TOKENS.discard(str(self.token))
            LOST_TOKENS.add(str(self.token))
        if not self.owned or self.kept:
            return
        try:
            db.execute("DELETE FROM openers WHERE token = ?", (self.token,))
        except sqlite3.Error:
            logger.debug("scrapy-polite: could not remove the running mark of %s", uri, exc_info=True)
        OPEN_TOKENS.discard(str(self.token))



#: After a write-behind window, the share of its length during which no window opens (each group commits alone):
#: another writer waiting for the lock (SQLite retries every 25 ms or so, then every 50 to 100) finds it free.
GAP = 0.25


class WriteBehind:
    """A connection's write-behind window (docs/spec.md §6, "Write-behind"): while this opener's mark is alone in the
    file, a group's write transaction stays open for the next groups, :attr:`seconds` at most, and none opens for
    :data:`GAP` of that after one ends (so another writer finds the lock free between two windows); a group that
    writes a row held in flight commits it at once. The store calls it under its connection's lock, inside its
    transactions.

    Args:
        mark: the connection's part in the "running" marks.

    Attributes:
        seconds: the longest window, seconds (0: none: the store commits every transaction).
        open: a window is open (its transaction not committed).
        lost: a window was rolled back after some of its groups were delivered: the crawl must stop.
    """

    def __init__(self, mark: Mark) -> None:
        self._mark = mark
        self.seconds = 0.0
        self.open = False
        self.lost = False
        self._began = 0.0
        self._ended = -math.inf  # time.monotonic()

    def begin(self, db: sqlite3.Connection, table: Any) -> None:
        """Inside a group's transaction: open a window if one may open (its mark said to write behind, and
        committed, first: a crash in the first window finds it said)."""
        if not self.seconds or time.monotonic() - self._ended < self.seconds * GAP:
            return
        alone = self._mark.alone(db)
        if alone is False:
            self._mark.say_behind(db)
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            table.begin()
            alone = self._mark.alone(db)
        if alone:
            self.open, self._began = True, time.monotonic()

    def after(self, db: sqlite3.Connection, table: Any) -> None:
        """After a group in the open window: commit it when the group wrote a row held in flight (a hold lost with the
        process would let another process book the host while the request may be served) or it has lasted long
        enough."""
        if table.holds or time.monotonic() - self._began >= self.seconds:
            self.commit(db)

    def commit(self, db: sqlite3.Connection) -> bool:
        """Commit the open window: True when one was open. A failed commit loses it (:attr:`lost`) and raises (the
        store rolls the transaction back)."""
        if not self.open:
            return False
        self.open, self._ended = False, time.monotonic()
        try:
            db.execute("COMMIT")
        except BaseException:
            self.lost = True
            raise
        return True

    def abort(self) -> None:
        """The transaction is rolled back: an open window is lost with it."""
        if self.open:
            self.open, self.lost, self._ended = False, True, time.monotonic()


def _repair(db: sqlite3.Connection, dead: list[tuple[str, int, float]], now: float, uri: str, *,
            behind: bool = False) -> Recovery:
    """Treat the rows of the crash window of the gone openers ``dead`` as just booked (every row, when one of them
    wrote behind: a booking it had not committed left no trace to find), remove their marks, log one WARNING."""
    last_seen = min(beat for _, _, beat in dead)
    since = -math.inf if behind else last_seen - CRASH_WINDOW
    rows = db.execute(REPAIR, {"now": now, "since": since}).rowcount
    db.executemany("DELETE FROM openers WHERE token = ?", [(token,) for token, _, _ in dead])
    pids = tuple(sorted({pid for _, pid, _ in dead}))
    logger.warning(
        "scrapy-polite: the pace table %s was not closed by process %s (an unclean stop, last seen %.1f s "
        "ago): %d rows %s are treated as just booked (docs/spec.md §6, \"After a crash\")", uri,
        ", ".join(map(str, pids)), max(0.0, now - last_seen), rows,
        "(every row: it wrote behind)" if behind else f"changed within {CRASH_WINDOW:g} s before it")
    return Recovery(pids, last_seen, since, now, int(rows))
