"""Riding out an outage of a server pace table (docs/spec.md §6, "Outages").

A server store (Redis) can become unreachable mid-crawl. The crawl then **fails closed but recovers on its
own**: every call that found the store unreachable
(:class:`~scrapy_polite.stores.StoreUnavailable`) waits and tries again, with a growing delay, so no
request is sent without a booking and no response goes unrecorded; the first call that gets through ends
the outage and the crawl carries on. An outage is logged once at WARNING when it begins and at INFO when it
ends, and counted in ``polite/store/outages`` and ``polite/store/outage_seconds``. When the store has not
come back ``POLITE_STORE_TIMEOUT`` seconds after the outage began, the calls fail with a
:class:`~scrapy_polite.stores.StoreError` and the pacer closes the spider (reason ``polite_store_error``).

Embedded stores (memory, SQLite) never raise ``StoreUnavailable``: for them the guard only passes calls on.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from .policy import HostState
from .reporting import Report
from .stores import AsyncStore, ManyUpdateFn, Snapshot, StoreClosed, StoreError, StoreUnavailable, UpdateFn

__all__ = ["DeferredStore", "StoreGuard"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DeferredStore(Protocol):
    """The pace table as the glue units use it: every call returns a ``Deferred`` of its result
    (:class:`~scrapy_polite.stores.AsyncStore`, :class:`StoreGuard`)."""

    @property
    def uri(self) -> str:
        """The backend's URI."""
        ...

    def get(self, key: str) -> Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        ...

    def read(self, keys: Sequence[str]) -> Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        ...

    def update(self, key: str, fn: UpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        ...

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
        ...


class StoreGuard:
    """Calls of an :class:`~scrapy_polite.stores.AsyncStore` that wait through an outage of the store.

    A call that fails with :class:`~scrapy_polite.stores.StoreUnavailable` is made again (the same update
    function, which a backend recognises to make the retry safe) after ``first_delay`` seconds, then
    twice as long each time up to ``max_delay`` (each delay drawn from its upper half, so processes that lost
    the same server do not all come back at once), until it succeeds or ``timeout`` seconds have passed
    since the outage began: then it fails with a :class:`~scrapy_polite.stores.StoreError` naming the store,
    the timeout and the fix. Any other error is passed on at once.

    Args:
        store: the pace table.
        timeout: ``POLITE_STORE_TIMEOUT``, seconds.
        report: where ``polite/store/outages`` and ``polite/store/outage_seconds`` are counted.
        clock: this process's clock, epoch seconds (tests inject one).
        sleep: ``sleep(seconds) -> Deferred`` that never blocks the reactor (tests inject one).
        first_delay, max_delay: the backoff between two attempts, seconds.
        jitter: a random number in [0, 1) (tests inject a constant).
    """

    def __init__(self, store: AsyncStore, *, timeout: float, report: Report, clock: Callable[[], float],
                 sleep: Callable[[float], Deferred[None]], first_delay: float = 0.1, max_delay: float = 2.0,
                 jitter: Callable[[], float] = random.random) -> None:
        self.store = store
        self.timeout = timeout
        self.report = report
        self.clock = clock
        self.sleep = sleep
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.jitter = jitter
        #: When the current outage began (this process's clock), or None.
        self.outage_started: float | None = None
        self._recovered_at = float("-inf")
        self._given_up = False
        self._closed = False

    @property
    def uri(self) -> str:
        """The backend's URI."""
        return self.store.uri

    def get(self, key: str) -> Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        return self._call(lambda: self.store.get(key))

    def read(self, keys: Sequence[str]) -> Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        return self._call(lambda: self.store.read(keys))

    def update(self, key: str, fn: UpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        return self._call(lambda: self.store.update(key, fn))

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
        return self._call(lambda: self.store.update_many(keys, fn))

    def close(self) -> None:
        """Stop retrying (a call waiting out an outage fails with
        :class:`~scrapy_polite.stores.StoreClosed` at its next attempt) and close the store."""
        self._closed = True
        self.store.close()

    def close_async(self) -> Deferred[None]:
        """:meth:`close` without blocking the reactor (:meth:`AsyncStore.close_async
        <scrapy_polite.stores.AsyncStore.close_async>`)."""
        self._closed = True
        return self.store.close_async()

    # -- the retry loop ---------------------------------------------------------------------------------

    def _call(self, make: Callable[[], Deferred[T]], delay: float | None = None) -> Deferred[T]:
        started = self.clock()
        d = make()
        d.addCallbacks(self._succeeded, self._failed,
                       errbackArgs=(make, self.first_delay if delay is None else delay, started))
        return d

    def _succeeded(self, result: T) -> T:
        if self.outage_started is not None and not self._given_up:
            now = self.clock()
            seconds = max(0.0, now - self.outage_started)
            self.outage_started = None
            self._recovered_at = now
            self.report.inc("store/outage_seconds", seconds)
            logger.info("scrapy-polite: the pace table %s is reachable again after %.1f s; the crawl carries on",
                        self.uri, seconds)
        return result

    def _failed(self, failure: Failure, make: Callable[[], Deferred[T]], delay: float,
                started: float) -> Deferred[Any] | Failure:
        exc = failure.value
        if not isinstance(exc, StoreUnavailable):
            return failure
        if self._closed:  # the crawl is over: the call is abandoned, not a failure to report
            return fail(self._closed_error())
        now = self.clock()
        if self.outage_started is None and started >= self._recovered_at:
            self.outage_started = now
            self._given_up = False
            self.report.inc("store/outages")
            logger.warning("%s Requests wait (none is sent without a booking) while scrapy-polite reconnects; "
                           "the spider closes with reason polite_store_error if the pace table is not back "
                           "within POLITE_STORE_TIMEOUT=%g s.", exc, self.timeout)
        began = self.outage_started if self.outage_started is not None else started
        remaining = began + self.timeout - now
        if remaining <= 0:
            return fail(self._give_up(exc, now - began))
        wait = min(delay * (0.5 + 0.5 * self.jitter()), remaining)
        d: Deferred[Any] = self.sleep(wait)
        d.addCallback(lambda _: fail(self._closed_error()) if self._closed
                      else self._call(make, min(2 * delay, self.max_delay)))
        return d  # fires with the retried call's result

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(f"scrapy-polite's pace table {self.uri} is closed")

    def _give_up(self, exc: StoreUnavailable, seconds: float) -> StoreError:
        if self.outage_started is not None and not self._given_up:
            self._given_up = True
            self.report.inc("store/outage_seconds", max(0.0, seconds))
        return StoreError(f"{exc} It stayed unreachable for {self.timeout:g} s (POLITE_STORE_TIMEOUT).")
