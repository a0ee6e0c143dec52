"""End-to-end: a throttle is not a failure (docs/spec.md §2). The package retries a throttled page itself, when
its host is due, up to ``POLITE_THROTTLE_RETRIES`` times, without consuming Scrapy's ``RETRY_TIMES``; a page
whose budget is spent is given up, counted and named in the closing summary. Also: Retry-After of any length
(RFC 9110 §10.2.3), and the failure backoff's own cap (``POLITE_MAX_FAILURE_BACKOFF``).

Judged on the server-side arrival log of loopback hosts (127.0.7.x); ``RETRY_ENABLED`` is Scrapy's default
(True, ``RETRY_TIMES = 2``) unless a test says otherwise.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
import pytest_twisted

from scrapy_polite.clock import process_clock
from scrapy_polite.stores import open_store
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Arrival, Reply, gaps, scripted, sequence

#: Lower-bound tolerance (seconds): clock granularity only.
TOL = 0.02
#: Upper-bound slack (seconds) for reactor timers and the scheduler's wake-up.
SLACK = 0.6


def settings(tmp_path: Any, **overrides: Any) -> dict[str, Any]:
    s = polite_settings(POLITE_IP_INTERVAL=0, POLITE_STORE=f"sqlite:///{tmp_path}/pace.sqlite3",
                        RETRY_ENABLED=True)
    s.update(overrides)
    return s


def timeline(srv: Any) -> list[Arrival]:
    return sorted(srv.arrivals(), key=lambda a: (a.start, a.end))


def describe(hits: list[Arrival]) -> str:
    if not hits:
        return "(no arrivals)"
    t0 = hits[0].start
    return "; ".join(f"{a.path} {a.status} @+{a.start - t0:.3f}" for a in hits)


def stat(crawler: Any, key: str) -> Any:
    return crawler.stats.get_value(f"polite/{key}")


def closed_port(address: str) -> int:
    """A port nothing listens on at ``address`` (bound, then closed)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------
# 1. Four 429s, then the page: fetched with the default RETRY_TIMES, spaced by Retry-After or the backoff


@pytest_twisted.ensureDeferred
async def test_four_429s_with_retry_after_then_the_page_is_fetched(arrival_server, tmp_path):
    srv = arrival_server("127.0.7.1")
    srv.route("/api", scripted(*[Reply.throttle(429, "1")] * 4))
    crawler = await run_crawl(ListSpider, settings(tmp_path), urls=[srv.url("/api")], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 429, 429, 429, 200], describe(hits)
    for g in gaps(hits):
        assert 1.0 - TOL <= g <= 1.0 + SLACK, describe(hits)
    assert [f.status for f in crawler.spider.fetched] == [200] and crawler.spider.failed == []
    assert stat(crawler, "throttle/retries") == 4
    assert not stat(crawler, "throttle/given_up")
    assert not crawler.stats.get_value("retry/count")  # RETRY_TIMES (2) was never touched


@pytest_twisted.ensureDeferred
async def test_four_429s_without_retry_after_follow_the_backoff(arrival_server, tmp_path):
    """Interval 0.3 s: the retries leave after 0.3, 0.6, 1.2 and 2.4 s (``eff × 2^n``)."""
    srv = arrival_server("127.0.7.2")
    srv.route("/api", scripted(*[Reply.throttle(429)] * 4))
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_HOST_INTERVAL=0.3), urls=[srv.url("/api")],
                              timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 429, 429, 429, 200], describe(hits)
    for g, expected in zip(gaps(hits), [0.3, 0.6, 1.2, 2.4]):
        assert expected - TOL <= g <= expected + SLACK, (round(g, 3), expected, describe(hits))
    assert [f.status for f in crawler.spider.fetched] == [200]
    assert stat(crawler, "throttle/retries") == 4
    assert not crawler.stats.get_value("retry/count")


