"""End-to-end pacing: real Scrapy crawls with ``ADDONS = {"scrapy_polite.Addon": 0}`` against loopback
:class:`~tests.support.server.ArrivalServer` hosts, judged on the *server-side* arrival log (docs/spec.md §2, §5, §6).

Each test models its hosts as distinct 127.0.1.x addresses (the pacing key of an IP-literal URL is the
address). ``POLITE_IP_INTERVAL`` is 0 throughout: these tests are about per-host pacing only.

Timing rule: a lower bound is checked with :data:`TOL` (clock granularity only: the pacer's clock reads
the response's end *after* the server logged it, and the next request reaches the server *after* it was
booked, so a correct pacer can never be early by more than that); an upper bound ("≈", "not more than")
gets the generous :data:`SLACK` for reactor and scheduler latency.
"""

from __future__ import annotations

import email.utils
import json
import os
import subprocess
import sys
import textwrap

import pytest
import pytest_twisted

from scrapy_polite.clock import process_clock
from scrapy_polite.stores import open_store
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.server import Arrival, Reply, always, gaps, page, scripted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Lower-bound tolerance (seconds): clock granularity only.
TOL = 0.02
#: Upper-bound slack (seconds) for "about this long": reactor timers, the scheduler's wake-up, the store thread.
SLACK = 0.6


# ---------------------------------------------------------------------------------------------------
# Helpers


def settings(tmp_path, **overrides):
    """The add-on with a SQLite pace table in ``tmp_path`` (readable after the crawl) and no per-IP pacing."""
    s = polite_settings(POLITE_IP_INTERVAL=0, POLITE_STORE=f"sqlite:///{tmp_path}/pace.sqlite3")
    s.update(overrides)
    return s


def read_row(uri, host):
    """The host's row of the pace table at ``uri`` (a HostState, or None)."""
    store = open_store(uri)
    try:
        return store.get(host)
    finally:
        store.close()


def timeline(srv, exclude_robots=True):
    """The server's arrivals sorted by start (robots.txt left out unless asked)."""
    hits = sorted(srv.arrivals(), key=lambda a: (a.start, a.end))
    if exclude_robots:
        hits = [a for a in hits if a.path != "/robots.txt"]
    return hits


def describe(hits: list[Arrival]) -> str:
    """A readable timeline for assertion messages: path, status, start (relative), gap since previous end."""
    if not hits:
        return "(no arrivals)"
    t0 = hits[0].start
    rows = []
    prev = None
    for a in hits:
        gap = "" if prev is None else f" gap={a.start - prev.end:.3f}"
        rows.append(f"{a.path} {a.status} @+{a.start - t0:.3f}{gap}")
        prev = a
    return "; ".join(rows)


def stat(crawler, key):
    return crawler.stats.get_value(f"polite/{key}")


# ---------------------------------------------------------------------------------------------------
# 1. Per-host spacing, and a negative control that proves the assertion can fail


@pytest_twisted.ensureDeferred
async def test_every_host_spaced_by_interval(arrival_server, tmp_path):
    hosts = [arrival_server(f"127.0.1.{i}") for i in (1, 2, 3)]
    for srv in hosts:
        paths = srv.site(5)  # "/", /p/0 .. /p/4: 6 pages per host
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_HOST_INTERVAL=1.0),
                              urls=[srv.url("/") for srv in hosts], follow=True, timeout=60)
    assert crawler.stats.get_value("finish_reason") == "finished"
    for srv in hosts:
        hits = timeline(srv)
        assert sorted(a.path for a in hits) == sorted(paths), describe(hits)
        g = gaps(hits)
        assert len(g) == 5
        assert min(g) >= 1.0 - TOL, f"{srv.address}: a gap below the 1 s interval: {describe(hits)}"
    # The hosts were paced independently (in parallel), not one after the other. Judged on the servers' log
    # (the crawler's start-up, which load stretches most, left out): each host's first request came before any
    # host's last, and the three together took less than two hosts' 5 s; hosts paced one after the other, or
    # sharing one line, take at least 3 x 5 gaps of >= 1 s (asserted above), 15 s.
    every = [timeline(srv) for srv in hosts]
    assert max(h[0].start for h in every) < min(h[-1].start for h in every), [describe(h) for h in every]
    span = max(h[-1].end for h in every) - min(h[0].start for h in every)
    assert span < 2 * 5 * 1.0, f"the three hosts took {span:.1f} s: {[describe(h) for h in every]}"
    assert stat(crawler, "requests") == 18


