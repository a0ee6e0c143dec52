"""The per-crawler pacer (docs/spec.md §5): the small container of the units a crawl's components share, built
once per crawler by :func:`get_pacer` and found by :func:`find_pacer`. Each component takes from it the units it
uses, as Scrapy's components take ``crawler.stats`` or ``engine.downloader``:

* :attr:`Pacer.config` — the validated ``POLITE_*`` settings (:class:`~scrapy_polite.settings.PoliteConfig`) and
  :attr:`Pacer.policy`, the pure rules (:mod:`scrapy_polite.policy`; nothing here decides a duration);
* :attr:`Pacer.booker` (:class:`~scrapy_polite.crawl.booking.Booker`) — the host's and addresses' lines, the booking
  transaction, go / wait / defer;
* :attr:`Pacer.recorder` (:class:`~scrapy_polite.crawl.recording.Recorder`) — responses, failures and robots.txt delays
  into the table;
* :attr:`Pacer.lifecycle` (:class:`~scrapy_polite.crawl.lifecycle.Lifecycle`) — every paced request's stage, lines
  and claims;
* :attr:`Pacer.retries` (:class:`~scrapy_polite.crawl.retrying.ThrottleRetries`) — the package's own retries of
  throttled pages;
* :attr:`Pacer.resolution` (:class:`~scrapy_polite.crawl.resolution.Resolution`) and :attr:`Pacer.unpinned`
  (:class:`~scrapy_polite.network.handlers.UnpinnedRequests`) — public-only resolution, pinning, checked handlers;
* :attr:`Pacer.report` (:class:`~scrapy_polite.reports.counters.Report`) — per-host counters and ``polite/...`` stats;
* :attr:`Pacer.sync` (:class:`~scrapy_polite.clock.ClockSync`) — this process's clock and the table's;
* :attr:`Pacer.store` — the pace table, an :class:`~scrapy_polite.stores.AsyncStore` (I/O never blocks the
  reactor), and :attr:`Pacer.table`, the same behind a :class:`~scrapy_polite.crawl.outage.StoreGuard` (calls wait
  through an outage of a server store) and a :class:`~scrapy_polite.crawl.outage.TableWatch`.

The pacer itself wires them, answers what needs more than one of them (:meth:`Pacer.effective_interval`,
:meth:`Pacer.reconcile`, the table's contents), stops the crawl when the table or the resolver fails
(:attr:`Pacer.failed`), and closes what it opened. A request's outcome is the downloader middleware's
(:class:`~scrapy_polite.middleware.PoliteDownloaderMiddleware`). What the pace table's backend can do is asked
once, of the abilities it declares (:func:`~scrapy_polite.stores.has_ability`, :mod:`scrapy_polite.stores.base`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.project import data_path
from twisted.internet import threads
from twisted.internet.defer import Deferred

from ._compat import crawler_engine, engine_closing
from .browser import bind_browser
from .clock import ClockSync, process_clock
from .crawl.booking import DEFAULT_TIMEOUT, Booker
from .crawl.lifecycle import Lifecycle
from .crawl.outage import DeferredStore, StoreGuard, TableWatch
from .crawl.reactor import await_deferred, call_later, reactor_sleep, sleep_until
from .crawl.recording import SERVER_SIDE_FAILURES, Recorder
from .crawl.resolution import Resolution
from .crawl.retrying import ThrottleRetries
from .crawl.seams import Closing, Defer, Go, Redefer, ResolverNotInstalled
from .network.handlers import UnpinnedRequests, UnsafeHandlerError, handler_modes
from .policy import HostState, PacingPolicy
from .reports.counters import Report
from .reports.events import EventLog
from .settings import PoliteConfig
from .stores import (
    AsyncStore,
    Event,
    ExpiringRows,
    PaceStore,
    ProcessLocal,
    ServerClock,
    SharedClock,
    StoreClosed,
    StoreError,
    StoreOptions,
    has_ability,
    hosts_backing_off,
    open_async,
    open_store,
    table_name,
)
from .vocabulary import CloseReason

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = [
    "CrawlStopped",
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
    reason ``polite_store_error``; the resolver is missing: ``polite_resolver_missing``), has closed its
    pace table, or because the crawl's close began while it waited for its host (``polite/closed_waiting``,
    docs/spec.md §5). The reason was logged once when the crawl was stopped (at ERROR; the close's, at INFO);
    an ``IgnoreRequest``, so Scrapy does not log each dropped request again with a traceback. Request
    errbacks see it; ``__cause__`` is the error that stopped the crawl."""


