"""The event log of a crawl (docs/guides/operating.md, "The event log"): what happened to each host and when, by the
store's clock, kept beside the pace table and shared by every process that uses the same store.

The glue units call one small seam, an :class:`EventLog` (``Report.events``): each call appends one
:class:`~scrapy_polite.stores.Event` to a buffer in memory, nothing more, so the reactor's hot path pays for a
tuple. The buffer is written to the store in batches, at most ``flush_interval`` seconds after its first event
(or at once when ``batch_size`` events are waiting), through :meth:`AsyncStore.append_events
<scrapy_polite.stores.AsyncStore.append_events>`, which writes off the pace table's path (a thread and a
connection of its own for SQLite). A batch that cannot be written is dropped, never retried: the log is a
diagnostic, and it never stops or slows the crawl (``polite/events/dropped`` counts what was lost, with one
WARNING).

Times: a booking or a response carries the ``now`` of its store transaction; a wait, a deferral or a refusal,
which have no transaction, the store's clock as estimated from the last one
(:meth:`~scrapy_polite.clock.ClockSync.store_now`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import AlreadyCalled, AlreadyCancelled
from twisted.python.failure import Failure

from ..clock import ClockSync
from ..policy import HostState
from ..stores.base import Event, StoreBusy, StoreUnavailable
from ..vocabulary import DeferralReason, RefusalReason

__all__ = ["DEFERRAL_WORDS", "LOG_MARKS", "EventLog", "EventWriter", "REFUSAL_WORDS", "clock_time", "crawl_events",
           "describe", "process_source", "throttle_cause", "unrepeated"]

logger = logging.getLogger(__name__)


class EventWriter(Protocol):
    """Where batches go: :class:`~scrapy_polite.stores.AsyncStore` (``append_events`` returns a Deferred)."""

    def append_events(self, events: list[Event]) -> Deferred[None]:
        """Write ``events``; the Deferred fires when they are written (or fails)."""
        ...


#: The most events a log keeps to write again after failed writes (:meth:`EventLog._keep`); beyond, they are dropped.
KEPT_MAX = 10_000
#: The longest wait (s) before events kept are written again.
RETRY_MAX = 10.0
#: The causes of a failed write whose batch is written again: the store unreachable or busy for now.
TRANSIENT = (StoreUnavailable, StoreBusy, ConnectionError, TimeoutError)

#: The kinds of a crawler's log's own events (its opening and its clean close), no host's: the audit counts them,
#: the timeline and the other readers of a crawl's events skip them.
LOG_MARKS = ("opened", "closed")


def crawl_events(events: Iterable[Event]) -> list[Event]:
    """``events`` without the logs' own (:data:`LOG_MARKS`): what the crawls did, each once (:func:`unrepeated`)."""
    return [e for e in unrepeated(events) if e.kind not in LOG_MARKS]


def unrepeated(events: Iterable[Event]) -> list[Event]:
    """``events`` with an event repeated whole (its source, number and every field) read once: a batch written again
    after its write failed where it had landed (:meth:`EventLog._keep`). The same number on another event stays (the
    audit reports it as corrupt)."""
    seen: set[Event] = set()
    kept = []
    for event in events:
        if event.seq is not None:
            try:
                if event in seen:
                    continue
                seen.add(event)
            except TypeError:  # a field of a corrupt entry that is not hashable: left to the reader's checks
                pass
        kept.append(event)
    return kept


def process_source() -> str:
    """This process as events name it: ``"machine:pid"``."""
    return f"{socket.gethostname()}:{os.getpid()}"