@pytest_twisted.ensureDeferred
async def test_negative_control_unpaced_crawl_has_short_gaps(arrival_server, tmp_path):
    """The same crawl with POLITE_ENABLED=False: the spacing assertion above is not vacuous."""
    hosts = [arrival_server(f"127.0.1.{i}") for i in (4, 5, 6)]
    for srv in hosts:
        srv.site(5)
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_ENABLED=False),
                              urls=[srv.url("/") for srv in hosts], follow=True, timeout=60)
    assert crawler.stats.get_value("polite/requests") is None  # the add-on really was off
    all_gaps = [g for srv in hosts for g in gaps(timeline(srv))]
    assert len(all_gaps) == 15
    assert min(all_gaps) < 0.5, f"unpaced crawl unexpectedly spaced: {sorted(all_gaps)}"


# ---------------------------------------------------------------------------------------------------
# 2. Retry-After: delay-seconds and HTTP-date


@pytest_twisted.ensureDeferred
async def test_retry_after_seconds_holds_host(arrival_server, tmp_path):
    srv = arrival_server("127.0.1.10")
    srv.route("/*", scripted(Reply.throttle(429, "3")))
    crawler = await run_crawl(ListSpider, settings(tmp_path), urls=[srv.url(f"/p/{i}") for i in range(3)],
                              timeout=40)
    hits = timeline(srv)
    # The throttled page is retried by the package once its host is due (docs/spec.md §2).
    assert [a.status for a in hits] == [429, 200, 200, 200], describe(hits)
    assert sorted(a.path for a in hits) == ["/p/0", "/p/0", "/p/1", "/p/2"], describe(hits)
    gap = hits[1].start - hits[0].end
    assert gap >= 3.0 - TOL, describe(hits)
    assert gap <= 3.0 + SLACK, f"held far longer than Retry-After: {describe(hits)}"
    assert min(gaps(hits[1:])) >= 1.0 - TOL, describe(hits)
    assert stat(crawler, "retry_after/honoured") == 1
    assert stat(crawler, "throttles/429") == 1
    assert stat(crawler, "throttle/retries") == 1


@pytest_twisted.ensureDeferred
async def test_retry_after_on_two_lines_holds_for_the_longer(arrival_server, tmp_path):
    """A gateway's ``Retry-After: 3`` and the origin's ``1`` on two field lines (review: Scrapy's ``Headers.get`` reads
    the last line only, and the host was held 1 s): the longer wait is honoured."""
    srv = arrival_server("127.0.1.11")
    srv.route("/*", scripted(Reply(429, {"Retry-After": ["3", "1"]}, "slow down")))
    await run_crawl(ListSpider, settings(tmp_path), urls=[srv.url("/p/0")], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 200], describe(hits)
    assert hits[1].start - hits[0].end >= 3.0 - TOL, describe(hits)


