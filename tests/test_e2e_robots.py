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

import socket
import threading
import time
from typing import Any

import pytest
import pytest_twisted
import scrapy
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware

from scrapy_polite.robotstxt import PoliteRobotsTxtMiddleware
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Arrival, ArrivalServer, Reply, RequestInfo, page

#: Lower-bound tolerance (seconds) on server-side gaps: clock granularity only.
TOL = 0.05
RULES = "User-agent: *\nDisallow: /private\n"
BUSY = Reply.html("<html><body><h1>503 Service Unavailable</h1><p>Disallow: /</p></body></html>", status=503)


def settings(**overrides: Any) -> dict[str, Any]:
    """The add-on, robots.txt obeyed, loopback allowed, no per-IP pacing, a 1 s host interval."""
    return polite_settings(**{"ROBOTSTXT_OBEY": True, "POLITE_IP_INTERVAL": 0, **overrides})


def stock(settings_: dict[str, Any]) -> dict[str, Any]:
    """The same crawl with Scrapy's own RobotsTxtMiddleware in place of the add-on's (the negative control)."""
    return {**settings_, "DOWNLOADER_MIDDLEWARES": {PoliteRobotsTxtMiddleware: None, RobotsTxtMiddleware: 100}}


def robots_hits(srv: ArrivalServer) -> list[Arrival]:
    return sorted((a for a in srv.arrivals() if a.path == "/robots.txt"), key=lambda a: a.start)


def pages(srv: ArrivalServer) -> list[Arrival]:
    return sorted((a for a in srv.arrivals() if a.path != "/robots.txt"), key=lambda a: a.start)


def describe(srv: ArrivalServer, t0: float) -> str:
    return ", ".join(f"{a.path} {a.status} @{a.start - t0:.2f}-{a.end - t0:.2f}"
                     for a in sorted(srv.arrivals(), key=lambda a: a.start))


def polite_stats(crawler: Any) -> dict[str, Any]:
    return {k: v for k, v in crawler.stats.get_stats().items() if k.startswith(("polite/", "robotstxt/"))}


def unreachable_for(seconds: float, then: Reply) -> Any:
    """A robots.txt handler: 503 (an HTML page, no Retry-After) until ``seconds`` after its first request, then
    ``then``."""
    first: list[float] = []

    def handler(info: RequestInfo, count: int) -> Reply:
        if not first:
            first.append(info.start)
        return BUSY if info.start - first[0] < seconds else then

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
    t0 = time.time()
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
    stats = polite_stats(crawler)
    assert stats.get("robotstxt/forbidden") == 1, stats
    assert stats.get("polite/robots/unreachable") == 3, stats
    assert stats.get("polite/deferrals/robots_unreachable", 0) >= 4, stats
    assert not stats.get("retry/count"), f"Scrapy retried robots.txt itself: {stats}"
    assert crawler.stats.get_value("finish_reason") == "finished"


@pytest_twisted.ensureDeferred
async def test_negative_control_scrapy_s_own_middleware_reads_the_503_as_allow_all(arrival_server):
    """The same crawl with Scrapy's own RobotsTxtMiddleware: robots.txt asked 3 times (Scrapy's retries, paced by
    the add-on), never again, and every page fetched — ``/private/1`` included — with no robots.txt 200 ever. What
    the test above guards against."""
    srv = arrival_server("127.0.33.2")
    srv.route("/robots.txt", unreachable_for(6.0, Reply.robots(RULES)))
    t0 = time.time()
    await run_crawl(ListSpider, stock(settings(RETRY_ENABLED=True)), urls=[srv.url(p) for p in FOUR], timeout=50)
    log = describe(srv, t0)
    robots = robots_hits(srv)
    assert [a.status for a in robots] == [503, 503, 503], log
    assert sorted(a.path for a in pages(srv)) == sorted(FOUR), log
