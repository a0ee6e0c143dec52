"""The downloader middleware that paces every request by host (docs/spec.md §5).

Before a request it books the request on its host: the request goes now, **waits** (non-blocking, at most
``POLITE_MAX_WAIT`` at a time) or is **deferred** — it leaves the downloader and the
:class:`~scrapy_polite.scheduler.PoliteScheduler` holds it until its host is due. After the response (or
failure) is recorded by the pacer (:meth:`Pacer.response_downloaded
<scrapy_polite.pacer.Pacer.response_downloaded>`, connected here; :meth:`Pacer.after_failure
<scrapy_polite.pacer.Pacer.after_failure>`), it frees the host's line for the next request. A response judged a
throttle is not passed on: the same request goes back to the scheduler to be held until its host is due, up
to ``POLITE_THROTTLE_RETRIES`` times (:mod:`scrapy_polite.retrying`), so throttles never use up
``RETRY_TIMES``.

Settings: ``POLITE_ENABLED`` and the ``POLITE_*`` settings (:data:`scrapy_polite.settings.declaration.SETTINGS`).
Request meta: ``polite_delay`` (seconds, a larger interval for this request's host), ``polite_burst`` (segments of
one stream: skip the ordinary interval unless the host is throttling), ``dont_pace`` (exempt, counted in stats).

Enable it with the add-on (``ADDONS = {"scrapy_polite.Addon": 0}``), which puts it at priority 950: after
the HTTP cache (a cached response is not a request to the host) and closest to the download handler.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured

from .hosts import NO_NETWORK_SCHEMES, InvalidHost, url_host
from .pacer import CrawlStopped, Pacer, get_pacer
from .policy import host_key
from .seams import Defer, Redefer, ResolverNotInstalled
from .settings import polite_enabled
from .stores import StoreError
from .vocabulary import DONT_PACE_META, HOST_META, IP_META, PINNED_META, QUOTA_SERIAL_META, SENT_AT_META

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["PoliteDownloaderMiddleware", "PoliteEarlyDeferMiddleware"]


class _PacerComponent:
    """Built ``from_crawler`` around the crawler's shared :class:`~scrapy_polite.pacer.Pacer`.

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
    """

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not polite_enabled(crawler.settings):
            raise NotConfigured("POLITE_ENABLED is False")
        return cls(get_pacer(crawler))


class PoliteDownloaderMiddleware(_PacerComponent):
    """Paces requests per host through the shared :class:`~scrapy_polite.pacer.Pacer`.

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
        SettingsError, StoreError: at construction, for a bad setting or an unusable pace table
            (the crawl does not start).
    """

    def __init__(self, pacer: Pacer) -> None:
        super().__init__(pacer)
        self._refusals_logged: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        middleware = super().from_crawler(crawler)
        pacer = middleware.pacer
        # Every downloaded response is recorded as it leaves the download handler, before any middleware acts on it.
        crawler.signals.connect(pacer.response_downloaded, signal=signals.response_downloaded)
        # A throttled page whose retries are spent is given up once its response reaches the engine.
        crawler.signals.connect(pacer.response_received, signal=signals.response_received)
        return middleware

    async def process_request(self, request: Request) -> Request | None:
        pacer = self.pacer
        # A redirect or retry copies its parent's meta: forget the parent's booking.
        request.meta.pop(HOST_META, None)
        request.meta.pop(SENT_AT_META, None)
        request.meta.pop(QUOTA_SERIAL_META, None)
        request.meta.pop(IP_META, None)
        request.meta.pop(PINNED_META, None)
        try:
            parsed = url_host(request.url)  # never from meta: a redirect copies the old request's meta
        except InvalidHost as exc:  # docs/spec.md §1: the URL Standard rejects it; nothing is resolved
            if exc.missing:
                pacer.inc("refused/no_host")
                raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: it has no host to pace") from exc
            pacer.inc("refused/invalid_host")
            _log_refusal(self._refusals_logged, request.url, exc.reason)
            raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: {exc.reason}") from exc
        if parsed is None:
            try:
                scheme = urlsplit(request.url).scheme.lower()
            except ValueError:
                scheme = ""
            if scheme in NO_NETWORK_SCHEMES:
                return None
            pacer.inc("refused/no_host")
            raise IgnoreRequest(f"scrapy-polite refuses {request.url!r}: it has no host to pace")
        host = parsed.key
        request.meta[HOST_META] = host
        if request.meta.get(DONT_PACE_META):  # exempt from pacing, never from the address rules
            pacer.inc("dont_pace")
            pacer.arrive(request, host)
            try:
                addresses = await pacer.addresses(request, host)
            except ResolverNotInstalled as exc:
                raise _stopped(request, exc) from exc
            if addresses:
                pacer.send_to(request, host, addresses[0])
            return None
        try:
            outcome = await pacer.before_request(request, host)
        except (StoreError, ResolverNotInstalled) as exc:
            raise _stopped(request, exc) from exc
        if isinstance(outcome, Defer):
            _hold(pacer, request, host, outcome.due)
            return request  # the engine hands it back to the scheduler, which keeps it until due
        request.meta[SENT_AT_META] = outcome.sent_at
        if outcome.serial is not None:
            request.meta[QUOTA_SERIAL_META] = outcome.serial
        if outcome.address is not None:
            pacer.send_to(request, host, outcome.address)
        return None

    async def process_response(self, request: Request, response: Response) -> Request | Response:
        # The record's outcome (docs/spec.md §5); IgnoreRequest for a response from a non-public address (§4.1).
        due = await self.pacer.after_response(request, response)
        # A throttle is not a failure (docs/spec.md §2): the same request goes back to be held until its host
        # is due, instead of reaching RetryMiddleware or the spider, while its retry budget lasts.
        if due is not None:
            _hold(self.pacer, request, request.meta[HOST_META], due)
            return request
        return response

    async def process_exception(self, request: Request, exception: Exception) -> Any:
        if isinstance(exception, Redefer):
            host = request.meta[HOST_META]
            self.pacer.release(request, host)
            try:
                due = await self.pacer.due(host)
            except StoreError as exc:
                raise _stopped(request, exc) from exc
            self.pacer.defer(host, due, "throttled")
            _hold(self.pacer, request, host, due)
            return request
        # Recorded (docs/spec.md §2), or, dropped before it was booked (IgnoreRequest from RobotsTxtMiddleware,
        # OffsiteMiddleware, a project's middleware, or our own refusal), only ended (§5).
        await self.pacer.after_failure(request, exception)
        return None


class PoliteEarlyDeferMiddleware(_PacerComponent):
    """Defers a request of a throttled host *before* the rest of the downloader middlewares see it.

    Installed by the add-on at priority 50, before Scrapy's ``RobotsTxtMiddleware`` (100): without it, the
    first request of a host still backing off from an earlier run would wait inside ``RobotsTxtMiddleware``
    while the host's robots.txt request waits out the backoff, and both would hold downloader slots that
    other hosts could use (docs/spec.md §5: other hosts run at full speed). Only requests the
    :class:`~scrapy_polite.scheduler.PoliteScheduler` handed out are deferred; the decision is the same
    predicate as in :class:`PoliteDownloaderMiddleware` (docs/spec.md §2).
    """

    async def process_request(self, request: Request) -> Request | None:
        pacer = self.pacer
        if request.meta.get(DONT_PACE_META) or pacer.failed is not None or not pacer.can_defer(request):
            return None
        host = host_key(request.url)
        if host is None:
            return None
        try:
            due = await pacer.early_due(request, host)
        except StoreError as exc:
            raise _stopped(request, exc) from exc
        if due is None:
            return None
        _hold(pacer, request, host, due)
        return request


def _stopped(request: Request, exc: Exception) -> CrawlStopped:
    """The request is dropped: the crawl is being stopped (``exc`` was logged once at ERROR when it
    stopped it) or its pace table is closed. An ``IgnoreRequest``: Scrapy logs no "Error downloading"
    traceback for each request dropped (docs/spec.md §6)."""
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


def _hold(pacer: Pacer, request: Request, host: str, due: float | None) -> None:
    """Hand a deferred request to the holding scheduler (only requests it owns are ever deferred)."""
    scheduler = pacer.scheduler
    if scheduler is None:  # closed between the decision and now: nothing can hold it any more
        raise IgnoreRequest(f"scrapy-polite: the scheduler closed while {request} was deferred")
    scheduler.hold(request, host, due)
