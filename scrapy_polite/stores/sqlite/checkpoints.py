"""The WAL's checkpoints of SQLite's async table (docs/spec.md §6, "Never blocking the crawl" and "The WAL's
bound"): when, on the store's thread, in two phases."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.python.failure import Failure

from ..threads import CallPool

if TYPE_CHECKING:
    from .store import SQLiteStore

__all__ = ["RESTART_WAIT", "Checkpointer", "checkpoint"]

logger = logging.getLogger(__name__)

#: Seconds a checkpoint's second phase waits for other processes' writes and reads of the WAL to end, so the
#: WAL starts over (docs/spec.md §6, "The WAL's bound"); the calls of this process wait meanwhile.
RESTART_WAIT = 0.05


def checkpoint(db: sqlite3.Connection, restart_wait: float | None, *, busy_timeout: float) -> tuple[int, int]:
    """Copy the WAL back into the database file and sync it (``synchronous=NORMAL``), on connection ``db``
    (:meth:`SQLiteStore.checkpoint <scrapy_polite.stores.sqlite.SQLiteStore.checkpoint>` holds its lock).

    Args:
        db: the connection, whose busy timeout is ``busy_timeout`` seconds (restored after a TRUNCATE).
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
        sqlite3.Error: the file cannot be written.
    """
    if restart_wait is None:
        row = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    else:
        db.execute(f"PRAGMA busy_timeout = {max(0, int(restart_wait * 1000))}")
        try:
            row = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    if row is None:
        return (-1, -1)
    if restart_wait is not None and int(row[0]):
        # Busy: the wait ran out (another connection's write or read went on), SQLite copied what it could
        # and did not start the WAL over: said as "could not run", so the WAL's length is watched again.
        return (-1, -1)
    return (int(row[1]), int(row[2]))


class Checkpointer:
    """Checkpoints the WAL on the store's thread, in two phases: first while the calls go on (the bulk of the
    WAL is copied back, the crawl is not held), then, when writes landed meanwhile, once more while the table
    holds its calls (:attr:`holding`): it copies only those few pages, then starts the WAL over and cuts its
    file (SQLite's TRUNCATE, waiting at most :data:`RESTART_WAIT` for other processes' writes).

    A checkpoint comes when the WAL's file has grown past ``restart_frames`` pages (looked at every 250 writes):
    the first one, and every one after a cut or after a checkpoint that could not run; after a checkpoint that
    copied the WAL back without a second phase (the file not cut), after as many writes as made the WAL that
    long, going by the pages per write it found (never more often than every 1000 writes).

    Args:
        store: the store whose waiting connection checkpoints (its ``checkpoint`` and ``wal_pages``).
        pool: the store's thread.
        restart_frames: about how many pages the WAL may hold before it is checkpointed.
        resume: called on the reactor's thread once a checkpoint is done: the table runs what it held.

    Attributes:
        checkpoints: the checkpoints run so far (each counted once, whether it needed its second phase or not).
        second_phases: how many of them needed the second phase (the one that holds the calls).
        cuts: how many second phases started the WAL over and cut its file.
        holding: a second phase runs: the table's calls and event batches wait.
    """

    def __init__(self, store: SQLiteStore, pool: CallPool, restart_frames: int, resume: Callable[[], None],
                 pause: Callable[[], None] = lambda: None) -> None:
        self._store = store
        self._pool = pool
        self._resume = resume
        self._pause = pause  # before the second phase: the table's write-behind window is committed
        self.checkpoints = 0
        self.second_phases = 0
        self.cuts = 0
        self.holding = False
        self._running = False  # a checkpoint runs on the thread (either phase)
        self._stopped = False
        self._restart_frames = max(1, restart_frames)
        #: Writes between two checkpoints (set from the WAL's pages per write at each one), and the writes since
        #: the last one.
        self._every = restart_frames
        self._since = 0
        self._learned = False  # no checkpoint yet: the WAL file's length decides the first
        self._frames_after = 0  # the WAL's length at the last checkpoint

    def wrote(self) -> None:
        """One inline write landed in the WAL: a checkpoint when it is due."""
        self._since += 1
        if self._running:
            return
        if self._learned:
            if self._since >= self._every:
                self._start()
        elif self._since % 250 == 0 and self._store.wal_pages() > self._restart_frames:
            self._start()

    def stop(self) -> None:
        """At the table's close: no checkpoint starts or goes on to its second phase; nothing is held."""
        self._stopped = True
        self.holding = False

    def _start(self) -> None:
        if self._stopped or self._running:
            return
        self._running = True
        d = self._pool.run_aside(self._store.checkpoint)
        d.addErrback(self._failed)
        d.addCallback(self._first_phase_done, self._since)

    def _failed(self, failure: Failure) -> None:
        """A failed checkpoint leaves the WAL as it was; the next one retries."""
        logger.debug("scrapy-polite: a checkpoint of %s failed: %s", self._store.uri, failure.getErrorMessage())

    def _first_phase_done(self, frames: tuple[int, int] | None, writes_before: int) -> None:
        """When writes landed meanwhile (or it could not copy the whole WAL back), the second phase, holding the
        calls; else the checkpoint is done."""
        if frames is None or self._stopped or (frames[1] >= frames[0] and self._since == writes_before):
            self._done(frames)
            return
        self.holding = True
        self._pause()
        self.second_phases += 1
        d = self._pool.run_aside(self._restart)
        d.addErrback(self._failed)
        d.addCallback(self._done, True)

    def _restart(self) -> tuple[int, int]:
        """The second phase, on the store's thread: a checkpoint that lets the WAL start over."""
        return self._store.checkpoint(restart_wait=RESTART_WAIT)

    def _done(self, frames: tuple[int, int] | None, second: bool = False) -> None:
        """Set the writes until the next checkpoint from the pages per write this one found, then let the table
        run the calls (and event batches) held meanwhile."""
        self.holding = self._running = False
        self.checkpoints += 1
        self.cuts += second and frames == (0, 0)  # a first phase that found the WAL empty cut nothing
        self._learn(frames)
        self._since = 0
        if not self._stopped:  # (closed meanwhile: the held calls went to the thread)
            self._resume()

    def _learn(self, frames: tuple[int, int] | None) -> None:
        if frames is None or frames == (0, 0) or frames[0] < 0:
            # The second phase cut the WAL's file (its length is the WAL's again, every process's pages), or
            # the checkpoint could not run (another process's was running, or its writes went on past
            # RESTART_WAIT): the file's length is watched every 250 writes, as before the first checkpoint,
            # so a checkpoint that could not cut it is tried again soon.
            self._learned = False
            self._frames_after = 0
        elif frames[0] > 0 and self._since > 0:
            # Pages added since the last checkpoint: all of them when that one copied the whole WAL back
            # (the WAL started over after it), else those past its length (it could not: it kept growing).
            added = frames[0] - self._frames_after if frames[0] > self._frames_after else frames[0]
            per_write = max(1.0, added / self._since)  # a write appends at least one page
            # Never more often than every 1000 writes: other processes' pages count in the WAL's length.
            self._every = max(1000, min(100_000, int(self._restart_frames / per_write)))
            self._frames_after = frames[0] if frames[1] < frames[0] else 0
            self._learned = True
