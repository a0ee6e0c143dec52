"""Run a real Scrapy crawl inside a pytest-twisted test (asyncio reactor).

Usage::

    import pytest_twisted
    from tests.support.crawl import ListSpider, run_crawl

    @pytest_twisted.ensureDeferred
    async def test_something(arrival_server):
        srv = arrival_server("127.0.0.2")
        srv.site(3)
        crawler = await run_crawl(ListSpider, {"ADDONS": {"scrapy_polite.Addon": 0}}, urls=[srv.url("/")], follow=True)
        spider = crawler.spider
        assert [f.status for f in spider.fetched] == [200] * 4
        assert crawler.stats.get_value("downloader/response_count") == 4

``run_crawl`` must be awaited from a coroutine driven by Twisted (``@pytest_twisted.ensureDeferred``), since
it awaits Deferreds. The reactor must be the asyncio one: ``--reactor=asyncio`` (setup.cfg [tool:pytest] addopts).

Like ``scrapy crawl`` (``CrawlerProcess``) and unlike a bare ``CrawlerRunner``, ``run_crawl`` installs the
``TWISTED_DNS_RESOLVER`` of the runner's settings on the reactor — after add-ons' ``update_pre_crawler_settings``
ran, so the add-on's resolver is the one installed — and puts the previous resolver back afterwards (the
reactor is shared by the whole test session).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import scrapy
from scrapy.crawler import Crawler, CrawlerRunner
from scrapy.http import Request, Response
from scrapy.settings import Settings
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet.defer import Deferred

from tests.support.server import clock

__all__ = ["CrawlTimeout", "Failed", "Fetched", "ListSpider", "TEST_SETTINGS", "polite_settings", "run_crawl"]

#: Defaults merged *under* the settings a test passes to :func:`run_crawl`.
TEST_SETTINGS: dict[str, Any] = {
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "COOKIES_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 20,
}


def polite_settings(**overrides: Any) -> dict[str, Any]:
    """The usual settings of an add-on test (memory store, loopback allowed, 1 s host interval), plus
    ``overrides`` (``POLITE_IP_INTERVAL=0.5`` etc.)."""
    s: dict[str, Any] = {
        "ADDONS": {"scrapy_polite.Addon": 0},
        "POLITE_STORE": "memory://",
        "POLITE_HOST_INTERVAL": 1.0,
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    }
    s.update(overrides)
    return s


class CrawlTimeout(AssertionError):
    """The crawl did not finish within ``timeout``; it was stopped. ``.crawler`` holds what was collected."""

    def __init__(self, message: str, crawler: Crawler):
        super().__init__(message)
        self.crawler = crawler


async def run_crawl(
    spider_cls: type[scrapy.Spider],
    settings: dict[str, Any] | Settings | None = None,
    *,
    timeout: float | None = 120.0,
    install_resolver: bool = True,
    **spider_kwargs: Any,
) -> Crawler:
    """Run one crawl of ``spider_cls`` to completion and return its :class:`~scrapy.crawler.Crawler`
    (``crawler.spider`` is the spider instance, ``crawler.stats`` its stats).

    Args:
        spider_cls: the spider class (e.g. :class:`ListSpider`).
        settings: Scrapy settings, merged over :data:`TEST_SETTINGS`.
        timeout: seconds after which the crawl is stopped and :class:`CrawlTimeout` raised (None: no limit).
        install_resolver: install ``TWISTED_DNS_RESOLVER`` on the reactor for the crawl, as ``scrapy crawl``
            does (default True); the previous resolver is restored afterwards.
        **spider_kwargs: passed to the spider's constructor.
    """
    from twisted.internet import reactor
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    if not isinstance(reactor, AsyncioSelectorReactor):
        raise RuntimeError(
            f"run_crawl needs the asyncio reactor, found {type(reactor).__name__}: run pytest with "
            "--reactor=asyncio (setup.cfg [tool:pytest] addopts)"
        )

    merged = Settings(TEST_SETTINGS)
    if isinstance(settings, Settings):
        merged.update(settings.copy_to_dict())
    elif settings:
        merged.update(settings)

    runner = CrawlerRunner(merged)  # runs add-ons' update_pre_crawler_settings on runner.settings
    old_resolver, old_name_resolver = reactor.resolver, reactor.nameResolver
    if install_resolver:
        resolver_cls = load_object(runner.settings["TWISTED_DNS_RESOLVER"])
        # Same call as CrawlerProcess._setup_reactor: the runner stands in for the crawler (settings only).
        resolver = build_from_crawler(resolver_cls, runner, reactor=reactor)  # type: ignore[arg-type]
        resolver.install_on_reactor()

    crawler = runner.create_crawler(spider_cls)
    timed_out = False
    done: Deferred[Any] = Deferred()
    stuck_timer: list[Any] = []

    def _on_timeout() -> None:
        nonlocal timed_out
        timed_out = True
        deferred_from_coro(crawler.stop_async())
        stuck_timer.append(reactor.callLater(STOP_GRACE, _on_stuck))

    def _on_stuck() -> None:
        # The stop did not complete either (e.g. a download that never ends keeps the engine's slot open):
        # fail the test with what is in progress instead of hanging the suite.
        if not done.called:
            done.errback(CrawlTimeout(
                f"crawl of {spider_cls.__name__} did not finish within {timeout} s, and stopping it did not "
                f"complete within {STOP_GRACE} s; in progress: {_in_progress(crawler)}", crawler))

    def _finished(result: Any) -> None:
        if not done.called:
            done.callback(result)
        # else: the test already failed on the stuck stop; the crawl's late result (a Failure too) is
        # dropped here rather than logged as an unhandled error

    timer = reactor.callLater(timeout, _on_timeout) if timeout else None
    runner.crawl(crawler, **spider_kwargs).addBoth(_finished)
    try:
        await done
    finally:
        for t in [timer, *stuck_timer]:
            if t is not None and t.active():
                t.cancel()
        if install_resolver:
            reactor.resolver = old_resolver
            reactor._nameResolver = old_name_resolver
    if timed_out:
        raise CrawlTimeout(f"crawl of {spider_cls.__name__} did not finish within {timeout} s", crawler)
    assert_no_illegal_moves(crawler.stats.get_stats() if crawler.stats is not None else {}, spider_cls.__name__)
    return crawler


def assert_no_illegal_moves(stats: dict[str, Any], where: str) -> None:
    """A crawl's stats count no illegal move of a request (``polite/lifecycle/illegal``, docs/spec.md §5): every
    crawl of the suite checks its lifecycle, in this process (where the move also raises) or in a child's."""
    illegal = stats.get("polite/lifecycle/illegal")
    assert not illegal, f"{where}: {illegal} illegal lifecycle moves (the crawl's log names them)"