@pytest_twisted.ensureDeferred
async def test_negative_control_without_the_package_the_page_is_lost(arrival_server, tmp_path):
    """The same server with the add-on off: RetryMiddleware gives up after RETRY_TIMES (2) retries."""
    srv = arrival_server("127.0.7.3")
    srv.route("/api", scripted(*[Reply.throttle(429, "1")] * 4))
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_ENABLED=False), urls=[srv.url("/api")],
                              timeout=40)
    assert [a.status for a in timeline(srv)] == [429, 429, 429]
    assert crawler.stats.get_value("retry/max_reached") == 1
    assert [(f.status, f.via_errback) for f in crawler.spider.fetched] == [(429, True)]


# ---------------------------------------------------------------------------------------------------
# 2. A spent budget: given up, counted, named; RETRY_TIMES used only then


@pytest.mark.parametrize("cache", [False, True], ids=["plain", "http_cache"])
@pytest_twisted.ensureDeferred
async def test_a_spent_budget_gives_the_page_up_and_names_it_in_the_summary(arrival_server, tmp_path, caplog, cache):
    """POLITE_THROTTLE_RETRIES=2 and a host that always answers 429: the package sends the page 3 times, then
    hands the response on as Scrapy would handle it — RetryMiddleware retries it RETRY_TIMES (2) times more —
    and when the 429 reaches the spider the page is given up: ``polite/throttle/given_up`` and the summary. With the
    HTTP cache on, the same (trial: the 429 handed on was stored, answered Scrapy's 2 retries from the cache, and the
    page was not reported given up): a throttle handed on is not stored."""
    srv = arrival_server("127.0.7.4")
    srv.route("/*", Reply.throttle(429, "0.5"))
    caplog.set_level(logging.INFO)
    ok = arrival_server("127.0.7.5")
    extra = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "cache")} if cache else {}
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_THROTTLE_RETRIES=2, **extra),
                              urls=[srv.url("/lost"), ok.url("/fine")], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429] * 5, describe(hits)
    assert min(gaps(hits)) >= 0.5 - TOL, describe(hits)  # Scrapy's retries are paced too
    assert stat(crawler, "throttle/retries") == 2
    assert crawler.stats.get_value("retry/count") == 2 and crawler.stats.get_value("retry/max_reached") == 1
    assert stat(crawler, "throttle/given_up") == 1
    assert sorted((f.status, f.url) for f in crawler.spider.fetched) == [(200, ok.url("/fine")),
                                                                          (429, srv.url("/lost"))]
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scrapy-polite summary")]
    assert len(summary) == 1 and srv.url("/lost") in summary[0], summary
    assert ok.url("/fine") not in summary[0]  # negative control: a fetched page is not named


@pytest_twisted.ensureDeferred
async def test_dont_retry_requests_are_left_to_scrapy(arrival_server, tmp_path):
    srv = arrival_server("127.0.7.6")
    srv.route("/*", scripted(Reply.throttle(429, "1")))
    crawler = await run_crawl(ListSpider, settings(tmp_path), urls=[(srv.url("/once"), {"dont_retry": True})],
                              timeout=40)
    assert [a.status for a in timeline(srv)] == [429]
    assert [(f.status, f.via_errback) for f in crawler.spider.fetched] == [(429, True)]
    assert not stat(crawler, "throttle/retries") and not stat(crawler, "throttle/given_up")
    assert not crawler.stats.get_value("retry/count")


