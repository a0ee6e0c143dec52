"""The downloader middleware that paces every request by host (docs/spec.md §5).

Before a request it books the request on its host: the request goes now, **waits** (non-blocking, at most
``POLITE_MAX_WAIT`` at a time) or is **deferred** — it leaves the downloader and the
:class:`~scrapy_polite.scheduler.PoliteScheduler` holds it until its host is due. It is the one owner of
a download's outcome: a response is recorded as it leaves the download handler (by the add-on's pinned handler
itself, by :meth:`PoliteDownloaderMiddleware.response_downloaded` for any other), a failure by
``process_exception``; then the request's life ends (its lines freed for the next request). A response judged a
throttle is not passed on: the same request goes back to the scheduler to be held until its host is due, up to
``POLITE_THROTTLE_RETRIES`` times (:mod:`scrapy_polite.crawl.retrying`), so throttles never use up ``RETRY_TIMES``.

Settings: ``POLITE_ENABLED`` and the ``POLITE_*`` settings (:data:`scrapy_polite.settings.declaration.SETTINGS`).
Request meta: ``polite_delay`` (seconds, a larger interval for this request's host), ``polite_burst`` (segments of
one stream: skip the ordinary interval unless the host is throttling), ``dont_pace`` (exempt, counted in stats).

Enable it with the add-on (``ADDONS = {"scrapy_polite.Addon": 0}``), which puts it at priority 950: after
the HTTP cache (a cached response is not a request to the host) and closest to the download handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured

from ._compat import crawler_engine, wake_engine
from .crawl.lifecycle import Stage
from .crawl.seams import Closing, Defer, Go, Redefer, ResolverNotInstalled
from .network.handlers import own_handler_schemes
from .network.hosts import NO_NETWORK_SCHEMES, InvalidHost, url_host
from .pacer import CrawlStopped, Pacer, get_pacer
from .policy import host_key
from .settings import polite_enabled
from .stores import StoreError
from .vocabulary import (
    DONT_PACE_META,
    HOST_META,
    IP_META,
    PINNED_META,
    QUOTA_SERIAL_META,
    RECORDED_META,
    SENT_AT_META,
    UNCACHED_META,
    DeferralReason,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.signalmanager import SignalManager
    from typing_extensions import Self

    from .crawl.booking import Booker
    from .crawl.recording import Recorder
    from .policy import Decision
    from .reports.counters import Report

logger = logging.getLogger(__name__)

__all__ = ["PoliteDownloaderMiddleware", "PoliteEarlyDeferMiddleware", "defer_early"]


class _PacerComponent:
    """Built ``from_crawler`` around the crawler's shared :class:`~scrapy_polite.pacer.Pacer`, taking the units it
    uses: the booker (go / wait / defer) and the report (stats).

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
    """

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.booker = pacer.booker
        self.report = pacer.report

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not polite_enabled(crawler.settings):
            raise NotConfigured("POLITE_ENABLED is False")
        return cls(get_pacer(crawler))


class PoliteDownloaderMiddleware(_PacerComponent):
    """Paces requests per host with the crawler's shared :class:`~scrapy_polite.pacer.Pacer` units, and records
    their outcomes.

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
        SettingsError, StoreError: at construction, for a bad setting or an unusable pace table
            (the crawl does not start).
    """

    def __init__(self, pacer: Pacer) -> None:
        super().__init__(pacer)
        self.lifecycle = pacer.lifecycle
        self.recorder = pacer.recorder
        self.resolution = pacer.resolution
        self.unpinned = pacer.unpinned
        self.retries = pacer.retries
        self._refusals_logged: set[str] = set()
        #: The crawler's signals, and the schemes whose download handler is one of the add-on's pinned ones (they
        #: record their responses themselves): set by :meth:`from_crawler`. Until a request of another scheme
        #: comes, ``response_downloaded`` is not connected (its dispatch costs about 0.3 % of plain Scrapy's
        #: instructions per page); from then on, for the rest of the crawl (:meth:`_listen`).
        self._signals: SignalManager | None = None
        self._own_schemes: frozenset[str] = frozenset()
        self._listening = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        middleware = super().from_crawler(crawler)
        # Every downloaded response is recorded as it leaves the download handler, before any middleware acts on it:
        # by the add-on's pinned handlers themselves, by response_downloaded for any other handler's (_listen).
        middleware._signals = crawler.signals
        middleware._own_schemes = own_handler_schemes(crawler.settings)
        # A throttled page whose retries are spent is given up once its response reaches the engine.
        middleware.retries.attach(crawler.signals)
        return middleware

    async def process_request(self, request: Request) -> Request | None:
        report = self.report
        meta = request.meta  # (a property of Scrapy's Request: read once)
        # A redirect or retry copies its parent's meta: forget the parent's booking.
        meta.pop(HOST_META, None)
        meta.pop(SENT_AT_META, None)
        meta.pop(QUOTA_SERIAL_META, None)
        meta.pop(IP_META, None)
        meta.pop(PINNED_META, None)
        if meta.pop(UNCACHED_META, False):  # a throttle's retry: its answer may be cached (ThrottleRetries.due)
            meta.pop("dont_cache", None)
        try:
            parsed = url_host(request.url)  # never from meta: a redirect copies the old request's meta
        except InvalidHost as exc:  # docs/spec.md §1: the URL Standard rejects it; nothing is resolved
            if exc.missing:
                report.inc("refused/no_host")
                raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: it has no host to pace") from exc
            report.inc("refused/invalid_host")
            _log_refusal(self._refusals_logged, request.url, exc.reason)
            raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: {exc.reason}") from exc
        if parsed is None:
            try:
                scheme = urlsplit(request.url).scheme.lower()
            except ValueError:
                scheme = ""
            if scheme in NO_NETWORK_SCHEMES:
                return None
            report.inc("refused/no_host")
            raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: it has no host to pace")
        host = parsed.key
        meta[HOST_META] = host
        meta.pop(RECORDED_META, None)  # recorded once per pass through the downloader (Recorder.downloaded)
        if not self._listening and request.url.partition(":")[0].lower() not in self._own_schemes:
            self._listen()
        if meta.get(DONT_PACE_META):  # exempt from pacing, never from the address rules
            await self._unpaced(request, host)
            return None
        try:
            if self.pacer.failed is not None:  # the error that stopped the crawl: no request goes out after it
                raise self.pacer.failed
            scheduler = self.booker.scheduler
            if scheduler is None or scheduler.owns(request):
                outcome = await self.booker.before_request(request, host)
            else:
                outcome = await self._book_outside(request, host)
        except (StoreError, ResolverNotInstalled, Closing) as exc:
            raise stopped_error(request, exc, report) from exc
        if isinstance(outcome, Defer):
            hold_request(self.pacer, request, host, outcome.due, reason=outcome.reason)
            return request  # the engine hands it back to the scheduler, which keeps it until due
        meta[SENT_AT_META] = outcome.sent_at
        if outcome.serial is not None:
            meta[QUOTA_SERIAL_META] = outcome.serial
        if outcome.address is not None:
            self._send_to(request, host, outcome.address)
        return None

    async def _book_outside(self, request: Request, host: str) -> Go | Defer:
        """Book a request the scheduler cannot hold (robots.txt, ``engine.download()``: a media pipeline's file) outside
        Scrapy's count of the downloader's requests (``Downloader.active``, which ``CONCURRENT_REQUESTS`` bounds) while
        it waits for its host, and back in it when it goes: such requests waiting for a throttled host filled the
        downloader and every other host waited with them (trial: pages stalled 28 s and 40 s behind a file host's
        Retry-After). ``Pacer.outside`` keeps them meanwhile, ``POLITE_MAX_HELD_IN_MEMORY`` at most (requests kept out
        of the downloader in memory): the next wait in the count, so their makers are held back as before (§5)."""
        active = getattr(getattr(crawler_engine(self.pacer.crawler), "downloader", None), "active", None)
        if not isinstance(active, set) or request not in active \
                or len(self.pacer.outside) >= self.pacer.config.max_held_in_memory:
            return await self.booker.before_request(request, host)
        active.discard(request)
        self.pacer.outside.add(request)
        wake_engine(self.pacer.crawler)  # a slot is free: the engine takes the next request now, not at its heartbeat
        try:
            return await self.booker.before_request(request, host)
        finally:
            self.pacer.outside.discard(request)
            active.add(request)  # (Scrapy's Downloader.fetch removes it when it leaves)

    async def _unpaced(self, request: Request, host: str) -> None:
        """A ``dont_pace`` request: its claim on the host is over, it is counted, and it goes to a public address
        of the host (the address rules hold for it: docs/spec.md §4)."""
        self.report.inc("dont_pace")
        self.lifecycle.arrive(request, host)
        try:
            addresses = await self.resolution.addresses(request, host)
        except ResolverNotInstalled as exc:
            raise stopped_error(request, exc) from exc
        if addresses:
            self._send_to(request, host, addresses[0])

    def _send_to(self, request: Request, host: str, address: str) -> None:
        """``request`` of ``host`` goes to ``address``: pinned to it, and counted (``polite/unpinned/<handler>``)
        when a checked handler sends it (docs/spec.md §4.1)."""
        self.resolution.pin(request, host, address)
        if self.unpinned.active:
            self.unpinned.sent(request)

    def _listen(self) -> None:
        """Connect :meth:`response_downloaded`, for the rest of the crawl: a request goes to a download handler
        that is not one of the add-on's pinned ones (a checked handler, scrapy-playwright, ``ftp``, ``s3``)."""
        self._listening = True
        if self._signals is not None:
            self._signals.connect(self.response_downloaded, signal=signals.response_downloaded)

    def response_downloaded(self, response: Response, request: Request, spider: Any = None) -> None:
        """``response_downloaded`` (connected by :meth:`_listen`): records a response that a download handler other
        than the add-on's pinned ones downloaded (:meth:`Recorder.downloaded
        <scrapy_polite.crawl.recording.Recorder.downloaded>`, docs/spec.md §5), before any downloader middleware
        acts on it (``RetryMiddleware`` turning a 429 into a retry): its status, ``Retry-After`` and rate-limit
        fields into the table. A response a checked handler got from a non-public address is recorded as a failure
        that never throttles (that server's status says nothing of the booked host), one from another host than
        the booked one (a browser's redirect) is not recorded (docs/spec.md §4.1). ``process_response`` then
        waits for the record."""
        if request.meta.get(RECORDED_META):  # the add-on's own handler recorded it
            return
        unpinned = self.unpinned
        if not unpinned.active:
            self.recorder.downloaded(request, response)
            return
        refusal = unpinned.refusal(request, response)
        self.recorder.downloaded(request, response, refusal=refusal,
                                 foreign=refusal is None and unpinned.foreign_response(request, response))

    async def process_response(self, request: Request, response: Response) -> Request | Response:
        """Wait for the response's record (:meth:`response_downloaded`), then end the request's life (its lines
        freed, its host woken); a response that answers a request before it was booked (the HTTP cache, a
        middleware's own response) only ends it (docs/spec.md §5). A throttle within ``POLITE_THROTTLE_RETRIES``
        sends the same request back to be held until its host is due (§2), instead of reaching RetryMiddleware
        or the spider.

        Raises:
            IgnoreRequest: a checked handler reached a non-public address (docs/spec.md §4.1).
        """
        if self.lifecycle.stage(request) != Stage.IN_FLIGHT:  # not booked in this pass through the downloader
            self.booker.end(request, dropped=True)
            return response
        # Decided when it was recorded: counted once.
        refusal = self.unpinned.refusal(request, response) if self.unpinned.active else None
        decision = await end_when_recorded(self.recorder, self.booker, request)
        if refusal is not None:
            raise IgnoreRequest(f"scrapy-polite refuses the response of {request.url!r}: {refusal}")
        due = self.retries.due(request, decision) if decision is not None and decision.throttle else None
        if due is not None:
            hold_request(self.pacer, request, request.meta[HOST_META], due)
            return request
        return response

    async def process_exception(self, request: Request, exception: Exception) -> Any:
        """A throttled burst segment (:class:`~scrapy_polite.crawl.seams.Redefer`) goes back to be held until its host
        is due. Any other failure is recorded (a failure that reached the server's side counts as a throttle
        without Retry-After: docs/spec.md §2) and ends the request's life; a request dropped before it was
        booked (``IgnoreRequest`` from RobotsTxtMiddleware, OffsiteMiddleware, a project's middleware, our own
        refusal) only ends it (§5)."""
        booker = self.booker
        if isinstance(exception, Redefer):
            host = request.meta[HOST_META]
            booker.release(request, host)
            try:
                due = await booker.due(host)
            except StoreError as exc:
                raise stopped_error(request, exc) from exc
            booker.defer(host, due, "throttled")
            hold_request(self.pacer, request, host, due)
            return request
        if self.lifecycle.stage(request) != Stage.IN_FLIGHT:  # not booked in this pass through the downloader
            booker.end(request, dropped=True)
            return None
        self.recorder.record_failure(request, exception)
        await end_when_recorded(self.recorder, booker, request)
        return None


async def end_when_recorded(recorder: Recorder, booker: Booker, request: Request) -> Decision | None:
    """The end of a download's pass (docs/spec.md §5, "Recording"): wait for the record of its response or failure,
    then end the pass (:meth:`Booker.end <scrapy_polite.crawl.booking.Booker.end>`: its lines and claim freed, its host
    woken), however the wait ends. Returns the record's decision (None: nothing was recorded)."""
    try:
        return await recorder.recorded(request)
    finally:
        booker.end(request)


class PoliteEarlyDeferMiddleware(_PacerComponent):
    """The early deferral (docs/spec.md §5) when robots.txt is judged by a middleware other than
    :class:`~scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware`, which decides it itself: defers a request of a host
    that should defer *before* the rest of the downloader middlewares see it, so that it does not wait inside that
    robots.txt middleware while the host's robots.txt request waits out the backoff (two downloader slots other hosts
    could use).

    Installed by the add-on at priority 50 only then (``ROBOTSTXT_OBEY`` on, and robots.txt handled by Scrapy's
    middleware, kept by the project's opt-out, or by a project's own subclass of it): it reads the host's row for
    every request it sees. Only requests the :class:`~scrapy_polite.scheduler.PoliteScheduler` handed out are
    deferred; the predicate is docs/spec.md §2's.
    """

    async def process_request(self, request: Request) -> Request | None:
        return request if await defer_early(self.pacer, request, host_key(request.url)) else None


async def defer_early(pacer: Pacer, request: Request, host: str | None, *,
                      unless: Callable[[], bool] | None = None) -> bool:
    """**The early deferral** (docs/spec.md §5) of ``request`` of ``host``, on the host's row read from the table:
    True when it was handed to the scheduler to hold until the host is due (the caller returns it to the engine).
    Only requests the scheduler handed out are held; a ``dont_pace`` request or one without a host never is, nor one
    for which ``unless()``, asked only when the host should defer, is True.

    Raises:
        CrawlStopped: the table cannot be read (the crawl is being stopped).
    """
    if (host is None or request.meta.get(DONT_PACE_META) or pacer.failed is not None
            or not pacer.booker.can_defer(request)):
        return False
    try:
        due = await pacer.booker.early_due(request, host, unless)
    except StoreError as exc:
        raise stopped_error(request, exc) from exc
    if due is None:
        return False
    hold_request(pacer, request, host, due)
    return True


def stopped_error(request: Request, exc: Exception, report: Report | None = None) -> CrawlStopped:
    """The request is dropped: the crawl is being stopped (``exc`` was logged once at ERROR when it
    stopped it), its pace table is closed, or its close began while the request waited for its host
    (:class:`~scrapy_polite.crawl.seams.Closing`: counted in ``polite/closed_waiting`` of ``report``). An
    ``IgnoreRequest``: Scrapy logs no "Error downloading" traceback for each request dropped (docs/spec.md §5, §6)."""
    if isinstance(exc, Closing) and report is not None:
        report.inc("closed_waiting")
    logger.debug("scrapy-polite: %s not sent: %s", request, exc)
    return CrawlStopped(f"scrapy-polite did not send {request}: the crawl is being stopped ({exc})")


def _log_refusal(logged: set[str], url: str, reason: str) -> None:
    """Log a refused URL's reason at WARNING the first time it is given (at most 1,000 distinct reasons are
    remembered in ``logged``), then at DEBUG."""
    if reason not in logged and len(logged) < 1000:
        logged.add(reason)
        logger.warning("scrapy-polite refuses %s: %s (further URLs refused for this reason are logged at DEBUG)",
                       url, reason)
    else:
        logger.debug("scrapy-polite refuses %s: %s", url, reason)


def hold_request(pacer: Pacer, request: Request, host: str, due: float | None, *,
                 reason: DeferralReason | None = None) -> None:
    """Hand a deferred request to the holding scheduler (only requests it owns are ever deferred); ``reason``: why
    the booking deferred it (None: the host's mood, from a response or the early deferral)."""
    scheduler = pacer.booker.scheduler
    if scheduler is None:  # closed between the decision and now: nothing can hold it any more
        raise IgnoreRequest(f"scrapy-polite: the scheduler closed while {request} was deferred")
    scheduler.hold(request, host, due, reason=reason)
