"""End-to-end: nothing held is ever stranded (docs/spec.md §5, "The request lifecycle").

Each crawl starts with a host in backoff from an earlier run (its SQLite row: one throttle, next allowed
in 2 s), so every start request of that host is held by the scheduler (the early deferral, in robots.txt
handling, before the middlewares after it). When the host comes due, its held
requests are released one at a time; some of them are then dropped or answered *before* the pacing
middleware books them — by ``RobotsTxtMiddleware``, ``OffsiteMiddleware``, ``HttpCacheMiddleware``, a
project middleware raising ``IgnoreRequest`` or returning a ``Response`` or another request. Each crawl must finish on its
own (``finish_reason`` ``"finished"``) with every allowed page fetched (the server's arrival log), no
request left held, and no timeout needed.

Before the lifecycle owner, the host was parked "until its line frees" after the first dropped request —
a line nothing would ever free: the crawl never ended (the 60 s timeout of these tests stopped it, with
the remaining pages not crawled).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import pytest_twisted
from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse

from scrapy_polite.clock import process_clock
from scrapy_polite.pacer import discard_pacer, find_pacer, get_pacer
from scrapy_polite.policy import HostState
from scrapy_polite.stores import open_store
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Reply, page

#: A crawl that needs more than this is stranded (it should take about 2 s of backoff plus pacing).
TIMEOUT = 60.0


def seed_backoff(uri: str, host: str, seconds: float = 2.0) -> None:
    """The host backs off from an earlier run: one throttle, next allowed in ``seconds``."""
    store = open_store(uri)
    now = process_clock()
    state = HostState(next_allowed=now + seconds, consec=1, throttled_at=now, updated=now)
    try:
        store.update(host, lambda _old, _now: (state, None))
    finally:
        store.close()


def paths(srv) -> list[str]:
    return sorted(a.path for a in srv.arrivals() if a.path != "/robots.txt")


class DropPrivate:
    """A project's downloader middleware: ``/private*`` pages are not for this crawl."""

    def process_request(self, request: Any, spider: Any = None) -> None:
        if "/private" in request.url:
            raise IgnoreRequest(f"not for this crawl: {request.url}")


class AnswerCanned:
    """A project's downloader middleware that answers ``/canned*`` itself (a stub, a local mirror)."""

    def process_request(self, request: Any, spider: Any = None) -> HtmlResponse | None:
        if "/canned" in request.url:
            return HtmlResponse(request.url, body=b"<html>canned</html>", encoding="utf-8", request=request)
        return None


class Rewrite:
    """A project middleware that returns a rewritten request in place of ``/old*`` (as scrapy-splash does
    for its render endpoint): the released request leaves without reaching scrapy-polite's middleware."""

    def process_request(self, request: Any, spider: Any = None) -> Any:
        if "/old" in request.url:
            return request.replace(url=request.url.replace("/old", "/new"))
        return None


class OffsiteSpider(ListSpider):
    """Only ``127.0.5.1`` is allowed; the other host's held requests are refused by ``OffsiteMiddleware``."""

    allowed_domains = ["127.0.5.1"]


async def crawl(srv, tmp_path, urls: list[str], spider: type[ListSpider] = ListSpider, **overrides: Any):
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    seed_backoff(uri, srv.address)
    # With ROBOTSTXT_OBEY, the early deferral holds every start request before any middleware after robots.txt
    # handling sees it (docs/spec.md §5): the held requests are released to the middlewares under test.
    settings = polite_settings(POLITE_STORE=uri, POLITE_IP_INTERVAL=0, POLITE_HOST_INTERVAL=0.1,
                               **{"ROBOTSTXT_OBEY": True, **overrides})
    t0 = process_clock()
    crawler = await run_crawl(spider, settings, urls=urls, timeout=TIMEOUT)
    return crawler, process_clock() - t0


