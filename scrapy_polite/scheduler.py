"""The scheduler that holds deferred requests out of the downloader (docs/spec.md §5).

:class:`PoliteScheduler` wraps the scheduler Scrapy would otherwise use (``POLITE_SCHEDULER_BASE``,
default ``scrapy.core.scheduler.Scheduler``; the add-on moves a project's own ``SCHEDULER`` there). A
request the downloader middleware defers is handed back to it and **held** by host until due:

* it does not count against ``CONCURRENT_REQUESTS`` or ``CONCURRENT_REQUESTS_PER_DOMAIN`` while held;
* it does not go through the dupe filter again and the spider's errback is not called;
* when its host is due and its line is free, it is handed out before any new request;
* the spider stays open while requests are held; when everything left is held beyond
  ``POLITE_MAX_IDLE_WAIT`` seconds, the spider closes with reason ``polite_deferred``;
* held requests are kept by :class:`~scrapy_polite.crawl.held.HeldRequests`: at most
  ``POLITE_MAX_HELD_IN_MEMORY`` in memory, the others on disk; under ``JOBDIR`` every one is written to
  ``JOBDIR/polite_held`` as it is held, so a crawl that stops, or is killed, holds them again on resume at
  their due time; without ``JOBDIR`` the requests still held at close are reported (count and hosts) and
  counted (``polite/deferred/not_crawled``).

A new request of a host whose line is taken is held as it is handed out (:func:`next_new`). With a **shared**
scheduler (scrapy-redis's, :func:`~scrapy_polite.frontier.leases.is_shared_scheduler`; ``POLITE_SHARED_FRONTIER``),
the requests it takes are leased in Redis and those deferred until a moment go back there for any worker
(:class:`~scrapy_polite.frontier.worker.SharedWorker`; docs/spec.md §5, "The shared frontier").
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from weakref import ref

from scrapy.utils.misc import build_from_crawler
from twisted.internet import threads

from ._compat import crawler_engine, in_engine, wake_engine
from .addon import answering_middlewares, cache_answers
from .contracts import fail_held_contract_requests
from .crawl.held import HELD_DIR, HeldRequests, seen_again
from .crawl.lifecycle import IN_DOWNLOADER, Stage
from .crawl.reactor import call_later
from .crawl.seams import SharedFrontier
from .frontier.leases import is_shared_scheduler
from .frontier.worker import SharedWorker
from .pacer import Pacer, get_pacer
from .policy.keys import host_key
from .settings import SettingsError
from .settings.config import scheduler_base_class
from .vocabulary import BURST_META, CLOSE_REASONS, DONT_PACE_META, TURN_REASONS, DeferralReason

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["PoliteScheduler"]

#: How many new requests :func:`next_new` may hold in one call before it lets the reactor turn.
HOLD_BATCH = 64

#: Seconds between two pokes of the engine while a held request is due but not taken (its host's line busy, the
#: downloader full): the engine also asks whenever a download ends.
REPOLL = 1.0


@dataclass(slots=True)
class HeldHost:
    """One host with held requests: when they are due and why they are held (forgotten when none is left).

    Attributes:
        due: when its next held request is due (this process's epoch s; ``inf``: when its line frees).
        turn: its last request held was held for its turn (its line, an address's line, a full downloader:
            docs/spec.md §5), not for its mood (a throttle, a Crawl-delay, a quota): its new requests go behind
            the held ones (:meth:`PoliteScheduler.behind`).
        burst: a burst request of it is held: woken at once when its line frees, not when its row allows.
    """

    due: float
    turn: bool = False
    burst: bool = False


#: The record read for a host with nothing held (never written).
NOT_HELD = HeldHost(math.inf)


def downloads(crawler: Crawler) -> Any:
    """The requests in Scrapy's downloader (``Downloader.active``; empty before the engine opens)."""
    return getattr(getattr(crawler_engine(crawler), "downloader", None), "active", ())


def next_new(scheduler: PoliteScheduler) -> Request | None:
    """The wrapped scheduler's next request that may go to the downloader now, or None (asked by
    :meth:`PoliteScheduler.next_request` when no held request is due).

    A request handed out before is sent as a copy (:func:`again`). A new one whose host is blocked (its line taken, its
    claim out) or that goes behind its host's held requests (:meth:`~PoliteScheduler.behind`) is deferred for its
    ``line`` and held at once, not sent through the downloader for the booking to send back (docs/spec.md §5: 974 of
    1,000 requests of 10 hosts made that pass). One handed out claims its host until it reaches the booking, as a held
    one does: its host's other new requests of the same engine turn (a page's links) are held too. Never held back:
    one the HTTP cache answers (:func:`~scrapy_polite.addon.cache_answers`), any while another middleware may answer
    first (:func:`~scrapy_polite.addon.answering_middlewares`), a ``dont_pace`` or burst request. At most
    :data:`HOLD_BATCH` per call: the engine asks again on its next turn."""
    inner, lifecycle = scheduler.inner, scheduler.lifecycle
    for _ in range(HOLD_BATCH):
        request: Request | None = inner.next_request()
        if request is None:
            return None
        if scheduler.owns(request) or lifecycle.stage(request) is Stage.HELD:
            return again(scheduler.crawler, request, lifecycle.stage(request))  # handed out before
        meta = request.meta
        host = None if not scheduler.holds_new or meta.get(DONT_PACE_META) or meta.get(BURST_META) \
            else host_key(request.url)
        if host is None:
            return request
        if not (lifecycle.blocked(host) or scheduler.behind(request, host)):
            lifecycle.release(request, host)  # it claims its host: the host's next new ones are held behind it
            return request
        if scheduler.cache_answers is not None and scheduler.cache_answers(request):
            return request  # the HTTP cache answers it: never held back
        scheduler.booker.defer(host, None, "line", request)
        scheduler.hold(request, host, None, reason="line", returned=False)
    wake_engine(scheduler.crawler)
    return None


def again(crawler: Crawler, request: Request, stage: Stage | None) -> Request:
    """``request``, handed out by the wrapped scheduler once more (``stage``: its stage): itself when its first pass
    has ended, else a copy (a spider yielded the same object twice with ``dont_filter``, or ``response.request`` from
    its own callback, and its first pass is still held or in the engine): each pass is a request of its own, paced
    and recorded, and Scrapy's downloader and engine never have one object twice (trial: one lifecycle record for two
    passes freed the host's line under the first, gaps of 0.1 s for 0.2, and the crawl hung with pages lost; the
    engine logged "Error while removing request from slot"). Counted in ``polite/lifecycle/copied``; logged at
    WARNING once, then at DEBUG (docs/spec.md §5)."""
    if stage is not Stage.HELD and not in_engine(crawler, request):
        return request
    stats = crawler.stats
    first = stats is None or not stats.get_value("polite/lifecycle/copied")
    (logger.warning if first else logger.debug)(
        "scrapy-polite: %s was scheduled again while its first pass is still on; the second pass is sent as a copy "
        "(further ones are logged at DEBUG)", request)
    if stats is not None:
        stats.inc_value("polite/lifecycle/copied")
    return request.copy()


class PoliteScheduler:
    """A scheduler wrapper that holds deferred requests by host until due.

    Args:
        crawler: the crawler.
        inner: the wrapped scheduler (any ``BaseScheduler``).
        pacer: the crawler's pacer, of which it takes the units it uses: the lifecycle (blocked and parkable
            hosts, claims), the booker (a held request gives up its lines), the clocks (``sync``), the settings.
    """

    def __init__(self, crawler: Crawler, inner: Any, pacer: Pacer) -> None:
        self.crawler = crawler
        self.inner = inner
        self.pacer = pacer
        self.clock = pacer.clock
        self.lifecycle = pacer.lifecycle
        self.booker = pacer.booker
        self.sync = pacer.sync
        self._jobdir: str | None = crawler.settings.get("JOBDIR") or None
        self._held = HeldRequests(crawler, max_in_memory=pacer.config.max_held_in_memory, jobdir=self._jobdir)
        self._hosts: dict[str, HeldHost] = {}  # the hosts with held requests
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._owned: weakref.WeakSet[Request] = weakref.WeakSet()
        self._rehold: weakref.WeakSet[Request] = weakref.WeakSet()
        self._leaving: list[Request] = []  # handed out, kept until their last pass left the downloader (_next_due)
        self._owned_refs: set[weakref.ref[Request]] = vars(self._owned)["data"]  # CPython's WeakSet.data: see owns
        self._timer: Any = None
        self._timer_at = math.inf  # when the timer fires, this process's clock (epoch s)
        self._closing = False
        self.cache_answers = cache_answers(crawler, answering := answering_middlewares(crawler.settings))
        self.holds_new = self.cache_answers is not None or not answering  # next_new: a cached page is never held
        #: This worker's side of the shared frontier (scrapy-redis's scheduler), set at open; None: held ones are here.
        self.shared: SharedWorker | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        pacer = get_pacer(crawler)
        inner_cls = scheduler_base_class(pacer.config.scheduler_base, crawler.settings)
        if inner_cls is cls:
            raise SettingsError("POLITE_SCHEDULER_BASE must not be PoliteScheduler itself: name the scheduler it "
                                "wraps, e.g. 'scrapy.core.scheduler.Scheduler'")
        inner = build_from_crawler(inner_cls, crawler)
        return cls(crawler, inner, pacer)

    # -- BaseScheduler interface -------------------------------------------------------------------------

    def open(self, spider: Spider) -> Any:
        self.pacer.booker.attach(self)
        self._load()
        result = self.inner.open(spider) if hasattr(self.inner, "open") else None
        if self.pacer.config.shared_frontier and is_shared_scheduler(self.inner):
            self.shared = SharedWorker.open(self.crawler, self.pacer, self.inner, spider)
        elif len(self._held) and self._jobdir:  # (scrapy-redis's dupe filter is in Redis: nothing it lacks)
            done = threads.deferToThread(seen_again, self.crawler, self.inner, self._jobdir)
            return done.addCallback(lambda _: result)
        return result

    @property
    def frontier(self) -> SharedFrontier | None:
        """The shared frontier (scrapy-redis's scheduler), None: held requests live in this process."""
        return self.shared.frontier if self.shared is not None else None

    def close(self, reason: str) -> Any:
        self._closing = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        shared = self.shared
        if shared is not None:
            shared.stop()
            frontier = shared.frontier
            d = frontier.settle()
            d.addCallback(lambda _: threads.deferToThread(self._close_shared, shared))
            d.addErrback(lambda failure: logger.warning("scrapy-polite: could not give back the requests leased in "
                                                        "the shared frontier %s: %s", frontier.key, failure.value))
            d.addBoth(lambda _: self._close_local(reason))
            return d
        return self._close_local(reason)

    def _close_shared(self, shared: SharedWorker) -> None:
        """Give back every request this worker leases, held ones included (they are in Redis: not lost),
        and log what waits in the shared frontier (thread)."""
        shared.close(len(self._held))
        self._held.close()
        self._held = HeldRequests(self.crawler, max_in_memory=0, jobdir=None)
        self._hosts.clear()

    def _close_local(self, reason: str) -> Any:
        try:
            self._save_or_report(stopped=reason != "finished" and reason not in CLOSE_REASONS)
        except Exception:
            logger.exception("scrapy-polite: could not save the deferred requests")
            if self.crawler.stats is not None:
                self.crawler.stats.set_value("polite/deferred/not_saved", self.held_count())
        finally:
            self.pacer.booker.attach(None)
        return self.inner.close(reason) if hasattr(self.inner, "close") else None

    def has_pending_requests(self) -> bool:
        """The wrapped scheduler's pending requests only (a shared frontier's: :meth:`SharedWorker.pending`): while
        requests are merely held, the engine sees the spider idle and sends ``spider_idle``, which the extension
        answers (``DontCloseSpider`` until everything held is due beyond ``POLITE_MAX_IDLE_WAIT``)."""
        shared = self.shared
        return shared.pending(self.inner) if shared is not None else bool(self.inner.has_pending_requests())

    def crowded(self, request: Request) -> bool:
        """The downloader has no free slot (``Downloader.needs_backout``: waits in line count) and others wait to enter
        it (the wrapped scheduler's pending requests, a held host due): ``request``, unless handed out from the held
        ones (its turn comes once), leaves it until its turn (docs/spec.md §5, "A full downloader")."""
        downloader = getattr(crawler_engine(self.crawler), "downloader", None)
        if downloader is None or self.shared is not None or self.lifecycle.had_turn(request) \
                or not downloader.needs_backout():  # (a shared frontier's deferral is a Redis write: not for a turn)
            return False
        return bool(self._heap and self._heap[0][0] <= self.clock()) or self.has_pending_requests()  # local first

    def held_count(self) -> int:
        """How many requests are held."""
        return len(self._held)

    def unpark(self) -> int:
        """Wake every host parked "until its line frees" that nothing holds back any more (the idle check,
        after :meth:`Pacer.reconcile <scrapy_polite.pacer.Pacer.reconcile>`); returns how many."""
        parked = [host for host, held in self._hosts.items()
                  if held.due == math.inf and not self.lifecycle.parkable(host)]
        for host in parked:
            self.wake(host)
        return len(parked)

    def earliest_due(self) -> float | None:
        """The earliest due time (epoch s) of a held request (``inf``: held only for a busy line; None: none held)."""
        return min(held.due for held in self._hosts.values()) if self._hosts else None

    def enqueue_request(self, request: Request) -> bool:
        if request in self._rehold:  # a deferred request coming back from the downloader: already held
            self._rehold.discard(request)
            return True
        if self.lifecycle.stage(request) in IN_DOWNLOADER and request not in downloads(self.crawler):
            # The same object sent again (a middleware returned it) while the lifecycle still has it in the downloader,
            # which it left by a path no middleware of ours saw: it ends here (its lines and claim freed at once, not
            # at the next reconcile: docs/spec.md §5) and begins a new pass. (Still in the downloader, a spider yielded
            # it twice: its first pass goes on, and this one is handed out as a copy, next_request.)
            self.booker.end(request, dropped=True)
        return bool(self.inner.enqueue_request(request))

    def next_request(self) -> Request | None:
        request = self._next_due() if self._heap or self._leaving else None  # (no call while nothing is held)
        if request is None:
            if self.shared is not None:
                request = self.shared.take({host for host, _ in self._held.items()}, len(self._held))
            else:
                request = next_new(self)
            if request is None:
                return None
        self._owned.add(request)
        if self.shared is not None:
            self.shared.busy()
        return request

    def behind(self, request: Request, host: str) -> bool:
        """``request``, not released with its host's claim (from the held ones, or new by :func:`next_new`), finds
        requests of its host held for their turn: it goes behind them (the host's order kept; asked as it is handed out,
        :func:`next_new`, or by the booking before it arrives, while a middleware may answer first: docs/spec.md §5)."""
        held = self._hosts.get(host)
        return held is not None and held.turn and self.lifecycle.stage(request) is not Stage.RELEASED

    def ended(self, request: Request) -> None:
        """``request`` left the process's pacing: its lease in the shared frontier ends (called by
        :class:`~scrapy_polite.crawl.lifecycle.Lifecycle`)."""
        if self.shared is not None:  # self.frontier, without the property's call on every request's end
            self.shared.frontier.end(request)

    def shared_wait(self, window: float) -> float | None:
        """Seconds this idle worker stays open for the shared frontier (``window``: its idle window, s), None
        without one or when nothing there keeps it open (:meth:`SharedWorker.wait
        <scrapy_polite.frontier.worker.SharedWorker.wait>`; docs/spec.md §5, "Idle")."""
        return self.shared.wait(window) if self.shared is not None else None

    def __len__(self) -> int:
        return len(self.inner) + len(self._held)

    # -- holding ------------------------------------------------------------------------------------------

    def owns(self, request: Request) -> bool:
        """The request was handed out by this scheduler, so it can be deferred. (``request in self._owned``, read in
        the WeakSet's own set of weak references without a Python-level call: once per page.)"""
        return ref(request) in self._owned_refs

    def hold(self, request: Request, host: str, due: float | None, *, reason: DeferralReason | None = None,
             returned: bool = True) -> None:
        """Keep ``request`` out of the downloader until ``due`` (epoch seconds; None: until its host's
        line is free; ``reason``: why the booking deferred it, None: the host's mood, docs/spec.md §5). The middleware
        then returns it to the engine, whose ``enqueue_request`` we skip (``returned``; False: a new request held as it
        is handed out, :func:`next_new`).

        With the shared frontier, a request deferred until a moment goes back to Redis (any worker takes it
        when its host is due); one deferred for a line stays here, leased."""
        if returned:
            self._rehold.add(request)
        self._owned.discard(request)
        frontier = self.frontier
        if (frontier is not None and due is not None and frontier.owns(request)
                and frontier.hold(request, host, due - self.clock())):
            self.booker.held(request, host)  # gives up its claim and lines
            return
        self._held.push(host, request, None if due is None else self.sync.to_store(due))  # persisted: store time
        if due is None and not self.lifecycle.parkable(host):
            due = self.clock()  # nothing holds the host back any more: it may go now (docs/spec.md §5)
        when = due if due is not None else math.inf
        held = self._hosts.get(host)
        if held is None or (due is not None and when > held.due) or held.due == math.inf:
            if held is None:
                held = self._hosts[host] = HeldHost(when)
            held.due = when
            if when != math.inf:  # one heap entry per change of the host's due time, not per request
                self._push(when, host)
        held.turn = reason in TURN_REASONS  # the last hold decides: a throttle's new requests meet the early deferral
        held.burst = held.burst or bool(request.meta.get(BURST_META))
        stats = self.crawler.stats
        if stats is not None:
            stats.max_value("polite/deferred/max_held", self.held_count())
        self.booker.held(request, host)  # gives up its claim and lines: may wake the host (self.wake)

    def wake(self, host: str, at: float | None = None) -> None:
        """What held the host back (its line, its claim, an address line) is gone (the lifecycle), or its row read again
        lets it go ``at`` (this process's clock), earlier than held for: its held requests may go when due."""
        held = self._hosts.get(host)
        if held is not None and host in self._held.hosts:
            if held.due == math.inf or (at is not None and at < held.due):
                if at is None and not held.burst:  # due when its recorded row allows (§5)
                    known = self.pacer.report.known(host)
                    at = self.sync.to_local(known.next_allowed) if known is not None else 0.0
                held.due = at if at is not None else 0.0
            self._push(held.due, host)

    def _push(self, due: float, host: str) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), host))
        self._arm()

    def _arm(self, *, wake: bool = True) -> None:
        """Poke the engine when the earliest held request is due (it also polls every few seconds).

        An entry already due wakes the engine at once (``wake``: it asks on its next turn; False when the caller
        just did) and is re-polled after :data:`REPOLL` seconds only: the engine asks for requests again whenever
        a download ends, so polling faster would only spin. A timer already set for that re-poll is kept, not
        cancelled and set again: waking a host costs one engine call, no timer (issue 31, point 7)."""
        while self._heap and self._stale(self._heap[0]):
            heapq.heappop(self._heap)
        if self._closing or not self._heap:
            return
        now = self.clock()
        at = self._heap[0][0]
        if at <= now:
            if wake:
                wake_engine(self.crawler)
            at = now + REPOLL
        if self._timer is not None and self._timer.active():
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer, self._timer_at = call_later(at - now, self._poke), at

    def _stale(self, entry: tuple[float, int, str]) -> bool:
        """A heap entry whose host has nothing held, or whose due time was moved since it was pushed."""
        due, _, host = entry
        return host not in self._held.hosts or self._hosts.get(host, NOT_HELD).due > due

    def _poke(self) -> None:
        self._timer = None
        wake_engine(self.crawler)
        self._arm(wake=False)

    def _next_due(self) -> Request | None:
        now = self.clock()
        found: Request | None = None
        active = downloads(self.crawler)
        for request in self._leaving:
            if request not in active:
                self._leaving.remove(request)
                return request
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            host = entry[2]
            held = self._hosts.get(host)
            if held is None or host not in self._held.hosts or held.due > now:
                continue  # a stale heap entry
            if self.lifecycle.blocked(host):
                held.due = math.inf  # woken again when its line frees or its claim ends (lifecycle)
                continue
            found = self._held.pop(host)  # None only when none of the host's records could be read back
            if host not in self._held.hosts:
                del self._hosts[host]
            else:
                held.due = math.inf
            if found is not None:
                self.lifecycle.release(found, host)  # it claims its host until it is booked or leaves
                if found not in active:
                    break
                self._leaving.append(found)  # its last pass still leaving the downloader: not in it twice (§5)
                found = None
                call_later(0.01, wake_engine, self.crawler)
        if found is None and self._heap:
            self._arm(wake=False)  # the engine asks again when the next is due, not at the next re-poll only
        return found

    def describe(self) -> str:
        """The held requests by host and when each host is due, for the log."""
        now = self.clock()
        parts = []
        for host, count in self._held.items():
            due = self._hosts.get(host, NOT_HELD).due
            when = ("when its line frees" if due == math.inf else "due now" if due - now < 0.5
                    else f"due in {due - now:.0f} s")
            parts.append(f"{host}: {count} request{'' if count == 1 else 's'}, {when}")
        return "Held: " + "; ".join(parts)

    def held_hosts(self) -> list[tuple[str, int, float]]:
        """``(host, requests held, due)`` per host, soonest first (due: this process's epoch s; inf: its line frees)."""
        return sorted(((host, count, self._hosts.get(host, NOT_HELD).due) for host, count in self._held.items()),
                      key=lambda row: (row[2], row[0]))

    # -- persistence ------------------------------------------------------------------------------------

    def _save_or_report(self, *, stopped: bool) -> None:
        """Close the held requests: under ``JOBDIR`` they stay on disk for resume (those that could not be written are
        logged and counted), without it they are reported (``stopped``: on request) and counted as not crawled."""
        count = len(self._held)
        summary = self.describe() if count else ""
        left = self._held.close()  # the requests held in memory, which are not kept
        # In `scrapy check`, a contract request still held fails the check instead of passing silently.
        fail_held_contract_requests(left, lambda host: self._hosts.get(host, NOT_HELD).due, self.pacer)
        self._held.report_close(count, left, summary, stopped=stopped)

    def _load(self) -> None:
        """Hold again what a previous run left under ``JOBDIR`` (stopped or killed), at the due times it
        recorded; a ``polite_deferred.pickle`` of an older version is moved into the held requests."""
        to_local = self.sync.to_local  # due times are persisted in the store's clock (docs/spec.md §5)
        dues = {host: 0.0 if due is None else to_local(due) for host, due in self._held.load().items()}
        for host, due in self._held.load_legacy(self._jobdir).items():
            dues[host] = max(dues.get(host, 0.0), to_local(due) if due else 0.0)
        for host, due in dues.items():
            self._hosts[host] = HeldHost(due)
            self._push(due, host)
        count = len(self._held)
        if not count:
            return
        if self.crawler.stats is not None:
            self.crawler.stats.set_value("polite/deferred/resumed", count)
        logger.info("scrapy-polite: resumed %d held requests from %s", count,
                    os.path.join(self._jobdir or "", HELD_DIR))
