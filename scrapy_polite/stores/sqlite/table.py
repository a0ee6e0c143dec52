"""SQLite's own async table (docs/spec.md §6, "Group commit" and "Never blocking the crawl"): group commit
inline on a no-wait connection, a busy group on the store's thread, the WAL's checkpoints
(:mod:`.checkpoints`) and the event log's writer (:mod:`.eventlog`)."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy.utils.asyncio import CallLaterResult
from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ...crawl.reactor import next_turn_scheduler
from ...policy import HostState
from ..asyncstore import TableBase
from ..base import Event, ManyUpdateFn, Snapshot, StoreBusy, StoreError, UpdateFn
from ..threads import CallPool, close_off_reactor
from . import rows
from .checkpoints import Checkpointer
from .eventlog import EventWriter

if TYPE_CHECKING:
    from .store import SQLiteStore

__all__ = ["AsyncSQLiteStore", "GROUP_MAX"]

T = TypeVar("T")

#: The most calls one group commit runs in one transaction (docs/spec.md §6, "Group commit").
GROUP_MAX = 512

#: Seconds a table written by one crawl alone keeps its write transaction open for the next groups (docs/spec.md
#: §6, "Write-behind"): about this much is lost with the process, and another opener waits about this long.
WRITE_BEHIND = 0.1

#: A call waiting for its group: ``(operation, Deferred of the result, whether it writes)``.
_Held = tuple[rows.Op[Any], "defer.Deferred[Any]", bool]


class AsyncSQLiteStore(TableBase["SQLiteStore"]):
    """SQLite's async table (:meth:`SQLiteStore.open_async <scrapy_polite.stores.sqlite.SQLiteStore.open_async>`):
    calls never block the reactor, every method returns a ``Deferred``; calls complete in call order.

    * **Group commit**: the updates (and the reads behind them) made in one reactor turn wait for the next
      turn (:func:`~scrapy_polite.crawl.reactor.next_turn_scheduler`), then run in call order in **one**
      ``BEGIN IMMEDIATE`` transaction (:meth:`SQLiteStore.run_group
      <scrapy_polite.stores.sqlite.SQLiteStore.run_group>`, at most ``group_max`` calls), each caller getting
      its own result or its own exception; a read with nothing waiting before it runs inline at once. The
      group is first tried inline on a no-wait connection (a WAL transaction without fsync, tens of
      microseconds); when another writer holds the lock (:class:`~scrapy_polite.stores.base.StoreBusy`), the
      whole group runs on the store's own thread, which may wait for the lock; the calls made meanwhile wait
      on the reactor's side and then run inline again.
    * **Checkpoints** of the WAL on the store's thread, in two phases
      (:class:`~scrapy_polite.stores.sqlite.checkpoints.Checkpointer`): the calls wait during the second only.
    * **The event log** (:meth:`append_events`): inline on the no-wait connection too, in short transactions,
      one per reactor turn (:class:`~scrapy_polite.stores.sqlite.eventlog.EventWriter`).

    Args:
        store: the SQLite store (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        restart_frames: about how many WAL pages the WAL may hold before it is checkpointed.
        event_chunk: the most events one inline event-log transaction writes.
        group_max: the most calls one group commit runs in one transaction.

    Attributes:
        transactions: write transactions run on the file (groups, event-log chunks), for ``bench/overhead.py``.
        checkpoints, second_phases, cuts: the checkpoints' counts (``bench/wal.py``), see
            :class:`~scrapy_polite.stores.sqlite.checkpoints.Checkpointer`.
    """

    def __init__(self, store: SQLiteStore, reactor: Any = None, *, restart_frames: int = 8192,
                 event_chunk: int = 250, group_max: int = GROUP_MAX, write_behind: float = WRITE_BEHIND) -> None:
        super().__init__(store, reactor)
        self._inline = store.nowait()
        #: Seconds a write-behind window stays open at most (0: none; docs/spec.md §6, "Write-behind").
        self._behind = max(0.0, write_behind)
        self._inline.behind.seconds = self._behind
        self._window_timer: Any = None  # the commit of the open window
        #: The StoreError of a window that could not be committed: every later call fails with it.
        self._lost: StoreError | None = None
        #: The store's thread: busy groups, reads that met a lock, checkpoints, the calls held at the close.
        self._pool = CallPool(self._reactor, 1, idle=self._schedule_flush)
        #: Schedules a call on the reactor's next turn (straight on the asyncio loop when it is the reactor's).
        self._next_turn = next_turn_scheduler(self._reactor)
        self._wal = Checkpointer(store, self._pool, restart_frames, resume=self._resume, pause=self._commit_window)
        self._events = EventWriter(self._reactor, store, self._inline, self._next_turn, event_chunk,
                                   wrote=self._wrote, paused=self._events_paused)
        #: Calls waiting for the next group (the calls of this turn, or held behind a checkpoint or a busy
        #: group on the thread), in call order.
        self._held: deque[_Held] = deque()
        self._group_max = max(1, group_max)
        self._flush_turn: CallLaterResult | None = None  # the reactor turn scheduled for the next group
        #: A group's results are being handed out: a write made meanwhile goes behind the group's later calls.
        self._delivering = False

    @property
    def checkpoints(self) -> int:
        return self._wal.checkpoints

    @property
    def second_phases(self) -> int:
        return self._wal.second_phases

    @property
    def cuts(self) -> int:
        return self._wal.cuts

    # -- the calls ---------------------------------------------------------------------------------------------

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        return self._call(partial(rows.get_op, key), False)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        return self._call(partial(rows.read_op, keys), False)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        return self._call(partial(rows.update_op, key, fn), True)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        return self._call(partial(rows.update_many_op, keys, fn), True)

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """Inline in chunks, one per reactor turn; a batch meeting another writer on its own thread."""
        if self._closed:
            return defer.fail(self._closed_error())
        lost = self._lost_error()
        if lost is not None:
            return defer.fail(lost)
        return self._events.append(events)

    def _call(self, op: rows.Op[T], writes: bool) -> defer.Deferred[T]:
        if self._closed:
            return defer.fail(self._closed_error())
        if self._lost is not None or self._inline.behind.lost:  # (the check of _lost_error, without its call)
            return defer.fail(self._lost_error())
        if writes and self._inline.behind.open and not (self._held or self._delivering or self._wal.holding
                                                         or self._pool.queued):
            # A write-behind window holds the file's write lock: this call is a group of its own, in the window's
            # transaction, at once (docs/spec.md §6, "Write-behind"): no turn waited, its result already there.
            try:
                (ok, value), = self._inline.run_group((op,))
            except Exception:
                return defer.fail()  # the file failed: the window is lost (later calls fail: _lost_error)
            self._grouped(True)
            return defer.succeed(value) if ok else defer.fail(value)
        if writes or self._held or self._wal.holding or self._pool.queued:
            # Group commit: behind the calls already waiting, in the next group.
            d: defer.Deferred[T] = defer.Deferred()
            self._held.append((op, d, writes))
            self._schedule_flush()
            return d
        # A read with nothing waiting before it: inline at once (it sees every write already delivered).
        try:
            result = self._inline.run_read(op)
        except StoreBusy:
            return self._pool.run(self.store.run_read, op)
        except Exception:
            return defer.fail()  # the caller's Deferred carries the error
        return defer.succeed(result)

    # -- group commit ------------------------------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        """The next group runs on the next reactor turn, unless one is scheduled, or a checkpoint or a busy
        group on the thread holds them (its end schedules it)."""
        if self._flush_turn is None and not self._closed and not self._wal.holding and not self._pool.queued:
            self._flush_turn = self._next_turn(self._flush)

    def _flush(self) -> None:
        """Run the waiting calls (at most ``group_max``) as one group, one transaction, inline on the no-wait
        connection; a group that finds another writer's lock goes whole to the store's thread, which waits
        for it. Each caller's Deferred fires in call order."""
        self._flush_turn = None
        if self._closed or self._wal.holding or self._pool.queued or not self._held:
            return
        lost = self._lost_error()
        if lost is not None:
            self._fail_all(lost, list(self._held))
            self._held.clear()
            return
        held, writes = self._held, False
        batch: list[_Held] = []
        ops: list[rows.Op[Any]] = []
        while held and len(batch) < self._group_max:  # (one loop, no comprehension: run once or twice per page)
            call = held.popleft()
            batch.append(call)
            ops.append(call[0])
            writes = writes or call[2]
        try:
            outcomes = self._inline.run_group(ops)
        except StoreBusy:
            d = self._pool.run(self.store.run_group, ops)
            d.addCallbacks(self._threaded_group_done, self._fail_all, callbackArgs=(batch,), errbackArgs=(batch,))
            return
        except Exception as exc:
            self._fail_all(exc, batch)  # each caller's Deferred carries the error
        else:
            self._grouped(writes)
            self._deliver(batch, outcomes)
        if self._held:
            self._schedule_flush()

    def _grouped(self, writes: bool) -> None:
        """An inline group ran: its write-behind window is timed (:meth:`_commit_window` ends it), or the write
        transaction it committed is counted (:meth:`_wrote`)."""
        if self._inline.behind.open:
            if self._window_timer is None:
                self._window_timer = self._reactor.callLater(self._behind, self._commit_window)
        elif writes:
            self._wrote()

    def _threaded_group_done(self, outcomes: list[tuple[bool, Any]], batch: list[_Held]) -> None:
        """A group that met another writer's lock ran on the store's thread (the calls made meanwhile then run
        inline again: the pool's idle call schedules them)."""
        self.transactions += 1
        self._deliver(batch, outcomes)

    def _deliver(self, batch: Sequence[_Held], outcomes: Sequence[tuple[bool, Any]]) -> None:
        """Each caller its own result or its own exception, in call order. A write that a caller's callback makes
        meanwhile waits for the next group (:attr:`_delivering`), so it completes after the rest of this one."""
        delivering, self._delivering = self._delivering, True
        try:
            for (_, d, _), (ok, value) in zip(batch, outcomes, strict=True):
                if ok:
                    d.callback(value)
                else:
                    d.errback(value)
        finally:
            self._delivering = delivering

    def _fail_all(self, failure: Failure | Exception, batch: Sequence[_Held]) -> None:
        """The group's transaction failed (nothing of it was written): every caller gets the error (in call order,
        as :meth:`_deliver`)."""
        self._deliver(batch, [(False, failure)] * len(batch))

    def _commit_window(self) -> None:
        """Commit the write-behind window (its timer, the close). A window that cannot be committed is lost: the
        opener's mark is left as an unclean stop's (the next opening treats every row as just booked), and every
        later call fails with the error, which stops the crawl."""
        if self._window_timer is not None and self._window_timer.active():
            self._window_timer.cancel()
        self._window_timer = None
        try:
            if self._inline.commit_window():
                self._wrote()
        except StoreError:
            self._lost_error()  # (the window is lost: every later call fails)

    def _lost_error(self) -> StoreError | None:
        """The error every call fails with once a write-behind window was lost (its groups were delivered, then
        rolled back): the crawl stops, and the opener's mark is left for the next opening to repair."""
        if self._lost is None and self._inline.behind.lost:
            self.store.keep_mark()
            self._lost = StoreError(f"the pace table {self.store.uri} could not commit its last writes (docs/spec.md "
                                    "§6, \"Write-behind\"): the crawl stops; the next opening repairs the table")
        return self._lost

    def _wrote(self) -> None:
        """One inline write transaction landed in the WAL (a group's, an event-log chunk's)."""
        self.transactions += 1
        self._wal.wrote()

    def _resume(self) -> None:
        """A checkpoint is done: the calls (and event batches) held meanwhile run, in order, inline while they
        can be."""
        if self._closed:
            return
        self._schedule_flush()
        self._events.write()

    def _events_paused(self) -> bool:
        return self._closed or self._wal.holding

    # -- closing -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        self._finish(*self._detach())

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the calls held on the reactor's side are queued on the
        threads and the table is marked closed here; the waits (the threads finishing the calls already
        queued, the final checkpoint, the connections' close) run on a thread of the reactor's pool."""
        return close_off_reactor(self._reactor, partial(self._finish, *self._detach()))

    def _detach(self) -> tuple[ThreadPool | None, ThreadPool | None]:
        """On the reactor's thread: calls waiting for their group go to the store's thread one by one, in
        order, and event batches not written yet to the event log's thread; from here on every call fails
        with StoreClosed. The threads are handed to :meth:`_finish`."""
        if not self._closed:
            self._commit_window()
            self._lost_error()  # a window lost by a group or an event chunk: the mark is left for the next opening
            self._wal.stop()
            if self._flush_turn is not None:
                self._flush_turn.cancel()
            self._flush_turn = None
            while self._held:
                op, d, writes = self._held.popleft()
                self._pool.run(self.store.run_alone if writes else self.store.run_read, op).chainDeferred(d)
            self._events.queue_on_thread()
        self._closed = True
        return self._pool.detach(), self._events.detach()

    def _finish(self, pool: ThreadPool | None, events_pool: ThreadPool | None) -> None:
        """Join the threads (the event log's first, after the batches already queued), checkpoint, close every
        connection; each step runs even when an earlier one failed (the error is raised at the end)."""
        with contextlib.ExitStack() as steps:  # run last to first
            steps.callback(self.store.close)
            steps.callback(self._inline.close)
            steps.callback(self._last_checkpoint, pool)
            steps.callback(self._events.close)
            if events_pool is not None:
                steps.callback(events_pool.stop)

    def _last_checkpoint(self, pool: ThreadPool | None) -> None:
        """After the store's thread is joined: the WAL copied back (a file that cannot be written keeps it)."""
        if pool is not None:
            pool.stop()
        with contextlib.suppress(StoreError):
            self.store.checkpoint()