class Pacer:
    """The units of one crawl's pacing (see the module docstring). Built by :func:`get_pacer`.

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

    Attributes: ``crawler`` (Scrapy's), ``clock``, ``user_agent`` (the robots.txt user agent), ``failed`` (the error
    that stopped the crawl, or None), ``closing`` (the close has begun) and the units: ``config``, ``policy``,
    ``store``, ``table``, ``guard``, ``sync``, ``report``, ``lifecycle``, ``booker``, ``recorder``, ``retries``,
    ``resolution``, ``events``, ``unpinned``. No method of the pacer forwards to one unit (tests/test_facade.py):
    a component calls the unit.
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
        #: Requests the scheduler cannot hold, waiting for their host outside Scrapy's ``Downloader.active`` (the
        #: middleware's ``_book_outside``; docs/spec.md §5): still in the downloader to :meth:`reconcile`.
        self.outside: set[Request] = set()
        self._cut_logged = False
        self.user_agent: str = (crawler.settings.get("ROBOTSTXT_USER_AGENT") or crawler.settings.get("USER_AGENT")
                                or "Scrapy")
        self.report = Report(crawler.stats, clock)
        #: The one owner of every paced request's stage, lines and claims (docs/spec.md §5).
        self.lifecycle = Lifecycle(inc=self.report.inc)
        self.sync = ClockSync(clock, server_clock=has_ability(self._backend, ServerClock),
                              offset=self._backend.clock_offset if has_ability(self._backend, SharedClock) else 0.0)
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
                                    check_every=1.0 if getattr(self._backend, "sharded", False) else 0.0,
                                    own_holds=self.lifecycle.hold_tokens)
        self.booker = Booker(config, self.table, self.lifecycle, self.resolution, self.report, self.sync,
                             sleep or sleep_until(self._closed_while_waiting), self._store_failed,
                             download_timeout=crawler.settings.getfloat("DOWNLOAD_TIMEOUT", DEFAULT_TIMEOUT))
        self.recorder = Recorder(config, self.table, self.lifecycle, self.report, self.sync, self.booker.override,
                                 self._store_failed, self.user_agent)
        self.retries = ThrottleRetries(config.policy, self.report, self.sync, self.booker.can_defer)
        #: The requests of a *checked* download handler (docs/spec.md §4.1).
        self.unpinned = UnpinnedRequests(_modes(crawler), config.address_filter, self.report.inc)
        self.resolution.through_proxy = self.unpinned.through_proxy
        if self.unpinned.active:  # else no handler resolves a host itself: the resolution asks nothing
            self.resolution.resolves_itself = self.unpinned.resolves_itself
        # scrapy-playwright's browser: its proxy (pinned) or its guard (checked), docs/spec.md §4.1.
        bind_browser(crawler, address_filter=config.address_filter, resolver=self.resolution.resolver,
                     inc=self.report.inc)

    # -- wiring ------------------------------------------------------------------------------------------

    def effective_interval(self, host: str, request: Request | None = None) -> float:
        """The interval (seconds) the pacer applies to ``host`` for ``request`` now: the policy's effective
        interval (docs/spec.md §2) of the host's last known row (its counters) with every override (:meth:`override`:
        ``meta['polite_delay']``, ``POLITE_HOST_DELAYS``, the spider's ``crawl_delay``)."""
        counters = self.report.hosts.get(host)
        return self.policy.effective_interval(counters.state if counters is not None else None,
                                              self.booker.override(host, request))

    def check(self) -> None:
        """Raise the error that stopped the crawl, if any (no request goes out after it)."""
        if self.failed is not None:
            raise self.failed

    def reconcile(self) -> int:
        """End the requests holding a line or a claim that the downloader no longer has
        (:meth:`Lifecycle.reconcile <scrapy_polite.crawl.lifecycle.Lifecycle.reconcile>`; the extension calls it
        once a second and at every idle check). Returns how many were ended."""
        active = getattr(getattr(crawler_engine(self.crawler), "downloader", None), "active", None)
        if self.outside and active is not None:
            active = active | self.outside
        return self.lifecycle.reconcile(active, self.booker.release)

    # -- the table's contents ----------------------------------------------------------------------------

    async def hosts_in_backoff(self) -> tuple[float, list[tuple[str, HostState]]]:
        """The hosts the pace table holds in backoff now (:func:`~scrapy_polite.stores.hosts_backing_off`: one
        query when the store has it, else a scan), read on a thread (the table may be large, or remote).

        Returns:
            ``(offset, rows)``: ``offset`` (seconds) turns the table's times into this process's clock (0
            unless the table has a server clock or a shared one), ``rows`` the ``(host, state)`` rows sorted by host.

        Raises:
            StoreError: the table cannot be read.
        """
        backend = self._backend

        def scan() -> tuple[float, list[tuple[str, HostState]]]:
            now = backend.now()
            return now, hosts_backing_off(backend, now)

        store_now, rows = await await_deferred(threads.deferToThread(scan))
        return (self.clock() - store_now if self.sync.server_clock else self.sync.offset), rows

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
            self.report.inc("store_errors")
            close_spider_soon(self.crawler, "polite_store_error")

    def _closed_while_waiting(self) -> Closing | None:
        """The error that ends a wait in the downloader (a request waiting for its host's turn, or for its unreachable
        robots.txt) once the crawl's close has begun: Scrapy's close waits for every request in the engine, which kept
        a crawl ``CLOSESPIDER_TIMEOUT`` or Ctrl-C stopped open for its host's whole backoff (docs/spec.md §5). None:
        the wait goes on."""
        if not engine_closing(self.crawler):
            return None
        if not self._cut_logged:  # once: a dropped file is otherwise only at DEBUG (FilesPipeline's "File (filtered)")
            self._cut_logged = True
            logger.info("scrapy-polite: the crawl is closing: requests waiting in the downloader for their host stop "
                        "waiting; those the scheduler cannot hold (robots.txt, a media pipeline's files) are not sent "
                        "(polite/closed_waiting counts them), the others are held")
        return Closing("the crawl is closing")

    def _resolver_missing(self, exc: ResolverNotInstalled) -> None:
        if self.failed is None and not self.closing:
            self.failed = exc
            logger.error("%s", exc)
            self.report.inc("resolver_missing")
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
                logger.warning("scrapy-polite: the pace table %s did not close cleanly", self.store.uri,
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
        logger.debug("scrapy-polite: the pace table %s did not close cleanly", pacer.store.uri, exc_info=True)


def find_pacer(crawler: Crawler) -> Pacer | None:
    """The crawler's :class:`Pacer` if :func:`get_pacer` has built it (after the crawl: while the crawler's
    components hold it), else None (never builds one)."""
    return _registered(crawler)
