"""The robots.txt lifecycle of RFC 9309, end to end (issue 33, part 1; docs/spec.md §5, "The robots.txt lifecycle").

Each test runs a real Scrapy crawl with the add-on and ``ROBOTSTXT_OBEY = True`` against loopback
:class:`~tests.support.server.ArrivalServer` hosts (each its own ``127.0.33.x`` address, per-IP interval 0) and is
judged from the servers' arrival logs:

* robots.txt 503 (an HTML error page, no ``Retry-After``) for its first 6 s, then 200 with ``Disallow: /private``:
  no page before the 200, the disallowed page never, the others fetched, robots.txt asked again at the backoff's
  pace (the negative control, Scrapy's own ``RobotsTxtMiddleware``, fetches every page before any 200);
* ``Retry-After`` on the robots.txt 503 is honoured; robots.txt timing out; a connection refused;
* 404 means everything allowed, whatever its body says (the negative control: Scrapy parses the 404's body);
* rules expire after 24 hours (an injected clock): new rules and a new Crawl-delay apply (negative control: 23 h 59 m);
* a robots.txt of more than 500 KiB: a rule within the first 500 KiB applies (negative control: one beyond it);
* 5 redirects followed, across hosts, each hop paced on its own host (negative control: 6 redirects: unavailable);
* a robots.txt that stays unreachable past ``POLITE_MAX_IDLE_WAIT`` ends the crawl as deferred requests do.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import threading
import time
from typing import Any

import pytest
import pytest_twisted
import scrapy
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware

from scrapy_polite.clock import process_clock
from scrapy_polite.commands import run_command
from scrapy_polite.robotstxt import PoliteRobotsTxtMiddleware
from scrapy_polite.stores import open_store
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Arrival, ArrivalServer, Reply, RequestInfo

#: Lower-bound tolerance (seconds) on server-side gaps: clock granularity only.
TOL = 0.05
RULES = "User-agent: *\nDisallow: /private\n"
BUSY = Reply.html("<html><body><h1>503 Service Unavailable</h1><p>Disallow: /</p></body></html>", status=503)


def settings(**overrides: Any) -> dict[str, Any]:
    """The add-on, robots.txt obeyed, loopback allowed, no per-IP pacing, a 1 s host interval."""
    return polite_settings(**{"ROBOTSTXT_OBEY": True, "POLITE_IP_INTERVAL": 0, **overrides})


def stock(settings_: dict[str, Any]) -> dict[str, Any]:
    """The same crawl with Scrapy's own RobotsTxtMiddleware in place of the add-on's (the negative control)."""
    return {**settings_, "DOWNLOADER_MIDDLEWARES": {**settings_.get("DOWNLOADER_MIDDLEWARES", {}),
                                                    PoliteRobotsTxtMiddleware: None, RobotsTxtMiddleware: 100}}


class MayAnswer:
    """A project's downloader middleware that may answer a request first (it answers none here)."""

    def process_request(self, request: Any) -> None:
        return None


#: With :class:`MayAnswer` on, every request reaches the downloader middlewares: none is held for its host's line as
#: the scheduler hands it out (docs/spec.md §5).
UNHELD = {"DOWNLOADER_MIDDLEWARES": {MayAnswer: 500}}


def robots_hits(srv: ArrivalServer) -> list[Arrival]:
    return sorted((a for a in srv.arrivals() if a.path == "/robots.txt"), key=lambda a: a.start)


def pages(srv: ArrivalServer) -> list[Arrival]:
    return sorted((a for a in srv.arrivals() if a.path != "/robots.txt"), key=lambda a: a.start)


def describe(srv: ArrivalServer, t0: float) -> str:
    return ", ".join(f"{a.path} {a.status} @{a.start - t0:.2f}-{a.end - t0:.2f}"
                     for a in sorted(srv.arrivals(), key=lambda a: a.start))


def polite_stats(crawler: Any) -> dict[str, Any]:
    return {k: v for k, v in crawler.stats.get_stats().items() if k.startswith(("polite/", "robotstxt/"))}


def unreachable_for(seconds: float, then: Reply, busy: Reply = BUSY) -> Any:
    """A robots.txt handler: ``busy`` (a 503, an HTML page, no Retry-After) until ``seconds`` after its first request,
    then ``then``."""
    first: list[float] = []

    def handler(info: RequestInfo, count: int) -> Reply:
        if not first:
            first.append(info.start)
        return busy if info.start - first[0] < seconds else then

    return handler


FOUR = ["/a", "/b", "/c", "/private/1"]


# ---------------------------------------------------------------------------------------------------------------
# 1. 503 for 6 s, then 200 with a Disallow (the crawl)


