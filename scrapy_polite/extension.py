"""The signals-driven extension (docs/spec.md §5): feeds the pace table and reports.

* ``robots_parsed`` (Scrapy ≥ 2.18) — the host's ``Crawl-delay`` / ``Request-rate`` for the crawler's
  user agent (``ROBOTSTXT_USER_AGENT`` or ``USER_AGENT``), read with Protego, is recorded (unless its
  robots.txt was answered 5xx or 429: :attr:`Recorder.robots_statuses
  <scrapy_polite.crawl.recording.Recorder.robots_statuses>`);
* at construction — the spider's ``crawl_delay`` attribute (seconds) becomes a per-spider override (an invalid one
  refuses the crawl: :func:`spider_delay`);
* ``spider_opened`` — the hosts that start in backoff from the persisted table are listed once at INFO, with the
  ``scrapy polite reset`` command that clears them; a progress line is logged at INFO every
  ``LOGSTATS_INTERVAL`` seconds while requests are held or hosts back off (:mod:`scrapy_polite.reports.summary`);
* ``spider_closed`` — the INFO summary in the documentation's words (docs/getting-started.md,
  :func:`~scrapy_polite.reports.summary.format_summary`)
  and the store is closed. A crawl the add-on stopped (``polite_store_error``, ``polite_resolver_missing``)
  is counted as failed, so that ``scrapy crawl`` exits with status 1 (docs/spec.md §7).

At construction it refuses a crawl that cannot run safely or has an invalid setting, before any request
(:func:`~scrapy_polite.startup.refuse_to_start`: one ERROR line, a non-zero exit status), and closes the
pace table it opened, so that the refused process exits.

Responses are recorded as they leave the download handler (:meth:`Recorder.downloaded
<scrapy_polite.crawl.recording.Recorder.downloaded>`), failures by the pacing middleware. Stats are under
``polite/`` (:data:`scrapy_polite.vocabulary.STATS`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider, NotConfigured
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_reactor_installed
from twisted.internet import task
from twisted.python import threadable

from ._compat import crawler_engine, fail_crawl_process
from .addon import MIDDLEWARE, MIDDLEWARE_PRIORITY, check_resolver
from .addon import component_name as name
from .crawl.reactor import await_deferred, installed_reactor
from .crawl.seams import ResolverNotInstalled
from .pacer import Pacer, discard_pacer, get_pacer
from .policy import host_key, origin_of
from .policy.robots import robots_delay
from .reports.summary import HeldHost, format_progress, format_start_backoffs, format_summary
from .resolver import PublicHostnameResolver
from .settings import SettingsError, polite_enabled
from .settings.config import scheduler_base_class
from .settings.declaration import DEFAULTS
from .startup import leftover_settings_warning, refuse_to_start
from .stores import ProcessLocal, StoreError, has_ability
from .vocabulary import REFUSAL_REASONS, parse_seconds

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Seconds between two reconciles of the lifecycle with the downloader (docs/spec.md §5).
RECONCILE_EVERY = 1.0
#: Seconds: a host held longer than this has its row read again at each progress line (:meth:`_reread_held`).
REREAD_AHEAD = 10.0
#: The most rows read again at a progress line.
REREAD_MAX = 1000

#: The longest (s) a process exiting with its crawl open waits for its pace table to close (:func:`_close_at_exit`).
EXIT_WAIT = 10.0

__all__ = ["PoliteExtension"]


def crawl_can_touch(spider: Spider) -> Callable[[str], bool] | None:
    """Which hosts a crawl can touch, from the spider's own words: the hosts of its ``start_urls`` and, with
    ``allowed_domains`` (Scrapy's offsite rule: a domain and its subdomains), those domains; None when the
    spider names neither (any host may be met: each is named when it is)."""
    starts = {key for url in getattr(spider, "start_urls", None) or () if isinstance(url, str)
              and (key := host_key(url)) is not None}
    domains = [str(d).lower().strip(".") for d in getattr(spider, "allowed_domains", None) or () if d]
    if not starts and not domains:
        return None

    def touches(host: str) -> bool:
        if host in starts:
            return True
        if domains:  # offsite filtering on: nothing outside them
            return any(host == d or host.endswith("." + d) for d in domains)
        return False

    return touches


def spider_delay(spider: Spider | None) -> float | None:
    """The spider's ``crawl_delay`` attribute, seconds (docs/guides/throttles.md, overrides), read as the crawl starts;
    None without one.

    Raises:
        SettingsError: it is not a number of seconds >= 0 (the crawl refuses to start: trial, an ERROR line and then a
            crawl at the default pace, exit status 0).
    """
    raw = getattr(spider, "crawl_delay", None)
    if raw is None:
        return None
    value = parse_seconds(raw)
    if value is None:
        raise SettingsError(f"{type(spider).__name__}.crawl_delay must be a number of seconds >= 0, got {raw!r}. Fix: "
                            f"give it such a number, or remove it to pace by POLITE_HOST_INTERVAL",
                            setting="crawl_delay")
    return value


class PoliteExtension:
    """Connects the pacer's units to Scrapy's signals: the idle check, the start-up listing, the progress line,
    robots.txt delays and the closing summary.

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
        SettingsError, StoreError: at construction (the crawl does not start).
    """

    def __init__(self, crawler: Crawler, pacer: Pacer) -> None:
        self.crawler = crawler
        self.pacer = pacer
        self.config = pacer.config
        self.report = pacer.report
        self._progress: task.LoopingCall | None = None
        #: The backstop for a request that left the downloader by a path no middleware of ours saw: its lines and
        #: claim are freed within a second (:meth:`Pacer.reconcile <scrapy_polite.pacer.Pacer.reconcile>`).
        self._reconciling = task.LoopingCall(pacer.reconcile)
        #: Registered with :mod:`atexit` until the spider opens (:func:`_close_unopened`), then while it is open
        #: (:func:`_close_at_exit`).
        self._at_exit: Callable[[], None] | None = None
        self._delay_read = False  # the spider's crawl_delay was read as the crawl started (from_crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not polite_enabled(crawler.settings):
            raise NotConfigured("POLITE_ENABLED is False")
        try:
            pacer = get_pacer(crawler)
            scheduler_base_class(pacer.config.scheduler_base, crawler.settings)
            check_resolver(crawler.settings, pacer.config.address_filter,
                           installed_reactor() if is_reactor_installed() else None)
            spider = getattr(crawler, "spider", None)  # None in scrapy shell: read at spider_opened
            pacer.booker.spider_delay = spider_delay(spider)
        except (SettingsError, StoreError, ResolverNotInstalled) as exc:
            discard_pacer(crawler)  # nothing the pace table started may keep the refused process alive
            raise refuse_to_start(exc, crawler.settings) from None
        ext = cls(crawler, pacer)
        ext._delay_read = spider is not None
        crawler.signals.connect(ext.robots_parsed, signal=signals.robots_parsed)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        ext._check_middleware_order(crawler)
        ext._at_exit = functools.partial(_close_unopened, pacer)
        atexit.register(ext._at_exit)
        leftover = leftover_settings_warning(crawler.settings)
        if leftover is not None:
            logger.warning("%s", leftover)
        rules = pacer.config.address_filter  # (POLITE_ALLOW_PRIVATE admits every address: nothing to say)
        if not rules.allow_private and (wide := rules.wide_networks):  # trial: 0.0.0.0/0 accepted without a word
            logger.warning("scrapy-polite: POLITE_ALLOWED_NETWORKS admits %s: public addresses need no entry, so a "
                           "network that holds public addresses too admits every non-public address in it (loopback, "
                           "private networks, link-local ones such as the cloud metadata service). Name only the "
                           "non-public networks you mean to reach, e.g. 127.0.0.0/8.", ", ".join(wide))
        if pacer.policy.adaptive is not None and crawler.settings.getbool("AUTOTHROTTLE_ENABLED"):
            # Allowed by POLITE_ADAPTIVE_WITH_AUTOTHROTTLE (else the settings refused to start: docs/spec.md §2).
            logger.warning(
                "scrapy-polite: POLITE_ADAPTIVE and AutoThrottle both pace this crawl on response times; turn "
                "AutoThrottle off (AUTOTHROTTLE_ENABLED = False): POLITE_ADAPTIVE's latency is shared by every "
                "process of the pace table and survives a restart, AutoThrottle's is per process")
        return ext

    @staticmethod
    def _check_middleware_order(crawler: Crawler) -> None:
        """A downloader middleware after ours that returns a Request from ``process_request`` bypasses our
        ``process_response``/``process_exception``: warn, naming it (its host's line could stay taken)."""
        middlewares = crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES")
        ours = next((v for k, v in middlewares.items() if name(k) == MIDDLEWARE and v is not None),
                    MIDDLEWARE_PRIORITY)
        later = sorted(name(k) for k, v in middlewares.items()
                       if v is not None and v > ours and name(k) != MIDDLEWARE)
        if later:
            logger.warning(
                "scrapy-polite: downloader middlewares %s run after PoliteDownloaderMiddleware (priority %d). "
                "If one returns a Request or Response from process_request, give it a priority below %d.",
                later, ours, ours)

    def _warn_wider_address_rules(self) -> None:
        """The resolver is per process: a spider's ``POLITE_ALLOW_PRIVATE`` / ``POLITE_ALLOWED_NETWORKS`` can
        narrow the process's rules, never widen them, and its DNS settings (``POLITE_DNS_*``) are not used. Say so
        when a spider tries (docs/spec.md §7)."""
        settings = self.crawler.settings
        spider = SETTINGS_PRIORITIES["spider"]
        dns = [n for n in DEFAULTS if n.startswith("POLITE_DNS_") and settings.getpriority(n) == spider]
        if dns:  # trial: a spider's POLITE_DNS_OVERRIDES was ignored without a word, and its lookups failed
            logger.warning("scrapy-polite: %s in the spider's custom_settings %s not used: the DNS settings are per "
                           "process (the resolver is built before any spider). Put them in the project settings "
                           "(settings.py).", ", ".join(dns), "is" if len(dns) == 1 else "are")
        resolver = getattr(installed_reactor(), "nameResolver", None)
        if not isinstance(resolver, PublicHostnameResolver):
            return  # not installed: the pacer reports that on the first request
        mine, process = self.config.address_filter, resolver.filter
        if process.allow_private:
            return
        wider = ["POLITE_ALLOW_PRIVATE=True"] if mine.allow_private else []
        for net in mine.allowed_networks:
            if not any(net.version == other.version and net.subnet_of(other)  # type: ignore[arg-type]
                       for other in process.allowed_networks):
                wider.append(str(net))
        if wider:
            process_words = ", ".join(str(net) for net in process.allowed_networks) or "public addresses only"
            logger.warning(
                "scrapy-polite: this spider's address rules allow %s, beyond the process-wide resolver's (%s): "
                "only what the process allows is reached, the rest stays refused. Put POLITE_ALLOWED_NETWORKS / "
                "POLITE_ALLOW_PRIVATE in the project settings (settings.py), not in the spider's custom_settings.",
                ", ".join(wider), process_words)

    def spider_idle(self, spider: Spider) -> None:
        """Keep the spider open while requests are held (docs/spec.md §5), unless everything held is due beyond
        ``POLITE_MAX_IDLE_WAIT``: then close with reason ``polite_deferred``, listing the hosts.

        The idle check first asks the lifecycle owner what can still move: a line or claim held by a request
        the downloader no longer has is freed (:meth:`Pacer.reconcile <scrapy_polite.pacer.Pacer.reconcile>`)
        and every host parked on it is woken. If something held can then never move, the spider closes with
        reason ``polite_stranded``, naming what was not crawled, instead of staying open forever."""
        scheduler = self.pacer.booker.scheduler
        if scheduler is None:
            return
        self.pacer.reconcile()
        if self.pacer.outside:  # a request the scheduler cannot hold waits for its host, out of Scrapy's count (§5)
            if scheduler.held_count():
                scheduler.unpark()
            raise DontCloseSpider
        if not scheduler.held_count():
            # A shared frontier (scrapy-redis): stay open while Redis holds something this worker may take
            # within its idle window (MAX_IDLE_TIME_BEFORE_CLOSE, else POLITE_MAX_IDLE_WAIT), while other
            # workers lease requests that would come back within it if they died, and, whatever the window,
            # while a worker that stopped renewing leases requests (docs/spec.md §5, "Idle").
            if scheduler.shared_wait(self._idle_window()) is not None:
                raise DontCloseSpider
            return
        scheduler.unpark()
        earliest = scheduler.earliest_due()
        given_up = self.report.robots_given_up(self.config.max_idle_wait)
        if given_up:
            # A robots.txt unreachable for longer than POLITE_MAX_IDLE_WAIT keeps nothing open: its held requests
            # end like requests deferred beyond it (docs/spec.md §5, "The robots.txt lifecycle").
            dues = [due for host, _, due in scheduler.held_hosts() if host not in given_up]
            if not dues:
                logger.info("scrapy-polite: everything left waits for a robots.txt unreachable for longer than "
                            "POLITE_MAX_IDLE_WAIT=%g s; closing. %s", self.config.max_idle_wait, scheduler.describe())
                raise CloseSpider("polite_deferred")
            earliest = min(dues)
        if earliest == float("inf"):
            logger.error("scrapy-polite: the held requests wait for lines that nothing in the downloader will free; "
                         "closing. %s", scheduler.describe())
            self.report.inc("stranded")
            raise CloseSpider("polite_stranded")
        wait = (earliest - self.pacer.clock()) if earliest is not None else 0.0
        if earliest is not None and wait > self.config.max_idle_wait:
            logger.info("scrapy-polite: everything left is deferred beyond POLITE_MAX_IDLE_WAIT=%g s; closing. %s",
                        self.config.max_idle_wait, scheduler.describe())
            raise CloseSpider("polite_deferred")
        raise DontCloseSpider

    def _idle_window(self) -> float:
        """scrapy-redis's ``MAX_IDLE_TIME_BEFORE_CLOSE`` when set (> 0), else ``POLITE_MAX_IDLE_WAIT`` (s)."""
        idle = self.crawler.settings.getfloat("MAX_IDLE_TIME_BEFORE_CLOSE")
        return idle if idle > 0 else self.config.max_idle_wait

    async def spider_opened(self, spider: Spider) -> None:
        if not self._delay_read:  # a spider made after the extension (scrapy shell): its crawl_delay read now
            try:
                self.pacer.booker.spider_delay = spider_delay(spider)
            except SettingsError as exc:
                logger.error("scrapy-polite: %s: ignored", exc)
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
        self._at_exit = functools.partial(_close_at_exit, self.pacer)
        atexit.register(self._at_exit)
        self._warn_wider_address_rules()
        await self._list_start_backoffs(spider)
        self._reconciling.clock = installed_reactor()
        self._reconciling.start(RECONCILE_EVERY, now=False).addErrback(
            lambda failure: logger.error("scrapy-polite: the reconcile failed", exc_info=failure.value))
        interval = self.crawler.settings.getfloat("LOGSTATS_INTERVAL")
        if interval > 0:
            self._progress = task.LoopingCall(lambda: deferred_from_coro(self.progress()))
            self._progress.clock = installed_reactor()
            self._progress.start(interval, now=False).addErrback(
                lambda failure: logger.error("scrapy-polite: the progress line failed", exc_info=failure.value))

    def _store_option(self) -> str | None:
        """The ``--store`` a ``scrapy polite`` command line needs to reach this crawl's table: None when the
        project's settings name it (the command reads them too)."""
        if (self.crawler.settings.getpriority("POLITE_STORE") or 0) >= SETTINGS_PRIORITIES["spider"]:
            return self.pacer.store.uri
        return None

    async def _list_start_backoffs(self, spider: Spider) -> None:
        """List once, at INFO, the hosts that start in backoff from the persisted table (host, cause, due),
        with the command that clears them: at start the hosts this crawl can touch (:func:`crawl_can_touch`) or
        holds requests for (resumed from ``JOBDIR``), any other one when the crawl first meets it (a table shared by
        many crawls holds hosts this one never touches). The table is read on a thread (:meth:`Pacer.hosts_in_backoff
        <scrapy_polite.pacer.Pacer.hosts_in_backoff>`: it may be large, or remote)."""
        try:
            offset, rows = await self.pacer.hosts_in_backoff()
        except Exception as exc:  # only a report: the crawl goes on, its own calls meet any store error
            logger.warning("scrapy-polite: could not list the hosts in backoff at start: %s", exc)
            return
        report = self.report
        touchable = crawl_can_touch(spider)
        held = {h.host for h in self.held_hosts()}  # resumed from JOBDIR (trial: such a host was never named)
        now_listed = []
        for key, state in rows:
            met = report.hosts.get(key)  # start requests may have met it while the table was read
            listed = (touchable is not None and touchable(key)) or (met is not None and met.active) or key in held
            report.starts_in_backoff(key, state, offset=offset, announce=not listed)
            if listed:
                now_listed.append(key)
        report.on_first_touch = self._announce_backoff
        line = format_start_backoffs({k: report.hosts[k] for k in now_listed}, now=self.pacer.clock(),
                                     store_uri=self.pacer.store.uri, store_option=self._store_option())
        if line is not None:
            logger.info("%s", line)

    def _announce_backoff(self, host: str) -> None:
        """The crawl first meets a host that started in backoff and was not listed at start: name it."""
        counters = self.report.hosts.get(host)
        if counters is None:
            return
        line = format_start_backoffs({host: counters}, now=self.pacer.clock(), store_uri=self.pacer.store.uri,
                                     store_option=self._store_option())
        if line is not None:
            logger.info("%s", line)

    def held_hosts(self) -> list[HeldHost]:
        """The requests the scheduler holds, per host (empty without the scheduler)."""
        scheduler = self.pacer.booker.scheduler
        if scheduler is None:
            return []
        return [HeldHost(host, count, due) for host, count, due in scheduler.held_hosts()]

    async def progress(self) -> None:
        """The progress timer: the rows of the hosts held for longer read again (:meth:`_reread_held`), then the
        progress line (:meth:`log_progress`)."""
        await self._reread_held()
        self.log_progress()

    def log_progress(self) -> None:
        """Log the progress line at INFO (:func:`~scrapy_polite.reports.summary.format_progress`), when requests are
        held or hosts back off; nothing once the scheduler has closed (it reported what it left, and other
        ``spider_closed`` handlers may run before this one stops the timer: trial, "0 requests held" after that)."""
        scheduler = self.pacer.booker.scheduler
        if self.pacer.booker.scheduler_closed:
            return
        downloader = getattr(crawler_engine(self.crawler), "downloader", None)
        # (a shared frontier that cannot be reached answers "pending": SharedWorker.pending)
        idle = (scheduler is not None and not scheduler.has_pending_requests()
                and not getattr(downloader, "active", None) and not self.pacer.outside)
        line = format_progress(self.report, self.held_hosts(), now=self.pacer.clock(), idle=idle,
                               store_option=self._store_option(), forgive=not has_ability(self.pacer.store.store,
                                                                                          ProcessLocal))
        if line is not None:
            logger.info("%s", line)

    async def _reread_held(self) -> None:
        """Read again the rows of the hosts held until later than :data:`REREAD_AHEAD` (at most :data:`REREAD_MAX`,
        one read): a host the table now lets go earlier (``scrapy polite reset``, or another process that moved its
        row back) is woken then, and its backoff is no longer reported (trial: a reset had no effect on a running
        crawl, whose progress line told to run it). A read that fails is left to the crawl's own calls."""
        booker, now = self.pacer.booker, self.pacer.clock()
        hosts = sorted((h for h in self.held_hosts() if REREAD_AHEAD < h.due - now < math.inf), key=lambda h: h.due)
        keys = [h.host for h in hosts[-REREAD_MAX:]]  # the latest due, whose wait a reset shortens most
        if booker.scheduler is None or not keys:
            return
        try:
            snapshot = await await_deferred(booker.store.read(keys))
        except StoreError:
            return
        sync = self.pacer.sync
        for host in keys:
            state = snapshot.states[host]
            self.report.reread(host, state, sync.offset)
            verdict = booker.policy.defer_verdict(state, snapshot.now, override=booker.override(host))
            booker.scheduler.wake(host, sync.to_local(verdict.due if verdict is not None else snapshot.now))

    async def robots_parsed(self, robotparser: Any, request: Request) -> None:
        host = host_key(request.url)
        if host is None:
            return
        origin = origin_of(urlparse_cached(request))
        status = self.pacer.recorder.robots_statuses.get(origin)  # None: none was downloaded
        if status is not None and (status >= 500 or status == 429):
            # RFC 9309 §2.3.1.4: an unreachable robots.txt says nothing new; keep the recorded delay.
            self.report.inc("robots/unreachable")
            return
        try:
            delay = robots_delay(robotparser, self.pacer.user_agent)
        except Exception:  # a parser we do not know: count, log, keep crawling paced by the base interval
            self.report.inc("robots/errors")
            logger.exception("scrapy-polite could not read the delay of %s", request.url)
            return
        await await_deferred(self.pacer.recorder.set_crawl_delay(host, delay, origin))

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        for timer in (self._progress, self._reconciling):
            if timer is not None and timer.running:
                timer.stop()
        stats = self.crawler.stats
        unhosted: dict[str, int] = {  # refused with no host to count them on
            reason: stats.get_value(f"polite/refused/{reason}", 0) or 0 if stats is not None else 0
            for reason in REFUSAL_REASONS if reason != "non_public"}
        logger.info("%s", format_summary(self.report, now=self.pacer.clock(), unhosted=unhosted))
        if self.pacer.failed is not None:  # stopped by the add-on: not a finished crawl (exit status 1)
            fail_crawl_process(self.crawler)
        await self.pacer.close_async()


def _close_unopened(pacer: Pacer) -> None:
    """The process exits and the spider never opened: the crawl failed at its start (a component's ``from_crawler``
    raised, say) after the extension had opened the pace table, and no Scrapy signal follows such a failure. The
    table is closed (blocking: the reactor never ran, or has stopped), so that its next opener does not take the
    failed start for an unclean stop (trial: a WARNING "was not closed by process …"). A running reactor is left
    to :func:`_close_at_exit`. A failure to close is logged at DEBUG (the crawl's own error was logged)."""
    if pacer.closing:
        return
    if is_reactor_installed() and getattr(installed_reactor(), "running", False):
        _close_at_exit(pacer)
        return
    try:
        pacer.close()
    except Exception:
        logger.debug("scrapy-polite: the pace table %s did not close cleanly", pacer.store.uri, exc_info=True)


def _close_at_exit(pacer: Pacer) -> None:
    """The process exits with its spider still open: ``scrapy shell`` never closes it (its reactor runs in a daemon
    thread). The pace table is closed on the reactor's thread as a crawl's close does (the event log ends with its
    ``closed`` event, the table's mark of an unclean stop is cleared), waiting at most :data:`EXIT_WAIT` seconds.
    Nothing is done when the reactor is not running or this is its thread (it can no longer close anything)."""
    reactor = installed_reactor()
    if not getattr(reactor, "running", False) or threadable.isInIOThread():  # type: ignore[no-untyped-call]
        return
    done = threading.Event()

    def close() -> None:
        deferred_from_coro(pacer.close_async()).addBoth(lambda _: done.set())

    reactor.callFromThread(close)
    if not done.wait(EXIT_WAIT):
        logger.warning("scrapy-polite: the pace table %s was not closed within %g s of the process's exit",
                       pacer.store.uri, EXIT_WAIT)
