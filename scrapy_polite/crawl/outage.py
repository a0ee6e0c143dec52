"""Riding out an outage of a server pace table (docs/spec.md §6, "Outages"), and a table that comes back
empty (§6, "A table that comes back empty": :class:`TableWatch`).

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
import math
import random
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from ..policy import HostState, PacingPolicy
from ..policy.state import replace
from ..reports.counters import Report
from ..stores import (
    TABLE_KEY,
    AsyncStore,
    ManyUpdateFn,
    Snapshot,
    StoreClosed,
    StoreError,
    StoreUnavailable,
    UpdateFn,
)
from .reactor import await_deferred

__all__ = ["DeferredStore", "StoreGuard", "TableWatch"]

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


#: Rows of :attr:`TableWatch.known` beyond which the rows that hold nothing (no wait, backoff, delay, quota or
#: hold in force) are forgotten: restoring them would change nothing.
KNOWN_ROWS_SWEEP = 50_000
#: Rows written back per transaction when a table came back empty.
RESTORE_BATCH = 200


class _Lost:
    """The result of a call that found the table's identity gone or changed: nothing was written."""


_LOST = _Lost()


class TableWatch:
    """The pace table as the crawl uses it, watched for **a table that comes back empty** (docs/spec.md §6): a
    Redis restarted without persistence, a failover onto an empty replica, a SQLite file deleted or replaced under
    the running crawl.

    Every table carries an identity, a row of its own (:data:`~scrapy_polite.stores.TABLE_KEY`, whose ``held_by``
    is a random id written by the first crawl that found the table without one). Each call reads it with its
    rows, in the same transaction (or, ``check_every`` > 0, at most that often: a sharded Redis table, whose
    identity lies in another slot than most rows); a call that finds it gone or changed writes nothing, and
    every call waits while this process writes back what it knows — every row it read or wrote this crawl
    (:attr:`known`), merged with what the table holds now (:meth:`PacingPolicy.restore
    <scrapy_polite.policy.PacingPolicy.restore>`: Crawl-delays, backoffs, Retry-After holds, quotas, in-flight
    holds) — then goes on. One WARNING per loss, counted (``polite/store/restores``,
    ``polite/store/restored_rows``) and recorded in the event log (``restored`` events, which ``scrapy polite
    audit`` reads).

    Args:
        store: the table's calls (a :class:`StoreGuard`, or the :class:`~scrapy_polite.stores.AsyncStore`).
        report: counters and stats.
        restored: ``restored(rows, since)`` records the restore in the event log (``rows``: key → the row
            written back; ``since``: the table's time this process last found it whole).
        check_every: seconds between two checks of the identity (0: with every call).
        clock: this process's clock (seconds), for ``check_every``.
        own_holds: the tokens of the in-flight holds of this process's requests still in flight; a restore writes
            back these holds only (another process's, seen before the loss, may have been released since: written
            back, it would hold its host for a request's whole timeout). None: every hold known.
    """

    def __init__(self, store: DeferredStore, *, report: Report,
                 restored: Callable[[dict[str, HostState], float], None] | None = None, check_every: float = 0.0,
                 clock: Callable[[], float] | None = None, own_holds: Callable[[], Collection[int]] | None = None,
                 ) -> None:
        self.store = store
        self.own_holds = own_holds
        self.report = report
        self.restored = restored
        self.check_every = check_every
        self.clock = clock or (lambda: 0.0)
        #: key → the row as this process last read or wrote it this crawl.
        self.known: dict[str, HostState] = {}
        #: The table's id (None: not known yet).
        self.identity: int | None = None
        #: The table's time at which this process last found it whole.
        self.whole_at = 0.0
        self._checked = float("-inf")
        self._restoring: Deferred[None] | None = None

    @property
    def uri(self) -> str:
        """The backend's URI."""
        return self.store.uri

    def get(self, key: str) -> Deferred[HostState | None]:
        """See :meth:`PaceStore.get <scrapy_polite.stores.base.PaceStore.get>`."""
        return self.read([key]).addCallback(lambda snapshot: snapshot.states[key])

    def read(self, keys: Sequence[str]) -> Deferred[Snapshot]:
        """See :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
        if self._restoring is not None:
            return self._after_restore(lambda: self.read(keys))
        checked = self._checks()
        d = self.store.read([TABLE_KEY, *keys] if checked else keys)
        d.addCallback(self._read, keys, checked, self.identity)
        return d

    def _read(self, snapshot: Snapshot, keys: Sequence[str], checked: bool,
              expected: int | None) -> Snapshot | Deferred[Snapshot]:
        states = snapshot.states
        if checked:
            table = states.pop(TABLE_KEY)
            if self._lost(table):
                return self._after_loss(lambda: self.read(keys), expected)
            if self.identity is None and table is not None:
                self.identity = table.held_by
            self.whole_at = snapshot.now
        self._note(states, {}, snapshot.now)
        return Snapshot(states, snapshot.now) if checked else snapshot

    def update(self, key: str, fn: UpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
        def many(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], T]:
            new, result = fn(states[key], now)
            return ({key: new} if new is not None else {}), result

        return self.update_many([key], many)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> Deferred[T]:
        """See :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`. The call's
        function runs only on a table whose identity is the one this process knows (writing it first when the
        table has none yet)."""
        if self._restoring is not None:
            return self._after_restore(lambda: self.update_many(keys, fn))
        checked = self._checks()
        expected = self.identity

        def watched(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], Any]:
            writes: dict[str, HostState] = {}
            identity = expected
            if checked:
                table = states.pop(TABLE_KEY)
                if expected is not None and (table is None or table.held_by != expected):
                    return {}, _LOST
                if table is None:  # a table without an identity yet: this crawl gives it one
                    identity = _new_identity()
                    writes[TABLE_KEY] = HostState(held_by=identity, updated=math.inf)
                else:
                    identity = table.held_by
            new, result = fn(states, now)
            writes.update(new)
            return writes, (result, states, new, now, identity)

        d = self.store.update_many([TABLE_KEY, *keys] if checked else keys, watched)
        d.addCallback(self._updated, keys, fn, checked, expected)
        return d

    def _updated(self, outcome: Any, keys: Sequence[str], fn: ManyUpdateFn[T], checked: bool,
                 expected: int | None) -> T | Deferred[T]:
        if outcome is _LOST:
            return self._after_loss(lambda: self.update_many(keys, fn), expected)
        result, states, new, now, identity = outcome
        if checked:
            self.identity = identity
            self.whole_at = now
        self._note(states, new, now)
        return result  # type: ignore[no-any-return]

    def _checks(self) -> bool:
        """This call reads the identity (every call, or once per ``check_every``)."""
        if self.check_every <= 0:
            return True
        now = self.clock()
        if now - self._checked >= self.check_every or self.identity is None:
            self._checked = now
            return True
        return False

    def _lost(self, table: HostState | None) -> bool:
        return self.identity is not None and (table is None or table.held_by != self.identity)

    def _note(self, states: dict[str, HostState | None], new: dict[str, HostState], now: float) -> None:
        known = self.known
        for key, state in states.items():
            row = new.get(key, state)
            if row is not None:
                known[key] = row
        if len(known) > KNOWN_ROWS_SWEEP:
            self.known = {k: v for k, v in known.items() if _holds_something(v, now)}

    # -- a table that came back empty ----------------------------------------------------------------------

    def _after_loss(self, again: Callable[[], Deferred[T]], expected: int | None) -> Deferred[T]:
        """Restore the table (once, whatever the number of calls that found it lost), then ``again()``. A call
        made on the identity ``expected`` that a restore has replaced since (it was in flight meanwhile, e.g.
        waiting out the outage) found the loss already repaired: it is only made again."""
        if self._restoring is None and self.identity != expected:
            return again()
        if self._restoring is None:
            restoring: Deferred[None] = deferred_from_coro(self._restore())
            if restoring.called:  # an inline store: already restored
                return restoring.addCallback(lambda _: again())
            self._restoring = restoring

            def done(result: Any) -> Any:
                self._restoring = None
                return result

            restoring.addBoth(done)
        return self._after_restore(again)

    def _after_restore(self, again: Callable[[], Deferred[T]]) -> Deferred[T]:
        """``again()`` once the restore in progress is done (its failure, the table's error, is passed on)."""
        assert self._restoring is not None
        d: Deferred[Any] = Deferred()

        def relay(result: Any) -> None:
            if isinstance(result, Failure):
                d.errback(result)  # the waiting call fails with the table's error (it was not restored)
            else:
                d.callback(None)

        self._restoring.addBoth(relay)
        d.addCallback(lambda _: again())
        return d

    async def _restore(self) -> None:
        """Give the table an identity again, then write back every row this process knows (docs/spec.md §6)."""
        since, previous = self.whole_at, self.identity

        def claim(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], int]:
            table = states[TABLE_KEY]
            if table is not None and table.held_by != previous:
                return {}, table.held_by  # another process restored it first, or a new crawl gave it an id
            identity = _new_identity()
            return {TABLE_KEY: HostState(held_by=identity, updated=math.inf)}, identity

        self.identity = await await_deferred(self.store.update_many([TABLE_KEY], claim))
        own = None if self.own_holds is None else self.own_holds()
        known = {key: state if own is None or not state.held_by or state.held_by in own
                 else replace(state, held_until=0.0, held_by=0) for key, state in self.known.items()}
        written: dict[str, HostState] = {}
        keys = sorted(known)
        for start in range(0, len(keys), RESTORE_BATCH):
            batch = keys[start:start + RESTORE_BATCH]

            def merge(states: dict[str, HostState | None], now: float,
                      batch: list[str] = batch) -> tuple[dict[str, HostState], dict[str, HostState]]:
                rows = {k: PacingPolicy.restore(states[k], known[k]) for k in batch}
                return rows, rows

            written.update(await await_deferred(self.store.update_many(batch, merge)))
        self.known.update(written)
        hosts = sum(1 for key in written if not key.startswith("ip:"))
        self.report.inc("store/restores")
        self.report.inc("store/restored_rows", len(written))
        logger.warning("scrapy-polite: the pace table %s came back empty (its identity was %s): %d hosts and %d "
                       "addresses restored from this process; bookings waited until they were written back "
                       "(docs/spec.md §6, \"A table that comes back empty\")", self.uri,
                       "gone" if previous is not None else "not known", hosts, len(written) - hosts)
        if self.restored is not None:
            self.restored(written, since)


def _new_identity() -> int:
    """A table's random id (63 bits, never 0)."""
    return random.getrandbits(62) | 1


def _holds_something(state: HostState, now: float) -> bool:
    """The row says something a restore must keep: a wait, backoff, delay, quota or in-flight hold."""
    return (state.next_allowed > now or state.consec > 0 or state.crawl_delay > 0 or state.ratelimit_interval > 0
            or state.ratelimit_until > now or state.quota_left >= 0 or state.held_until > now or state.strain > 0)