@pytest_twisted.ensureDeferred
async def test_a_real_failure_still_uses_retry_times_with_its_own_backoff_cap(tmp_path):
    """Connection refused (nothing listens): a failure, not a throttle — RetryMiddleware retries it RETRY_TIMES
    (2) times and gives up, the package retries nothing. Its backoff is capped by POLITE_MAX_FAILURE_BACKOFF
    (1.5 s: steps 1 s, then 1.5 s, and no step beyond the cap); with the default cap (60 s) the same failures
    leave a 4 s backoff and 3 steps (the negative control)."""
    capped, default = "127.0.7.7", "127.0.7.8"
    urls = [f"http://{capped}:{closed_port(capped)}/x", f"http://{default}:{closed_port(default)}/x"]
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_MAX_FAILURE_BACKOFF=1.5), urls=urls[:1],
                              timeout=40)
    other = await run_crawl(ListSpider, settings(tmp_path / "default"), urls=urls[1:], timeout=40)
    for c in (crawler, other):
        assert c.stats.get_value("retry/count") == 2 and c.stats.get_value("retry/max_reached") == 1
        assert [("ConnectionRefused" in f.error) for f in c.spider.failed] == [True], c.spider.failed
        assert not stat(c, "throttle/retries") and not stat(c, "throttle/given_up")
        assert stat(c, "throttles/failure") == 3
    store = open_store(settings(tmp_path)["POLITE_STORE"])
    try:
        row = store.get(capped)
    finally:
        store.close()
    assert row.consec == 1 and abs((row.next_allowed - row.updated) - 1.5) < 1e-6, row
    store = open_store(settings(tmp_path / "default")["POLITE_STORE"])
    try:
        row = store.get(default)
    finally:
        store.close()
    assert row.consec == 3 and abs((row.next_allowed - row.updated) - 4.0) < 1e-6, row


# ---------------------------------------------------------------------------------------------------
# 3. JOBDIR: the retry count is saved with the held request


@pytest_twisted.ensureDeferred
async def test_the_retry_count_survives_a_jobdir_resume(arrival_server, tmp_path):
    """POLITE_THROTTLE_RETRIES=1. Run 1: the page's first answer is 429 + Retry-After: 2; its retry is held and
    the crawl closes (POLITE_MAX_IDLE_WAIT=0.5), saving it under JOBDIR with its count. Run 2 resumes it; the
    host answers 429 again, and with the budget spent in run 1 the page is given up at once — not retried a
    second time (which a count lost on resume would do)."""
    srv = arrival_server("127.0.7.9")
    srv.route("/*", Reply.throttle(429, "2"))
    s = settings(tmp_path, JOBDIR=str(tmp_path / "job"), POLITE_THROTTLE_RETRIES=1, RETRY_ENABLED=False)
    c1 = await run_crawl(ListSpider, dict(s, POLITE_MAX_IDLE_WAIT=0.5), urls=[srv.url("/p")], timeout=30)
    assert [a.status for a in timeline(srv)] == [429]
    assert c1.stats.get_value("finish_reason") == "polite_deferred"
    assert stat(c1, "throttle/retries") == 1 and stat(c1, "deferred/saved") == 1
    c2 = await run_crawl(ListSpider, s, urls=[srv.url("/p")], timeout=30)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 429], describe(hits)
    assert hits[1].start >= hits[0].end + 2.0 - TOL
    assert stat(c2, "deferred/resumed") == 1
    assert not stat(c2, "throttle/retries")
    assert stat(c2, "throttle/given_up") == 1
    assert [(f.status, f.via_errback) for f in c2.spider.fetched] == [(429, True)]


# ---------------------------------------------------------------------------------------------------
# 4. Retry-After: any run of digits is delay-seconds (RFC 9110 §10.2.3)


@pytest_twisted.ensureDeferred
async def test_retry_after_of_400_nines_is_clamped_and_holds_the_host(arrival_server, tmp_path):
    """``Retry-After: 999…9`` (400 digits, too large for a float) is clamped to POLITE_MAX_RETRY_AFTER (2 s), not
    taken as invalid: no request reaches the host inside those 2 s (an invalid value would have let the next
    one go after the 0.3 s interval)."""
    srv = arrival_server("127.0.7.10")
    srv.route("/*", scripted(Reply.throttle(429, "9" * 400)))
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_HOST_INTERVAL=0.3, POLITE_MAX_RETRY_AFTER=2.0),
                              urls=[srv.url("/a"), srv.url("/b")], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 200, 200], describe(hits)
    assert 2.0 - TOL <= hits[1].start - hits[0].end <= 2.0 + SLACK, describe(hits)
    assert stat(crawler, "retry_after/clamped") == 1
    assert not stat(crawler, "retry_after/invalid")
    assert process_clock() - t0 < 20