@pytest_twisted.ensureDeferred
async def test_an_unreachable_robots_txt_holds_the_host_until_it_answers(arrival_server):
    """robots.txt answers 503 for its first 6 s, then ``Disallow: /private``; four start URLs. No page arrives before
    robots.txt's 200, ``/private/1`` never does, the three others do; robots.txt is asked again at the backoff's
    pace (1 s interval: gaps of at least 1, 2, 4 s), not by Scrapy's immediate retries (``RETRY_ENABLED`` on, as
    by default); the held requests are counted (``polite/deferrals/robots_unreachable``) and named in the summary.
    """
    srv = arrival_server("127.0.33.1")
    srv.route("/robots.txt", unreachable_for(6.0, Reply.robots(RULES)))
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(RETRY_ENABLED=True), urls=[srv.url(p) for p in FOUR], timeout=50)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    ok = [a for a in robots if a.status == 200]
    assert ok, f"robots.txt never answered 200: {log}"
    assert [a.status for a in robots] == [503] * (len(robots) - 1) + [200], log
    got = pages(srv)
    assert sorted(a.path for a in got) == ["/a", "/b", "/c"], log
    assert all(a.start >= ok[0].end for a in got), f"a page arrived before robots.txt's 200: {log}"
    # The re-asks follow the host's backoff: 1 s, then 2 s, then 4 s after each 503's end.
    waits = [b.start - a.end for a, b in zip(robots, robots[1:])]
    assert len(robots) == 4 and all(w >= 2 ** i - TOL for i, w in enumerate(waits)), (waits, log)
    assert waits[0] < 2.5, (waits, log)  # without Retry-After the first re-ask is one interval later (next test)
    stats = polite_stats(crawler)
    assert stats.get("robotstxt/forbidden") == 1, stats
    assert stats.get("polite/robots/unreachable") == 3, stats
    # Each page held until robots.txt answered: in the robots.txt middleware's deferral (robots_unreachable), or for
    # its host's line, taken by the robots.txt request, as the scheduler handed it out (line).
    assert stats.get("polite/deferrals/robots_unreachable", 0) >= 1 and stats.get("polite/deferrals", 0) >= 4, stats
    assert not stats.get("retry/count"), f"Scrapy retried robots.txt itself: {stats}"
    assert crawler.stats.get_value("finish_reason") == "finished"


@pytest_twisted.ensureDeferred
async def test_negative_control_scrapy_s_own_middleware_reads_the_503_as_allow_all(arrival_server):
    """The same crawl with Scrapy's own RobotsTxtMiddleware: robots.txt asked 3 times (Scrapy's retries, paced by
    the add-on), never again, and every page fetched — ``/private/1`` included — with no robots.txt 200 ever. What
    the test above guards against."""
    srv = arrival_server("127.0.33.2")
    srv.route("/robots.txt", unreachable_for(6.0, Reply.robots(RULES)))
    t0 = process_clock()
    await run_crawl(ListSpider, stock(settings(RETRY_ENABLED=True)), urls=[srv.url(p) for p in FOUR], timeout=50)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    assert [a.status for a in robots] == [503, 503, 503], log
    assert sorted(a.path for a in pages(srv)) == sorted(FOUR), log


# ---------------------------------------------------------------------------------------------------------------
# 2. Retry-After, a timeout, a refused connection: unreachable too


@pytest_twisted.ensureDeferred
async def test_the_retry_after_of_a_robots_txt_503_is_honoured(arrival_server):
    """robots.txt answers 503 with ``Retry-After: 3`` once, then the rules: it is asked again no sooner than 3 s
    after the 503 (the 1 s interval alone would allow 1 s), and no page arrives before its 200."""
    srv = arrival_server("127.0.33.3")
    srv.route("/robots.txt", lambda info, count: Reply.throttle(503, "3") if count == 0 else Reply.robots(RULES))
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(), urls=[srv.url(p) for p in FOUR], timeout=40)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    assert [a.status for a in robots] == [503, 200], log
    assert robots[1].start - robots[0].end >= 3.0 - TOL, log
    assert sorted(a.path for a in pages(srv)) == ["/a", "/b", "/c"], log
    assert all(a.start >= robots[1].end for a in pages(srv)), log
    assert crawler.stats.get_value("polite/retry_after/honoured") == 1


@pytest_twisted.ensureDeferred
async def test_a_robots_txt_500_is_asked_again_at_a_doubling_pace_too(arrival_server):
    """robots.txt answers 500 twice, then the rules. A 500 is not a throttle in the pace table
    (``POLITE_THROTTLE_STATUSES`` is 429, 503), yet robots.txt is asked again 1 s, then 2 s, after each 500 (the
    re-ask's own doubling), and no page arrives before its 200."""
    srv = arrival_server("127.0.33.19")
    srv.route("/robots.txt", lambda info, count: Reply.html("<p>oops</p>", status=500) if count < 2
              else Reply.robots(RULES))
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(), urls=[srv.url(p) for p in FOUR], timeout=40)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    assert [a.status for a in robots] == [500, 500, 200], log
    assert robots[1].start - robots[0].end >= 1.0 - TOL and robots[2].start - robots[1].end >= 2.0 - TOL, log
    assert sorted(a.path for a in pages(srv)) == ["/a", "/b", "/c"], log
    assert all(a.start >= robots[2].end for a in pages(srv)), log
    assert not crawler.stats.get_value("polite/backoff_steps"), "a 500 is not a throttle of the pace table"