@pytest_twisted.ensureDeferred
async def test_retry_after_http_date_relative_to_date_header(arrival_server, tmp_path):
    """Retry-After = Date + 3 s. The server's clock is 100 s *behind* ours, so only a parser that takes the
    date relative to the response's Date header (RFC 9110 §10.2.3) gets 3 s; one that used the local clock
    would see a date 97 s in the past and not hold at all (gap ≈ the 1 s interval)."""
    srv = arrival_server("127.0.1.11")

    def dated(info, count):
        server_now = int(process_clock()) - 100
        return Reply(429, {"Content-Type": "text/plain",
                           # BaseHTTPRequestHandler also sends its own Date (our clock) first; Scrapy's
                           # Headers.get() returns the last value, which is this one.
                           "Date": email.utils.formatdate(server_now, usegmt=True),
                           "Retry-After": email.utils.formatdate(server_now + 3, usegmt=True)}, "slow down")

    srv.route("/*", scripted(dated))
    crawler = await run_crawl(ListSpider, settings(tmp_path), urls=[srv.url(f"/p/{i}") for i in range(2)],
                              timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 200, 200], describe(hits)  # the throttled page retried last
    gap = hits[1].start - hits[0].end
    assert gap >= 3.0 - TOL, describe(hits)
    assert gap <= 3.0 + SLACK, describe(hits)
    assert stat(crawler, "retry_after/honoured") == 1
    assert not stat(crawler, "retry_after/invalid")


# ---------------------------------------------------------------------------------------------------
# 3. Repeated 503 (Scrapy #6458: a sitemap answering 503 again and again, retried by RetryMiddleware)


@pytest_twisted.ensureDeferred
async def test_repeated_503_doubles_up_to_cap_and_a_200_takes_one_step_off(arrival_server, tmp_path):
    """interval 0.5, cap 2. Host A: /sitemap.xml 503 ×4 then 200 (the package retries it): gaps 0.5, 1, 2,
    then 2 (the cap); no step past the cap (docs/spec.md §2, "No dead steps"): the third and fourth 503 find
    0.5 × 2² = 2 at the cap and add none, so consec 2, and the 200 leaves 2 - 1 = 1. Host B: 503, 503, 200, 200, 200: gaps 0.5, 1, then 1
    (the 200 took one step off: consec 2 → 1 → backoff 0.5×2; an erased backoff would give 0.5, an
    unchanged one 2), then 0.5 (consec 0); table consec 0."""
    a = arrival_server("127.0.1.20")
    b = arrival_server("127.0.1.21")
    a.route("/*", scripted(*[Reply.throttle(503)] * 4))
    b.route("/*", scripted(Reply.throttle(503), Reply.throttle(503)))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=0.5, POLITE_MAX_BACKOFF=2.0,
                 RETRY_ENABLED=True, RETRY_TIMES=4)
    crawler = await run_crawl(ListSpider, s, urls=[a.url("/sitemap.xml"), b.url("/sitemap.xml"), b.url("/p/0"),
                                                    b.url("/p/1")], timeout=60)
    ha, hb = timeline(a), timeline(b)
    assert [x.status for x in ha] == [503, 503, 503, 503, 200], describe(ha)
    assert {x.path for x in ha} == {"/sitemap.xml"}
    assert [x.status for x in hb] == [503, 503, 200, 200, 200], describe(hb)
    for hits, expected in ((ha, [0.5, 1.0, 2.0, 2.0]), (hb, [0.5, 1.0, 1.0, 0.5])):
        got = gaps(hits)
        for g, e in zip(got, expected):
            assert e - TOL <= g <= e + SLACK, f"gaps {[round(x, 3) for x in got]}, expected ≈ {expected}: {describe(hits)}"
    uri = s["POLITE_STORE"]
    assert read_row(uri, a.address).consec == 1
    assert read_row(uri, b.address).consec == 0
    assert stat(crawler, "throttles/503") == 6
    assert stat(crawler, "backoff_steps") == 4  # A's 2 (two 503s at the cap took none) and B's 2
    assert stat(crawler, "throttle/retries") == 6
    assert not crawler.stats.get_value("retry/count")  # RETRY_TIMES is left for real failures


# ---------------------------------------------------------------------------------------------------
# 4. 403: a rate limit in disguise after a 2xx, a refusal otherwise


