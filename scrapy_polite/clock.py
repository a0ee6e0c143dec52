"""The process clock (docs/spec.md §5, §6): epoch seconds that advance with the monotonic clock; and
:class:`ClockSync`, its offset to the pace table's clock (a server store's clock may differ).

The wall clock (``time.time()``) can step: NTP correcting it, a VM resumed, an operator setting the date.
Paced on it, a forward step lets held hosts go early by the step and a backward step stalls them. So every
local due time, wait and timer of scrapy-polite, and the ``now`` of the embedded stores (SQLite, memory),
are read from one :class:`ProcessClock` per process, :data:`process_clock`:

    ``now = wall0 + (monotonic() - mono0)``

anchored once (the first time it is read): it reads like Unix epoch seconds (the wall clock at the anchor),
never goes backwards, and a later step of the wall clock does not move it. Between steps it keeps the wall
clock's rate (on Linux NTP slews ``CLOCK_MONOTONIC`` as it slews the wall clock), so it stays within the
sum of the steps since the anchor of the wall clock.

Processes on one machine share ``CLOCK_MONOTONIC``, so processes anchored under the same wall-clock setting
read the same process clock; one anchored after a step of ``s`` seconds reads ``s`` off the others, so a
shared SQLite file keeps one anchor for its openers (docs/spec.md §6, "One clock per file").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["ClockSync", "ProcessClock", "process_clock"]


class ProcessClock:
    """Epoch seconds that advance with a monotonic clock, anchored once on the wall clock.

    Calling it returns the time, Unix epoch seconds (a ``float``); it never goes backwards (as long as
    ``monotonic`` does not), and a step of ``wall`` after the anchor does not move it (docs/spec.md §5).

    Args:
        wall: the wall clock, epoch seconds (read once, at the anchor; tests inject one).
        monotonic: a monotonic clock, seconds from an arbitrary origin (tests inject one).
    """

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.wall = wall
        self.monotonic = monotonic
        self._anchor: float | None = None  # wall0 - mono0, seconds
        self._lock = threading.Lock()  # the store's thread and the reactor may make the first read together

    @property
    def anchor(self) -> float:
        """``wall0 - mono0``: the wall clock minus the monotonic clock at the anchor, seconds (anchors now
        when the clock has not been read yet; only once, whichever thread reads first)."""
        anchor = self._anchor
        if anchor is None:
            with self._lock:
                if self._anchor is None:
                    mono = self.monotonic()
                    self._anchor = self.wall() - mono
                anchor = self._anchor
        return anchor

    def __call__(self) -> float:
        """The time now, Unix epoch seconds of the process clock."""
        anchor = self._anchor  # read many times per page: the property only for the first read
        return (self.anchor if anchor is None else anchor) + self.monotonic()


#: This process's clock: every local due time, wait and timer, and the embedded stores' ``now``.
process_clock = ProcessClock()


class ClockSync:
    """The offset between this process's clock and the pace table's (a server clock may differ).

    Every read and write of the table returns the store's ``now``; :meth:`observe` records the offset at
    that moment, so times of the table (due times) can be turned into this process's clock for the
    scheduler's timers, and local moments (a throttle seen) into the table's clock.

    The local clock is the monotonic process clock (:data:`process_clock`,
    docs/spec.md §5), so a step of this machine's wall clock moves neither side of the offset: a due time of
    the table turned into the local clock is not brought forward (or pushed back) by it.

    Args:
        clock: this process's clock, epoch seconds (the process clock; tests inject one).
        server_clock: the table has a clock of its own (a server's); when False (SQLite, memory: the
            table's clock is this process's clock, shifted by a fixed ``offset``) the offset stays as given.
        offset: seconds, this process's clock minus the table's until the first observation of a server clock,
            and for good without one (a SQLite file's one clock, docs/spec.md §6 "One clock per file").
    """

    def __init__(self, clock: Callable[[], float], *, server_clock: bool = False, offset: float = 0.0) -> None:
        self.clock = clock
        self.server_clock = server_clock
        self.offset = offset  # local clock minus the store's clock, seconds

    def observe(self, store_now: float) -> None:
        """Record the store's clock as read now."""
        if self.server_clock:
            self.offset = self.clock() - store_now

    def to_local(self, store_time: float) -> float:
        """A moment of the store's clock, in this process's clock."""
        return store_time + self.offset

    def to_store(self, local_time: float) -> float:
        """A moment of this process's clock, in the store's clock (what is persisted, docs/spec.md §5)."""
        return local_time - self.offset

    def store_now(self) -> float:
        """The store's clock now, estimated from the last observation."""
        return self.clock() - self.offset