@pytest_twisted.ensureDeferred
async def test_a_robots_txt_that_times_out_holds_the_host(arrival_server):
    """robots.txt takes 2 s to answer twice, with ``DOWNLOAD_TIMEOUT = 1``: both asks time out (unreachable), the
    third answers at once. No page arrives before that answer, ``/private/1`` never, and the asks are spaced by
    the failure backoff (1 s, then 2 s after each timeout)."""
    srv = arrival_server("127.0.33.4")
    asked: list[float] = []  # every robots.txt request's arrival (the timed-out ones never reach the log)

    def robots(info: RequestInfo, count: int) -> Reply:
        asked.append(info.start)
        return Reply.text(RULES, delay=2.0) if count < 2 else Reply.robots(RULES)

    srv.route("/robots.txt", robots)
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(DOWNLOAD_TIMEOUT=1), urls=[srv.url(p) for p in FOUR], timeout=40)
    srv.wait_idle(3.0)
    log = describe(srv, t0) + f"; robots.txt asked at {[round(t - t0, 2) for t in asked]}"
    answers = robots_hits(srv)
    assert len(asked) == 3 and [a.status for a in answers] == [200], log
    got = pages(srv)
    assert sorted(a.path for a in got) == ["/a", "/b", "/c"], log
    assert all(a.start >= answers[0].end for a in got), f"a page arrived before robots.txt answered: {log}"
    # Each ask times out 1 s after it starts; the next comes 1 s, then 2 s, after that.
    assert asked[1] - asked[0] >= 1.0 + 1.0 - TOL and asked[2] - asked[1] >= 1.0 + 2.0 - TOL, log
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/unreachable") == 2 and stats.get("robotstxt/forbidden") == 1, stats


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@pytest_twisted.ensureDeferred
async def test_a_refused_connection_holds_the_host_until_its_server_is_up(arrival_server):
    """Nothing listens on the host's port for its first 2.5 s (connections refused), then its server starts. The
    first request it sees is robots.txt (the pages were held, not sent and failed), ``/private/1`` never arrives,
    the three other pages do; the refusals were counted as unreachable answers."""
    address = "127.0.33.5"
    port = free_port(address)
    started: list[ArrivalServer] = []

    def start() -> None:
        srv = ArrivalServer(address, port=port)
        srv.route("/robots.txt", Reply.robots(RULES))
        started.append(srv)

    timer = threading.Timer(2.5, start)
    timer.start()
    try:
        crawler = await run_crawl(ListSpider, settings(), urls=[f"http://{address}:{port}{p}" for p in FOUR],
                                  timeout=40)
    finally:
        timer.cancel()
        timer.join()
        for srv in started:
            srv.stop()
    assert started, "the server never started"
    srv = started[0]
    hits = sorted(srv.arrivals(), key=lambda a: a.start)
    assert hits and hits[0].path == "/robots.txt", hits
    assert sorted(a.path for a in hits[1:]) == ["/a", "/b", "/c"], hits
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/unreachable", 0) >= 1 and stats.get("robotstxt/forbidden") == 1, stats
    assert [(f.url.rsplit("/", 2)[-2:], f.error) for f in crawler.spider.failed] == [(["private", "1"], "IgnoreRequest")]


def links(*urls: str) -> Reply:
    return Reply.html("".join(f'<a href="{url}">x</a>' for url in urls))


@pytest_twisted.ensureDeferred
async def test_a_robots_txt_without_a_delay_on_another_port_keeps_the_host_s_crawl_delay(arrival_server):
    """One host, two origins: ``:A``'s robots.txt publishes ``Crawl-delay: 1.5``, ``:B``'s answers 404 (read later:
    ``B`` is linked from ``A``'s first page). Both share the host's row (its key has no port), so every request after
    ``A``'s robots.txt answered starts at least 1.5 s after the one before it ended, ``B``'s robots.txt and pages
    included (the old rule, the last robots.txt read sets the row, let ``B``'s 404 clear the delay: the pages after it
    came 0.2 s apart)."""
    a, b = arrival_server("127.0.33.10"), arrival_server("127.0.33.10")
    a.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 1.5\n"))
    b.route("/robots.txt", Reply.text("not here", status=404))
    a.route("/1", links(b.url("/1"), b.url("/2")))
    b.route("/1", links(a.url("/2"), a.url("/3"), a.url("/4")))
    for path in ("/2", "/3", "/4"):
        a.route(path, links())
    b.route("/2", links())
    crawler = await run_crawl(ListSpider, settings(POLITE_HOST_INTERVAL=0.2), urls=[a.url("/1")], follow=True,
                              same_host=False, timeout=60)
    arrivals = sorted([*a.arrivals(), *b.arrivals()], key=lambda x: x.start)
    log = describe_all(arrivals)
    assert len(crawler.spider.fetched) == 6 and [x.path for x in robots_hits(b)] == ["/robots.txt"], log
    answered = robots_hits(a)[0].end
    after = [x for x in arrivals if x.start > answered]
    assert len(after) == 7, log  # A's 4 pages, B's robots.txt and 2 pages
    gaps = [nxt.start - prev.end for prev, nxt in zip([robots_hits(a)[0], *after], after)]
    assert min(gaps) >= 1.5 - TOL, (gaps, log)


@pytest_twisted.ensureDeferred
async def test_a_crawl_that_reads_only_a_no_delay_origin_keeps_the_delay_another_crawl_recorded(arrival_server,
                                                                                                tmp_path):
    """Two crawls share one SQLite table, as the processes of a fleet do: the first reads only ``:A``'s robots.txt
    (``Crawl-delay: 1.5``), the second only ``:B``'s (404), then fetches three of ``B``'s pages. ``A``'s delay stays in
    force for the host (the row keeps each origin's delay): the second crawl's requests start at least 1.5 s after
    the one before ended. Fails when a robots.txt without a delay clears the row's delay whatever origin published it
    (the rule kept per process: ``B``'s pages then came 0.2 s apart)."""
    a, b = arrival_server("127.0.33.11"), arrival_server("127.0.33.11")
    a.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 1.5\n"))
    b.route("/robots.txt", Reply.text("not here", status=404))
    a.route("/1", links())
    for path in ("/1", "/2", "/3"):
        b.route(path, links())
    shared = settings(POLITE_HOST_INTERVAL=0.2, POLITE_STORE=f"sqlite:///{tmp_path}/pace.sqlite3")
    await run_crawl(ListSpider, shared, urls=[a.url("/1")], timeout=40)
    crawler = await run_crawl(ListSpider, shared, urls=[b.url(p) for p in ("/1", "/2", "/3")], timeout=40)
    arrivals = sorted(b.arrivals(), key=lambda x: x.start)
    log = describe_all(arrivals)
    assert len(crawler.spider.fetched) == 3 and [x.path for x in arrivals][0] == "/robots.txt", log
    gaps = [nxt.start - prev.end for prev, nxt in zip(arrivals, arrivals[1:])]
    assert len(gaps) == 3 and min(gaps) >= 1.5 - TOL, (gaps, log)