@pytest_twisted.ensureDeferred
async def test_403_after_2xx_backs_off_403_from_never_served_host_does_not(arrival_server, tmp_path):
    """Host A: 200, 403 → consec 1, ok_seen, delay = the interval (the first throttle step is ``eff × 2**0``,
    docs/spec.md §2 and the gate's "403 AFTER a 2xx -> throttled base*1"). Host B: 200, 403, 403, 200 → the second
    403 doubles: gaps ≈ 1, 1, 2. Host C never served us: 403, 403, 403 → not a throttle: gaps ≈ 1, consec 0."""
    a = arrival_server("127.0.1.30")
    b = arrival_server("127.0.1.31")
    c = arrival_server("127.0.1.32")
    a.route("/*", scripted(page(), Reply.throttle(403, body="forbidden")))
    b.route("/*", scripted(page(), Reply.throttle(403, body="forbidden"), Reply.throttle(403, body="forbidden")))
    c.route("/*", Reply.throttle(403, body="forbidden"))
    # Each URL once (the package's retries of throttled pages are tested in test_e2e_throttle_retries.py).
    s = settings(tmp_path, POLITE_HOST_INTERVAL=1.0, POLITE_THROTTLE_RETRIES=0)
    urls = [a.url(f"/p/{i}") for i in range(2)] + [b.url(f"/p/{i}") for i in range(4)] + \
        [c.url(f"/p/{i}") for i in range(3)]
    crawler = await run_crawl(ListSpider, s, urls=urls, timeout=60)
    ha, hb, hc = timeline(a), timeline(b), timeline(c)
    assert [x.status for x in ha] == [200, 403], describe(ha)
    assert [x.status for x in hb] == [200, 403, 403, 200], describe(hb)
    assert [x.status for x in hc] == [403, 403, 403], describe(hc)
    uri = s["POLITE_STORE"]
    ra, rb, rc = read_row(uri, a.address), read_row(uri, b.address), read_row(uri, c.address)
    # A: one throttle step, held for the interval after the 403.
    assert ra.consec == 1 and ra.ok_seen
    assert abs((ra.next_allowed - ra.throttled_at) - 1.0) < 1e-6
    assert ra.throttled_at >= ha[1].end - TOL
    # B: the backoff grows on the second 403.
    gb = gaps(hb)
    assert gb[0] >= 1.0 - TOL and gb[1] >= 1.0 - TOL, describe(hb)
    assert 2.0 - TOL <= gb[2] <= 2.0 + SLACK, describe(hb)
    assert rb.consec == 1  # 2 throttles, then one 200 took one step off
    # C: a refusal, not a rate limit: no backoff at all.
    assert rc.consec == 0 and not rc.ok_seen
    for g in gaps(hc):
        assert 1.0 - TOL <= g <= 1.0 + SLACK, describe(hc)
    assert stat(crawler, "throttles/403") == 3


# ---------------------------------------------------------------------------------------------------
# 5. robots.txt Crawl-delay


@pytest_twisted.ensureDeferred
async def test_robots_crawl_delay_adopted_and_only_slows(arrival_server, tmp_path):
    """Host A publishes Crawl-delay: 2 → every gap ≥ 2 s. Host B publishes Crawl-delay: 0.5 with a 1 s interval
    → gaps ≥ 1 s (a published delay only ever slows us down)."""
    a = arrival_server("127.0.1.40")
    b = arrival_server("127.0.1.41")
    a.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 2\n"))
    b.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 0.5\n"))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=1.0, ROBOTSTXT_OBEY=True)
    crawler = await run_crawl(ListSpider, s, urls=[a.url(f"/p/{i}") for i in range(3)] +
                              [b.url(f"/p/{i}") for i in range(3)], timeout=60)
    ha, hb = timeline(a), timeline(b)
    assert len(ha) == 3 and len(hb) == 3
    assert a.hits("/robots.txt") == 1 and b.hits("/robots.txt") == 1
    assert min(gaps(ha)) >= 2.0 - TOL, describe(ha)
    assert min(gaps(hb)) >= 1.0 - TOL, describe(hb)
    uri = s["POLITE_STORE"]
    assert read_row(uri, a.address).crawl_delay == 2.0
    assert read_row(uri, b.address).crawl_delay == 0.5
    assert stat(crawler, "crawl_delay/adopted") == 2