async def fill_cache(srv, tmp_path) -> dict[str, Any]:
    """A first run (no backoff) puts /c1 and /c2 of ``srv`` in an HTTP cache; returns the cache's settings."""
    srv.route("/*", page())
    cache = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "httpcache")}
    first = await run_crawl(ListSpider, polite_settings(POLITE_STORE=f"sqlite:///{tmp_path}/first.sqlite3",
                                                        POLITE_IP_INTERVAL=0, POLITE_HOST_INTERVAL=0.1, **cache),
                            urls=[srv.url("/c1"), srv.url("/c2")], timeout=TIMEOUT)
    assert first.stats.get_value("finish_reason") == "finished" and paths(srv) == ["/c1", "/c2"]
    return cache


def assert_finished(crawler, elapsed: float) -> None:
    stats = crawler.stats.get_stats()
    assert stats.get("finish_reason") == "finished", (stats.get("finish_reason"), elapsed)
    assert not stats.get("polite/deferred/not_crawled"), stats
    assert stats.get("polite/deferrals/throttled"), "the host's requests were not held: the test proves nothing"
    assert elapsed < TIMEOUT / 2, f"the crawl took {elapsed:.1f} s"


@pytest_twisted.ensureDeferred
async def test_held_requests_disallowed_by_robots_txt_do_not_strand_the_host(arrival_server, tmp_path):
    srv = arrival_server("127.0.5.10")
    srv.route("/robots.txt", Reply.robots("User-agent: *\nDisallow: /private\n"))
    srv.route("/*", page())
    urls = [srv.url(p) for p in ("/a", "/private1", "/b", "/private2", "/c")]
    crawler, elapsed = await crawl(srv, tmp_path, urls, ROBOTSTXT_OBEY=True)
    assert paths(srv) == ["/a", "/b", "/c"]
    assert crawler.stats.get_value("robotstxt/forbidden") == 2
    assert_finished(crawler, elapsed)


@pytest_twisted.ensureDeferred
async def test_held_requests_refused_by_offsite_do_not_strand_the_host(arrival_server, tmp_path):
    """``OffsiteMiddleware`` placed before the pacing middleware (as a project may order it, here at 500), both
    hosts in backoff, ``ROBOTSTXT_OBEY`` off (the booking defers). Scrapy's ``OffsiteMiddleware`` refuses an offsite request when it is scheduled (its
    ``request_scheduled`` handler), so the other host's requests are never held: only the allowed host's
    two are, and they are fetched once due; the crawl finishes on its own."""
    ok = arrival_server("127.0.5.1")
    off = arrival_server("127.0.5.11")
    for srv in (ok, off):
        srv.route("/*", page())
    urls = [off.url(f"/x{i}") for i in range(4)] + [ok.url("/a"), ok.url("/b")]
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    seed_backoff(uri, ok.address)
    seed_backoff(uri, off.address)
    settings = polite_settings(POLITE_STORE=uri, POLITE_IP_INTERVAL=0, POLITE_HOST_INTERVAL=0.1,
                               DOWNLOADER_MIDDLEWARES={"scrapy.downloadermiddlewares.offsite.OffsiteMiddleware": 500})
    t0 = process_clock()
    crawler = await run_crawl(OffsiteSpider, settings, urls=urls, timeout=TIMEOUT)
    assert paths(ok) == ["/a", "/b"] and paths(off) == []
    assert crawler.stats.get_value("offsite/filtered") == 4
    assert crawler.stats.get_value("polite/deferrals/throttled") == 2  # the allowed host's, held then fetched
    assert_finished(crawler, process_clock() - t0)


@pytest_twisted.ensureDeferred
async def test_held_requests_answered_by_the_http_cache_do_not_strand_the_host(arrival_server, tmp_path):
    """A first run fills the HTTP cache with /c1 and /c2; the second starts with the host in backoff: the
    cached pages are answered by ``HttpCacheMiddleware`` after release, the others are fetched."""
    srv = arrival_server("127.0.5.12")
    cache = await fill_cache(srv, tmp_path)
    before = len(paths(srv))
    urls = [srv.url(p) for p in ("/a", "/c1", "/b", "/c2", "/c")]
    crawler, elapsed = await crawl(srv, tmp_path, urls, **cache)
    assert len(paths(srv)) - before == 3 and paths(srv).count("/c1") == 1, paths(srv)
    assert crawler.stats.get_value("httpcache/hit") == 2
    assert sorted(f.url.rsplit("/", 1)[1] for f in crawler.spider.fetched) == ["a", "b", "c", "c1", "c2"]
    assert_finished(crawler, elapsed)


