"""End-to-end regression tests for the defects a review demonstrated (and the review fixes repaired): each
test runs a real Scrapy crawl against loopback :class:`~tests.support.server.ArrivalServer` hosts and asserts
the *fixed* behaviour.

* download failures (refused connection, timeout) count as a throttle; a DNS failure does not;
* a spider whose ``start()`` awaits between yields is not closed early while a host is held;
* a deferred request that cannot be saved under ``JOBDIR`` does not lose the others nor the inner
  scheduler's state;
* a per-host delay above ``POLITE_MAX_WAIT`` defers instead of waiting in line;
* a robots.txt answered 5xx keeps the recorded Crawl-delay (a 4xx clears it), and holds the page;
* hosts still throttled from an earlier run do not stall a healthy host when ``ROBOTSTXT_OBEY`` is on;
* ``POLITE_MAX_WAIT = 0`` is refused at start;
* a downloader middleware after the add-on's is named in a start-up warning.

Every host is its own 127.0.4.x address (the pacing key of an IP-literal URL is the address); the per-IP
interval is 0 throughout. Each docstring says how the test fails when the defect comes back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

import pytest
import pytest_twisted
import scrapy
from scrapy import Request
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.utils.defer import deferred_from_coro

from scrapy_polite.clock import process_clock
from scrapy_polite.crawl.held import read_held
from scrapy_polite.policy import HostState
from scrapy_polite.robotstxt import PoliteRobotsTxtMiddleware
from scrapy_polite.settings import SettingsError
from scrapy_polite.stores import open_store
from tests.support.crawl import CrawlTimeout, ListSpider, polite_settings, run_crawl
from tests.support.server import Reply, gaps, page

#: Lower-bound tolerance (seconds): clock granularity only.
TOL = 0.02


# ---------------------------------------------------------------------------------------------------
# Helpers


def settings(**overrides: Any) -> dict[str, Any]:
    """The add-on, loopback allowed, no per-IP pacing."""
    return polite_settings(**{"POLITE_IP_INTERVAL": 0, **overrides})


def sqlite_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/pace.sqlite3"


def seed(uri: str, rows: dict[str, HostState]) -> None:
    """Write ``rows`` into the pace table at ``uri`` (as an earlier run would have left them)."""
    store = open_store(uri)
    try:
        for host, state in rows.items():
            store.update(host, lambda _old, _now, state=state: (state, None))
    finally:
        store.close()


def row(uri: str, host: str) -> HostState | None:
    store = open_store(uri)
    try:
        return store.get(host)
    finally:
        store.close()


def hits(srv) -> list:
    """The server's arrivals without robots.txt, by start time."""
    return sorted((a for a in srv.arrivals() if a.path != "/robots.txt"), key=lambda a: a.start)


def polite_stats(crawler) -> dict[str, Any]:
    return {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("polite/")}