@pytest_twisted.ensureDeferred
async def test_robots_crawl_delay_applies_from_the_robots_fetch(arrival_server, tmp_path):
    """robots.txt is a request to the host too: the Crawl-delay it publishes is known (parsed and recorded)
    before the first page is booked, so the first page must not follow robots.txt sooner than the delay
    (docs/spec.md §3 invariant: ``start2 >= end1 + delay``; eff = max(interval, crawl_delay))."""
    srv = arrival_server("127.0.1.42")
    srv.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 2\n"))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=1.0, ROBOTSTXT_OBEY=True)
    await run_crawl(ListSpider, s, urls=[srv.url("/p/0")], timeout=40)
    hits = timeline(srv, exclude_robots=False)
    assert [a.path for a in hits] == ["/robots.txt", "/p/0"], describe(hits)
    assert hits[1].start - hits[0].end >= 2.0 - TOL, describe(hits)


# ---------------------------------------------------------------------------------------------------
# 6. A success after throttles decays one step


@pytest_twisted.ensureDeferred
async def test_success_after_throttles_decays_one_step(arrival_server, tmp_path):
    """429, 429, 200 with interval 0.5: consec 1 → 2, then the 200 takes it to 1 (not 0), and the host stays
    backed off one step: next_allowed = end + 0.5 × 2."""
    srv = arrival_server("127.0.1.50")
    srv.route("/*", scripted(Reply.throttle(429), Reply.throttle(429)))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=0.5, POLITE_THROTTLE_RETRIES=0)  # each URL once
    crawler = await run_crawl(ListSpider, s, urls=[srv.url(f"/p/{i}") for i in range(3)], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 429, 200], describe(hits)
    g = gaps(hits)
    assert 0.5 - TOL <= g[0] <= 0.5 + SLACK and 1.0 - TOL <= g[1] <= 1.0 + SLACK, describe(hits)
    row = read_row(s["POLITE_STORE"], srv.address)
    assert row.consec == 1
    assert abs((row.next_allowed - row.updated) - 1.0) < 1e-6
    assert row.updated >= hits[2].end - TOL
    assert stat(crawler, "backoff_steps") == 2


# ---------------------------------------------------------------------------------------------------
# 7. The pace table survives a process restart


FIRST_CRAWL = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from scrapy.crawler import CrawlerProcess
    from tests.support.crawl import TEST_SETTINGS, ListSpider, polite_settings

    url, store, out = sys.argv[1:4]
    # The first process ends on the 429 (no throttle retry): the second must find the hold in the table.
    process = CrawlerProcess({{**TEST_SETTINGS, **polite_settings(POLITE_IP_INTERVAL=0, POLITE_STORE=store,
                                                                  POLITE_THROTTLE_RETRIES=0)}})
    crawler = process.create_crawler(ListSpider)
    process.crawl(crawler, urls=[url])
    process.start()
    stats = {{k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, float, str))}}
    with open(out, "w") as f:
        json.dump(stats, f)
