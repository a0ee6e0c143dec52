"""``memory://``: the in-process pace table, for tests and one-off runs (docs/spec.md §6).

Every crawl of a process that opens ``memory://`` shares one table (:meth:`MemoryStore.of_process`) while one has it
open: two spiders of one ``CrawlerProcess`` pace the hosts and addresses they share together, as on SQLite.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from twisted.internet import defer

from ..clock import process_clock
from ..policy import HostState
from .asyncstore import TableBase
from .base import DEFAULT_EVENTS_MAX, Event, ManyUpdateFn, Snapshot, UpdateFn

__all__ = ["AsyncMemoryStore", "MemoryStore"]

T = TypeVar("T")

_PROCESS_LOCK = threading.Lock()


class MemoryStore:
    """An in-process pace table (``memory://``). Thread-safe; lost when the process ends.

    Args:
        clock: the store's clock, epoch seconds: the monotonic process clock by default, so the store's
            ``now`` never goes backwards and ignores steps of the wall clock (docs/spec.md §6; tests inject one).
        events_max: the most events its event log keeps (the oldest are dropped first).
    """

    #: :class:`~scrapy_polite.stores.base.ProcessLocal`: the table lives in this process only.
    process_local: Literal[True] = True
    #: The table the crawls of this process share (:meth:`of_process`), None while none has it open.
    _process: ClassVar[MemoryStore | None] = None

    def __init__(self, *, clock: Callable[[], float] = process_clock, events_max: int = DEFAULT_EVENTS_MAX) -> None:
        self.uri = "memory://"
        self._rows: dict[str, HostState] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._events: deque[Event] = deque(maxlen=max(0, events_max))
        self._openers = 0  # (the process's table: how many have it open)

    @classmethod
    def of_process(cls, *, events_max: int = DEFAULT_EVENTS_MAX) -> MemoryStore:
        """This process's ``memory://`` table, opened once more: every crawl of the process shares it while one has
        it open (trial: two spiders of one ``CrawlerProcess`` each had a table of their own and sent to one host at
        once); a new one once all closed it (:meth:`close`). Its ``events_max`` is the first opener's."""
        with _PROCESS_LOCK:
            table = cls._process
            if table is None:
                table = cls._process = cls(events_max=events_max)
            table._openers += 1
            return table

    def now(self) -> float:
        return self._clock()

    def get(self, key: str) -> HostState | None:
        with self._lock:
            return self._rows.get(key)

    def read(self, keys: Sequence[str]) -> Snapshot:
        with self._lock:
            return Snapshot({key: self._rows.get(key) for key in keys}, self._clock())

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        with self._lock:
            new, result = fn(self._rows.get(key), self._clock())
            if new is not None:
                self._rows[key] = new
            return result

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        with self._lock:
            keys = list(keys)  # (read twice: an iterator given is read once)
            new, result = fn(dict(zip(keys, map(self._rows.get, keys))), self._clock())
            stray = set(new).difference(keys)
            if stray:
                raise ValueError(f"update function wrote {sorted(stray)!r}, which it did not read")
            self._rows.update(new)
            return result

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._rows.pop(key, None) is not None

    def items(self) -> Iterator[tuple[str, HostState]]:
        with self._lock:
            rows = sorted(self._rows.items())
        return iter(rows)

    def expire(self, before: float) -> int:
        with self._lock:
            stale = [k for k, s in self._rows.items() if s.updated < before and s.next_allowed < before]
            for key in stale:
                del self._rows[key]
            return len(stale)

    def append_events(self, events: Sequence[Event]) -> None:
        with self._lock:
            self._events.extend(events)

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        if limit <= 0:
            return []
        with self._lock:
            found = [e for e in self._events if (since is None or e.at >= since) and (host is None or e.host == host)]
        found = found[-limit:]  # the last appended
        order = sorted(range(len(found)), key=lambda i: (found[i].at, i))  # by time, then appending order
        return [found[i] for i in order]

    def close(self) -> None:
        """One opener of the process's table (:meth:`of_process`) is done with it: the last one lets it go (its rows
        stay readable through this object). Nothing for a table of its own."""
        with _PROCESS_LOCK:
            if self._openers:
                self._openers -= 1
                if not self._openers and MemoryStore._process is self:
                    MemoryStore._process = None

    def open_async(self, reactor: Any = None) -> AsyncMemoryStore:
        """The inline async table (:class:`AsyncMemoryStore`)."""
        return AsyncMemoryStore(self, reactor)


class AsyncMemoryStore(TableBase[MemoryStore]):
    """Memory's async table (:meth:`MemoryStore.open_async`): every call runs inline (no I/O), so its Deferred
    has fired when the call returns; after the close every call fails with
    :class:`~scrapy_polite.stores.base.StoreClosed`.

    Args:
        store: the memory store.
        reactor: the Twisted reactor (defaults to the installed one; not used by the calls).
    """


    def _inline(self, fn: Callable[..., T], *args: Any) -> defer.Deferred[T]:
        if self._closed:
            return defer.fail(self._closed_error())
        try:
            return defer.succeed(fn(*args))
        except Exception:
            return defer.fail()  # the caller's Deferred carries the error

    def get(self, key: str) -> defer.Deferred[HostState | None]:
        return self._inline(self.store.get, key)

    def read(self, keys: Sequence[str]) -> defer.Deferred[Snapshot]:
        return self._inline(self.store.read, keys)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        return self._inline(self.store.update, key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        if self._closed:  # _inline(self.store.update_many, keys, fn), without its call: twice per page
            return defer.fail(self._closed_error())
        try:
            return defer.succeed(self.store.update_many(keys, fn))
        except Exception:
            return defer.fail()

    def append_events(self, events: list[Event]) -> defer.Deferred[None]:
        return self._inline(self.store.append_events, events)

    def close(self) -> None:
        if not self._closed:  # (once: the store counts its openers)
            self._closed = True
            self.store.close()

    def close_async(self) -> defer.Deferred[None]:
        """Inline (no I/O to wait for)."""
        try:
            self.close()
        except Exception:
            return defer.fail()  # the caller's Deferred carries the error
        return defer.succeed(None)