# ---------------------------------------------------------------------------------------------------
# 4. Throttles and Scrapy's HTTP cache (the spent-budget test above covers a throttle handed on)


def cache_settings(tmp_path: Any, policy: str = "RFC2616Policy", **overrides: Any) -> dict[str, Any]:
    return settings(tmp_path, HTTPCACHE_ENABLED=True, HTTPCACHE_DIR=str(tmp_path / "cache"),
                    HTTPCACHE_POLICY=f"scrapy.extensions.httpcache.{policy}", **overrides)


@pytest_twisted.ensureDeferred
async def test_a_stale_entry_still_answers_when_its_revalidation_is_throttled(arrival_server, tmp_path):
    """Review: with RFC2616Policy the cache revalidates a stale entry, and when the server answers 5xx it hands back the
    entry instead. A throttle handed on while the cache revalidates is left to the cache's policy (not marked
    ``dont_cache``): the spider gets the stored page, as without the add-on."""
    srv = arrival_server("127.0.7.41")
    srv.route("/page", Reply.html("<p>cached</p>", headers={"Cache-Control": "max-age=0"}))
    await run_crawl(ListSpider, cache_settings(tmp_path), urls=[srv.url("/page")], timeout=30)
    srv.route("/page", Reply.throttle(503, "0.2"))
    crawler = await run_crawl(ListSpider, cache_settings(tmp_path, POLITE_THROTTLE_RETRIES=0, RETRY_ENABLED=False),
                              urls=[srv.url("/page")], timeout=30)
    assert [(a.path, a.status) for a in srv.arrivals()] == [("/page", 200), ("/page", 503)]
    assert [f.status for f in crawler.spider.fetched] == [200] and crawler.stats.get_value("httpcache/revalidate") == 1
    assert not stat(crawler, "throttle/given_up"), "the page reached the spider, from the cache"


@pytest_twisted.ensureDeferred
async def test_scrapy_s_retry_of_a_throttle_handed_on_is_cached_when_it_succeeds(arrival_server, tmp_path):
    """Review: the ``dont_cache`` mark of a throttle handed on travelled to Scrapy's retry copy, whose 200 was then not
    stored, and the next run fetched the page again. The mark is dropped as the retry reaches the pacing middleware:
    the 200 is stored and the second run reads both pages from the cache."""
    srv = arrival_server("127.0.7.43")
    srv.route("/p", scripted(Reply.throttle(429, "0.2"), Reply.throttle(429, "0.2"), then=Reply.html("<a href='/q'>q</a>")))
    srv.route("/q", Reply.html("<p>q</p>"))
    run = cache_settings(tmp_path, "DummyPolicy", POLITE_THROTTLE_RETRIES=1)
    first = await run_crawl(ListSpider, run, urls=[srv.url("/p")], follow=True, timeout=30)
    assert first.stats.get_value("retry/count") == 1 and first.stats.get_value("httpcache/store") == 2
    second = await run_crawl(ListSpider, run, urls=[srv.url("/p")], follow=True, timeout=30)
    assert second.stats.get_value("httpcache/hit") == 2 and len(second.spider.fetched) == 2
    assert [(a.path, a.status) for a in srv.arrivals()] == [("/p", 429), ("/p", 429), ("/p", 200), ("/q", 200)]


