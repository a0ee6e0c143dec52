"""Store calls that never block the reactor, with results as Twisted ``Deferred`` objects (docs/spec.md §6,
"Never blocking the crawl").

:class:`AsyncStore` is the async store protocol the pacer uses, and its factory: ``AsyncStore(backend)``
builds the adapter registered for the backend's type (:func:`register_async`; the registry,
:mod:`scrapy_polite.stores.registry`, registers memory's and SQLite's, each beside its backend), or
:class:`ThreadedStore`, the generic adapter for a network store (Redis), when none is registered. No adapter
here knows a concrete backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from ..policy import HostState
from ..reactor import installed_reactor
from .base import (
    Again,
    Event,
    ManyUpdateFn,
    PaceStore,
    Snapshot,
    SteppedStore,
    StoreClosed,
    UpdateFn,
    UpdateSteps,
    has_ability,
)

__all__ = ["AsyncStore", "ThreadedStore", "async_adapter", "register_async"]

T = TypeVar("T")

#: Backend type → its async adapter (:func:`register_async`).
_ADAPTERS: dict[type, type[AsyncStore]] = {}


def register_async(backend: type, adapter: type[AsyncStore]) -> None:
    """Make ``AsyncStore(store)`` build ``adapter`` for a store of type ``backend`` (or of a subclass)."""
    _ADAPTERS[backend] = adapter


def async_adapter(store: PaceStore) -> type[AsyncStore]:
    """The adapter :class:`AsyncStore` builds for ``store``: the one registered for its type (or the nearest
    base type), else :class:`ThreadedStore`."""
    for kind in type(store).__mro__:
        adapter = _ADAPTERS.get(kind)
        if adapter is not None:
            return adapter
    return ThreadedStore


class AsyncStore:
    """A store whose calls never block the reactor; every method returns a ``Deferred`` of its result.

    ``AsyncStore(store, ...)`` builds the adapter registered for the store's type (:func:`async_adapter`):

    * memory (:class:`~scrapy_polite.stores.memory.AsyncMemoryStore`): called inline (no I/O);
    * SQLite (:class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore`): group commit inline on a no-wait
      connection, a busy group on the store's thread, its own WAL checkpoints and event-log writer;
    * any other backend (:class:`ThreadedStore`, a network server such as Redis): on a thread pool, the
      updates of a :class:`~scrapy_polite.stores.base.SteppedStore` step by step.

    Every adapter: calls complete in call order; the threads it uses start when first needed (a crawl refused
    at its start never starts one) and stop at :meth:`close` / :meth:`close_async`; from the close on every
    call fails at once with :class:`~scrapy_polite.stores.base.StoreClosed` and touches no connection
    (docs/spec.md §6, "Closing").

    Args:
        store: the backend (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        restart_frames: SQLite: about how many WAL pages the WAL may hold before it is checkpointed.
        event_chunk: SQLite: the most events one inline event-log transaction writes.
        threads: size of the thread pool for backends that are not called inline.
        group_max: SQLite: the most calls one group commit runs in one transaction.

    Attributes:
        store: the backend.
        transactions: write transactions run on the backend's file (SQLite: groups, event-log chunks, calls
            that ran alone; 0 for the others), for ``bench/overhead.py``.
    """

    store: PaceStore

    def __new__(cls, store: PaceStore, reactor: Any = None, **options: Any) -> AsyncStore:
        if cls is AsyncStore:
            cls = async_adapter(store)
        return super().__new__(cls)

    def __init__(self, store: PaceStore, reactor: Any = None, *, restart_frames: int = 8192,
                 event_chunk: int = 250, threads: int = 1, group_max: int = 512) -> None:
        if reactor is None:
            reactor = installed_reactor()
        self.store = store
        self._reactor = reactor
        #: Set by the close (on the reactor's thread): every later call fails with StoreClosed.
        self._closed = False
        self.transactions = 0

    def _call(self, name: str, *args: Any) -> defer.Deferred[Any]:
        """Run the backend's method ``name`` with ``args``; a Deferred of its result. Each adapter's own."""
        raise NotImplementedError

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(f"scrapy-polite's pace table {self.store.uri} is closed")

    @property
    def closed(self) -> bool:
        """The store was closed (:meth:`close`, :meth:`close_async`): every call fails with
        :class:`~scrapy_polite.stores.base.StoreClosed`."""
        return self._closed

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
        """See :meth:`PaceStore.append_events <scrapy_polite.stores.base.PaceStore.append_events>`. Fires
        once every event of the batch is written; how each backend writes it: see its adapter."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the threads (after the calls already queued) and close the backend; blocks until the calls
        already queued are done (for a crawl, :meth:`close_async`). Idempotent; from here on every call
        fails with :class:`~scrapy_polite.stores.base.StoreClosed`."""
        raise NotImplementedError

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the store is marked closed here (a later call fails
        with :class:`~scrapy_polite.stores.base.StoreClosed`) and the waits run on a thread of the
        reactor's pool. Fires when the store is closed; errors of the close are the Deferred's."""
        raise NotImplementedError


class ThreadedStore(AsyncStore):
    """The generic adapter, for a backend that does I/O on every call (a network server: Redis): every call
    runs on the store's thread pool of ``threads`` threads. The updates of a
    :class:`~scrapy_polite.stores.base.SteppedStore` (Redis) run step by step: each step (a round trip or
    two) on the pool, and the wait after a lost race on the reactor's clock (``callLater``), so a contended
    row never holds a thread while it waits and delays only its own updates, not the other hosts'
    (docs/spec.md §6, "Redis: contention"). An update still waiting to retry when the store is closed fails
    with :class:`~scrapy_polite.stores.base.StoreError`. The event log's batches go to the pool too.

    Args: see :class:`AsyncStore`.
    """

    def __init__(self, store: PaceStore, reactor: Any = None, *, restart_frames: int = 8192,
                 event_chunk: int = 250, threads: int = 1, group_max: int = 512) -> None:
        super().__init__(store, reactor, restart_frames=restart_frames, event_chunk=event_chunk,
                         threads=threads, group_max=group_max)
        self._pool: ThreadPool | None = None  # started when first needed (:meth:`_start_pool`)
        self._threads = max(1, threads)
        #: Calls on the pool not yet done.
        self._queued = 0
        #: Updates of a stepped store waiting on the reactor's clock for their next step: timer → result.
        self._retrying: dict[Any, defer.Deferred[Any]] = {}
        self._stepped: SteppedStore | None = store if has_ability(store, SteppedStore) else None

    def _start_pool(self) -> ThreadPool:
        """The store's thread pool, started on first use (never after the close)."""
        if self._pool is None:
            self._pool = ThreadPool(minthreads=1, maxthreads=self._threads, name="scrapy-polite-store")
            self._pool.start()
        return self._pool

    def _call(self, name: str, *args: Any) -> defer.Deferred[Any]:
        if self._closed:
            return defer.fail(self._closed_error())
        if self._stepped is not None and name in ("update", "update_many"):
            return self._steps(name, args)
        return self._threaded(name, *args)

    def _steps(self, name: str, args: tuple[Any, ...]) -> defer.Deferred[Any]:
        """An update of a stepped store: its steps on the pool, the waits between them on the reactor."""
        if self._closed or self._stepped is None:
            return defer.fail(self._closed_error())
        try:
            if name == "update":
                steps: UpdateSteps[Any] = self._stepped.update_steps(*args)
            else:
                steps = self._stepped.update_many_steps(*args)
        except Exception:
            return defer.fail()
        result_d: defer.Deferred[Any] = defer.Deferred()
        self._step(steps, result_d)
        return result_d

    def _step(self, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        if self._closed:  # closed while the update waited for its next step
            result_d.errback(self._closed_error())
            return
        d: defer.Deferred[Any] = threads.deferToThreadPool(self._reactor, self._start_pool(), steps.step)
        d.addCallbacks(self._stepped_once, result_d.errback, callbackArgs=(steps, result_d))

    def _stepped_once(self, out: Any, steps: UpdateSteps[Any], result_d: defer.Deferred[Any]) -> None:
        """A step is done: the update's result, or its next step now (behind the calls already queued) or
        after the delay it asked for (on the reactor's clock: no thread waits)."""
        if not isinstance(out, Again):
            result_d.callback(out)
            return
        if out.delay <= 0:
            self._step(steps, result_d)
            return
        timer: Any = None

        def due() -> None:
            self._retrying.pop(timer, None)
            self._step(steps, result_d)

        timer = self._reactor.callLater(out.delay, due)
        self._retrying[timer] = result_d

    def _threaded(self, name: str, *args: Any) -> defer.Deferred[Any]:
        """The backend's method ``name`` on the pool; the result delivered on the reactor's thread, then
        :meth:`_after_thread` once nothing is queued."""
        if self._closed:
            return defer.fail(self._closed_error())
        pool = self._start_pool()
        self._queued += 1
        result_d: defer.Deferred[Any] = defer.Deferred()

        def done(result: Any) -> None:
            self._queued -= 1
            # The caller sees this result before any call held behind it runs: calls complete in call order.
            if isinstance(result, Failure):
                result_d.errback(result)
            else:
                result_d.callback(result)
            if not self._queued:
                self._after_thread()

        d: defer.Deferred[Any] = threads.deferToThreadPool(self._reactor, pool, getattr(self.store, name), *args)
        d.addBoth(done)
        return result_d

    def _after_thread(self) -> None:
        """The pool has no call left: an adapter holding calls behind it runs them (SQLite's)."""

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        """On the pool (fails as closed once the pool is gone)."""
        if self._closed:
            return defer.fail(self._closed_error())
        return self._threaded("append_events", events)

    def close(self) -> None:
        self._queue_held()
        self._close_parts(*self._detach())

    def close_async(self) -> defer.Deferred[None]:
        """:meth:`close` without blocking the reactor: the calls held on the reactor's side are queued and
        the store is marked closed here, and the waits (the store's threads finishing the calls already
        queued — a Redis call in an outage may take its socket timeout —, the backend's close) run on a
        thread of the reactor's pool. Blocking when the reactor is not running (nothing to keep responsive,
        and its pool may be gone)."""
        self._queue_held()
        parts = self._detach()
        if not getattr(self._reactor, "running", False):
            try:
                self._close_parts(*parts)
            except Exception:
                return defer.fail()
            return defer.succeed(None)
        d: defer.Deferred[None] = threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(),
                                                            self._close_parts, *parts)
        return d

    def _queue_held(self) -> None:
        """Before the close, on the reactor's thread: calls held on the reactor's side go to the threads, in
        order (an adapter that holds calls: SQLite's)."""

    def _detach(self) -> tuple[ThreadPool | None, ...]:
        """On the reactor's thread: take the threads out of use (later calls see the store closed) and hand
        them to :meth:`_close_parts`. From here on every call fails with StoreClosed."""
        self._closed = True
        pool, self._pool = self._pool, None
        retrying, self._retrying = self._retrying, {}
        for timer, result_d in retrying.items():  # updates waiting to retry a lost race: stopped, failed
            if timer.active():
                timer.cancel()
            result_d.errback(self._closed_error())
        return (pool,)

    def _close_parts(self, *pools: ThreadPool | None) -> None:
        """Join the pool (after the calls already queued), then close the backend (even when the join
        failed)."""
        try:
            for pool in pools:
                if pool is not None:
                    pool.stop()
        finally:
            self.store.close()