#: Seconds :func:`run_crawl` gives a timed-out crawl's stop to complete before it gives up on the crawl.
STOP_GRACE = 20.0


def _in_progress(crawler: Crawler) -> str:
    """The requests the engine still has in progress (for a stuck crawl's error), best effort."""
    engine = crawler.engine
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    inprogress = getattr(slot, "inprogress", None)
    downloader = getattr(engine, "downloader", None)
    active = getattr(downloader, "active", None)
    return f"engine slot {sorted(r.url for r in inprogress or ())!r}, downloader {sorted(r.url for r in active or ())!r}"


# --------------------------------------------------------------------------------------------------
# A generic spider


@dataclass(frozen=True)
class Fetched:
    """A response the spider received (including non-2xx ones that Scrapy turned into ``HttpError``)."""

    url: str
    status: int
    time: float  # clock() when the callback/errback ran
    ip: str | None  # response.ip_address: the address actually connected to
    meta: dict[str, Any] = field(default_factory=dict)  # the user meta the request was made with
    latency: float | None = None  # meta['download_latency']
    via_errback: bool = False  # True for a non-2xx handed to the errback as HttpError


@dataclass(frozen=True)
class Failed:
    """A request that produced no response (DNS error, refused connection, ignored request, …)."""

    url: str
    error: str  # exception class name, e.g. "DNSLookupError", "IgnoreRequest"
    message: str
    time: float
    meta: dict[str, Any] = field(default_factory=dict)