@pytest_twisted.ensureDeferred
async def test_an_operator_s_crawl_delay_outlives_a_later_crawl_s_read_of_the_same_robots_txt(arrival_server,
                                                                                            tmp_path, caplog):
    """A crawl reads the host's robots.txt (``Crawl-delay: 0.3``); the operator sets 1.5 s with ``scrapy polite
    crawl-delay``; a second crawl sharing the SQLite table, as a fleet's worker started later does, reads the same
    robots.txt again, then fetches three pages: each starts at least 1.5 s after the one before ended (fails when any
    read ends the operator's delay, as it did: the pages then came 0.3 s apart, trial G). Negative control: a third
    crawl reads a robots.txt that now publishes 0.4 s, which ends the operator's delay."""
    srv = arrival_server("127.0.33.12")
    srv.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 0.3\n"))
    for path in ("/1", "/2", "/3"):
        srv.route(path, links())
    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    shared = settings(POLITE_HOST_INTERVAL=0.2, POLITE_STORE=uri)
    await run_crawl(ListSpider, shared, urls=[srv.url("/1")], timeout=40)
    out, err = io.StringIO(), io.StringIO()
    assert run_command(["crawl-delay", "127.0.33.12", "1.5", "--store", uri], out=out, err=err) == 0, err.getvalue()
    first = len(srv.arrivals())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scrapy_polite"):
        crawler = await run_crawl(ListSpider, shared, urls=[srv.url(p) for p in ("/1", "/2", "/3")], timeout=40)
    assert "publishes a delay of 0.3 s for" in caplog.text and "recorded; the host's Crawl-delay is 1.5 s" in caplog.text
    arrivals = sorted(srv.arrivals()[first:], key=lambda x: x.start)
    log = describe_all(arrivals)
    assert len(crawler.spider.fetched) == 3 and [x.path for x in arrivals][0] == "/robots.txt", log
    gaps = [nxt.start - prev.end for prev, nxt in zip(arrivals, arrivals[1:])]
    assert len(gaps) == 3 and min(gaps) >= 1.5 - TOL, (gaps, log)
    srv.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 0.4\n"))
    await run_crawl(ListSpider, shared, urls=[srv.url("/1")], timeout=40)
    store = open_store(uri)
    try:
        assert store.get("127.0.33.12").crawl_delay == 0.4
    finally:
        store.close()


def describe_all(arrivals: list[Arrival]) -> str:
    t0 = arrivals[0].start if arrivals else 0.0
    return ", ".join(f":{a.server_address[1]}{a.path} {a.status} @{a.start - t0:.2f}-{a.end - t0:.2f}" for a in arrivals)


# ---------------------------------------------------------------------------------------------------------------
# 3. 4xx: unavailable, everything allowed


@pytest_twisted.ensureDeferred
async def test_a_404_robots_txt_allows_everything_whatever_its_body(arrival_server):
    """robots.txt answers 404 with a body that reads like ``Disallow: /``: unavailable (RFC 9309 §2.3.1.3), so all
    four pages are fetched, none held."""
    srv = arrival_server("127.0.33.6")
    srv.route("/robots.txt", Reply.text("User-agent: *\nDisallow: /\n", status=404))
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(), urls=[srv.url(p) for p in FOUR], timeout=40)
    log = describe(srv, t0)
    assert sorted(a.path for a in pages(srv)) == sorted(FOUR), log
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/unavailable") == 1 and not stats.get("polite/deferrals/robots_unreachable"), stats
    assert not stats.get("robotstxt/forbidden"), stats


@pytest_twisted.ensureDeferred
async def test_negative_control_scrapy_s_own_middleware_parses_the_404_body(arrival_server):
    """The same crawl with Scrapy's own RobotsTxtMiddleware: it parses the 404's body as rules, and forbids pages
    (not all four: see the next test)."""
    srv = arrival_server("127.0.33.7")
    srv.route("/robots.txt", Reply.text("User-agent: *\nDisallow: /\n", status=404))
    crawler = await run_crawl(ListSpider, stock(settings()), urls=[srv.url(p) for p in FOUR], timeout=40)
    assert crawler.stats.get_value("robotstxt/forbidden", 0) >= 1 and len(pages(srv)) < 4


PRIVATE = [f"/private/{i}" for i in range(6)] + ["/a"]


@pytest_twisted.ensureDeferred
async def test_every_request_that_waited_for_robots_txt_is_judged_by_it(arrival_server, tmp_path):
    """Seven start URLs wait together for a robots.txt that says ``Disallow: /private``: all six ``/private/…`` are
    dropped, ``/a`` is fetched. Each waiting request gets its own wake-up and reads the state again. (With the HTTP
    cache on, as here, the scheduler does not hold a request for its host's line, taken by robots.txt, as it hands it
    out: every request reaches the robots.txt middleware and waits there.)"""
    srv = arrival_server("127.0.33.8")
    srv.route("/robots.txt", Reply.text(RULES, delay=0.3))
    crawler = await run_crawl(ListSpider, settings(**UNHELD), urls=[srv.url(p) for p in PRIVATE], timeout=40)
    assert [a.path for a in pages(srv)] == ["/a"] and crawler.stats.get_value("robotstxt/forbidden") == 6


