"""Store calls that never block the reactor, with results as Twisted ``Deferred`` objects."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..policy import HostState
from ..reactor import installed_reactor
from .base import Event, ManyUpdateFn, PaceStore, Snapshot, StoreBusy, StoreError, UpdateFn
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["AsyncStore"]

T = TypeVar("T")


class AsyncStore:
    """A store whose calls never block the reactor; every method returns a ``Deferred`` of its result.

    * :class:`~scrapy_polite.stores.memory.MemoryStore`: called inline (no I/O).
    * :class:`~scrapy_polite.stores.sqlite.SQLiteStore`: first tried inline on a no-wait connection (a WAL
      transaction without fsync, tens of microseconds); when another writer holds the lock
      (:class:`~scrapy_polite.stores.base.StoreBusy`), the call runs on the store's own thread, which may
      wait for the lock; the calls made meanwhile wait on the reactor's side and then run inline again
      (one round trip through the thread, not one for every call of a busy crawl). The thread also
      checkpoints the WAL every
      ``checkpoint_every`` inline writes; the calls made meanwhile wait on the reactor's side (no write
      lands in the WAL while it is copied back, so the WAL can start over) and then run inline again,
      instead of each taking a round trip through the thread. Calls complete in call order.
    * any other backend (a network server): every call runs on the store's thread pool of
      ``threads`` threads.

    The event log (:meth:`append_events`) is written off the pace table's path: inline for memory; for
    SQLite on a connection and a thread of its own, never queued with the calls above (they only meet on
    the file's write lock, held for the one short transaction of a batch); on the pool for a server.

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        checkpoint_every: inline SQLite writes between two WAL checkpoints.
        threads: size of the thread pool for backends that are not called inline.
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, checkpoint_every: int = 1000,
                 threads: int = 1) -> None:
        if reactor is None:
            reactor = installed_reactor()
        self.store = store
        self._reactor = reactor
        self._pool: ThreadPool | None = None
        self._inline: PaceStore | None = None
        self._queued = 0
        self._writes = 0
        #: Calls made while a checkpoint or a busy call runs on the thread, in call order:
        #: ``(method name, args, Deferred of the result)``.
        self._held: deque[tuple[str, tuple[Any, ...], defer.Deferred[Any]]] = deque()
        self._checkpointing = False
        self._checkpoint_every = checkpoint_every
        self._events_pool: ThreadPool | None = None
        self._events_store: SQLiteStore | None = None
        if isinstance(store, MemoryStore):
            self._inline = store
            return
        if isinstance(store, SQLiteStore):
            self._inline = store.nowait()
        self._pool = ThreadPool(minthreads=1, maxthreads=max(1, threads), name="scrapy-polite-store")
        self._pool.start()

    def _call(self, name: str, *args: Any) -> defer.Deferred[Any]:
        # Behind the checkpoint, behind an inline call handed to the thread, and behind the calls already held.
        if self._checkpointing or self._held or (self._queued and self._inline is not None):
            d: defer.Deferred[Any] = defer.Deferred()
            self._held.append((name, args, d))
            return d
        return self._run(name, args)

    def _run(self, name: str, args: tuple[Any, ...]) -> defer.Deferred[Any]:
        if self._inline is not None and not self._queued:
            try:
                result = getattr(self._inline, name)(*args)
            except StoreBusy:
                pass
            except Exception:
                return defer.fail()
            else:
                if name in ("update", "update_many") and self._pool is not None:
                    self._writes += 1
                    if self._writes % self._checkpoint_every == 0:
                        self._checkpoint()
                return defer.succeed(result)
        return self._threaded(name, *args)

    def _checkpoint(self) -> None:
        """Checkpoint the WAL on the store's thread; calls wait on the reactor's side until it is done."""
        if self._pool is None or not isinstance(self.store, SQLiteStore):
            return
        self._checkpointing = True
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._pool, self.store.checkpoint)
        d.addErrback(lambda _failure: None)
        d.addCallback(self._checkpointed)

    def _checkpointed(self, _result: None) -> None:
        """The checkpoint is done: run the calls held meanwhile, in order (inline while they can be)."""
        self._checkpointing = False
        self._drain()

    def _drain(self) -> None:
        """Run the held calls in order, inline while they can be; stop when one starts a checkpoint or is
        handed to the thread (the rest wait for it)."""
        while self._held and not self._checkpointing and not (self._queued and self._inline is not None):
            name, args, d = self._held.popleft()
            self._run(name, args).chainDeferred(d)

    def _threaded(self, name: str, *args: Any) -> defer.Deferred[Any]:
        if self._pool is None:
            return defer.fail(StoreError(f"scrapy-polite's pace table {self.store.uri} is closed"))
        self._queued += 1
        result_d: defer.Deferred[Any] = defer.Deferred()

        def done(result: Any) -> None:
            self._queued -= 1
            # The caller sees this result before any call held behind it runs: calls complete in call order.
            if isinstance(result, Failure):
                result_d.errback(result)
            else:
                result_d.callback(result)
            if not self._queued and self._inline is not None:
                self._drain()

        d: defer.Deferred[Any] = threads.deferToThreadPool(self._reactor, self._pool,
                                                           getattr(self.store, name), *args)
        d.addBoth(done)
        return result_d

    @property
    def uri(self) -> str:
        """The backend's URI."""
        return self.store.uri

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        return self._call("get", key)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        return self._call("read", keys)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        return self._call("update", key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
        return self._call("update_many", keys, fn)

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """See :meth:`PaceStore.append_events <scrapy_polite.stores.base.PaceStore.append_events>`; written
        off the pace table's path (see the class)."""
        if isinstance(self.store, MemoryStore):
            try:
                self.store.append_events(events)
            except Exception:
                return defer.fail()
            return defer.succeed(None)
        if not isinstance(self.store, SQLiteStore):
            return self._threaded("append_events", events) if self._pool is not None else defer.fail(
                StoreError(f"scrapy-polite's pace table {self.store.uri} is closed"))
        if self._pool is None:
            return defer.fail(StoreError(f"scrapy-polite's pace table {self.store.uri} is closed"))
        if self._events_pool is None or self._events_store is None:
            try:
                self._events_store = self.store.sibling()
            except StoreError:
                return defer.fail()
            self._events_pool = ThreadPool(minthreads=1, maxthreads=1, name="scrapy-polite-events")
            self._events_pool.start()
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._events_pool,
                                                            self._events_store.append_events, events)
        return d

    def close(self) -> None:
        """Stop the thread (after the calls already queued), checkpoint and close the backend. Blocks until
        the calls already queued are done: for a crawl, :meth:`close_async` does the same off the reactor."""
        self._queue_held()
        self._close_parts(*self._detach())

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the calls held on the reactor's side are queued and
        the store is marked closed here (a later call fails with :class:`StoreError`), and the waits (the
        store's threads finishing the calls already queued — a Redis call in an outage may take its socket
        timeout —, the WAL checkpoint, the backend's close) run on a thread of the reactor's pool. Fires
        when the store is closed; errors of the close are the Deferred's. Blocking when the reactor is not
        running (nothing to keep responsive, and its pool may be gone)."""
        self._queue_held()
        parts = self._detach()
        pool, events_pool = parts[0], parts[1]
        if (pool is None and events_pool is None) or not getattr(self._reactor, "running", False):
            try:
                self._close_parts(*parts)
            except Exception:
                return defer.fail()
            return defer.succeed(None)
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(),
                                                            self._close_parts, *parts)
        return d

    def _queue_held(self) -> None:
        self._checkpointing = False
        while self._held:  # calls held behind a checkpoint or a busy call: queued on the thread, in order
            name, args, d = self._held.popleft()
            self._threaded(name, *args).chainDeferred(d)

    def _detach(self) -> tuple[ThreadPool | None, ThreadPool | None, SQLiteStore | None]:
        """On the reactor's thread: take the threads and the event log's connection out of use (later calls
        see the store closed) and hand them to :meth:`_close_parts`."""
        parts = (self._pool, self._events_pool, self._events_store)
        self._pool = self._events_pool = None
        self._events_store = None
        return parts

    def _close_parts(self, pool: ThreadPool | None, events_pool: ThreadPool | None,
                     events_store: SQLiteStore | None) -> None:
        """Join the threads (after the calls already queued), checkpoint, close every connection; each step
        runs even when an earlier one failed (the first error is raised at the end)."""
        try:
            if events_pool is not None:  # the event batches already queued are written first
                events_pool.stop()
        finally:
            try:
                if events_store is not None:
                    events_store.close()
            finally:
                try:
                    if pool is not None:
                        pool.stop()
                        if isinstance(self.store, SQLiteStore):
                            try:
                                self.store.checkpoint()
                            except StoreError:
                                pass
                finally:
                    try:
                        if self._inline is not None and self._inline is not self.store:
                            self._inline.close()
                    finally:
                        self.store.close()
