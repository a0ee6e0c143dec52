"""The one shared stand-in for the pacer (:class:`~scrapy_polite.pacer.Pacer`, the container of a crawl's units),
with the units the scheduler and the middleware's refusals take from it, for their tests without a crawl."""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

from scrapy_polite import scheduler as scheduler_module
from scrapy_polite.clock import ClockSync
from scrapy_polite.crawl.lifecycle import Stage


class FreeLines:
    """A lifecycle (:class:`~scrapy_polite.crawl.lifecycle.Lifecycle`'s scheduler side) whose lines are always free:
    no host is blocked or parkable, claims and holds change nothing but a request's stage (released or not)."""

    def __init__(self) -> None:
        self.released: weakref.WeakSet[Any] = weakref.WeakSet()

    def stage(self, request: Any) -> Stage | None:
        return Stage.RELEASED if request in self.released else None

    def blocked(self, host: str) -> bool:
        return False

    def parkable(self, host: str) -> bool:
        return False

    def blocked_hosts(self) -> set[str]:
        return set()

    def release(self, request: Any, host: str) -> None:
        self.released.add(request)

    def held(self, request: Any, host: str) -> None:
        self.released.discard(request)

    def attach(self, scheduler: Any) -> None:
        pass


class CountingReport:
    """A report (:class:`~scrapy_polite.reports.counters.Report`) that counts the ``polite/...`` stats in ``counts``."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}

    def known(self, host: str) -> None:
        return None  # no row known: a woken host is due now

    def inc(self, key: str, count: float = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + count


class SchedulerPacer:
    """A pacer's units for the scheduler: an injected clock (``now``, set by the test), the bound of held requests
    kept in memory, lines that are always free (:class:`FreeLines`, also as the booker a held request gives its
    lines back to), a counting report, and the pace table's clock.

    Args:
        now: this process's clock at the start, epoch seconds.
        max_held_in_memory: ``POLITE_MAX_HELD_IN_MEMORY``.
        offset: the pace table has a server clock ``offset`` seconds behind this process's; None: an embedded
            store, whose clock is this one.
    """

    def __init__(self, now: float = 0.0, *, max_held_in_memory: int = 100, offset: float | None = None) -> None:
        self.now = now
        self.config = SimpleNamespace(max_held_in_memory=max_held_in_memory, shared_frontier=False)
        self.lifecycle: Any = FreeLines()
        self.booker: Any = self.lifecycle
        self.report = CountingReport()
        self.counts = self.report.counts
        #: The units of a download's outcome: none (a test that reaches one fails on it).
        self.recorder = self.resolution = self.unpinned = self.retries = None
        self.sync = ClockSync(self.clock, server_clock=offset is not None)
        if offset is not None:
            self.sync.observe(now - offset)

    def clock(self) -> float:
        return self.now

    def reconcile(self) -> int:
        return 0

    failed = None

    def check(self) -> None:
        """Nothing stopped the crawl."""


class Timer:
    """A reactor timer (what the scheduler's ``call_later`` returns) that never fires: the test calls
    ``next_request`` itself. ``delay``: seconds from when it was set; ``cancelled``: whether it was."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.cancelled = False

    def active(self) -> bool:
        return not self.cancelled

    def cancel(self) -> None:
        self.cancelled = True


def no_timers(monkeypatch: Any) -> list[Timer]:
    """Replace the scheduler's timers by :class:`Timer` s that never fire; returns the list of those it sets."""
    timers: list[Timer] = []

    def call_later(delay: float, fn: Any) -> Timer:
        timers.append(Timer(delay))
        return timers[-1]

    monkeypatch.setattr(scheduler_module, "call_later", call_later)
    return timers