@pytest_twisted.ensureDeferred
async def test_negative_control_scrapy_s_own_middleware_lets_waiting_requests_through(arrival_server, tmp_path):
    """With Scrapy's own RobotsTxtMiddleware under the asyncio reactor, only the first request that awaited the
    robots.txt Deferred gets the parser; the others await the same Deferred after ``asFuture``'s callback, which
    passes None on, so they are allowed: ``/private/…`` pages are fetched (a defect of Scrapy 2.19, left to it;
    without such a middleware the add-on's scheduler holds them for their host's line until robots.txt answered)."""
    srv = arrival_server("127.0.33.9")
    srv.route("/robots.txt", Reply.text(RULES, delay=0.3))
    await run_crawl(ListSpider, stock(settings(**UNHELD)), urls=[srv.url(p) for p in PRIVATE], timeout=40)
    assert any(a.path.startswith("/private/") for a in pages(srv)), describe(srv, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# 4. 24 hours: the rules expire (an injected clock)


class ShiftedClock:
    """The process clock plus ``offset`` seconds (moved by the spider below)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return process_clock() + self.offset


CLOCK = ShiftedClock()


class ClockedRobotsTxtMiddleware(PoliteRobotsTxtMiddleware):
    """The add-on's middleware on :data:`CLOCK` (a subclass of ours: the add-on keeps it, and turns Scrapy's off)."""

    clock = CLOCK


class AgingSpider(ListSpider):
    """Ages the robots.txt clock by ``age`` seconds once ``/a`` is parsed, then asks for ``later``."""

    def __init__(self, *args: Any, age: float, later: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.age, self.later = age, later

    def parse(self, response: scrapy.http.Response, user_meta: dict[str, Any]) -> Any:
        yield from super().parse(response, user_meta)
        if response.url.endswith("/a"):
            CLOCK.offset += self.age
            for url in self.later:
                yield self._request(url, {})


RULES_V2 = "User-agent: *\nDisallow: /b\nCrawl-delay: 2\n"


async def aged_crawl(srv: ArrivalServer, age: float) -> Any:
    srv.route("/robots.txt", lambda info, count: Reply.robots(RULES if count == 0 else RULES_V2))
    CLOCK.offset = 0.0
    s = settings(DOWNLOADER_MIDDLEWARES={ClockedRobotsTxtMiddleware: 100})
    try:
        return await run_crawl(AgingSpider, s, urls=[srv.url("/a"), srv.url("/private/1")], age=age,
                               later=[srv.url("/private/2"), srv.url("/b"), srv.url("/c")], timeout=40)
    finally:
        CLOCK.offset = 0.0


@pytest_twisted.ensureDeferred
async def test_robots_txt_rules_expire_after_24_hours(arrival_server):
    """The robots.txt clock moves 24 h and 1 s after ``/a``: the next requests ask robots.txt again (counted), and
    its new rules (``Disallow: /b``) and Crawl-delay (2 s) apply: ``/private/2`` is fetched, ``/b`` is not, and the
    pages after the new robots.txt are at least 2 s apart."""
    srv = arrival_server("127.0.33.10")
    t0 = process_clock()
    crawler = await aged_crawl(srv, 24 * 3600 + 1)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    assert len(robots) == 2, log
    got = pages(srv)
    assert sorted(a.path for a in got) == ["/a", "/c", "/private/2"], log
    after = [robots[1], *[a for a in got if a.start > robots[1].start]]
    assert len(after) == 3 and all(b.start - a.end >= 2.0 - TOL for a, b in zip(after, after[1:])), log
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/expired") == 1 and stats.get("polite/crawl_delay/adopted") == 1, stats
    assert stats.get("robotstxt/forbidden") == 2, stats  # /private/1 by the first rules, /b by the new ones


@pytest_twisted.ensureDeferred
async def test_negative_control_rules_younger_than_24_hours_are_kept(arrival_server):
    """The clock moves 23 h 59 m: robots.txt is not asked again, the first rules still apply (``/private/2``
    dropped, ``/b`` fetched), no Crawl-delay."""
    srv = arrival_server("127.0.33.11")
    crawler = await aged_crawl(srv, 24 * 3600 - 60)
    assert len(robots_hits(srv)) == 1
    assert sorted(a.path for a in pages(srv)) == ["/a", "/b", "/c"]
    stats = polite_stats(crawler)
    assert not stats.get("polite/robots/expired") and not stats.get("polite/crawl_delay/adopted"), stats


# ---------------------------------------------------------------------------------------------------------------
# 5. 500 KiB parsed


def big_robots(rule_at: int, size: int = 600 * 1024) -> str:
    """A robots.txt of ``size`` bytes: ``User-agent: *``, comment lines, ``Disallow: /private`` starting at byte
    ``rule_at``, comment lines."""
    head = "User-agent: *\n"
    rule = "Disallow: /private\n"
    filler = "#" + "x" * 98 + "\n"
    before = head + filler * ((rule_at - len(head)) // len(filler))
    before += "#" * (rule_at - len(before) - 1) + "\n" if rule_at - len(before) > 0 else ""
    text = before + rule
    text += filler * ((size - len(text)) // len(filler))
    assert text.index(rule) == rule_at, (text.index(rule), rule_at)
    return text


LIMIT = 500 * 1024


@pytest.mark.parametrize("rule_at, disallowed", [
    (LIMIT - len("Disallow: /private\n"), True),  # its last byte is the 500 KiB-th: parsed
    (LIMIT + 100, False),  # the negative control: beyond 500 KiB, ignored
])
@pytest_twisted.ensureDeferred
async def test_the_first_500_kib_of_robots_txt_are_parsed(arrival_server, rule_at, disallowed):
    """A 600 KiB robots.txt whose ``Disallow: /private`` ends at its 500 KiB-th byte: the rule applies
    (RFC 9309 §2.5: at least 500 KiB parsed). One starting past 500 KiB is ignored, and the file counted as cut."""
    srv = arrival_server("127.0.33.12" if disallowed else "127.0.33.13")
    srv.route("/robots.txt", Reply.robots(big_robots(rule_at)))
    crawler = await run_crawl(ListSpider, settings(), urls=[srv.url(p) for p in FOUR], timeout=40)
    fetched = sorted(a.path for a in pages(srv))
    assert fetched == (["/a", "/b", "/c"] if disallowed else sorted(FOUR))
    assert crawler.stats.get_value("polite/robots/truncated") == 1


# ---------------------------------------------------------------------------------------------------------------
# 6. Redirects: 5 followed, across hosts, each hop paced on its own host


def redirect_chain(a: ArrivalServer, b: ArrivalServer, redirects: int) -> None:
    """``a``'s robots.txt redirects ``redirects`` times, through ``a`` then ``b`` (``/r1`` … on each), to ``b``'s
    ``/robots.txt``, which says ``Disallow: /private`` and ``Crawl-delay: 2``."""
    hops = [a.url("/robots.txt")] + [(a if i <= 2 else b).url(f"/r{i}") for i in range(1, redirects)]
    hops.append(b.url("/robots.txt"))
    for here, there in zip(hops, hops[1:]):
        srv = a if here.startswith(a.url("/")) else b
        srv.route(here.split(str(srv.port), 1)[1], Reply.redirect(there, 301))
    b.route("/robots.txt", Reply.robots(RULES + "Crawl-delay: 2\n"))


@pytest_twisted.ensureDeferred
async def test_five_redirects_are_followed_across_hosts(arrival_server):
    """``a``'s robots.txt reaches ``b``'s after 5 redirects (2 on ``a``, 3 on ``b``): its rules and Crawl-delay are
    ``a``'s (``/private/1`` dropped; ``a``'s pages 2 s apart), and each hop was a request to the host it went to,
    paced there (``b``'s three at least its 0.5 s interval apart)."""
    a, b = arrival_server("127.0.33.14"), arrival_server("127.0.33.15")
    redirect_chain(a, b, 5)
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(POLITE_HOST_INTERVAL=0.5), urls=[a.url(p) for p in FOUR],
                              timeout=40)
    log = f"a: {describe(a, t0)}; b: {describe(b, t0)}"
    assert sorted(x.path for x in pages(a) if not x.path.startswith("/r")) == ["/a", "/b", "/c"], log
    assert [x.path for x in sorted(b.arrivals(), key=lambda x: x.start)] == ["/r3", "/r4", "/robots.txt"], log
    b_hits = sorted(b.arrivals(), key=lambda x: x.start)
    assert all(y.start - x.end >= 0.5 - TOL for x, y in zip(b_hits, b_hits[1:])), log
    a_pages = [x for x in pages(a) if not x.path.startswith("/r")]
    assert all(y.start - x.end >= 2.0 - TOL for x, y in zip(a_pages, a_pages[1:])), log
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/redirects") == 5 and stats.get("robotstxt/forbidden") == 1, stats
    hosts = crawler.spider.crawler.stats  # noqa: F841 - the pacer's per-host counts follow
    from scrapy_polite.pacer import find_pacer

    pacer = find_pacer(crawler)
    assert pacer is not None and pacer.report.hosts["127.0.33.15"].requests == 3, log