#: The next event number (:attr:`Event.seq <scrapy_polite.stores.Event.seq>`) of each ``(process id, table name)``
#: (:func:`~scrapy_polite.stores.table_name`: the store's URI and key prefix): every crawler of a process that
#: writes to one shared table shares one sequence, so the numbers a source (``machine:pid``) wrote to a table run
#: 0, 1, 2, ... without a gap unless events were lost (a forked child, a new pid, starts its own). A table of the
#: process's own (:class:`~scrapy_polite.stores.ProcessLocal`, ``memory://``) numbers its events alone (one sequence for
#: the crawls that share it: its writers' ``store``).
_SEQUENCES: dict[tuple[int, str], Iterator[int]] = {}
_OWN_SEQUENCES: weakref.WeakKeyDictionary[Any, Iterator[int]] = weakref.WeakKeyDictionary()
_SEQUENCES_LOCK = threading.Lock()


def _sequence(table: str | None, writer: object) -> Iterator[int]:
    with _SEQUENCES_LOCK:
        if table is None:
            try:
                return _OWN_SEQUENCES.setdefault(getattr(writer, "store", writer), itertools.count())
            except TypeError:  # not weakly referenceable: this log's own numbers
                return itertools.count()
        key = (os.getpid(), table)
        found = _SEQUENCES.get(key)
        if found is None:
            found = _SEQUENCES[key] = itertools.count()
        return found