@pytest_twisted.ensureDeferred
async def test_a_throttled_hosts_cached_pages_are_not_held_back(arrival_server, tmp_path):
    """Without ``ROBOTSTXT_OBEY`` nothing waits before the pacing middleware, so nothing defers before it either
    (docs/spec.md §5, "The early deferral"): the pages of a host in backoff that the HTTP cache answers reach
    the spider at once, before the backoff ends; the others are deferred by the booking and fetched after it.
    Negative control: with ``ROBOTSTXT_OBEY`` the cached pages wait for the backoff's end too (the early deferral
    holds every start request before it would wait for robots.txt; without it they would wait for a robots.txt that
    waits out the backoff, and ``assert_finished`` finds nothing deferred)."""
    srv = arrival_server("127.0.5.15")
    cache = await fill_cache(srv, tmp_path)
    for robots, cached_first in ((False, True), (True, False)):
        before = len(srv.arrivals())
        crawler, elapsed = await crawl(srv, tmp_path / str(robots), [srv.url(p) for p in ("/a", "/c1", "/c2")],
                                       ROBOTSTXT_OBEY=robots, **cache)
        assert_finished(crawler, elapsed)
        fetched = {f.url.rsplit("/", 1)[1]: f.time for f in crawler.spider.fetched}
        assert sorted(fetched) == ["a", "c1", "c2"]
        first_arrival = min(a.start for a in srv.arrivals()[before:])  # after the backoff (robots.txt or /a)
        assert (max(fetched["c1"], fetched["c2"]) < first_arrival) is cached_first, (robots, fetched, first_arrival)


@pytest.mark.parametrize("middleware,dropped", [(DropPrivate, "/private"), (AnswerCanned, "/canned")],
                         ids=["ignore-request", "own-response"])
@pytest_twisted.ensureDeferred
async def test_held_requests_dropped_or_answered_by_a_project_middleware_do_not_strand_the_host(
        arrival_server, tmp_path, middleware, dropped):
    srv = arrival_server("127.0.5.13" if middleware is DropPrivate else "127.0.5.14")
    srv.route("/*", page())
    urls = [srv.url(p) for p in ("/a", f"{dropped}1", "/b", f"{dropped}2", "/c")]
    crawler, elapsed = await crawl(srv, tmp_path, urls, DOWNLOADER_MIDDLEWARES={middleware: 500})
    assert paths(srv) == ["/a", "/b", "/c"]
    fetched = sorted(f.url.rsplit("/", 1)[1] for f in crawler.spider.fetched)
    if middleware is AnswerCanned:
        assert fetched == ["a", "b", "c", "canned1", "canned2"]
    else:
        assert fetched == ["a", "b", "c"]
        assert sorted(f.error for f in crawler.spider.failed) == ["IgnoreRequest", "IgnoreRequest"]
    assert_finished(crawler, elapsed)


@pytest_twisted.ensureDeferred
async def test_held_requests_replaced_by_a_project_middleware_do_not_strand_the_host(arrival_server, tmp_path):
    """No hook of ours sees a released request replaced by another (the middleware returns a Request): the
    lifecycle owner finds it missing from the downloader and frees its host (``polite/lifecycle/reclaimed``)."""
    srv = arrival_server("127.0.5.21")
    srv.route("/*", page())
    urls = [srv.url(p) for p in ("/a", "/old1", "/b", "/old2", "/c")]
    crawler, elapsed = await crawl(srv, tmp_path, urls, DOWNLOADER_MIDDLEWARES={Rewrite: 500})
    assert paths(srv) == ["/a", "/b", "/c", "/new1", "/new2"]
    assert crawler.stats.get_value("polite/lifecycle/reclaimed") == 2
    assert_finished(crawler, elapsed)