@pytest_twisted.ensureDeferred
async def test_negative_control_six_redirects_mean_unavailable(arrival_server):
    """Six redirects: robots.txt is unavailable (RFC 9309 §2.3.1.2 allows that reading), everything is allowed,
    ``b``'s final robots.txt is never asked."""
    a, b = arrival_server("127.0.33.16"), arrival_server("127.0.33.17")
    redirect_chain(a, b, 6)
    crawler = await run_crawl(ListSpider, settings(POLITE_HOST_INTERVAL=0.5), urls=[a.url(p) for p in FOUR],
                              timeout=40)
    assert sorted(x.path for x in pages(a) if not x.path.startswith("/r")) == sorted(FOUR)
    assert b.hits("/robots.txt") == 0
    stats = polite_stats(crawler)
    assert stats.get("polite/robots/redirects") == 5 and stats.get("polite/robots/unavailable") == 1, stats


# ---------------------------------------------------------------------------------------------------------------
# 7. Unreachable past POLITE_MAX_IDLE_WAIT


@pytest.mark.parametrize("status, control", [(500, False), (500, True), (503, False)],
                         ids=["500_asked_past_the_cache", "control_500_read_from_the_cache", "503_never_stored"])
@pytest_twisted.ensureDeferred
async def test_a_robots_txt_error_the_http_cache_kept_is_asked_again_past_it(arrival_server, tmp_path, monkeypatch,
                                                                            status, control):
    """Trial: with the HTTP cache on, robots.txt's 503 was stored and every re-ask read it back: the server saw one
    request, the host was held for ever and the next run sent nothing. robots.txt answers ``status`` for its first
    1.5 s, then its rules; two runs on one cache. A 503 (a throttle) is not stored: the first run reaches the rules
    and fetches the three allowed pages, the second reads the rules from the cache. A 500 is stored (Scrapy's cache
    keeps errors), but a stored 5xx is not the server's answer now: it is asked again past the cache at once, in
    both runs (the second asks the server once). Control: the stored 500 taken as the answer: no page, and the crawl
    ends ``polite_deferred``."""
    from scrapy_polite import robotstxt

    if control:
        monkeypatch.setattr(robotstxt, "_stored_error", lambda request, response: False)
    srv = arrival_server("127.0.33.19")
    srv.route("/robots.txt", unreachable_for(1.5, Reply.robots(RULES), busy=Reply.text("down", status=status)))
    cache = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path / "httpcache"), "POLITE_MAX_IDLE_WAIT": 6}
    crawler = await run_crawl(ListSpider, settings(**cache), urls=[srv.url(p) for p in FOUR], timeout=40)
    log = describe(srv, 0.0)
    if control:
        assert pages(srv) == [] and len(robots_hits(srv)) == 1, log
        assert crawler.stats.get_value("finish_reason") == "polite_deferred"
        return
    assert sorted(a.path for a in pages(srv)) == ["/a", "/b", "/c"] and robots_hits(srv)[-1].status == 200, log
    before = len(robots_hits(srv))
    crawler = await run_crawl(ListSpider, settings(**cache), urls=[srv.url(p) for p in FOUR], timeout=40)
    log = describe(srv, 0.0)
    assert len(robots_hits(srv)) == before + (1 if status == 500 else 0) and len(pages(srv)) == 3, log
    assert crawler.stats.get_value("finish_reason") == "finished" and len(crawler.spider.fetched) == 3


