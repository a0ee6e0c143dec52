"""The per-crawler pacer (docs/spec.md §5): one object the downloader middleware, the extension, the
scheduler and the download handler share, built by :func:`get_pacer` and found by :func:`find_pacer`.

It composes the glue units, each with one job:

* :class:`~scrapy_polite.booking.Booker` — the host's and addresses' lines, the booking transaction, go /
  wait / defer;
* :class:`~scrapy_polite.recording.Recorder` — responses, failures and robots.txt delays into the table;
* :class:`~scrapy_polite.retrying.ThrottleRetries` — the package's own retries of throttled pages;
* :class:`~scrapy_polite.resolution.Resolution` — public-only resolution and pinning;
* :class:`~scrapy_polite.reporting.Report` — per-host counters and ``polite/...`` stats;
* the pace table, an :class:`~scrapy_polite.stores.AsyncStore` (I/O never blocks the reactor) behind a
  :class:`~scrapy_polite.outage.StoreGuard` (calls wait through an outage of a server store).

The rules themselves are in :mod:`scrapy_polite.policy`; nothing here decides a duration.

The pacer is the only way in: the middleware, the extension, the scheduler, the contracts and the example
project call its methods and properties, never the units behind them (:attr:`Pacer.store_uri`,
:meth:`Pacer.hosts_in_backoff`, :meth:`Pacer.logged_events`, :meth:`Pacer.send_to`, the settings they need
such as :attr:`Pacer.max_idle_wait`, the clock conversions :meth:`Pacer.to_store` / :meth:`Pacer.to_local`,
the report's lines :meth:`Pacer.progress_line` / :meth:`Pacer.summary_line`, ...). It is the one owner of a
download's outcome: a response is recorded by :meth:`Pacer.response_downloaded` (the signal, connected by
the middleware), a failure by :meth:`Pacer.after_failure`, and :meth:`Pacer.after_response` says what the
record decided. What the pace table's backend can do is asked once, of the abilities it declares
(:func:`~scrapy_polite.stores.has_ability`, :mod:`scrapy_polite.stores.base`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.project import data_path
from twisted.internet import threads
from twisted.internet.defer import Deferred

from ._compat import crawler_engine
from .addresses import AddressFilter
from .booking import DEFAULT_TIMEOUT, Booker
from .browser import bind_browser
from .clock import process_clock
from .events import EventLog
from .handlers import UnpinnedRequests, UnsafeHandlerError, handler_modes
from .lifecycle import Lifecycle, Stage
from .outage import DeferredStore, StoreGuard, TableWatch
from .policy import HostState, PacingPolicy
from .reactor import await_deferred, call_later, reactor_sleep
from .recording import SERVER_SIDE_FAILURES, Recorder
from .reporting import HostCounters, Report
from .resolution import Resolution
from .retrying import ThrottleRetries
from .seams import ClockSync, Defer, Go, HoldingScheduler, Redefer, ResolverNotInstalled
from .settings import PoliteConfig
from .stores import (
    AsyncStore,
    Event,
    ExpiringRows,
    PaceStore,
    ProcessLocal,
    ServerClock,
    StoreClosed,
    StoreError,
    StoreOptions,
    has_ability,
    hosts_backing_off,
    open_async,
    open_store,
    table_name,
)
from .summary import HeldHost, format_progress, format_summary
from .vocabulary import CloseReason, DeferralReason

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = [
    "CrawlStopped",
    "FrontierOptions",
    "Pacer",
    "get_pacer",
    "discard_pacer",
    "find_pacer",
    "default_store_uri",
    "open_pace_table",
    "Go",
    "Defer",
    "Redefer",
    "ResolverNotInstalled",
    "SERVER_SIDE_FAILURES",
]


class CrawlStopped(IgnoreRequest):
    """A request that was not sent because scrapy-polite is stopping the crawl (its pace table failed:
    reason ``polite_store_error``; the resolver is missing: ``polite_resolver_missing``) or has closed its
    pace table. The reason was logged once, at ERROR, when the crawl was stopped (docs/spec.md §6, §7);
    an ``IgnoreRequest``, so Scrapy does not log each dropped request again with a traceback. Request
    errbacks see it; ``__cause__`` is the error that stopped the crawl."""


class FrontierOptions(NamedTuple):
    """The shared frontier's settings (docs/spec.md §5, "The shared frontier").

    Attributes:
        key: ``POLITE_FRONTIER_KEY``, the frontier's key prefix (``%(spider)s``: the spider's name).
        lease_time: ``POLITE_LEASE_TIME``, seconds a worker's leases last without renewal (> 0).
    """

    key: str
    lease_time: float


class Pacer:
    """Per-crawler pacing: the public face of the glue units. Built by :func:`get_pacer`.

    Args:
        crawler: the Scrapy crawler.
        config: the validated settings.
        store: the pace table (opened; failures were raised as :class:`StoreError` already). What its backend
            can do is asked here, once, of the abilities it declares (:mod:`scrapy_polite.stores.base`): a
            server clock (:class:`~scrapy_polite.stores.ServerClock`), a table of this process's own
            (:class:`~scrapy_polite.stores.ProcessLocal`), its name (:func:`~scrapy_polite.stores.table_name`).
        clock: this process's clock, Unix epoch seconds: the monotonic process clock (docs/spec.md §5;
            :data:`~scrapy_polite.clock.process_clock`), for every local due time, wait and timer (tests
            inject one).
        sleep: ``sleep(seconds) -> Deferred`` that never blocks the reactor (tests inject one).

    The facade (what other modules use): its methods and properties, and the attributes ``crawler`` (Scrapy's),
    ``clock``, ``user_agent``, ``failed`` (the error that stopped the crawl, or None) and ``closing``. The other
    attributes (``config``, ``policy``, ``store``, ``table``, ``guard``, ``sync``, ``report``, ``lifecycle``,
    ``booker``, ``recorder``, ``retries``, ``resolution``, ``events``, ``unpinned``) are the units behind it:
    the pacer wires them and tests inspect them; no other module reaches through them (docs/spec.md §5).
    """

    def __init__(self, crawler: Crawler, config: PoliteConfig, store: AsyncStore,
                 clock: Callable[[], float] = process_clock,
                 sleep: Callable[[float], Deferred[None]] | None = None) -> None:
        self.crawler = crawler
        self.config = config
        self.policy: PacingPolicy = config.policy
        self.store = store
        #: The backend behind the AsyncStore: its declared abilities, the start-up listing, the events after
        #: the crawl (the one place the pacer looks past the AsyncStore).
        self._backend: PaceStore = store.store
        self.clock = clock
        self.failed: Exception | None = None
        #: The crawl's close has begun (:meth:`close`, :meth:`close_async`): store errors no longer stop it.
        self.closing = False
        self.user_agent: str = (crawler.settings.get("ROBOTSTXT_USER_AGENT") or crawler.settings.get("USER_AGENT")
                                or "Scrapy")
        self.report = Report(crawler.stats, clock)
        #: The one owner of every paced request's stage, lines and claims (docs/spec.md §5).
        self.lifecycle = Lifecycle(inc=self.report.inc)
        self.sync = ClockSync(clock, server_clock=has_ability(self._backend, ServerClock))
        self.resolution = Resolution(crawler, config.address_filter, self.report, self._resolver_missing)
        self.guard = StoreGuard(store, timeout=config.store_timeout, report=self.report, clock=clock,
                                sleep=sleep or reactor_sleep)
        # Only a server store (Redis: it has a clock of its own) has outages to wait out; the embedded
        # stores (SQLite, memory) fail closed at once, so their calls skip the guard.
        self.table: DeferredStore = self.guard if self.sync.server_clock else store
        #: The event log (docs/guides/operating.md, "The event log"): batches written beside the pace table, off the
        #: hot path.
        self.events = EventLog(store if config.event_log else None, self.sync, call_later=call_later,
                               inc=self.report.inc, table=table_name(self._backend))
        self.report.events = self.events
        if not has_ability(self._backend, ProcessLocal):  # a shared table may come back empty (docs/spec.md §6)
            # A sharded Redis table keeps its identity in another slot than most rows: checked once a second.
            self.table = TableWatch(self.table, report=self.report, restored=self.events.restored, clock=clock,
                                    check_every=1.0 if getattr(self._backend, "sharded", False) else 0.0)
        self.booker = Booker(config, self.table, self.lifecycle, self.resolution, self.report, self.sync,
                             sleep or reactor_sleep, self._store_failed,
                             download_timeout=crawler.settings.getfloat("DOWNLOAD_TIMEOUT", DEFAULT_TIMEOUT))
        self.recorder = Recorder(config, self.table, self.lifecycle, self.report, self.sync, self.booker.override,
                                 self.booker.end, self._store_failed, self.user_agent)
        self._reconciled = float("-inf")
        self.retries = ThrottleRetries(config.policy, self.report, self.sync, self.booker.can_defer)
        #: The requests of a *checked* download handler (docs/spec.md §4.1).
        self.unpinned = UnpinnedRequests(_modes(crawler), config.address_filter, self.report.inc)
        self.resolution.resolves_itself = self.unpinned.resolves_itself
        # scrapy-playwright's browser: its proxy (pinned) or its guard (checked), docs/spec.md §4.1.
        bind_browser(crawler, address_filter=config.address_filter, resolver=self.resolution.resolver,
                     inc=self.report.inc)

    # -- shared state -----------------------------------------------------------------------------------

    @property
    def store_uri(self) -> str:
        """The pace table's URI as logs and command lines name it (a password hidden)."""
        return self.store.uri

    @property
    def server_clock(self) -> bool:
        """The pace table's clock is a server's (:class:`~scrapy_polite.stores.ServerClock`): its times are
        converted to this process's clock (docs/spec.md §6)."""
        return self.sync.server_clock

    @property
    def scheduler(self) -> HoldingScheduler | None:
        """The scheduler holding deferred requests (attached while it is open), or None."""
        return self.booker.scheduler

    @scheduler.setter
    def scheduler(self, scheduler: HoldingScheduler | None) -> None:
        self.booker.scheduler = scheduler
        self.lifecycle.wake = scheduler.wake if scheduler is not None else None
        self.lifecycle.ended = scheduler.ended if scheduler is not None else None

    @property
    def spider_delay(self) -> float | None:
        """The spider's ``crawl_delay`` attribute (seconds), a per-spider interval override."""
        return self.booker.spider_delay

    @spider_delay.setter
    def spider_delay(self, value: float | None) -> None:
        self.booker.spider_delay = value

    @property
    def address_filter(self) -> AddressFilter:
        """This crawler's address rules."""
        return self.config.address_filter

    # -- the settings the scheduler, the extension and the contracts need -------------------------------

    @property
    def max_idle_wait(self) -> float:
        """``POLITE_MAX_IDLE_WAIT``, seconds: when everything held is due later than this, the idle spider
        closes with reason ``polite_deferred`` (docs/spec.md §5)."""
        return self.config.max_idle_wait

    @property
    def max_held_in_memory(self) -> int:
        """``POLITE_MAX_HELD_IN_MEMORY``: how many held requests the scheduler keeps in memory (>= 0; the
        others wait on disk, :mod:`scrapy_polite.held`)."""
        return self.config.max_held_in_memory

    @property
    def scheduler_base(self) -> str | type[Any]:
        """``POLITE_SCHEDULER_BASE``: the scheduler class (or its import path) the scheduler wraps."""
        return self.config.scheduler_base

    @property
    def shared_frontier(self) -> FrontierOptions | None:
        """The shared frontier's options when ``POLITE_SHARED_FRONTIER`` is on (docs/spec.md §5, "The shared
        frontier"), else None."""
        config = self.config
        return FrontierOptions(config.frontier_key, config.lease_time) if config.shared_frontier else None

    @property
    def adaptive_enabled(self) -> bool:
        """``POLITE_ADAPTIVE`` is on: intervals follow the hosts' response times (docs/spec.md §2, "Adaptive
        pacing")."""
        return self.policy.adaptive is not None

    @property
    def max_backoff(self) -> float:
        """``POLITE_MAX_BACKOFF``, seconds: the cap of a host's backoff after throttles (docs/spec.md §2)."""
        return self.policy.max_backoff

    @property
    def host_interval(self) -> float:
        """``POLITE_HOST_INTERVAL``, seconds: the base interval between two requests to one host
        (docs/spec.md §2)."""
        return self.policy.host_interval

    def host_delay(self, host: str) -> float | None:
        """The host's ``POLITE_HOST_DELAYS`` entry, seconds (None: it has none; ``host`` is a host key)."""
        return self.config.host_delays.get(host)

    def effective_interval(self, host: str, request: Request | None = None) -> float:
        """The interval (seconds) the pacer applies to ``host`` for ``request`` now: the policy's effective
        interval (docs/spec.md §2) of the host's last known row (its counters) with every override (:meth:`override`:
        ``meta['polite_delay']``, ``POLITE_HOST_DELAYS``, the spider's ``crawl_delay``)."""
        counters = self.report.hosts.get(host)
        return self.policy.effective_interval(counters.state if counters is not None else None,
                                              self.override(host, request))

    # -- the pace table's clock (docs/spec.md §5, §6) ----------------------------------------------------

    def to_store(self, local_time: float) -> float:
        """A moment of this process's clock (epoch s) in the pace table's clock: what is persisted (held
        requests' due times). The same moment unless the table has a server clock (:attr:`server_clock`)."""
        return self.sync.to_store(local_time)

    def to_local(self, store_time: float) -> float:
        """A moment of the pace table's clock (epoch s) in this process's clock (:meth:`to_store`'s inverse)."""
        return self.sync.to_local(store_time)

    @property
    def hosts(self) -> dict[str, HostCounters]:
        """Per-host counters of this crawl."""
        return self.report.hosts

    def inc(self, key: str, count: float = 1) -> None:
        """Add ``count`` to the stat ``polite/<key>``."""
        self.report.inc(key, count)

    def counters(self, host: str) -> HostCounters:
        """The host's counters."""
        return self.report.counters(host)

    def starts_in_backoff(self, host: str, state: HostState, *, offset: float = 0.0, announce: bool = False) -> None:
        """See :meth:`Report.starts_in_backoff <scrapy_polite.reporting.Report.starts_in_backoff>` (the
        extension's start-up listing)."""
        self.report.starts_in_backoff(host, state, offset=offset, announce=announce)

    @property
    def on_first_touch(self) -> Callable[[str], None] | None:
        """Called with a host that started in backoff and was not listed at start, when this crawl first
        meets it (:attr:`Report.on_first_touch <scrapy_polite.reporting.Report.on_first_touch>`); None: not
        named."""
        return self.report.on_first_touch

    @on_first_touch.setter
    def on_first_touch(self, callback: Callable[[str], None] | None) -> None:
        self.report.on_first_touch = callback

    def progress_line(self, held: Sequence[HeldHost], *, idle: bool, store_option: str | None = None) -> str | None:
        """The progress line of this crawl's report now (:func:`~scrapy_polite.summary.format_progress`), or
        None when there is nothing to tell."""
        return format_progress(self.report, held, now=self.clock(), idle=idle, store_option=store_option)

    def summary_line(self, *, no_host: int = 0) -> str:
        """The closing summary of this crawl's report now (:func:`~scrapy_polite.summary.format_summary`;
        ``no_host``: requests refused for having no host)."""
        return format_summary(self.report, now=self.clock(), no_host=no_host)

    def check(self) -> None:
        """Raise the error that stopped the crawl, if any (no request goes out after it)."""
        if self.failed is not None:
            raise self.failed

    # -- before a request (Booker, Resolution) ----------------------------------------------------------

    async def before_request(self, request: Request, host: str) -> Go | Defer:
        """See :meth:`Booker.before_request <scrapy_polite.booking.Booker.before_request>`; raises the
        error that stopped the crawl first."""
        self.check()
        return await self.booker.before_request(request, host)

    async def addresses(self, request: Request, host: str) -> list[str] | None:
        """See :meth:`Resolution.addresses <scrapy_polite.resolution.Resolution.addresses>`."""
        return await self.resolution.addresses(request, host)

    def pin(self, request: Request, host: str, address: str) -> None:
        """See :meth:`Resolution.pin <scrapy_polite.resolution.Resolution.pin>`."""
        self.resolution.pin(request, host, address)

    def send_to(self, request: Request, host: str, address: str) -> None:
        """``request`` of ``host`` goes to ``address``: pinned to it (:meth:`pin`), and counted
        (``polite/unpinned/<handler>``) when a checked handler sends it (docs/spec.md §4.1)."""
        self.resolution.pin(request, host, address)
        self.unpinned.sent(request)

    def can_defer(self, request: Request) -> bool:
        """See :meth:`Booker.can_defer <scrapy_polite.booking.Booker.can_defer>`."""
        return self.booker.can_defer(request)

    def defer(self, host: str, due: float | None, reason: DeferralReason, request: Request | None = None) -> Defer:
        """Count a deferral of ``host`` (of ``request``, when known: ``polite/deferrals/<reason>``) and return it."""
        return self.booker.defer(host, due, reason, request)

    def override(self, host: str, request: Request | None = None) -> float | None:
        """See :meth:`Booker.override <scrapy_polite.booking.Booker.override>`."""
        return self.booker.override(host, request)

    async def early_due(self, request: Request, host: str) -> float | None:
        """See :meth:`Booker.early_due <scrapy_polite.booking.Booker.early_due>`."""
        return await self.booker.early_due(request, host)

    async def due(self, host: str) -> float:
        """See :meth:`Booker.due <scrapy_polite.booking.Booker.due>`."""
        return await self.booker.due(host)

    def release(self, request: Request, host: str | None = None) -> None:
        """See :meth:`Booker.release <scrapy_polite.booking.Booker.release>`."""
        self.booker.release(request, host)

    # -- the lifecycle (the scheduler's side) ------------------------------------------------------------

    def host_blocked(self, host: str) -> bool:
        """See :meth:`Lifecycle.blocked <scrapy_polite.lifecycle.Lifecycle.blocked>`."""
        return self.lifecycle.blocked(host)

    def blocked_hosts(self) -> set[str]:
        """See :meth:`Lifecycle.blocked_hosts <scrapy_polite.lifecycle.Lifecycle.blocked_hosts>`."""
        return self.lifecycle.blocked_hosts()

    def host_parkable(self, host: str) -> bool:
        """See :meth:`Lifecycle.parkable <scrapy_polite.lifecycle.Lifecycle.parkable>`."""
        return self.lifecycle.parkable(host)

    def released(self, request: Request, host: str) -> None:
        """See :meth:`Lifecycle.release <scrapy_polite.lifecycle.Lifecycle.release>`."""
        self.lifecycle.release(request, host)

    def held(self, request: Request, host: str) -> None:
        """``request`` is held by the scheduler: it gives up its claim and lines (unpinned)."""
        self.booker.release(request, host)
        self.lifecycle.held(request, host)

    def reconcile(self, *, force: bool = False) -> int:
        """End the requests holding a line or a claim that the downloader no longer has
        (:meth:`Lifecycle.reconcile <scrapy_polite.lifecycle.Lifecycle.reconcile>`): at most once a second
        unless ``force`` (the idle check). Returns how many were ended."""
        now = self.clock()
        if not force and 0.0 <= now - self._reconciled < 1.0:
            return 0
        self._reconciled = now
        active = getattr(getattr(crawler_engine(self.crawler), "downloader", None), "active", None)
        return self.lifecycle.reconcile(active, self.booker.release)

    def drop(self, request: Request) -> None:
        """``request`` left without a download (``IgnoreRequest`` from any component, a response made by a
        middleware or the cache): its lines and claim are freed, its host woken (docs/spec.md §5)."""
        self.booker.end(request, dropped=True)

    def arrive(self, request: Request, host: str) -> None:
        """``request`` reached the pacing middleware for ``host`` unpaced (``dont_pace``): its claim on the
        host is over (docs/spec.md §5)."""
        self.lifecycle.arrive(request, host)

    def response_downloaded(self, response: Response, request: Request, spider: Any = None) -> None:
        """``response_downloaded`` (connected by the pacing middleware): **the** place a downloaded response is
        recorded (docs/spec.md §5), before any downloader middleware acts on it (``RetryMiddleware`` turning a
        429 into a retry): its status, ``Retry-After`` and rate-limit fields into the table. A response a
        checked handler got from a non-public address is recorded as a failure that never throttles, one from
        another host than the booked one (a browser's redirect) is not recorded (docs/spec.md §4.1). A
        robots.txt response's status is noted (:meth:`robots_status`). :meth:`after_response` then waits for
        the record."""
        try:
            refusal = self.unpinned.refusal(request, response)
            if refusal is not None:
                # A checked handler reached a non-public address; that server's status (a 429) says nothing
                # of the booked host: a failure, which never throttles it.
                self.recorder.record_failure(request, IgnoreRequest(refusal))
            elif not self.unpinned.foreign_response(request, response):
                self.recorder.record_response(request, response)
        finally:  # a failing record never skips the robots.txt status
            if request.url.endswith("/robots.txt"):
                self.recorder.robots_downloaded(request.url, response.status)

    async def after_response(self, request: Request, response: Response) -> float | None:
        """The pacing middleware's ``process_response``: wait for the response's record
        (:meth:`response_downloaded`), then end the request's life (its lines freed, its host woken). A
        response that answers a request before it was booked (the HTTP cache, a middleware's own response)
        only ends it (docs/spec.md §5).

        Returns:
            When the page is to be retried (a throttle within ``POLITE_THROTTLE_RETRIES``, this process's
            epoch seconds: docs/spec.md §2), or None: the response goes on.

        Raises:
            IgnoreRequest: a checked handler reached a non-public address (docs/spec.md §4.1).
        """
        if self.lifecycle.stage(request) != Stage.IN_FLIGHT:  # not booked in this pass through the downloader
            self.drop(request)
            return None
        refusal = self.unpinned.refusal(request, response)  # decided when it was recorded: counted once
        decision = await self.recorder.finish(request)
        if refusal is not None:
            raise IgnoreRequest(f"scrapy-polite refuses the response of {request.url!r}: {refusal}")
        return self.retries.due(request, decision)

    async def after_failure(self, request: Request, exception: BaseException) -> None:
        """The pacing middleware's ``process_exception`` (no signal carries a download's failure): record it (a
        failure that reached the server's side counts as a throttle without Retry-After: docs/spec.md §2) and
        end the request's life; a request dropped before it was booked (``IgnoreRequest`` from another
        middleware, our own refusal) only ends it (docs/spec.md §5)."""
        if self.lifecycle.stage(request) != Stage.IN_FLIGHT:  # not booked in this pass through the downloader
            self.drop(request)
            return
        self.recorder.record_failure(request, exception)
        await self.recorder.finish(request)

    def response_received(self, response: Response, request: Request, spider: Any = None) -> None:
        """``response_received`` (connected by the pacing middleware): see :meth:`ThrottleRetries.response_received
        <scrapy_polite.retrying.ThrottleRetries.response_received>` (a page whose throttle retries are spent is
        given up)."""
        self.retries.response_received(response, request)

    def robots_unreachable(self, host: str, since: float | None, cause: str | None = None) -> None:
        """The host's robots.txt is unreachable since ``since`` (this process's epoch s), with no rules read before:
        its requests are held (docs/spec.md §5, "The robots.txt lifecycle"); ``cause``: its last answer; None: it
        answered. Read by the progress line, the closing summary and the idle check."""
        self.report.robots_unreachable(host, since, cause)

    def robots_given_up(self) -> set[str]:
        """The hosts whose robots.txt has been unreachable (their requests held) for longer than
        ``POLITE_MAX_IDLE_WAIT``: the idle check does not keep the spider open for them."""
        now = self.clock()
        return {host for host, c in self.report.hosts.items()
                if c.robots_unreachable_since is not None and now - c.robots_unreachable_since > self.max_idle_wait}

    def robots_status(self, host: str) -> int | None:
        """The status of the host's last downloaded robots.txt (None: none was downloaded)."""
        return self.recorder.robots_statuses.get(host)

    def throttled_since(self, request: Request) -> bool:
        """See :meth:`Recorder.throttled_since <scrapy_polite.recording.Recorder.throttled_since>`."""
        return self.recorder.throttled_since(request)

    def set_crawl_delay(self, host: str, delay: float | None) -> Deferred[Any]:
        """See :meth:`Recorder.set_crawl_delay <scrapy_polite.recording.Recorder.set_crawl_delay>`."""
        return self.recorder.set_crawl_delay(host, delay)

    # -- the table's contents ----------------------------------------------------------------------------

    async def hosts_in_backoff(self) -> tuple[float, list[tuple[str, HostState]]]:
        """The hosts the pace table holds in backoff now (:func:`~scrapy_polite.stores.hosts_backing_off`: one
        query when the store has it, else a scan), read on a thread (the table may be large, or remote).

        Returns:
            ``(offset, rows)``: ``offset`` (seconds) turns the table's times into this process's clock (0
            unless the table has a server clock), ``rows`` the ``(host, state)`` rows sorted by host.

        Raises:
            StoreError: the table cannot be read.
        """
        backend = self._backend

        def scan() -> tuple[float, list[tuple[str, HostState]]]:
            now = backend.now()
            return now, hosts_backing_off(backend, now)

        store_now, rows = await await_deferred(threads.deferToThread(scan))
        return (self.clock() - store_now if self.sync.server_clock else 0.0), rows

    def logged_events(self, since: float | None = None, limit: int = 1_000_000) -> list[Event]:
        """The pace table's event log (:meth:`PaceStore.events <scrapy_polite.stores.PaceStore.events>`),
        blocking: for after the crawl, whose close closed the table. A table of this process's own
        (:class:`~scrapy_polite.stores.ProcessLocal`, ``memory://``) is read from the crawl's own rows, any
        other is opened again from its URI for the read.

        Raises:
            StoreError: the table cannot be opened or read.
        """
        if has_ability(self._backend, ProcessLocal):
            return self._backend.events(since=since, limit=limit)
        store = open_store(self.config.store_uri or default_store_uri(), store_options(self.config))
        try:
            return store.events(since=since, limit=limit)
        finally:
            store.close()

    # -- reporting and failures -------------------------------------------------------------------------

    def host_report(self) -> dict[str, dict[str, Any]]:
        """See :meth:`Report.host_report <scrapy_polite.reporting.Report.host_report>`."""
        return self.report.host_report()

    def _store_failed(self, exc: StoreError) -> None:
        if isinstance(exc, StoreClosed):  # a late call after the close: it wrote nothing, nothing to stop
            logger.debug("scrapy-polite: %s", exc)
            return
        if self.closing:  # the crawl is closing already: nothing to stop
            logger.warning("scrapy-polite: %s (while the crawl was closing)", exc)
            return
        if self.failed is None:
            self.failed = exc
            logger.error("%s Stopping the crawl: without its pace table scrapy-polite cannot pace it.", exc)
            self.inc("store_errors")
            close_spider_soon(self.crawler, "polite_store_error")

    def _resolver_missing(self, exc: ResolverNotInstalled) -> None:
        if self.failed is None and not self.closing:
            self.failed = exc
            logger.error("%s", exc)
            self.inc("resolver_missing")
            close_spider_soon(self.crawler, "polite_resolver_missing")

    def close(self) -> None:
        """Write the events still buffered, then close the pace table (blocking: outside a running crawl, or
        a crawl refused at its start). Idempotent; later store calls fail with
        :class:`~scrapy_polite.stores.StoreClosed`, quietly."""
        self.closing = True
        try:
            self.events.close()
            self.guard.close()
        finally:
            _registry_lets_go(self)

    async def close_async(self) -> None:
        """Write the events still buffered, then close the pace table, without blocking the reactor (the
        crawl's close: ``spider_closed``). A failure of either is logged, never raised."""
        self.closing = True
        try:
            try:  # the holds of requests cancelled in flight (no record came): nothing outlives the crawl
                held = self.booker.release_holds()
                if held is not None:
                    await await_deferred(held)
            except Exception:
                logger.debug("scrapy-polite: the last in-flight holds were not released", exc_info=True)
            try:
                await await_deferred(self.events.close())
            except Exception:
                logger.warning("scrapy-polite: the last events could not be written", exc_info=True)
            try:
                await await_deferred(self.guard.close_async())
            except Exception:
                logger.warning("scrapy-polite: the pace table %s did not close cleanly", self.store_uri,
                               exc_info=True)
        finally:  # even when cancelled: the crawl's objects are freed with its crawler
            _registry_lets_go(self)


def close_spider_soon(crawler: Crawler, reason: CloseReason) -> None:
    """Close the crawler's spider with ``reason`` on the next reactor turn (no-op when not running)."""
    engine = crawler_engine(crawler)
    if engine is not None and getattr(engine, "running", False):
        call_later(0, _close_spider, crawler, reason)


def _close_spider(crawler: Crawler, reason: str) -> None:
    engine = crawler.engine
    if engine is None or engine.spider is None:
        return
    close = getattr(engine, "close_spider_async", None)
    if close is not None:
        deferred_from_coro(close(reason=reason))
    else:  # Scrapy before close_spider_async
        engine.close_spider(engine.spider, reason)


def default_store_uri() -> str:
    """``sqlite:///<project data dir>/polite.sqlite3`` — inside ``.scrapy/`` of the Scrapy project."""
    path = data_path("polite.sqlite3")  # SQLiteStore creates the directory (createdir would make the file one)
    return f"sqlite:///{os.path.abspath(path)}"


def store_options(config: PoliteConfig) -> StoreOptions:
    """The options the ``POLITE_STORE_*`` settings give a backend (docs/spec.md §6)."""
    return StoreOptions(prefix=config.store_prefix, timeout=config.store_timeout, expire=config.store_expire,
                        events_max=config.event_log_size)


def open_pace_table(uri: str, options: StoreOptions) -> AsyncStore:
    """Open the pace table ``uri`` names (:func:`~scrapy_polite.stores.open_store`) for a crawl: its stale rows
    swept unless they expire on their own (:class:`~scrapy_polite.stores.ExpiringRows`; else rows idle for
    ``options.expire`` seconds whose ``next_allowed`` has passed are removed), then the backend's own async table
    (:func:`~scrapy_polite.stores.open_async`). docs/spec.md §6.

    Raises:
        StoreError: the table cannot be opened or swept (the backend is closed again).
    """
    backend = open_store(uri, dataclasses.replace(options, mark=True))  # a crawl's opening (§6, "After a crash")
    try:
        expired = 0 if has_ability(backend, ExpiringRows) else backend.expire(backend.now() - options.expire)
        if expired:
            logger.info("scrapy-polite: expired %d stale hosts from %s", expired, backend.uri)
        logger.info("scrapy-polite: pace table %s", backend.uri)
        return open_async(backend)
    except BaseException:
        backend.close()
        raise


def _modes(crawler: Crawler) -> dict[str, Any]:
    """Each scheme's handler mode; {} for a handler the add-on would have refused (the middleware used
    without the add-on: nothing to count)."""
    try:
        return handler_modes(crawler.settings)
    except UnsafeHandlerError:
        return {}


#: One pacer per crawler, without a private attribute on the crawler. An open pacer is held here; a closed one
#: only weakly (:func:`_registry_lets_go`): a pacer refers to its crawler, so a strong value would keep its own
#: weak key alive, and every finished crawl of a process (its crawler, spider, stats, pacer and pace table
#: object) would stay in memory until the process ends. After the close the crawler's components (the
#: extension, the middleware) still hold the pacer, so :func:`find_pacer` finds it while the crawler lives.
_PACERS: weakref.WeakKeyDictionary[Any, Pacer | weakref.ReferenceType[Pacer]] = weakref.WeakKeyDictionary()


def _registered(crawler: Crawler) -> Pacer | None:
    """The crawler's pacer in :data:`_PACERS` (open, or closed and still held by a component), or None."""
    entry = _PACERS.get(crawler)
    return entry() if isinstance(entry, weakref.ReferenceType) else entry


def _registry_lets_go(pacer: Pacer) -> None:
    """``pacer`` is closed: the registry holds it weakly from now on (:data:`_PACERS`), so its crawl's objects
    are freed with its crawler."""
    crawler = pacer.crawler
    try:
        registered = _PACERS.get(crawler) is pacer
    except TypeError:  # not weakly referenceable: a pacer built without get_pacer (a test's stand-in crawler)
        return
    if registered:
        _PACERS[crawler] = weakref.ref(pacer)


def get_pacer(crawler: Crawler) -> Pacer:
    """The crawler's :class:`Pacer`, built (settings validated, store opened) on first use.

    After the crawl, this is its closed pacer as long as the crawler's components (the extension, the
    middleware) hold it. Once nothing holds it, it is freed, and a later call builds a new pacer and opens the
    pace table again, which the caller then closes (:meth:`Pacer.close`); :func:`find_pacer` never builds one.

    Raises:
        SettingsError: a bad ``POLITE_*`` setting.
        StoreError: the pace table cannot be opened (the crawl must not start).
    """
    pacer = _registered(crawler)
    if pacer is None:
        config = PoliteConfig.from_settings(crawler.settings)
        store = open_pace_table(config.store_uri or default_store_uri(), store_options(config))
        try:
            pacer = Pacer(crawler, config, store)
        except BaseException:
            store.close()
            raise
        _PACERS[crawler] = pacer
    return pacer


def discard_pacer(crawler: Crawler) -> None:
    """Close the crawler's :class:`Pacer`, if :func:`get_pacer` built one, and forget it: for a crawl refused
    at its start, so that nothing the pace table started (threads, connections) outlives the refusal
    (docs/spec.md §7). A failure to close is logged at DEBUG, never raised (the refusal is the error)."""
    pacer = _registered(crawler)
    _PACERS.pop(crawler, None)
    if pacer is None:
        return
    try:
        pacer.close()
    except Exception:
        logger.debug("scrapy-polite: the pace table %s did not close cleanly", pacer.store_uri, exc_info=True)


def find_pacer(crawler: Crawler) -> Pacer | None:
    """The crawler's :class:`Pacer` if :func:`get_pacer` has built it (after the crawl: while the crawler's
    components hold it), else None (never builds one)."""
    return _registered(crawler)