@pytest.mark.parametrize("others", [True, False], ids=["host_serves_others", "alone"])
@pytest_twisted.ensureDeferred
async def test_a_page_answered_403_again_after_the_host_served_others_is_refused_not_throttled(
        arrival_server, tmp_path, others):
    """A 403 from a host that served a 2xx is a throttle, so the page is retried when due; answered 403 again after
    the host served another page in between, the 403 refuses that page (docs/spec.md §2): it goes to the spider as
    Scrapy would hand it, without a second backoff step or more retries (trial: two always-forbidden pages among 30
    were tried 11 times each and took the host's crawl from 6 s to 55 s). Control (``alone``): a host that serves
    nothing in between keeps it a throttle, retried the whole POLITE_THROTTLE_RETRIES budget."""
    srv = arrival_server("127.0.7.31")
    srv.route("/forbidden/*", Reply.text("forbidden", status=403))
    pages = [srv.url(f"/p/{i}") for i in range(10 if others else 0)]
    urls = [srv.url("/first"), srv.url("/forbidden/a"), srv.url("/forbidden/b"), *pages]
    s = settings(tmp_path, POLITE_HOST_INTERVAL=0.1, POLITE_MAX_BACKOFF=1.0, POLITE_THROTTLE_RETRIES=3)
    crawler = await run_crawl(ListSpider, s, urls=urls, timeout=60)
    hits = timeline(srv)
    tries = {path: sum(a.path == path for a in hits) for path in ("/forbidden/a", "/forbidden/b")}
    assert tries == ({"/forbidden/a": 2, "/forbidden/b": 2} if others else {"/forbidden/a": 4, "/forbidden/b": 4}), \
        describe(hits)
    assert sorted(a.path for a in hits if a.status == 200) == sorted(["/first", *(p[p.index("/p/"):] for p in pages)])
    forbidden = [f.status for f in crawler.spider.fetched if "/forbidden/" in f.url]
    assert forbidden == [403, 403], crawler.spider.fetched  # each page reached the spider once, as Scrapy hands it
    assert bool(stat(crawler, "throttle/given_up")) is not others


class _MetaCopyingSpider(ListSpider):
    """Follows each link with a copy of the page's whole meta (``response.follow(href, meta=response.meta)``)."""

    def parse(self, response: Any, user_meta: dict[str, Any]) -> Any:
        self._record(response, user_meta, via_errback=False)
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, meta=dict(response.meta), callback=self.parse, errback=self.on_error,
                                  cb_kwargs={"user_meta": user_meta})


@pytest.mark.parametrize("via", ["link_with_copied_meta", "meta_refresh"])
@pytest_twisted.ensureDeferred
async def test_a_403_mark_stays_with_its_page(arrival_server, tmp_path, via):
    """The mark of a page answered 403 names that page: a page reached from it with a copy of its meta (a link
    followed with ``meta=response.meta``, a redirect) is another page, whose own first 403 is a throttle, retried
    (review: the mark travelled, and the next page's first 403, after a 2xx, was refused without a retry)."""
    srv = arrival_server("127.0.7.32")
    forbidden_once = Reply.text("forbidden", status=403)
    onward = (Reply.html('<a href="/b">b</a>') if via == "link_with_copied_meta"
              else Reply.html('<meta http-equiv="refresh" content="0; url=/b">'))  # a 200, then a redirect
    srv.route("/a", sequence(forbidden_once, onward))
    srv.route("/b", sequence(forbidden_once, Reply.html("<p>b</p>")))
    srv.route("/first", Reply.html('<a href="/a">a</a>'))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=0.1, POLITE_MAX_BACKOFF=1.0)
    spider = _MetaCopyingSpider if via == "link_with_copied_meta" else ListSpider
    crawler = await run_crawl(spider, s, urls=[srv.url("/first"), *([] if spider is _MetaCopyingSpider
                                                                    else [srv.url("/a")])],
                              follow=spider is _MetaCopyingSpider, timeout=60)
    hits = timeline(srv)
    assert [(a.path, a.status) for a in hits if a.path == "/b"] == [("/b", 403), ("/b", 200)], describe(hits)
    assert [f.status for f in crawler.spider.fetched if f.url.endswith("/b")] == [200]