""")


@pytest_twisted.ensureDeferred
async def test_backoff_survives_process_restart(arrival_server, tmp_path):
    from twisted.internet import threads

    srv = arrival_server("127.0.1.60")
    srv.route("/*", scripted(Reply.throttle(429, "6")))
    store = f"sqlite:///{tmp_path}/pace.sqlite3"
    script = tmp_path / "first_crawl.py"
    script.write_text(FIRST_CRAWL.format(root=ROOT))
    out = tmp_path / "stats.json"
    proc = await threads.deferToThread(
        subprocess.run, [sys.executable, str(script), srv.url("/first"), store, str(out)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first_stats = json.loads(out.read_text())
    assert first_stats.get("polite/throttles/429") == 1, first_stats
    (first,) = timeline(srv)
    assert first.status == 429
    hold_end = first.end + 6.0
    row = read_row(store, srv.address)
    assert row is not None and row.consec == 1
    assert abs((row.next_allowed - row.throttled_at) - 6.0) < 1e-6

    asked_at = process_clock()
    assert asked_at < hold_end - 1.0, "the first crawl took too long for this test to mean anything"
    crawler = await run_crawl(ListSpider, settings(tmp_path, POLITE_STORE=store), urls=[srv.url("/second")],
                              timeout=40)
    hits = timeline(srv)
    assert [a.path for a in hits] == ["/first", "/second"], describe(hits)
    second = hits[1]
    assert second.status == 200
    assert second.start >= hold_end - TOL, (
        f"second process requested {hold_end - second.start:.3f} s before the persisted hold ended: {describe(hits)}")
    assert second.start <= hold_end + SLACK + 0.5, describe(hits)
    assert crawler.stats.get_value("finish_reason") == "finished"


# ---------------------------------------------------------------------------------------------------
# 8. Public bug reports


@pytest_twisted.ensureDeferred
async def test_lowercase_retry_after_with_retry_middleware(arrival_server, tmp_path):
    """Scrapy #3849: RetryMiddleware retries a 429 at once, ignoring Retry-After. With the add-on the package
    retries it itself, only after the hold (``retry-after: 7``, header name in lower case), and RetryMiddleware's
    budget is untouched."""
    srv = arrival_server("127.0.1.70")
    srv.route("/*", scripted(Reply(429, {"content-type": "text/plain", "retry-after": "7"}, "slow down")))
    crawler = await run_crawl(ListSpider, settings(tmp_path, RETRY_ENABLED=True), urls=[srv.url("/api")],
                              timeout=40)
    hits = timeline(srv)
    assert [(a.path, a.status) for a in hits] == [("/api", 429), ("/api", 200)], describe(hits)
    gap = hits[1].start - hits[0].end
    assert gap >= 7.0 - TOL, describe(hits)
    assert gap <= 7.0 + SLACK, describe(hits)
    assert stat(crawler, "throttle/retries") == 1
    assert not crawler.stats.get_value("retry/count")
    assert stat(crawler, "retry_after/honoured") == 1
    assert crawler.spider.statuses() == [200]


async def throttled_once(arrival_server, tmp_path, address, retry_after):
    """Two pages of one host, the first answered 429 with ``Retry-After: retry_after`` (its text), then 200s:
    the crawler, the arrivals (the throttled page retried last: 429, 200, 200) and the host's row as it stood
    when the second request came."""
    srv = arrival_server(address)
    s = settings(tmp_path)
    rows = []

    def second(info, count):  # the table as it stood when the next request came
        rows.append(read_row(s["POLITE_STORE"], srv.address))
        return page()

    srv.route("/*", scripted(Reply.throttle(429, retry_after), second))
    crawler = await run_crawl(ListSpider, s, urls=[srv.url("/p/0"), srv.url("/p/1")], timeout=40)
    hits = timeline(srv)
    assert [a.status for a in hits] == [429, 200, 200], describe(hits)  # the throttled page retried last
    return crawler, hits, rows


@pytest_twisted.ensureDeferred
async def test_negative_retry_after_is_invalid_and_ordinary_backoff_applies(arrival_server, tmp_path):
    crawler, hits, rows = await throttled_once(arrival_server, tmp_path, "127.0.1.71", "-5")
    assert stat(crawler, "retry_after/invalid") == 1
    assert not stat(crawler, "retry_after/honoured")
    gap = hits[1].start - hits[0].end
    assert 1.0 - TOL <= gap <= 1.0 + SLACK, describe(hits)  # the first backoff step is the interval
    assert rows and rows[0].consec == 1
    assert stat(crawler, "backoff_steps") == 1


@pytest_twisted.ensureDeferred
async def test_past_http_date_retry_after_is_one_plain_throttle_step(arrival_server, tmp_path):
    crawler, hits, rows = await throttled_once(arrival_server, tmp_path, "127.0.1.72", "Wed, 21 Oct 2015 07:28:00 GMT")
    gap = hits[1].start - hits[0].end
    assert 1.0 - TOL <= gap <= 2.0, describe(hits)
    assert rows and rows[0].consec == 1
    assert not stat(crawler, "retry_after/invalid")  # a past date is valid: it means "now"


@pytest_twisted.ensureDeferred
async def test_decimal_retry_after_kept_exactly_and_spider_closes_deferred(arrival_server, tmp_path):
    srv = arrival_server("127.0.1.73")
    srv.route("/*", scripted(Reply.throttle(429, "299.997")))
    s = settings(tmp_path, POLITE_MAX_IDLE_WAIT=1.0)
    crawler = await run_crawl(ListSpider, s, urls=[srv.url("/p/0"), srv.url("/p/1")], timeout=40)
    closed = process_clock()
    assert crawler.stats.get_value("finish_reason") == "polite_deferred"
    hits = timeline(srv)
    assert [a.status for a in hits] == [429], describe(hits)
    # Closed instead of waiting out the 300 s hold: timed from the 429's end (the crawler's start-up, which
    # load stretches, left out); 20 s is a fifteenth of what the bug costs, several idle checks' worth.
    assert closed - hits[0].end < 20, f"closed {closed - hits[0].end:.1f} s after the 429"
    row = read_row(s["POLITE_STORE"], srv.address)
    assert row.consec == 1
    assert abs((row.next_allowed - row.throttled_at) - 299.997) < 1e-6, row
    assert hits[0].end - TOL <= row.throttled_at <= hits[0].end + 1.0
    assert stat(crawler, "deferred/not_crawled") == 2  # the other page, and the throttled one's retry
    assert stat(crawler, "retry_after/honoured") == 1


@pytest_twisted.ensureDeferred
async def test_robots_crawl_delay_10_beats_1s_interval(arrival_server, tmp_path):
    srv = arrival_server("127.0.1.74")
    srv.route("/robots.txt", Reply.robots("User-agent: *\nCrawl-delay: 10\n"))
    s = settings(tmp_path, POLITE_HOST_INTERVAL=1.0, ROBOTSTXT_OBEY=True)
    crawler = await run_crawl(ListSpider, s, urls=[srv.url("/p/0"), srv.url("/p/1")], timeout=60)
    hits = timeline(srv)
    assert len(hits) == 2, describe(hits)
    assert hits[1].start - hits[0].end >= 10.0 - TOL, describe(hits)
    assert stat(crawler, "crawl_delay/adopted") == 1


# ---------------------------------------------------------------------------------------------------
# memory:// is the process's table


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("second", ["memory://", "sqlite"], ids=["both-memory", "control-two-tables"])
async def test_two_crawls_of_one_process_on_memory_share_its_table(arrival_server, tmp_path, second):
    """Trial: two spiders of one ``CrawlerProcess`` on ``memory://`` each had a table of their own, and a slow host
    (0.3 s answers, interval 0.5 s) had two requests in flight at once (gaps of -0.5 s). The crawls of a process share
    its ``memory://`` table, as processes share a SQLite file: from the server's log, no gap below the interval. The
    control: the second crawl on a table of its own overlaps the first."""
    from twisted.internet.defer import Deferred, DeferredList

    srv = arrival_server("127.0.3.30")
    srv.route("/*", always(Reply.html("<p>slow</p>", delay=0.3)))
    uris = ["memory://", "memory://" if second == "memory://" else f"sqlite:///{tmp_path}/pace.sqlite3"]
    crawls = [run_crawl(ListSpider, settings(tmp_path, POLITE_STORE=uri, POLITE_HOST_INTERVAL=0.5),
                        urls=[srv.url(f"/{k}/{i}") for i in range(5)], timeout=90) for k, uri in enumerate(uris)]
    await DeferredList([Deferred.fromCoroutine(c) for c in crawls], fireOnOneErrback=True, consumeErrors=True)
    hits = timeline(srv)
    assert len(hits) == 10, describe(hits)
    if second == "memory://":
        assert min(gaps(hits)) >= 0.5 - TOL, describe(hits)
    else:
        assert min(gaps(hits)) < 0, describe(hits)