@pytest_twisted.ensureDeferred
async def test_a_request_replaced_unseen_frees_its_host_while_the_crawl_is_busy_elsewhere(arrival_server, tmp_path):
    """The reconcile runs once a second, not only when the crawl goes idle: a host whose released request left
    unseen (replaced by a project middleware) gets its next request while another host's pages still keep the
    crawl busy. Negative control (the order that tells): that other host's last page comes after it."""
    srv, busy = arrival_server("127.0.5.22"), arrival_server("127.0.5.23")
    srv.route("/*", page())
    busy.route("/*", page())
    urls = [srv.url("/old1"), srv.url("/a2")] + [busy.url(f"/b{i}") for i in range(80)]  # 8 s at 0.1 s apart
    crawler, elapsed = await crawl(srv, tmp_path, urls, DOWNLOADER_MIDDLEWARES={Rewrite: 500})
    assert paths(srv) == ["/a2", "/new1"]
    a2 = next(a.start for a in srv.arrivals() if a.path == "/a2")
    last_busy = max(a.start for a in busy.arrivals() if a.path != "/robots.txt")
    assert a2 < last_busy, (a2, last_busy)  # not left to the idle check, after the busy host's pages
    assert crawler.stats.get_value("polite/lifecycle/reclaimed") == 1
    assert_finished(crawler, elapsed)


@pytest_twisted.ensureDeferred
async def test_a_finished_crawl_is_freed_with_its_crawler(arrival_server, tmp_path):
    """Nothing of a finished crawl outlives its crawler: once the caller drops it, the crawler, its spider and
    its pacer (with the pace table object, the report and the held requests' queues) are freed. The pacer
    refers to its crawler, so the registry holds a closed pacer only weakly; a process running crawl after
    crawl (a ``CrawlerRunner`` service, a test suite) kept every one of them before. Negative control: while
    the caller holds the crawler, ``find_pacer`` still finds its closed pacer (the components hold it)."""
    srv = arrival_server("127.0.5.22")
    srv.route("/robots.txt", Reply.robots("User-agent: *\nDisallow: /private\n"))
    srv.route("/*", page())
    urls = [srv.url(p) for p in ("/a", "/private", "/b", "/c")]
    crawler, elapsed = await crawl(srv, tmp_path, urls, ROBOTSTXT_OBEY=True, HTTPCACHE_ENABLED=True,
                                   HTTPCACHE_DIR=str(tmp_path / "cache"))
    assert paths(srv) == ["/a", "/b", "/c"]
    assert_finished(crawler, elapsed)
    found = find_pacer(crawler)
    assert found is not None and found.closing
    refs = {"crawler": weakref.ref(crawler), "spider": weakref.ref(crawler.spider), "pacer": weakref.ref(found),
            "pace table": weakref.ref(found.store)}
    del found  # the test holds no pacer now: only the crawler's components do
    gc.collect()
    assert find_pacer(crawler) is refs["pacer"](), "the closed pacer is not found while its crawler is held"
    del crawler
    gc.collect()
    assert [name for name, ref in refs.items() if ref() is not None] == []


def test_an_open_pacer_is_held_by_the_registry_a_closed_one_only_while_something_holds_it():
    """The registry's own hold (:func:`~scrapy_polite.pacer.get_pacer`): an open pacer is kept with no other
    reference to it (a component built later finds the same one, the pace table opened once); a closed one
    goes once nothing else holds it, and a discarded one is forgotten at once."""
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://"})  # no add-on: no resolver check
    ref = weakref.ref(get_pacer(crawler))
    gc.collect()
    assert ref() is not None and find_pacer(crawler) is ref() and get_pacer(crawler) is ref()
    find_pacer(crawler).close()
    gc.collect()
    assert ref() is None and find_pacer(crawler) is None
    held = get_pacer(crawler)  # a new one for the same crawler (as on a first use), open
    assert not held.closing and find_pacer(crawler) is held
    discard_pacer(crawler)
    assert held.closing and find_pacer(crawler) is None
