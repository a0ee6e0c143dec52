"""The typed seams between the glue units (docs/spec.md §5): outcomes of a booking and the holding
scheduler's protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..vocabulary import DeferralReason

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from twisted.internet.defer import Deferred

    from ..frontier.report import FrontierState

__all__ = ["Go", "Defer", "Closing", "Redefer", "ResolverNotInstalled", "HoldingScheduler", "SharedFrontier"]


@dataclass(frozen=True)
class Go:
    """The request may be sent now.

    Attributes:
        sent_at: the booking time, epoch seconds of the pace table's clock (``meta['polite_sent_at']``).
        address: the IP address it is booked on (None behind a proxy or without addresses).
        serial: its booking serial on the host's row (``HostState.booked`` after the booking,
            ``meta['polite_quota_serial']``): the requests booked after it count against the quota its
            response announces (docs/spec.md §2, "Quota booking"); None: not booked (a burst).
    """

    sent_at: float
    address: str | None = None
    serial: int | None = field(default=None, compare=False)  # bookkeeping: two Go's differ by when and where


@dataclass(frozen=True)
class Defer:
    """The request must leave the downloader.

    Attributes:
        due: epoch seconds of this process's clock at which it may come back; None: when its host's (or
            address's) line is free.
        reason: a :data:`~scrapy_polite.vocabulary.DeferralReason` (``polite/deferrals/<reason>``).
    """

    due: float | None
    reason: DeferralReason


class Redefer(Exception):
    """Raised by the download handler for a burst request whose host throttled after it was decided:
    the middleware defers it again instead of sending it into the backoff."""


class Closing(Exception):
    """The crawl's close began while a request waited in the downloader for its host (raised by the Booker's sleep;
    Scrapy's close waits for every request in the engine): a request the scheduler handed out is held, any other is
    not sent (docs/spec.md §5)."""


class ResolverNotInstalled(RuntimeError):
    """Address filtering is on but the reactor's name resolver is not scrapy-polite's (docs/spec.md §7)."""


class HoldingScheduler(Protocol):
    """What the pacer needs of the scheduler that holds deferred requests
    (:class:`~scrapy_polite.scheduler.PoliteScheduler`)."""

    def owns(self, request: Request) -> bool:
        """The request was handed out by this scheduler, so it can be deferred."""
        ...

    def hold(self, request: Request, host: str, due: float | None, *, reason: DeferralReason | None = None) -> None:
        """Keep ``request`` out of the downloader until ``due`` (epoch s; None: until its line frees; ``reason``: why
        the booking deferred it, None: the host's mood)."""
        ...

    def wake(self, host: str, at: float | None = None) -> None:
        """The host's line was freed: its held requests may go as soon as the host is due (``at``: its row, read
        again, lets it go then, earlier than it was held for)."""
        ...

    def behind(self, request: Request, host: str) -> bool:
        """``request``, not released with its host's claim, finds requests of its host held for their turn: it goes
        behind them."""
        ...

    def crowded(self, request: Request) -> bool:
        """The downloader has no free slot, other requests wait to enter it, and ``request`` was not handed out from
        the held requests (it may wait for its turn out of the downloader once)."""
        ...

    def ended(self, request: Request) -> None:
        """``request`` left the process's pacing (finished or dropped): its home forgets it (a lease in the
        shared frontier ends)."""
        ...

    def shared_wait(self, window: float) -> float | None:
        """Seconds this idle worker stays open for the shared frontier (docs/spec.md §5, "Idle"; ``window``:
        its idle window, s), None without a shared frontier or when nothing there keeps it open."""
        ...

    def held_count(self) -> int:
        """How many requests are held."""
        ...

    def unpark(self) -> int:
        """Wake every host parked until its line frees that nothing holds back any more; how many."""
        ...

    def earliest_due(self) -> float | None:
        """The earliest due time of a held request (``inf``: only for a busy line; None: nothing held)."""
        ...

    def describe(self) -> str:
        """The held requests by host and when each is due, for the log."""
        ...

    def held_hosts(self) -> list[tuple[str, int, float]]:
        """``(host, requests held, due)`` per host holding requests, soonest due first (``due``: epoch s of
        this process's clock; ``inf``: when its line frees)."""
        ...

    def has_pending_requests(self) -> bool:
        """The wrapped scheduler has requests that are not held."""
        ...


class SharedFrontier(Protocol):
    """The home of held and in-flight requests shared by every worker of a crawl (docs/spec.md §5, "The
    shared frontier"; :class:`~scrapy_polite.frontier.leases.RedisFrontier` with scrapy-redis). The scheduler
    chooses it at open; nothing else needs to know where a held request lives."""

    key: str
    lease_time: float
    mode: str
    worker: str  # this worker's id (``<hostname>-<pid>-<random>``), logged at start
    state: FrontierState  # what it held at the last read
    #: ``outage(doing, exc)``, told of a background write that failed because the server cannot be reached (None:
    #: each is an ERROR); the worker sets it to its once-per-outage log.
    outage: Callable[[str, BaseException], None] | None

    def take(self, skip: set[str], *, queue: bool = True) -> tuple[Request, str | None] | None:
        """One request, leased to this worker: returned first, then of a due held host not in ``skip``,
        then (``queue``) the shared queue's head; ``(request, host of a held one or None)``, or None."""
        ...

    def lease(self, request: Request) -> None:
        """Lease a request the shared scheduler's own pop returned."""
        ...

    def owns(self, request: Request) -> bool:
        """``request`` is leased to this worker."""
        ...

    def hold(self, request: Request, host: str, delay: float) -> bool:
        """Move ``request`` from its lease to its host's held requests, due in ``delay`` s, written as the
        scheduler handed it out (not with this worker's headers or cookies); False when it cannot be written
        (it stays in this process, leased)."""
        ...

    def end(self, request: Request) -> None:
        """``request`` left (response, final error, drop): its lease ends."""
        ...

    def renew(self, *, alive: bool = True) -> FrontierState:
        """Renew this worker's leases, return dead workers' ones, read what waits (blocking)."""
        ...

    def renew_soon(self) -> Deferred[FrontierState]:
        """:meth:`renew` off the reactor."""
        ...

    def settle(self) -> Deferred[Any]:
        """Fires when every write started so far is done."""
        ...

    def release(self) -> int:
        """Give back everything this worker leases (blocking); how many."""
        ...

    def describe(self) -> str:
        """What waits in the frontier, per host, and what other workers lease, for the log (blocking)."""
        ...

    def clear(self) -> None:
        """Delete the frontier (the shared queue is flushed too)."""
        ...
