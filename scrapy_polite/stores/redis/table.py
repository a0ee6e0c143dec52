"""Redis's async table (docs/spec.md §6, "Never blocking the crawl" and "Redis: contention"): every call is a
network round trip on the store's client, run on threads of its own; its updates run step by step, the wait
after a lost race on the reactor's clock, so a hot row never holds a thread and delays only its own updates."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet import defer
from twisted.python.threadpool import ThreadPool

from ...policy import HostState
from ..asyncstore import TableBase
from ..base import Event, ManyUpdateFn, Snapshot, UpdateFn, UpdateSteps
from ..threads import CallPool, Stepper, close_off_reactor

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = ["AsyncRedisStore"]

T = TypeVar("T")


class AsyncRedisStore(TableBase["RedisStore"]):
    """Redis's async table (:meth:`RedisStore.open_async <scrapy_polite.stores.redis.RedisStore.open_async>`):
    reads and the event log's batches on a pool of the store's ``threads`` threads (two: their round trips
    overlap), updates step by step (:class:`~scrapy_polite.stores.threads.Stepper`: each step on the pool, the
    wait after a lost race on the reactor's clock). An update still waiting for its next step when the table is
    closed fails with :class:`~scrapy_polite.stores.base.StoreError`; a close during an outage waits for the
    calls already sent (each at most its socket timeout) on a thread of the reactor's pool.

    Args:
        store: the Redis store (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        threads: the pool's size (None: the store's ``threads``). With more than one, calls made together
            may complete in another order (each caller waits for its own).
    """

    def __init__(self, store: RedisStore, reactor: Any = None, *, threads: int | None = None) -> None:
        super().__init__(store, reactor)
        self._pool = CallPool(self._reactor, store.threads if threads is None else threads)
        self._stepper = Stepper(self._reactor, self._pool, self._closed_error)

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        return self._run(self.store.get, key)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        return self._run(self.store.read, keys)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        return self._steps(self.store.update_steps, key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        return self._steps(self.store.update_many_steps, keys, fn)

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        return self._run(self.store.append_events, events)

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

    def close(self) -> None:
        self._finish(self._detach())

    def close_async(self) -> defer.Deferred[None]:
        return close_off_reactor(self._reactor, partial(self._finish, self._detach()))

    def _detach(self) -> ThreadPool | None:
        """On the reactor's thread: closed from here on; the updates waiting for a step fail; the pool goes."""
        self._closed = True
        self._stepper.stop()
        return self._pool.detach()

    def _finish(self, pool: ThreadPool | None) -> None:
        """Join the pool (after the calls already sent), then close the client (even when the join failed)."""
        try:
            if pool is not None:
                pool.stop()
        finally:
            self.store.close()