class ListSpider(scrapy.Spider):
    """Requests a list of URLs and records what came back.

    Args:
        urls: start URLs; an item may be a ``str`` or a ``(url, meta)`` pair.
        meta: meta given to every request (per-URL meta is merged over it).
        follow: follow ``<a href>`` links of every 2xx HTML response (Scrapy's dupe filter applies; followed
            requests carry the meta of the page they came from).
        same_host: when following, only follow links to the same host:port (default True).
        dont_filter: pass ``dont_filter=True`` to the start requests (repeat a URL on purpose).
        priority: priority of the start requests.

    Results (on the instance): ``fetched: list[Fetched]``, ``failed: list[Failed]``, plus the helpers
    :meth:`statuses` and :meth:`urls`.
    """

    name = "list"

    def __init__(
        self,
        urls: Iterable[str | tuple[str, dict[str, Any]]] = (),
        meta: dict[str, Any] | None = None,
        follow: bool = False,
        same_host: bool = True,
        dont_filter: bool = False,
        priority: int = 0,
        *args: Any,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.start_items: list[tuple[str, dict[str, Any]]] = []
        for item in urls:
            if isinstance(item, str):
                self.start_items.append((item, dict(meta or {})))
            else:
                url, m = item
                self.start_items.append((url, {**(meta or {}), **m}))
        self.follow = follow
        self.same_host = same_host
        self.dont_filter = dont_filter
        self.priority = priority
        self.fetched: list[Fetched] = []
        self.failed: list[Failed] = []

    async def start(self) -> AsyncIterator[Any]:
        for url, m in self.start_items:
            yield self._request(url, m, dont_filter=self.dont_filter, priority=self.priority)

    def _request(self, url: str, user_meta: dict[str, Any], **kw: Any) -> Request:
        return Request(
            url,
            meta=dict(user_meta),
            callback=self.parse,
            errback=self.on_error,
            cb_kwargs={"user_meta": user_meta},
            **kw,
        )

    def _record(self, response: Response, user_meta: dict[str, Any], via_errback: bool) -> None:
        ip = getattr(response, "ip_address", None)
        self.fetched.append(
            Fetched(
                url=response.url,
                status=response.status,
                time=clock(),
                ip=str(ip) if ip is not None else None,
                meta=dict(user_meta),
                latency=response.meta.get("download_latency"),
                via_errback=via_errback,
            )
        )

    def parse(self, response: Response, user_meta: dict[str, Any]) -> Any:
        self._record(response, user_meta, via_errback=False)
        if not self.follow or not isinstance(response, scrapy.http.TextResponse):
            return
        from urllib.parse import urlsplit

        here = urlsplit(response.url).netloc
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if self.same_host and urlsplit(url).netloc != here:
                continue
            yield self._request(url, user_meta)

    def on_error(self, failure: Any) -> None:
        request = failure.request
        user_meta = request.cb_kwargs.get("user_meta", {})
        if failure.check(HttpError):
            self._record(failure.value.response, user_meta, via_errback=True)
            return
        exc = failure.value
        self.failed.append(Failed(request.url, type(exc).__name__, str(exc), clock(), dict(user_meta)))

    # -- convenience -------------------------------------------------------------------------------
    def statuses(self) -> list[int]:
        return [f.status for f in self.fetched]

    def urls(self) -> list[str]:
        return [f.url for f in self.fetched]