@pytest_twisted.ensureDeferred
async def test_a_robots_txt_unreachable_past_the_idle_wait_ends_the_crawl_as_deferred(arrival_server, caplog):
    """robots.txt answers 503 for ever, ``POLITE_MAX_IDLE_WAIT = 4``: robots.txt is asked at the backoff's pace
    until the host has been unreachable for 4 s, then the idle spider closes with ``polite_deferred``; no page
    was sent, the four are reported not crawled, and the summary names the unreachable robots.txt."""
    caplog.set_level(logging.INFO)
    srv = arrival_server("127.0.33.18")
    srv.route("/robots.txt", BUSY)
    t0 = process_clock()
    crawler = await run_crawl(ListSpider, settings(POLITE_MAX_IDLE_WAIT=4, LOGSTATS_INTERVAL=1),
                              urls=[srv.url(p) for p in FOUR], timeout=40)
    elapsed = process_clock() - t0
    log = describe(srv, t0)
    assert pages(srv) == [], log
    assert 3 <= len(robots_hits(srv)) <= 4 and elapsed < 15, (elapsed, log)
    assert crawler.stats.get_value("finish_reason") == "polite_deferred"
    assert crawler.stats.get_value("polite/deferred/not_crawled") == 4
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("scrapy_polite")]
    summary = [m for m in messages if m.startswith("scrapy-polite summary")]
    # The deferrals by reason: robots.txt unreachable (the page that asked, and those held again each time); on a loaded
    # machine a held page may come back while the host still backs off from the 503s, and is deferred as throttled.
    # The pages handed out while the robots.txt request had their host's line were held for it (turn waits).
    found = re.search(r"(\d+) deferred \((\d+) robots.txt unreachable(?:, (\d+) throttled)?\)", summary[0] if summary else "")
    assert len(summary) == 1 and found, summary
    assert int(found[1]) == int(found[2]) + int(found[3] or 0) and int(found[2]) >= 1, summary
    assert crawler.stats.get_value("polite/deferrals") >= 4
    assert f"{srv.address}: robots.txt unreachable (503) for" in summary[0], summary  # still so at close
    progress = [m for m in messages if re.match(r"scrapy-polite: (\d+ requests? held|only waiting)", m)]
    assert progress and all("robots.txt unreachable" in m for m in progress), progress



# 8. One origin however its URLs spell it


def robots_recording(headers: list[dict[str, str]]) -> Any:
    """A robots.txt handler answering :data:`RULES`, keeping each request's headers in ``headers``."""
    def handler(info: RequestInfo, count: int) -> Reply:
        headers.append(info.headers)
        return Reply.text(RULES)

    return handler


