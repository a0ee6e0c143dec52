"""A stand-in for the pacer, with only what :class:`~scrapy_polite.scheduler.PoliteScheduler` uses of the
facade (:class:`~scrapy_polite.pacer.Pacer`): for the scheduler's tests without a crawl."""

from __future__ import annotations

from typing import Any

from scrapy_polite.seams import ClockSync


class SchedulerPacer:
    """What PoliteScheduler uses of the pacer: an injected clock (``now``, set by the test), the bound of held
    requests kept in memory, lines that are always free, and the pace table's clock.

    Args:
        now: this process's clock at the start, epoch seconds.
        max_held_in_memory: ``POLITE_MAX_HELD_IN_MEMORY``.
        offset: the pace table has a server clock ``offset`` seconds behind this process's; None: an embedded
            store, whose clock is this one.
    """

    def __init__(self, now: float, *, max_held_in_memory: int = 100, offset: float | None = None) -> None:
        self.now = now
        self.max_held_in_memory = max_held_in_memory
        self.scheduler: Any = None
        self._sync = ClockSync(self.clock, server_clock=offset is not None)
        if offset is not None:
            self._sync.observe(now - offset)

    def clock(self) -> float:
        return self.now

    def to_store(self, local_time: float) -> float:
        return self._sync.to_store(local_time)

    def to_local(self, store_time: float) -> float:
        return self._sync.to_local(store_time)

    def host_blocked(self, host: str) -> bool:
        return False

    def host_parkable(self, host: str) -> bool:
        return False

    def released(self, request: Any, host: str) -> None:
        pass

    def held(self, request: Any, host: str) -> None:
        pass

    def reconcile(self, *, force: bool = False) -> int:
        return 0
