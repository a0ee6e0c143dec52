"""Smoke tests of the test support: the loopback ArrivalServer and run_crawl (plain Scrapy, no add-on)."""

from __future__ import annotations

import asyncio
import http.client
import socket
import time

import pytest
import pytest_twisted

from tests.support.crawl import CrawlTimeout, ListSpider, run_crawl
from tests.support.server import Arrival, ArrivalServer, Reply, gaps, sequence, start_gaps


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------
# The server alone


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.0.0.1", "192.168.1.1", "8.8.8.8", "2001:db8::1",
                                     "::ffff:127.0.0.1", "localhost", "example.com", ""])
def test_non_loopback_bind_is_refused(address):
    with pytest.raises(ValueError):
        ArrivalServer(address)


def test_keep_alive_routing_and_log(arrival_server):
    srv = arrival_server("127.0.0.3")
    srv.route("/limited", sequence(Reply.throttle(429, "3"), Reply.throttle(503), Reply.text("ok")))
    srv.route("/pre/*", lambda info, count: Reply.text(f"{info.path} #{count}"))
    srv.route("/vhost", Reply.text("only b"), host="b.test")
    conn = http.client.HTTPConnection(srv.address, srv.port, timeout=5)
    seen = []
    for path, host in [("/limited", None), ("/limited", None), ("/limited?x=1", None), ("/pre/a/b", None),
                       ("/pre/a/b", None), ("/robots.txt", None), ("/vhost", "b.test:81"), ("/vhost", None)]:
        headers = {"Host": host} if host else {}
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        seen.append((r.status, r.getheader("Retry-After"), r.getheader("Content-Length"), r.read()))
    conn.close()
    assert [s[0] for s in seen] == [429, 503, 200, 200, 200, 404, 200, 200]
    assert seen[0][1] == "3" and seen[1][1] is None
    assert all(s[2] == str(len(s[3])) for s in seen)  # Content-Length always sent
    assert seen[3][3] == b"/pre/a/b #0" and seen[4][3] == b"/pre/a/b #1"
    assert seen[6][3] == b"only b" and seen[7][3] != b"only b"

    log = srv.arrivals()
    assert len(log) == 8
    assert len({a.client_port for a in log}) == 1  # one keep-alive connection
    assert {a.server_address for a in log} == {"127.0.0.3"}
    assert [a.host for a in log].count("b.test") == 1
    assert all(a.host in ("127.0.0.3", "b.test") for a in log)
    assert all(a.start <= a.end for a in log)
    assert log[2].path == "/limited" and log[2].target == "/limited?x=1"
    assert len(srv.arrivals(path_prefix="/limited")) == 3
    assert len(srv.arrivals(host="b.test")) == 1
    assert srv.hits("/pre/a/b") == 2


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_loopback(arrival_server):
    srv = arrival_server("::1")
    assert srv.url("/x") == f"http://[::1]:{srv.port}/x"
    conn = http.client.HTTPConnection("::1", srv.port, timeout=5)
    conn.request("GET", "/x")
    assert conn.getresponse().status == 200
    conn.close()
    (a,) = srv.arrivals(host="[::1]")
    assert a.host == "::1" and a.server_address == "::1" and a.path == "/x"


def test_context_manager_stops():
    with ArrivalServer("127.0.0.4") as srv:
        port = srv.port
        conn = http.client.HTTPConnection("127.0.0.4", port, timeout=5)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
    with pytest.raises(OSError):
        c2 = http.client.HTTPConnection("127.0.0.4", port, timeout=2)
        c2.request("GET", "/")
        c2.getresponse()


def test_gaps():
    def a(start, end):
        return Arrival("h", "/", start, end, 200, "127.0.0.1", 1)

    log = [a(10.0, 10.5), a(0.0, 1.0), a(3.0, 3.2)]
    assert gaps(log) == pytest.approx([2.0, 6.8])
    assert start_gaps(log) == pytest.approx([3.0, 7.0])
    assert gaps([]) == [] and gaps(log[:1]) == []


# ---------------------------------------------------------------------------------------------------
# A real Scrapy crawl (no add-on) against two loopback addresses