def closed_port(address: str, kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A port on ``address`` (TCP, or UDP with ``kind=socket.SOCK_DGRAM``) that nothing listens on (bound, then
    closed)."""
    s = socket.socket(socket.AF_INET, kind)
    s.bind((address, 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


class SilentServer:
    """Accepts TCP connections on a loopback address and never answers (a download timeout)."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._loop, daemon=True, name=f"SilentServer-{address}").start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        """Keep the connection open, never answering (a subclass may answer)."""
        self.conns.append(conn)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


# ---------------------------------------------------------------------------------------------------
# 1. Download failures count as throttles; DNS failures do not


@pytest_twisted.ensureDeferred
async def test_refused_connection_and_timeout_count_as_throttles(tmp_path):
    """A refused connection (127.0.4.1) and a download timeout (127.0.4.2, a server that accepts and never
    answers) are server-side failures: each counts as a throttle without Retry-After (docs/spec.md §2), so each
    host's row has ``consec >= 1`` and ``polite/throttles/failure`` counts them.

    Fails when Scrapy's wrapped download errors (``DownloadConnectionRefusedError``,
    ``DownloadTimeoutError``, Scrapy >= 2.17) are not recognised as server-side failures: then no row has
    a backoff step and the stat is missing."""
    refused_port = closed_port("127.0.4.1")
    silent = SilentServer("127.0.4.2")
    uri = sqlite_uri(tmp_path)
    try:
        crawler = await run_crawl(
            ListSpider, settings(POLITE_STORE=uri, DOWNLOAD_TIMEOUT=1),
            urls=[f"http://127.0.4.1:{refused_port}/refused", f"http://127.0.4.2:{silent.port}/timeout"],
            timeout=30)
    finally:
        silent.close()
    failed = {f.url.rsplit("/", 1)[1]: f.error for f in crawler.spider.failed}
    assert set(failed) == {"refused", "timeout"}, f"both requests should have failed without a response: {failed}"
    for host, kind in (("127.0.4.1", "refused connection"), ("127.0.4.2", "download timeout")):
        state = row(uri, host)
        assert state is not None and state.consec >= 1, (
            f"a {kind} ({failed}) must count as a throttle without Retry-After: row of {host} = {state}")
    throttles = crawler.stats.get_value("polite/throttles/failure")
    assert throttles is not None and throttles >= 2, (
        f"polite/throttles/failure should count both failures, got {throttles}; stats {polite_stats(crawler)}")


@pytest_twisted.ensureDeferred
async def test_dns_failure_does_not_touch_the_backoff(tmp_path):
    """A name with no DNS override, resolved through a nameserver that does not exist (a closed UDP port on
    127.0.4.3), fails before any connection: a DNS failure never touches the host's backoff (docs/spec.md §2), so
    the host has no row, or one with ``consec == 0``, and ``polite/throttles/failure`` is not counted.

    Guards against an over-broad fix: it passed before the review fixes too, and fails when DNS failures
    (Twisted's ``DNSLookupError`` family, which the resolver's ``DNSTimeout`` belongs to, or Scrapy's
    ``CannotResolveHostError``) are counted as server-side failures: the row then has ``consec == 1``
    (checked by adding ``DNSLookupError`` to the pacer's server-side failures)."""
    ns = f"127.0.4.3:{closed_port('127.0.4.3', socket.SOCK_DGRAM)}"
    uri = sqlite_uri(tmp_path)
    crawler = await run_crawl(
        ListSpider, settings(POLITE_STORE=uri, POLITE_DNS_NAMESERVERS=[ns], POLITE_DNS_TIMEOUT=0.5,
                             POLITE_DNS_OVERRIDES={}),
        urls=["http://nowhere.test/x"], timeout=30)
    failed = [(f.error, f.message) for f in crawler.spider.failed]
    dns_errors = {"DNSTimeout", "DNSServerFailure", "HostNotFound", "DNSLookupError", "CannotResolveHostError"}
    assert len(failed) == 1 and failed[0][0] in dns_errors and not crawler.spider.fetched, (
        f"the request should have failed with a DNS error: {failed}")
    state = row(uri, "nowhere.test")
    assert state is None or state.consec == 0, (
        f"a DNS failure ({failed}) must not take a backoff step: row of nowhere.test = {state}")
    assert not crawler.stats.get_value("polite/throttles/failure"), (
        f"a DNS failure was counted as a throttle: {polite_stats(crawler)}")


# ---------------------------------------------------------------------------------------------------
# 2. A spider whose start() awaits is not closed early


class PausingStartSpider(scrapy.Spider):
    """Yields one request to the throttled host, then three to the healthy one, awaiting between yields
    (start URLs read from a queue or an API)."""

    name = "pausing_start"

    def __init__(self, throttled: str, healthy: str, pause: float, **kw: Any):
        super().__init__(**kw)
        self.throttled, self.healthy, self.pause = throttled, healthy, pause
        self.got: list[str] = []

    async def start(self):
        yield Request(self.throttled + "/x", callback=self.parse)
        for i in range(3):
            if self.pause:
                await asyncio.sleep(self.pause)
            yield Request(self.healthy + f"/y{i}", callback=self.parse)

    def parse(self, response):
        self.got.append(response.url)


@pytest.mark.parametrize("pause", [0, 0.3], ids=["no-pause", "pause-0.3s"])
@pytest_twisted.ensureDeferred
async def test_start_that_awaits_is_not_closed_early(arrival_server, tmp_path, pause):
    """Host 127.0.4.10 is throttled (from an earlier run) far beyond ``POLITE_MAX_IDLE_WAIT``; its request is
    held. While ``start()`` awaits before its next yield, nothing else is pending, but the spider must stay
    open: all three requests to 127.0.4.11 are fetched; only then may it close (``polite_deferred``).

    Fails when the scheduler closes the spider as soon as only held requests remain, without waiting for
    ``start()`` to finish (the pre-fix ``_maybe_close_idle``): with a 0.3 s pause no healthy page arrived.
    The no-pause variant is a control (it passed before the fix too): it fails if held requests close the
    spider before ``start()`` is exhausted even when it never awaits."""
    throttled = arrival_server("127.0.4.10")
    healthy = arrival_server("127.0.4.11")
    for srv in (throttled, healthy):
        srv.route("/*", page())
    uri = sqlite_uri(tmp_path)
    now = process_clock()
    seed(uri, {"127.0.4.10": HostState(next_allowed=now + 1000, consec=1, throttled_at=now, updated=now)})
    crawler = await run_crawl(
        PausingStartSpider, settings(POLITE_STORE=uri, POLITE_HOST_INTERVAL=0.2, POLITE_MAX_IDLE_WAIT=5),
        throttled=throttled.url("").rstrip("/"), healthy=healthy.url("").rstrip("/"), pause=pause, timeout=30)
    reason = crawler.stats.get_value("finish_reason")
    got = sorted(u.rsplit("/", 1)[1] for u in crawler.spider.got)
    assert got == ["y0", "y1", "y2"], (
        f"every start request of the healthy host must be fetched (pause {pause} s between yields); "
        f"got {got}, finish_reason {reason!r}")
    assert hits(throttled) == [], "the throttled host must not be requested before it is due"
    assert reason == "polite_deferred", f"then the spider closes with the held request: {reason!r}"


# ---------------------------------------------------------------------------------------------------
# 3. JOBDIR: one unserialisable deferred request does not lose the others


def plain_callback(response):
    """A module-level function: a valid Scrapy callback, but ``Request.to_dict`` cannot serialise it."""


class JobdirSpider(scrapy.Spider):
    name = "jobdir"

    def __init__(self, base: str, **kw: Any):
        super().__init__(**kw)
        self.base = base

    async def start(self):
        yield Request(self.base + "/first", callback=self.parse)
        for i in range(3):
            yield Request(self.base + f"/m/{i}", callback=self.parse)
        yield Request(self.base + "/fn", callback=plain_callback)
        for i in range(3):
            yield Request(self.base + f"/n/{i}", callback=self.parse)

    def parse(self, response):
        pass


#: Every path JobdirSpider requests.
JOBDIR_PATHS = {"/first", "/fn"} | {f"/m/{i}" for i in range(3)} | {f"/n/{i}" for i in range(3)}


@pytest_twisted.ensureDeferred
async def test_jobdir_unserialisable_deferred_request_is_skipped(arrival_server, tmp_path, caplog):
    """The first response of 127.0.4.20 is a 429 with ``Retry-After: 600``: every other request is deferred,
    and the spider closes (``POLITE_MAX_IDLE_WAIT=1``). At close, the deferred request whose callback is a
    module-level function cannot be saved: it is logged (ERROR naming it) and counted in
    ``polite/deferred/not_saved``; every other deferred request is saved (``polite/deferred/saved`` and the
    file's rows); the inner scheduler still closes (``JOBDIR/requests.queue/active.json`` is written).

    Fails when one unserialisable request makes the save raise: nothing is saved and the inner scheduler's
    close never runs (no ``active.json``)."""
    srv = arrival_server("127.0.4.20")
    calls = [0]
    lock = threading.Lock()

    def handler(info, count):
        with lock:
            calls[0] += 1
            first = calls[0] == 1
        return Reply.throttle(429, "600") if first else page()

    srv.route("/*", handler)
    jobdir = tmp_path / "job"
    caplog.set_level(logging.INFO)
    crawler = await run_crawl(
        JobdirSpider, settings(JOBDIR=str(jobdir), POLITE_MAX_IDLE_WAIT=1.0, CONCURRENT_REQUESTS=1),
        base=srv.url("").rstrip("/"), timeout=30)
    stats = polite_stats(crawler)
    arrived = {a.path for a in hits(srv)}
    throttled = {a.path for a in hits(srv) if a.status == 429}  # held for its throttle retry, saved too
    held = (JOBDIR_PATHS - arrived) | throttled
    assert "/fn" in held and len(held) >= 2, (
        f"the test needs /fn and at least one other request deferred; arrived {sorted(arrived)}")
    assert stats.get("polite/deferred/not_saved") == 1, f"the /fn request should be counted as not saved: {stats}"
    unsaved_logs = [r.getMessage() for r in caplog.records
                    if r.levelno >= logging.ERROR and "cannot save deferred" in r.getMessage()]
    assert len(unsaved_logs) == 1 and "/fn" in unsaved_logs[0], f"the unsaved request must be logged: {unsaved_logs}"
    crashed = [r.getMessage() for r in caplog.records if "could not save the deferred requests" in r.getMessage()]
    assert not crashed, f"saving must not fail as a whole: {crashed}"
    others = held - {"/fn"}
    assert stats.get("polite/deferred/saved") == len(others), (
        f"the {len(others)} other deferred requests must be saved: {stats}")
    saved_paths = {"/" + request["url"].split("/", 3)[3] for _, _, request in read_held(str(jobdir))}
    assert saved_paths == others, f"saved {sorted(saved_paths)}, expected {sorted(others)}"
    assert (jobdir / "requests.queue" / "active.json").exists(), (
        f"the inner scheduler did not close (no JOBDIR/requests.queue/active.json): "
        f"{sorted(p.name for p in jobdir.rglob('*'))}")


# ---------------------------------------------------------------------------------------------------
# 4. An override above POLITE_MAX_WAIT defers


@pytest_twisted.ensureDeferred
async def test_host_delay_above_max_wait_defers(arrival_server):
    """``POLITE_HOST_DELAYS`` gives 127.0.4.30 a 3 s interval, above ``POLITE_MAX_WAIT=1``: no in-line wait
    can honour it, so the requests wait out of the downloader (no ``polite/waits``, docs/spec.md §2: a crawl delay
    "from robots.txt or an override") and still arrive at least 3 s apart.

    Fails when the deferral predicate only looks at the robots.txt delay: the requests then wait in line in
    1 s chunks (``polite/waits`` grows) and no ``crawl_delay`` deferral is counted."""
    srv = arrival_server("127.0.4.30")
    srv.route("/*", page())
    crawler = await run_crawl(
        ListSpider, settings(POLITE_MAX_WAIT=1.0, POLITE_HOST_DELAYS={"127.0.4.30": 3.0}),
        urls=[srv.url(f"/p/{i}") for i in range(3)], timeout=30)
    stats = polite_stats(crawler)
    timeline = hits(srv)
    assert len(timeline) == 3, f"all three pages must be fetched: {[a.path for a in timeline]}"
    # Out of the downloader, not in line: deferred for the delay, or held for the host's line and handed out when
    # the recorded row allows (docs/spec.md §5), which then needs no deferral for the delay; either way no wait.
    assert not stats.get("polite/waits") and (stats.get("polite/deferrals/crawl_delay") or 0) + (
        stats.get("polite/deferrals/line") or 0) > 0, (
        f"a 3 s host delay above a 1 s POLITE_MAX_WAIT must defer, not wait in line: {stats}")
    got = gaps(timeline)
    assert min(got) >= 3.0 - TOL, f"the 3 s host delay must still be honoured: gaps {got}"


# ---------------------------------------------------------------------------------------------------
# 5. An unreachable robots.txt keeps the recorded Crawl-delay


async def _crawl_with_robots(srv, tmp_path, robots: Reply, *, pages: int):
    srv.route("/robots.txt", robots)
    srv.route("/*", page())
    uri = sqlite_uri(tmp_path)
    now = process_clock()
    seed(uri, {srv.address: HostState(crawl_delay=5.0, ok_seen=True, updated=now)})
    # POLITE_MAX_IDLE_WAIT=2: a page held for an unreachable robots.txt (asked again 5 s later) ends the crawl.
    crawler = await run_crawl(ListSpider, settings(POLITE_STORE=uri, ROBOTSTXT_OBEY=True, POLITE_MAX_IDLE_WAIT=2),
                              urls=[srv.url("/a")], timeout=30)
    assert srv.hits("/robots.txt") == 1 and len(hits(srv)) == pages, f"unexpected arrivals: {srv.arrivals()}"
    return crawler, row(uri, srv.address)


@pytest_twisted.ensureDeferred
async def test_robots_503_keeps_recorded_crawl_delay(arrival_server, tmp_path):
    """127.0.4.40 published ``Crawl-delay: 5`` in an earlier run (pre-seeded row); now its robots.txt answers
    503. An unreachable robots.txt says nothing new (RFC 9309 §2.3.1.4): the recorded delay stays 5 and
    ``polite/robots/unreachable == 1``; the page is held (everything is disallowed until robots.txt answers,
    tests/test_e2e_robots.py), and with robots.txt due again beyond ``POLITE_MAX_IDLE_WAIT`` the crawl ends.

    Fails when a 5xx robots.txt is parsed like an empty one (Scrapy treats it as "allow all"): the delay
    is erased to 0 and the stat is missing."""
    srv = arrival_server("127.0.4.40")
    crawler, state = await _crawl_with_robots(srv, tmp_path, Reply.throttle(503, None, body="<html>busy</html>"),
                                              pages=0)
    assert state is not None and state.crawl_delay == 5.0, (
        f"a 503 robots.txt must keep the recorded Crawl-delay of 5 s: row {state}")
    assert crawler.stats.get_value("polite/robots/unreachable") == 1, (
        f"the unreachable robots.txt should be counted once: {polite_stats(crawler)}")


@pytest_twisted.ensureDeferred
async def test_robots_404_clears_recorded_crawl_delay(arrival_server, tmp_path):
    """Negative control of the test above: a 404 robots.txt on 127.0.4.41 means "no rules", so the recorded
    delay is cleared (``crawl_delay == 0``) and nothing is counted as unreachable.

    Fails when every robots.txt status keeps the old delay (an over-broad fix)."""
    srv = arrival_server("127.0.4.41")
    crawler, state = await _crawl_with_robots(srv, tmp_path, Reply.not_found(), pages=1)
    assert state is not None and state.crawl_delay == 0, f"a 404 robots.txt must clear the Crawl-delay: row {state}"
    assert not crawler.stats.get_value("polite/robots/unreachable"), (
        f"a 404 robots.txt is not unreachable: {polite_stats(crawler)}")


@pytest.mark.parametrize("redirected", [True, False], ids=["redirected", "direct"])
@pytest_twisted.ensureDeferred
async def test_a_503_robots_txt_keeps_the_delay_under_scrapy_s_own_middleware(arrival_server, tmp_path, redirected):
    """Scrapy's own ``RobotsTxtMiddleware`` (the add-on's opt-out) lets Scrapy's ``RedirectMiddleware`` follow a
    robots.txt redirect, and sends ``robots_parsed`` for every status. Origin ``:A``'s robots.txt redirects to
    ``:B``'s on the same host (the loopback stand-in for http → https), which answers 503: the recorded Crawl-delay
    of 2 s stays, as for a 503 at ``:A`` itself (``direct``, the control). Fails when the 503 is noted for the origin
    it came from and not for the one asked (the row's delay is then cleared to 0)."""
    ip = "127.0.4.42" if redirected else "127.0.4.43"
    a, b = arrival_server(ip), arrival_server(ip)
    busy = Reply.html("<html>busy</html>", status=503)
    a.route("/robots.txt", Reply.redirect(b.url("/robots.txt"), 301) if redirected else busy)
    b.route("/robots.txt", busy)
    a.route("/*", page())
    uri = sqlite_uri(tmp_path)
    seed(uri, {ip: HostState(crawl_delay=2.0, ok_seen=True, updated=process_clock())})
    crawler = await run_crawl(ListSpider, settings(
        POLITE_STORE=uri, ROBOTSTXT_OBEY=True, POLITE_HOST_INTERVAL=0.2,
        DOWNLOADER_MIDDLEWARES={PoliteRobotsTxtMiddleware: None, RobotsTxtMiddleware: 100}),
        urls=[a.url("/page")], timeout=40)
    assert [x.path for x in b.arrivals()] == (["/robots.txt"] if redirected else []), b.arrivals()
    state = row(uri, ip)
    assert state is not None and state.crawl_delay == 2.0, (state, polite_stats(crawler))
    assert crawler.stats.get_value("polite/robots/unreachable") == 1, polite_stats(crawler)


# ---------------------------------------------------------------------------------------------------
# 6. Hosts throttled from an earlier run do not stall a healthy one behind robots.txt


class StopWhenDoneSpider(ListSpider):
    """A ListSpider that stops its crawler (``stop_async``) once ``stop_after`` pages were fetched,
    recording when (``stop_at``)."""

    def __init__(self, *args: Any, stop_after: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stop_after = stop_after
        self.stop_at: float | None = None

    def parse(self, response, user_meta):
        yield from super().parse(response, user_meta)
        if self.stop_at is None and len(self.fetched) >= self.stop_after:
            self.stop_at = process_clock()
            deferred_from_coro(self.crawler.stop_async())


@pytest.mark.parametrize("robots", ["ours", "scrapy"])
@pytest_twisted.ensureDeferred
async def test_throttled_hosts_do_not_stall_robots_txt(arrival_server, tmp_path, robots):
    """Four hosts (127.0.4.51-54) are still backing off from an earlier run (rows with ``consec=1`` and
    ``next_allowed = now + 40``), with ``ROBOTSTXT_OBEY=True``. Their requests are deferred before they wait for
    their robots.txt (the early deferral, docs/spec.md §5), so the healthy host 127.0.4.50 is crawled at once: its first page within 6 s, all five within
    8 s (bounds for a loaded machine). Then ``crawler.stop_async()`` (called by the spider) ends the crawl within
    6 s although requests are still held.

    Fails (checked with ``scrapy_polite.robotstxt.defer_early`` patched to return False) when the
    throttled hosts' first requests wait inside ``RobotsTxtMiddleware`` behind their
    robots.txt request, which waits out the backoff in line: they hold the downloader and the healthy host
    gets nothing (before the fix: no healthy page at all, and the crawl only ended after ~40 s, the 10 s
    safety timeout's stop waiting behind those in-line waits).

    ``robots="scrapy"``: the project turns our robots.txt middleware off, so Scrapy's judges robots.txt and the
    add-on's PoliteEarlyDeferMiddleware (priority 50) does the early deferral instead."""
    bad = [arrival_server(f"127.0.4.{i}") for i in range(51, 55)]
    good = arrival_server("127.0.4.50")
    for srv in bad + [good]:
        srv.route("/*", page())
    uri = sqlite_uri(tmp_path)
    now = process_clock()
    seed(uri, {srv.address: HostState(next_allowed=now + 40, consec=1, throttled_at=now, updated=now) for srv in bad})
    urls = [srv.url("/x") for srv in bad] + [good.url(f"/g{i}") for i in range(5)]
    t0 = process_clock()
    try:
        crawler = await run_crawl(
            StopWhenDoneSpider,
            settings(POLITE_STORE=uri, ROBOTSTXT_OBEY=True, CONCURRENT_REQUESTS=8, POLITE_HOST_INTERVAL=0.1,
                     DOWNLOADER_MIDDLEWARES={PoliteRobotsTxtMiddleware: None} if robots == "scrapy" else {}),
            urls=urls, stop_after=5, timeout=10)
    except CrawlTimeout as exc:
        crawler = exc.crawler
    t_end = process_clock()
    good_hits = hits(good)
    timeline = [(a.path, round(a.start - t0, 2)) for a in good_hits]
    # Bounds for a loaded machine (about 1 s and 1.5 s unloaded, the crawl's start included); the bug they catch
    # sends no healthy page at all and holds the stop for ~40 s.
    assert good_hits and good_hits[0].start - t0 < 6.0, (
        f"the healthy host's first page must arrive within 6 s: {timeline}")
    assert len(good_hits) == 5 and good_hits[-1].start - t0 < 8.0, (
        f"all five pages of the healthy host must arrive within 8 s: {timeline}")
    assert all(hits(srv) == [] and srv.hits("/robots.txt") == 0 for srv in bad), (
        "no request (not even robots.txt) may reach a host still backing off")
    stop_at = crawler.spider.stop_at
    assert stop_at is not None, "the spider never asked to stop"
    assert t_end - stop_at < 6.0, (
        f"crawler.stop_async() took {t_end - stop_at:.1f} s to end the crawl "
        f"(finish_reason {crawler.stats.get_value('finish_reason')!r})")
    assert crawler.stats.get_value("finish_reason") == "shutdown"


# ---------------------------------------------------------------------------------------------------
# 7. POLITE_MAX_WAIT = 0 is refused


@pytest_twisted.ensureDeferred
async def test_max_wait_zero_stops_the_crawl_at_start(arrival_server):
    """``POLITE_MAX_WAIT = 0`` cannot wait at all (a waiting request would spin the reactor): the crawl stops
    at start with a ``SettingsError`` naming the setting, and no request is sent.

    Fails when 0 is accepted (only negatives refused): the crawl runs and nothing is raised."""
    srv = arrival_server("127.0.4.60")
    srv.route("/*", page())
    with pytest.raises(SettingsError, match="POLITE_MAX_WAIT"):
        await run_crawl(ListSpider, settings(POLITE_MAX_WAIT=0, POLITE_HOST_INTERVAL=2.0),
                        urls=[srv.url("/a"), srv.url("/b")], timeout=30)
    assert srv.arrivals() == [], "no request may be sent when the settings are refused"


# ---------------------------------------------------------------------------------------------------
# 8. A downloader middleware after ours is named at start


class RewriteAfterPolite:
    """A downloader middleware that answers a request with another one (a URL rewrite). If it ran after the
    add-on's middleware, the request it returns would bypass the add-on's ``process_response`` /
    ``process_exception`` and keep the host's line taken; the add-on therefore places its middleware after
    every other one."""

    def process_request(self, request, spider=None):
        if request.url.endswith("/old"):
            return request.replace(url=request.url[:-4] + "/new")
        return None


@pytest.mark.parametrize("priority", [960, 900], ids=["configured-after-950", "before-950"])
@pytest_twisted.ensureDeferred
async def test_a_middleware_that_returns_requests_cannot_leak_the_line(arrival_server, caplog, priority):
    """A URL-rewriting downloader middleware, configured at 960 (after the add-on's default 950) or at 900:
    the add-on's middleware runs after it either way, so the rewritten request is paced and the original's
    line is never taken: every page, including the rewritten one, is fetched and the crawl finishes.

    Fails (the crawl hangs on ``/old`` and ends ``polite_deferred`` with requests not crawled) when the add-on's
    middleware stays at 950 behind a middleware at 960."""
    srv = arrival_server("127.0.4.70" if priority > 950 else "127.0.4.71")
    srv.route("/*", page())
    caplog.set_level(logging.WARNING)
    crawler = await run_crawl(
        ListSpider, settings(POLITE_HOST_INTERVAL=0.1, DOWNLOADER_MIDDLEWARES={RewriteAfterPolite: priority}),
        urls=[srv.url("/old"), srv.url("/a"), srv.url("/b")], timeout=30)
    assert sorted(a.path for a in hits(srv)) == ["/a", "/b", "/new"], [(a.path, a.status) for a in hits(srv)]
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert not crawler.stats.get_value("polite/deferred/not_crawled")
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name.startswith("scrapy_polite")
                and "RewriteAfterPolite" in r.getMessage()]
    assert warnings == [], warnings


class TwiceSpider(ListSpider):
    """Yields each start request object twice (``dont_filter``): a spider's bug Scrapy's own downloader cannot take
    (its ``Downloader.active`` is a set: ``KeyError``)."""

    name = "twice"

    async def start(self) -> Any:
        for url, m in self.start_items:
            request = self._request(url, m, dont_filter=True)
            yield request
            yield request


@pytest_twisted.ensureDeferred
async def test_the_same_request_object_yielded_twice_is_sent_twice_each_pass_paced(arrival_server, tmp_path):
    """Trial: a spider yielding the same Request object twice with ``dont_filter`` hung the crawl at 100 % CPU (half a
    million deferrals), lost pages and sent requests 0.1 s apart for a 0.2 s interval: both passes shared one
    lifecycle record, and the second freed the host's line under the first. The second pass is now sent as a copy
    (counted, logged once): each page arrives twice, never closer than the interval, and both reach the spider. The
    control: a copy yielded by the spider is a request of its own, not counted."""
    srv = arrival_server("127.0.2.160")
    s = settings(POLITE_HOST_INTERVAL=0.2, POLITE_STORE=sqlite_uri(tmp_path), CONCURRENT_REQUESTS=8)
    urls = [srv.url(f"/p/{i}") for i in range(4)]
    crawler = await run_crawl(TwiceSpider, s, urls=urls, timeout=60)
    assert sorted(a.path for a in srv.arrivals()) == sorted(f"/p/{i}" for i in range(4) for _ in range(2))
    assert min(gaps(srv.arrivals())) >= 0.2 - TOL, gaps(srv.arrivals())
    assert len(crawler.spider.fetched) == 8 and not crawler.stats.get_value("log_count/ERROR")
    assert crawler.stats.get_value("polite/lifecycle/copied") == 4
    control = await run_crawl(ListSpider, settings(POLITE_STORE=sqlite_uri(tmp_path / "c")), urls=urls[:1] * 2,
                              dont_filter=True, timeout=60)
    assert len(control.spider.fetched) == 2 and control.stats.get_value("polite/lifecycle/copied") is None