class EventLog:
    """Collects the events of one crawler and writes them to the store's event log in batches.

    Args:
        writer: the store (:class:`~scrapy_polite.stores.AsyncStore`); None: the log is off (every call
            returns at once, nothing is kept).
        clock: this process's clock and its offset to the store's (:class:`~scrapy_polite.clock.ClockSync`).
        call_later: ``call_later(seconds, fn) -> IDelayedCall``, the reactor's ``callLater``.
        inc: ``inc(stat, count)``, adds to ``polite/<stat>`` (the dropped events).
        flush_interval: seconds an event may wait in memory before its batch is written.
        batch_size: events that make a batch be written at once.
        max_pending: batches being written at once; a batch beyond it waits in the buffer, as a batch that could
            not be written does, up to :data:`KEPT_MAX` events (a store slower than the crawl, or lost, never makes
            the buffer grow without bound).
        source: the process's name in the events (default :func:`process_source`).
        table: the name of the shared table the writer writes to (:func:`~scrapy_polite.stores.table_name`):
            the logs of one process writing to it share one numbering (:attr:`Event.seq
            <scrapy_polite.stores.Event.seq>`); None: a table of this log's own (``memory://``), numbered alone.
    """

    def __init__(self, writer: EventWriter | None, clock: ClockSync, *,
                 call_later: Callable[[float, Callable[[], Any]], Any] | None = None,
                 inc: Callable[[str, float], None] | None = None, flush_interval: float = 1.0,
                 batch_size: int = 1000, max_pending: int = 8, source: str | None = None,
                 table: str | None = None) -> None:
        self.writer = writer
        self.table = table
        self.enabled = writer is not None
        self.clock = clock
        self.source = source if source is not None else process_source()
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.max_pending = max_pending
        self._call_later = call_later
        self._inc = inc
        self._buffer: list[Event] = []
        self._kept = 0  # the events at the buffer's front that wait to be written again (_keep)
        self._retry_delay = flush_interval  # seconds before they are, doubling to RETRY_MAX
        self._seq: Iterator[int] | None = None
        self._timer: Any = None
        self._pending = 0
        self._warned = False
        self._closed = False

    @classmethod
    def off(cls) -> EventLog:
        """A log that keeps nothing (``POLITE_EVENT_LOG = False``, or before the pacer attaches one)."""
        return cls(None, ClockSync(lambda: 0.0))

    # -- the events (each appends one tuple) --------------------------------------------------------------

    def _add(self, event: Event) -> None:
        """Buffer ``event`` numbered (:attr:`Event.seq <scrapy_polite.stores.Event.seq>`: the next of this log's
        sequence, :func:`_sequence`), and have the buffer written when full or after ``flush_interval``.

        The number is set as ``event._replace(seq=...)`` would (``seq`` is the last field) at a fifth of its
        cost: one per event logged. The log's first event is preceded by an ``opened`` one, and that batch is
        written at once (:meth:`close` writes ``closed``): the audit tells a process that stopped without writing
        its last events, even one killed in its first second (docs/spec.md §8)."""
        buffer = self._buffer
        seq = self._seq
        opening = seq is None
        if seq is None:
            seq = self._seq = _sequence(self.table, self.writer)
            buffer.append(Event(event.at, "opened", "", source=self.source, seq=next(seq)))
        buffer.append(tuple.__new__(Event, (*event[:-1], next(seq))))
        if opening or len(buffer) - self._kept >= self.batch_size:  # (the events kept for a retry wait their timer)
            self._schedule(0.0)
        elif self._timer is None:
            self._schedule(self.flush_interval)

    def booking(self, host: str, url: str | None, *, at: float, due: float | None, address: str | None,
                reason: str | None = None, interval: float | None = None, ip_interval: float | None = None) -> None:
        """A request booked on ``host`` at ``at`` (store's clock; the moment it goes); ``due``: the host's next
        allowed after it, ``address``: the address booked (the one it connects to, docs/spec.md §4); ``reason``
        ``"burst"`` for a burst request; ``interval``: the host's interval the booking applied, seconds,
        ``ip_interval``: the address's (docs/spec.md §3; ``scrapy polite audit`` holds the next request to them)."""
        if self.enabled:
            self._add(Event(at, "booking", host, url, None, None if due is None else due - at, due, reason,
                            None, None, address, None, self.source, interval, ip_interval))

    def wait(self, host: str, url: str | None, seconds: float) -> None:
        """A request of ``host`` waits ``seconds`` in line, from now."""
        if self.enabled:
            at = self.clock.store_now()
            self._add(Event(at, "wait", host, url, None, seconds, at + seconds, None, None, None, None, None,
                            self.source))

    def deferral(self, host: str, url: str | None, reason: DeferralReason, due: float | None) -> None:
        """A request of ``host`` left the downloader for ``reason``; ``due``: when it may come back, **this
        process's clock** (None: when its line frees)."""
        if self.enabled:
            at = self.clock.store_now()
            due_store = None if due is None else due - self.clock.offset
            self._add(Event(at, "deferral", host, url, None, None if due_store is None else max(0.0, due_store - at),
                            due_store, reason, None, None, None, None, self.source))

    def response(self, host: str, url: str | None, *, at: float, status: int | None, failure: str | None,
                 retry_after: float | None, delay: float, due: float, steps: int, started: float | None,
                 throttle: bool, counted: bool, address: str | None = None, ip_interval: float | None = None,
                 hold: float | None = None) -> None:
        """A response (``status``) or a server-side failure (``failure``: its name) recorded at ``at``:
        ``delay`` chosen (s), the host's next allowed ``due``, its backoff ``steps`` after it, ``started``:
        its booking time; ``address``: the address its request was booked on, finished with ``ip_interval``
        seconds (docs/spec.md §3); ``hold``: seconds the host is held for its spent quota (None: no hold). A
        throttle that took a step is followed by a ``backoff`` event."""
        if not self.enabled:
            return
        if failure is not None:
            self._add(Event(at, "failure", host, url, None, delay, due, failure, retry_after, steps, address,
                            started, self.source, None, ip_interval, hold))
        else:
            reason = ("throttle" if counted else "throttle_counted_before") if throttle else None
            self._add(Event(at, "response", host, url, status, delay, due, reason, retry_after, steps, address,
                            started, self.source, None, ip_interval, hold))
        if throttle and counted:
            cause = failure if failure is not None else str(status)
            self._add(Event(at, "backoff", host, url, status, delay, due, cause, retry_after, steps, None, started,
                            self.source))

    def robots_delay(self, host: str, delay: float) -> None:
        """``host``'s robots.txt delay (seconds, 0: none) was recorded."""
        if self.enabled:
            at = self.clock.store_now()
            self._add(Event(at, "robots_delay", host, None, None, delay, at + delay, None, None, None, None, None,
                            self.source))

    def refusal(self, host: str, url: str | None, reason: RefusalReason) -> None:
        """A request was refused (``reason``: ``non_public``, ``no_host``, ``invalid_host``)."""
        if self.enabled:
            self._add(Event(self.clock.store_now(), "refusal", host, url, None, None, None, reason, None, None,
                            None, None, self.source))

    def restored(self, rows: Mapping[str, HostState], since: float) -> None:
        """The table came back empty and this process wrote back ``rows`` (docs/spec.md §6, "A table that comes
        back empty"): one event for the table (host ``""``, ``steps``: the rows written back, ``started``: the
        table's time this process last found it whole), then one per host written back, with what ``scrapy polite
        audit`` holds its next requests to (``delay``: its Crawl-delay, ``due``: its next allowed)."""
        if not self.enabled:
            return
        at = self.clock.store_now()
        self._add(Event(at, "restored", "", None, None, None, None, "table", None, len(rows), None, since,
                        self.source))
        for key, state in sorted(rows.items()):
            if not key.startswith("ip:"):
                self._add(Event(at, "restored", key, None, None, state.crawl_delay, state.next_allowed, None, None,
                                state.consec, None, None, self.source))

    # -- writing -----------------------------------------------------------------------------------------

    def _schedule(self, seconds: float) -> None:
        if self._timer is not None:
            if seconds > 0:
                return
            _cancel(self._timer)
            self._timer = None
        if self._call_later is None or self._closed:
            return
        self._timer = self._call_later(seconds, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> Deferred[None]:
        """Write what is buffered now, as one batch; the Deferred fires once it is written or dropped (never
        fails)."""
        batch, self._buffer, self._kept = self._buffer, [], 0
        if not batch or self.writer is None:
            return succeed(None)
        if self._pending >= self.max_pending:
            self._keep(batch, "the store is writing slower than the crawl", transient=True)
            return succeed(None)
        self._pending += 1
        try:
            d = self.writer.append_events(batch)
        except Exception as exc:  # a writer that raises instead of failing its Deferred
            self._pending -= 1
            self._keep(batch, str(exc), transient=isinstance(exc, TRANSIENT))
            return succeed(None)

        def done(result: Failure | None) -> None:
            self._pending -= 1
            if isinstance(result, Failure):
                self._keep(batch, result.getErrorMessage(), transient=isinstance(result.value, TRANSIENT))
            else:
                self._retry_delay = self.flush_interval

        d.addBoth(done)
        return d

    def _keep(self, batch: list[Event], why: str, *, transient: bool) -> None:
        """A batch not written (``why``) for a ``transient`` cause (:data:`TRANSIENT`: the store unreachable or busy,
        or still writing) is written again with the next one, before it, after a delay that doubles up to
        :data:`RETRY_MAX` seconds (trial: a Redis restarted within seconds left holes that made the whole crawl's log
        impossible to audit). It is dropped for any other cause, once the log is closed, or past :data:`KEPT_MAX`
        events kept. A batch written again where it had landed is in the log twice: its readers read an event
        repeated whole once (:func:`unrepeated`)."""
        if not transient or self._closed or len(batch) + len(self._buffer) > KEPT_MAX:
            self._dropped(len(batch), why)
            return
        logger.debug("scrapy-polite: %d events kept to be written again (%s)", len(batch), why)
        self._buffer[:0] = batch
        self._kept += len(batch)
        self._schedule(self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)

    def _dropped(self, count: int, why: str) -> None:
        if self._inc is not None:
            self._inc("events/dropped", count)
        if not self._warned:
            self._warned = True
            logger.warning("scrapy-polite could not write %d events to its event log (%s); they are dropped (the "
                           "crawl is not affected; polite/events/dropped counts them)", count, why)

    def close(self) -> Deferred[None]:
        """Stop the timer and write what is left, ending with a ``closed`` event when the log wrote any (call before
        the store is closed; once)."""
        if self.enabled and self._seq is not None and not self._closed:
            self._add(Event(self.clock.store_now(), "closed", "", source=self.source))
        self._closed = True
        if self._timer is not None:
            _cancel(self._timer)
            self._timer = None
        return self.flush()


def _cancel(timer: Any) -> None:
    """Cancel a flush timer (a Twisted ``DelayedCall`` or an asyncio handle) that may have run already."""
    with contextlib.suppress(AlreadyCalled, AlreadyCancelled):  # it ran, or was cancelled: nothing left to do
        timer.cancel()


#: The user's words for a deferral reason and a refusal reason (the closing summary's, docs/getting-started.md).
DEFERRAL_WORDS = {"throttled": "throttled", "ratelimit": "rate limit", "crawl_delay": "Crawl-delay",
                  "line": "line busy", "ip_line": "address busy", "turn": "its turn",
                  "robots_unreachable": "robots.txt unreachable"}
REFUSAL_WORDS = {"non_public": "non-public", "no_host": "no host", "invalid_host": "invalid host"}


def clock_time(t: float, *, date: bool = False) -> str:
    """``t`` (epoch s) as local time, ``HH:MM:SS.mmm`` (with the date first when ``date``)."""
    local = time.localtime(t)
    text = time.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S", local)
    return f"{text}.{int((t % 1) * 1000):03d}"


def throttle_cause(event: Event) -> str | None:
    """The cause of the throttle an event records, or None when it records none (README, "The operator command"):
    a throttled ``response``'s status (``"429"``), a ``failure``'s name (every failure recorded reached the
    server's side: a throttle), a ``backoff`` step's cause. A throttle past the backoff's step cap takes no step
    and writes no ``backoff`` event: its ``response`` is the record of it."""
    if event.kind == "response":
        return str(event.status) if (event.reason or "").startswith("throttle") else None
    if event.kind == "failure":
        return event.reason or "failure"
    if event.kind == "backoff":
        return event.reason or (str(event.status) if event.status is not None else "?")
    return None


def describe(event: Event) -> str:
    """One event in words, as ``scrapy polite show`` and the timeline's tooltips write it."""
    kind, delay, due, reason = event.kind, event.delay, event.due, event.reason
    if kind == "booking":
        text = "booked" + (f" on {event.address}" if event.address else "")
        if delay is not None:
            text += f", next allowed in {delay:.1f} s" if delay >= 0.05 else ", next allowed now"
        return text + (" (burst)" if reason == "burst" else "")
    if kind == "wait":
        return f"waits {delay or 0.0:.1f} s in line"
    if kind == "deferral":
        words = DEFERRAL_WORDS.get(reason or "", reason or "?")
        if due is None:
            return f"deferred ({words})" + (" until its line frees" if reason in ("line", "ip_line") else "")
        return f"deferred ({words}) for {delay or 0.0:.1f} s, until {clock_time(due)}"
    if kind in ("response", "failure"):
        text = f"{event.status}" if kind == "response" else f"{reason} (download failure)"
        if event.retry_after is not None:
            text += f", Retry-After {event.retry_after:g} s"
        text += f": delay chosen {delay or 0.0:.1f} s"
        if kind == "response" and reason is not None:
            text += ", a throttle" + (" (counted before)" if reason == "throttle_counted_before" else "")
        if event.steps:
            text += f", backoff steps {event.steps}"
        return text
    if kind == "backoff":
        text = f"backoff step {event.steps} ({reason}): {delay or 0.0:.1f} s"
        text += " (Retry-After)" if event.retry_after is not None and event.retry_after > 0 else ""
        return text + (f", until {clock_time(due)}" if due is not None else "")
    if kind == "robots_delay":
        return f"robots.txt delay {delay:g} s adopted" if delay else "robots.txt publishes no delay"
    if kind in ("opened", "closed"):
        return f"{event.source}'s event log {kind}"
    if kind == "refusal":
        return f"refused ({REFUSAL_WORDS.get(reason or '', reason)})"
    if kind == "operator":
        return f"operator: {reason}"
    return kind
