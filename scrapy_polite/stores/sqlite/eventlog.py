"""The event log's writer of SQLite's async table (docs/spec.md §6, "Never blocking the crawl"): batches written
inline in short transactions, one per reactor turn, so it never holds the write lock the pace table's calls
wait for."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import CallLaterResult
from twisted.internet import defer
from twisted.python.threadpool import ThreadPool

from ..base import Event, StoreBusy
from ..threads import CallPool

if TYPE_CHECKING:
    from .store import SQLiteStore

__all__ = ["EventWriter"]


class EventWriter:
    """Writes the event log's batches inline on the no-wait connection, in transactions of at most ``chunk``
    events, one per reactor turn (under a millisecond each). A batch that finds another process's write under
    way, or is still waiting at the close, is written on a connection and a thread of its own, which waits for
    the lock; the batches appended meanwhile follow it there until it is written (in order). While the table
    holds its calls (a checkpoint's second phase) the batches wait too.

    Args:
        reactor: the Twisted reactor.
        store: the table's waiting connection (the thread's connection is its :meth:`~SQLiteStore.sibling`).
        inline: the table's no-wait connection.
        next_turn: schedules a call on the reactor's next turn.
        chunk: the most events one inline transaction writes.
        wrote: called after each inline transaction (the table counts it toward its checkpoints).
        paused: True while batches must wait (the table holds its calls, or is closed).
    """

    def __init__(self, reactor: Any, store: SQLiteStore, inline: SQLiteStore,
                 next_turn: Callable[..., CallLaterResult], chunk: int, *,
                 wrote: Callable[[], None], paused: Callable[[], bool]) -> None:
        self._store = store
        self._inline = inline
        self._next_turn = next_turn
        self._chunk = max(1, chunk)
        self._wrote = wrote
        self._paused = paused
        #: Batches waiting for the inline writer, in order: ``[events not yet written, Deferred]``.
        self._waiting: deque[tuple[list[Event], defer.Deferred[None]]] = deque()
        self._turn: CallLaterResult | None = None  # the reactor turn scheduled for the next chunk
        self._writing = False  # a chunk is being written (a batch appended meanwhile waits its turn)
        self._on_thread = 0  # batches on the thread: later ones follow them there, in order
        self._pool = CallPool(reactor, 1, name="scrapy-polite-events")
        self._thread_store: SQLiteStore | None = None

    def append(self, events: list[Event]) -> defer.Deferred[None]:
        """Fires once every event of the batch is written."""
        d: defer.Deferred[None] = defer.Deferred()
        self._waiting.append((list(events), d))
        if self._turn is None and not self._writing:
            self.write()
        return d

    def write(self) -> None:
        """Write one chunk of the waiting batches inline, and schedule the next reactor turn for the rest."""
        if self._turn is not None:  # called before its turn came (a cancel after it is harmless)
            self._turn.cancel()
        self._turn = None
        if self._writing or self._paused():
            return
        self._writing = True
        try:
            self._write_one_chunk()
        finally:
            self._writing = False
        if self._waiting and not self._paused() and not self._on_thread:
            self._turn = self._next_turn(self.write)

    def _write_one_chunk(self) -> None:
        """The first batch's next chunk, inline; a batch that meets the lock (or follows one on the thread)
        goes to the thread, and the next one is tried."""
        while self._waiting:
            events, d = self._waiting[0]
            if self._on_thread:
                self._waiting.popleft()
                self._threaded(events).chainDeferred(d)
                continue
            chunk = events[:self._chunk]
            try:
                self._inline.append_events(chunk)
            except StoreBusy:
                self._waiting.popleft()
                self._threaded(events).chainDeferred(d)
                continue
            except Exception:
                self._waiting.popleft()
                d.errback()  # the batch's caller gets the error
                continue
            del events[:len(chunk)]
            if not events:
                self._waiting.popleft()
                d.callback(None)  # a batch its callbacks append waits for the next turn
            self._wrote()
            break

    def _threaded(self, events: list[Event]) -> defer.Deferred[None]:
        """Write a batch on the event log's own connection and thread (it waits for the lock; the connection is
        opened there too, since opening it also waits)."""
        self._on_thread += 1
        d: defer.Deferred[None] = self._pool.run_aside(self._append_on_thread, events)

        def written(result: Any) -> Any:
            self._on_thread -= 1
            if not self._on_thread and self._waiting and self._turn is None:
                self.write()  # the thread is done: inline again
            return result

        d.addBoth(written)
        return d

    def _append_on_thread(self, events: list[Event]) -> None:
        """On the event log's thread: open its connection the first time, then append."""
        if self._thread_store is None:
            self._thread_store = self._store.sibling()
        self._thread_store.append_events(events)

    def queue_on_thread(self) -> None:
        """At the table's close, on the reactor's thread: every batch not written yet goes to the thread, in
        order."""
        if self._turn is not None:
            self._turn.cancel()
        self._turn = None
        while self._waiting:
            events, d = self._waiting.popleft()
            self._threaded(events).chainDeferred(d)

    def detach(self) -> ThreadPool | None:
        """At the table's close: the thread, handed over to be joined (None: it never started)."""
        return self._pool.detach()

    def close(self) -> None:
        """After the thread was joined: close its connection."""
        thread_store, self._thread_store = self._thread_store, None
        if thread_store is not None:
            thread_store.close()