@pytest_twisted.ensureDeferred
async def test_plain_crawl_two_addresses(arrival_server):
    a = arrival_server("127.0.0.1")
    b = arrival_server("127.0.0.2")
    a.site(5)
    b.site(7, links_per_page=2)
    b.route("/throttled", sequence(Reply.throttle(429, "3")))
    settings = {"LOG_LEVEL": "INFO", "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": True,
                "CONCURRENT_REQUESTS": 4}
    crawler = await run_crawl(
        ListSpider, settings,
        urls=[a.url("/"), b.url("/"), (b.url("/throttled"), {"tag": "t"})],
        meta={"run": 1}, follow=True,
    )
    spider = crawler.spider

    # server side: robots.txt (404) + / + all pages, on the right address, with the right Host
    pages_a = a.arrivals(path_prefix="/p/")
    pages_b = b.arrivals(path_prefix="/p/")
    assert sorted(x.path for x in pages_a) == [f"/p/{i}" for i in range(5)]
    assert sorted(x.path for x in pages_b) == sorted(f"/p/{i}" for i in range(7))
    assert a.hits("/robots.txt") == 1 and b.hits("/robots.txt") == 1
    assert [x.status for x in a.arrivals(path_prefix="/robots.txt")] == [404]
    assert len(a.arrivals()) == 1 + 1 + 5
    assert len(b.arrivals()) == 1 + 1 + 7 + 1
    assert {x.host for x in a.arrivals()} == {"127.0.0.1"}
    assert {x.host for x in b.arrivals()} == {"127.0.0.2"}
    assert {x.server_address for x in a.arrivals()} == {"127.0.0.1"}
    assert {x.server_address for x in b.arrivals()} == {"127.0.0.2"}
    assert all(x.status == 200 for x in pages_a + pages_b)
    assert [x.status for x in b.arrivals(path_prefix="/throttled")] == [429]
    assert len(start_gaps(pages_b)) == 6

    # spider side: every response recorded, with the address connected to and the user meta
    assert len(spider.fetched) == 1 + 5 + 1 + 7 + 1
    assert not spider.failed
    by_url = {f.url: f for f in spider.fetched}
    t = by_url[b.url("/throttled")]
    assert t.status == 429 and t.via_errback and t.meta == {"run": 1, "tag": "t"}
    assert by_url[a.url("/p/4")].ip == "127.0.0.1" and by_url[b.url("/p/6")].ip == "127.0.0.2"
    assert all(f.meta.get("run") == 1 for f in spider.fetched)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert crawler.stats.get_value("downloader/response_status_count/200") == 14


@pytest_twisted.ensureDeferred
async def test_crawl_records_connection_failures(arrival_server):
    srv = arrival_server("127.0.0.5")
    dead = f"http://127.0.0.6:{srv.port}/"  # nothing listens there
    crawler = await run_crawl(ListSpider, {}, urls=[srv.url("/ok"), dead])
    spider = crawler.spider
    assert spider.statuses() == [200]
    assert [f.error for f in spider.failed] == ["DownloadConnectionRefusedError"]


@pytest_twisted.ensureDeferred
async def test_crawl_timeout(arrival_server):
    srv = arrival_server("127.0.0.7")
    srv.route("/slow", Reply.text("late", delay=1.5))
    with pytest.raises(CrawlTimeout) as info:
        await run_crawl(ListSpider, {}, urls=[srv.url("/slow")], timeout=0.3)
    assert info.value.crawler.stats.get_value("finish_reason") is not None


class _NeverAnswers:
    """A downloader middleware whose every request waits forever: the engine cannot close."""

    async def process_request(self, request):
        await asyncio.get_running_loop().create_future()


@pytest_twisted.ensureDeferred
async def test_a_crawl_whose_stop_never_completes_fails_instead_of_hanging(arrival_server, monkeypatch):
    import tests.support.crawl as crawl_support

    monkeypatch.setattr(crawl_support, "STOP_GRACE", 0.5)
    srv = arrival_server("127.0.0.7")
    started = time.monotonic()
    with pytest.raises(CrawlTimeout) as info:
        await run_crawl(ListSpider, {"DOWNLOADER_MIDDLEWARES": {f"{__name__}._NeverAnswers": 1}},
                        urls=[srv.url("/x")], timeout=0.3)
    assert "stopping it did not complete" in str(info.value)
    assert srv.url("/x") in str(info.value)  # names the request in progress
    assert time.monotonic() - started < 10


def test_a_client_that_resets_its_connection_prints_no_traceback_but_another_error_does(capfd):
    """A crawler killed or stopped mid-request resets its connection: the server's thread says nothing (it is the
    client's business). Negative control: any other error of a handler is printed as by default."""
    import struct

    srv = ArrivalServer("127.0.0.1")
    try:
        with socket.create_connection((srv.address, srv.port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed: a reset
            deadline = time.monotonic() + 5
            while not srv._conns and time.monotonic() < deadline:  # the server took the connection
                time.sleep(0.01)
        while srv._conns and time.monotonic() < deadline:  # its thread read the reset, and let the connection go
            time.sleep(0.01)
        assert not srv._conns
        assert "Traceback" not in capfd.readouterr().err
        try:
            raise ValueError("a handler's own failure")
        except ValueError:
            srv._httpd.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a handler's own failure" in capfd.readouterr().err
    finally:
        srv.stop()
