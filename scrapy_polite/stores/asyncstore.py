"""Store calls that never block the reactor, with results as Twisted ``Deferred`` objects (docs/spec.md §6,
"Never blocking the crawl").

:class:`AsyncStore` is the async protocol the crawl uses. Each backend implements it itself and hands it out
with its ``open_async`` (:meth:`PaceStore.open_async <scrapy_polite.stores.base.PaceStore.open_async>`):
``memory://`` inline (:class:`~scrapy_polite.stores.memory.AsyncMemoryStore`), SQLite with its own group
commit and thread (:class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore`), Redis on its own client's threads,
its updates step by step (:class:`~scrapy_polite.stores.redis.AsyncRedisStore`). :func:`open_async` asks a
backend for its table.

:class:`TableBase` keeps what every table has (its backend, whether it is closed); :class:`PooledTable` runs
the calls of a backend whose every call does blocking I/O on a pool of threads, its stepped updates step by
step (Redis's table is one). A synchronous backend of :func:`~scrapy_polite.stores.register_store` opts into
:class:`ThreadedStore`, the generic one, by saying so in its own ``open_async``::

    def open_async(self, reactor=None):
        return ThreadedStore(self, reactor)

Nothing here picks a table by a backend's type.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from twisted.internet import defer
from twisted.python.threadpool import ThreadPool

from ..crawl.reactor import installed_reactor
from ..policy import HostState
from .base import (
    CallThreads,
    Event,
    ManyUpdateFn,
    PaceStore,
    Snapshot,
    SteppedStore,
    StoreClosed,
    StoreError,
    UpdateFn,
    UpdateSteps,
    has_ability,
)
from .threads import CallPool, Stepper, close_off_reactor

__all__ = ["AsyncStore", "PooledTable", "TableBase", "ThreadedStore", "open_async"]

T = TypeVar("T")
#: The backend of an async table.
S = TypeVar("S", bound=PaceStore)


class AsyncStore(Protocol):
    """A pace table whose calls never block the reactor; every call returns a ``Deferred`` of its result.

    Every implementation: calls complete in call order; the threads it uses start when first needed (a crawl
    refused at its start never starts one) and stop at :meth:`close` / :meth:`close_async`; from the close on
    every call fails at once with :class:`~scrapy_polite.stores.base.StoreClosed` and touches no connection
    (docs/spec.md §6, "Closing").

    Attributes:
        store: the backend (its declared abilities, its blocking calls for the start-up listing and the
            event log read after the crawl).
        transactions: write transactions run on the backend's file (SQLite: groups, event-log chunks, calls
            that ran alone; 0 for the others), for ``bench/overhead.py``.
    """

    transactions: int

    @property
    def store(self) -> PaceStore:
        """The backend."""
        ...

    @property
    def uri(self) -> str:
        """The backend's URI."""
        ...

    @property
    def closed(self) -> bool:
        """The table was closed: every call fails with :class:`~scrapy_polite.stores.base.StoreClosed`."""
        ...

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        ...

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        ...

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        ...

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
        ...

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """See :meth:`PaceStore.append_events <scrapy_polite.stores.base.PaceStore.append_events>`; fires once
        every event of the batch is written."""
        ...

    def close(self) -> None:
        """Stop the threads (after the calls already queued) and close the backend, blocking until the calls
        already queued are done (for a crawl, :meth:`close_async`). Idempotent."""
        ...

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the table is marked closed at once and the waits run on
        a thread of the reactor's pool. Fires when the table is closed; errors of the close are the
        Deferred's."""
        ...


def open_async(store: PaceStore, reactor: Any = None) -> AsyncStore:
    """The async table of ``store``, the one its backend implements (its ``open_async``).

    Raises:
        StoreError: the backend has none: the message says how a synchronous backend opts into
            :class:`ThreadedStore`.
    """
    try:
        opener = store.open_async
    except AttributeError:
        raise StoreError(f"scrapy-polite cannot pace a crawl on {store.uri}: its backend "
                         f"{type(store).__name__} has no open_async. Fix: give it one; a synchronous backend "
                         "returns scrapy_polite.stores.ThreadedStore(self, reactor).") from None
    return opener(reactor)