@pytest_twisted.ensureDeferred
async def test_one_origin_spelt_several_ways_asks_one_robots_txt_without_user_info(arrival_server):
    """``http://Robots.Test:P``, ``http://user:pw@robots.test.:P`` and ``http://ROBOTS.test:P`` are one origin
    (docs/spec.md §2, "A host's origins"): one robots.txt state, one robots.txt request, without the user info;
    every page's rule comes from it (``/private`` never fetched; the page with user info is refused). The control: Scrapy's own middleware keys robots.txt
    by the URL's netloc as written, and asks it once per spelling."""
    asked: list[dict[str, str]] = []
    srv = arrival_server("127.0.33.21")
    srv.route("/robots.txt", robots_recording(asked))
    spellings = ["http://Robots.Test:{}", "http://user:pw@robots.test.:{}", "http://ROBOTS.test:{}"]
    paths = ("/a", "/private/x")
    dns = {"POLITE_DNS_OVERRIDES": {"robots.test": [srv.address]}, "POLITE_HOST_INTERVAL": 0.05}
    urls = [spelling.format(srv.port) + path for spelling in spellings for path in paths]
    await run_crawl(ListSpider, settings(**dns), urls=urls, timeout=30)
    assert len(robots_hits(srv)) == 1 and "authorization" not in asked[0], (describe(srv, 0.0), asked)
    assert {a.path for a in pages(srv)} == {"/a"}  # (Scrapy's duplicate filter takes ROBOTS.test's for Robots.Test's)

    control = arrival_server("127.0.33.22")
    control.route("/robots.txt", Reply.text(RULES))
    dns = {"POLITE_DNS_OVERRIDES": {"robots.test": [control.address]}, "POLITE_HOST_INTERVAL": 0.05}
    spellings[1] = "http://robots.test.:{}"  # (a page with user info is refused: docs/spec.md §1)
    urls = [spelling.format(control.port) + path for spelling in spellings for path in paths]
    await run_crawl(ListSpider, stock(settings(**dns)), urls=urls, timeout=30)
    assert len(robots_hits(control)) > 1


def turn_ahead(tmp_path, host: str, seconds: float) -> str:
    """A SQLite pace table in ``tmp_path`` (its URI) where ``host``'s next turn is ``seconds`` ahead: an interval another
    process booked, not a backoff (nothing is held early; a request of the host waits in line)."""
    from scrapy_polite.policy import HostState

    uri = f"sqlite:///{tmp_path}/pace.sqlite3"
    store = open_store(uri)
    try:
        store.update(host, lambda s, now: (HostState(next_allowed=now + seconds, updated=now), None))
    finally:
        store.close()
    return uri


@pytest_twisted.ensureDeferred
async def test_a_robots_txt_request_the_close_cuts_short_allows_nothing(arrival_server, tmp_path):
    """Review: robots.txt's request waits in the downloader for its host's turn (6 s ahead, not a backoff: nothing is
    held early). The close began during its last second of waiting, so it was dropped as the host came due; the
    dropped request was taken for "no robots.txt" (allow all), and the page it disallows was booked and sent. Now a
    robots.txt request not sent teaches nothing: the page waiting for it is held (the close counts it not crawled),
    nothing reaches the host. (Before the fix this failed when the close fell in that last second: timing-dependent
    as a control, never as a check of the rule.)"""
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor

    srv = arrival_server("127.0.2.101")
    srv.route("/robots.txt", Reply.robots(RULES))
    srv.route("/*", Reply.html("<html><body>ok</body></html>"))
    uri = turn_ahead(tmp_path, "127.0.2.101", 6.0)
    due = time.monotonic() + 6.0

    class ClosingSpider(ListSpider):
        async def start(self):
            close = self.crawler.engine.close_spider_async
            reactor.callLater(max(0.0, due - 0.5 - time.monotonic()), lambda: deferred_from_coro(close(reason="test_close")))
            async for request in super().start():
                yield request

    crawler = await run_crawl(ClosingSpider, settings(POLITE_STORE=uri), urls=[srv.url("/private")], timeout=30)
    assert srv.arrivals() == [], [a.path for a in srv.arrivals()]
    assert crawler.stats.get_value("finish_reason") == "test_close"
    assert crawler.stats.get_value("polite/deferred/not_crawled") == 1, crawler.stats.get_stats()


class FileAfterRobots(scrapy.Spider):
    """A page of host H (its robots.txt asked, waiting for H's turn), then a slow page of host G whose item names a
    file of H: the file comes after the close cut H's robots.txt request short."""

    name = "file_after_robots"

    def __init__(self, h: str, g: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.h, self.g = h, g

    async def start(self):
        yield scrapy.Request(self.h + "/a")
        yield scrapy.Request(self.g + "/slow", callback=self.slow)

    def parse(self, response):
        return None

    def slow(self, response):
        yield {"file_urls": [self.h + "/file.bin"]}


@pytest_twisted.ensureDeferred
async def test_a_request_after_the_close_cut_robots_txt_short_asks_again_and_the_close_ends(arrival_server, tmp_path):
    """Review: the close cut H's robots.txt request short and left its origin ``fetching``; a file of H that came after
    (its page slower than the close) waited for that robots.txt for ever, and so did the close (the crawl never
    ended). The origin's state is put back as it was: the file asks robots.txt again, that request is cut at once, and
    the file is not sent. Nothing reaches H (its turn 8 s ahead)."""
    h, g = arrival_server("127.0.2.111"), arrival_server("127.0.2.112")
    for srv in (h, g):
        srv.route("/robots.txt", Reply.robots(RULES))
    h.route("/*", Reply.html("<html><body>ok</body></html>"))
    g.route("/*", Reply.html("<html><body>ok</body></html>", delay=2.0))
    uri = turn_ahead(tmp_path, "127.0.2.111", 8.0)
    s = settings(POLITE_STORE=uri, CLOSESPIDER_TIMEOUT=2, ITEM_PIPELINES={"scrapy.pipelines.files.FilesPipeline": 1},
                 FILES_STORE=str(tmp_path / "files"))
    crawler = await run_crawl(FileAfterRobots, s, h=h.url(""), g=g.url(""), timeout=25)
    assert crawler.stats.get_value("finish_reason") == "closespider_timeout"
    assert h.arrivals() == [], [a.path for a in h.arrivals()]
    assert crawler.stats.get_value("file_count") is None