class TableBase(Generic[S]):
    """What every async table keeps: its backend, the reactor, whether it is closed, the write transactions
    counted. No behaviour of any backend: each table writes its own calls and close.

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
    """

    def __init__(self, store: S, reactor: Any = None) -> None:
        self.store = store
        self._reactor = installed_reactor() if reactor is None else reactor
        #: Set by the close (on the reactor's thread): every later call fails with StoreClosed.
        self._closed = False
        self.transactions = 0

    @property
    def uri(self) -> str:
        """The backend's URI."""
        return self.store.uri

    @property
    def closed(self) -> bool:
        """The table was closed: every call fails with :class:`~scrapy_polite.stores.base.StoreClosed`."""
        return self._closed

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(f"scrapy-polite's pace table {self.store.uri} is closed")


class PooledTable(TableBase[S]):
    """An async table whose calls run on a pool of threads of its own (a backend whose every call does
    blocking I/O): reads, single-call updates and the event log's batches on the pool
    (:class:`~scrapy_polite.stores.threads.CallPool`), stepped updates by a
    :class:`~scrapy_polite.stores.threads.Stepper` (each step on the pool, the wait after a lost race on the
    reactor's clock; an update still waiting for its next step when the table is closed fails with
    :class:`~scrapy_polite.stores.base.StoreError`). Its subclasses say how an update runs.

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        threads: the pool's size (with more than one, calls made together may complete in another order:
            each caller waits for its own).
    """

    def __init__(self, store: S, reactor: Any = None, *, threads: int = 1) -> None:
        super().__init__(store, reactor)
        self._pool = CallPool(self._reactor, threads)
        self._stepper = Stepper(self._reactor, self._pool, self._closed_error)

    def _run(self, fn: Any, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        return self._pool.run(fn, *args)

    def _steps(self, make: Any, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        try:
            steps: UpdateSteps[Any] = make(*args)
        except Exception:
            return defer.fail()  # the caller's Deferred carries the error
        return self._stepper.run(steps)

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        return self._run(self.store.get, key)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        return self._run(self.store.read, keys)

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        return self._run(self.store.append_events, events)

    def close(self) -> None:
        self._finish(self._detach())

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the waits (the threads finishing the calls already
        queued — a server's call in an outage may take its socket timeout —, the backend's close) on a thread
        of the reactor's pool."""
        return close_off_reactor(self._reactor, partial(self._finish, self._detach()))

    def _detach(self) -> ThreadPool | None:
        """On the reactor's thread: closed from here on; the updates waiting for a step fail; the pool goes."""
        self._closed = True
        self._stepper.stop()
        return self._pool.detach()

    def _finish(self, pool: ThreadPool | None) -> None:
        """Join the pool (after the calls already queued), then close the backend (even when the join
        failed)."""
        try:
            if pool is not None:
                pool.stop()
        finally:
            self.store.close()


class ThreadedStore(PooledTable[PaceStore]):
    """The generic async table of a synchronous backend that asks for it in its ``open_async``: every call on
    a pool of ``threads`` threads (:class:`PooledTable`); the updates of a backend that declares
    :class:`~scrapy_polite.stores.base.SteppedStore` step by step, any other's in one call.

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        threads: the pool's size; None: as many as the backend declares
            (:class:`~scrapy_polite.stores.base.CallThreads`), else one.
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, threads: int | None = None) -> None:
        if threads is None:
            threads = store.threads if has_ability(store, CallThreads) else 1
        super().__init__(store, reactor, threads=threads)
        self._stepped: SteppedStore | None = store if has_ability(store, SteppedStore) else None

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        if self._stepped is not None:
            return self._steps(self._stepped.update_steps, key, fn)
        return self._run(self.store.update, key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        if self._stepped is not None:
            return self._steps(self._stepped.update_many_steps, keys, fn)
        return self._run(self.store.update_many, keys, fn)
