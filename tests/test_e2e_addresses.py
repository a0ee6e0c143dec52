"""End-to-end address safety and per-IP pacing (docs/spec.md §3, §4, §7): real Scrapy crawls with the add-on,
loopback :class:`~tests.support.server.ArrivalServer` hosts, and a scripted
:class:`~tests.support.dns_server.LocalDNSServer` as the only nameserver (nothing goes to the real network).

* DNS rebinding: a name first answers an allowed address, then 127.0.0.1 — the 127.0.0.1 listener never
  sees a request;
* per-IP pacing on real timelines: several host names on one address; one host on two addresses, where the
  address a request was booked on must be the address it connected to (keep-alive on);
* an SSRF matrix of links and redirects to non-public targets, including non-standard IPv4 spellings;
* refusals: unsafe download handlers, no Twisted reactor, the add-on only in a spider's custom_settings,
  and HTTP proxies (counted, not pinned).

Every crawl runs under :func:`guarded_connects`, which logs every TCP connection the reactor is asked to
open and refuses any that is not to a loopback address — so even a failing test never sends a packet to
169.254.169.254, 10.0.0.1 or anything else off this machine.

Timing rule (as in test_e2e_pacing): lower bounds get :data:`TOL` (clock granularity only).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.settings import Settings
from twisted.internet.error import ConnectError

from scrapy_polite import addon as addon_module
from scrapy_polite.addon import Addon, UnsafeHandlerError
from scrapy_polite.crawl.seams import ResolverNotInstalled
from scrapy_polite.network.handlers import HANDLER_FAMILIES, PINNED, PINNED_HTTP11_HANDLER
from scrapy_polite.pacer import find_pacer
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)
from tests.support.server import Arrival, ArrivalServer, Reply, gaps

TOL = 0.02


# ---------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def same_port_servers():
    """``same_port_servers(*addresses)`` → ArrivalServers on every address, all on one port number (the
    URL's port must reach each of them). All are stopped afterwards."""
    started: list[ArrivalServer] = []

    def start(*addresses: str) -> list[ArrivalServer]:
        last_error: OSError | None = None
        for _ in range(20):
            group: list[ArrivalServer] = []
            try:
                first = ArrivalServer(addresses[0])
                group.append(first)
                for address in addresses[1:]:
                    group.append(ArrivalServer(address, port=first.port))
            except OSError as exc:  # that port is taken on another address: try another one
                last_error = exc
                for srv in group:
                    srv.stop()
                continue
            started.extend(group)
            return group
        raise RuntimeError(f"no common free port for {addresses}: {last_error}")

    yield start
    for srv in started:
        srv.stop()


@contextlib.contextmanager
def guarded_connects():
    """Log every ``reactor.connectTCP`` as ``(host, port)``; refuse (never attempt) any connection that is
    not to a loopback IP literal. Yields the log."""
    from twisted.internet import reactor

    log: list[tuple[str, int]] = []
    original = reactor.connectTCP

    def connectTCP(host, port, factory, timeout=30, bindAddress=None):
        log.append((host, port))
        try:
            ip = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            loopback = False
        else:
            mapped = getattr(ip, "ipv4_mapped", None)
            loopback = (mapped or ip).is_loopback
        if not loopback:
            raise ConnectError(string=f"test guard: refusing a connection to non-loopback {host}:{port}")
        return original(host, port, factory, timeout=timeout, bindAddress=bindAddress)

    reactor.connectTCP = connectTCP
    try:
        yield log
    finally:
        del reactor.connectTCP  # the instance attribute hid the reactor's method


@contextlib.contextmanager
def tcp_listener(address: str, greeting: bytes = b""):
    """A TCP listener on ``address`` that accepts, sends ``greeting`` and closes every connection: yields
    ``(port, peers)``, the peers of the connections it took (a thread; stopped on exit)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind((address, 0))
    listener.listen(5)
    listener.settimeout(0.2)
    peers: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                continue
            peers.append(peer)
            if greeting:
                conn.sendall(greeting)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], peers
    finally:
        stop.set()
        thread.join()
        listener.close()


class RecordingSpider(ListSpider):
    """ListSpider that also records, per response, the address it was booked on (``meta['polite_ip']``)."""

    name = "recording"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.booked: list[tuple[str, str | None, str | None]] = []  # (url, meta polite_ip, ip_address)

    def _record(self, response, user_meta, via_errback):
        super()._record(response, user_meta, via_errback)
        ip = getattr(response, "ip_address", None)
        self.booked.append((response.url, response.meta.get("polite_ip"), str(ip) if ip is not None else None))


def by_start(arrivals: list[Arrival]) -> list[Arrival]:
    return sorted(arrivals, key=lambda a: (a.start, a.end))


def stat(crawler, key, default=0):
    return crawler.stats.get_value(key, default)


def assert_no_pins_left(crawler, *hosts):
    """Every pin taken for a request was released when the request was done."""
    resolver = find_pacer(crawler).resolution.resolver()
    for host in hosts:
        assert resolver.pinned(host) == [], f"{host} still pinned after the crawl"


# ---------------------------------------------------------------------------------------------------
# 3. DNS rebinding


@pytest_twisted.ensureDeferred
async def test_dns_rebinding_after_the_first_answer_never_reaches_loopback(same_port_servers, dns_server):
    """rebind.test answers 127.0.0.2 (allowed) once with TTL 0, then 127.0.0.1 (not allowed) for ever."""
    good, victim = same_port_servers("127.0.0.2", "127.0.0.1")
    good.site(4, links_per_page=4)
    port = good.port
    dns_srv = dns_server({"rebind.test": lambda n, qtype: [("127.0.0.2", 0)] if n == 0 else [("127.0.0.1", 0)]})
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.2/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_MIN_TTL=0, POLITE_DNS_TIMEOUT=1.0, POLITE_HOST_INTERVAL=0.05, POLITE_IP_INTERVAL=0)
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=[f"http://rebind.test:{port}/"], follow=True,
                                  timeout=30)
    spider = crawler.spider
    assert victim.arrivals() == [], "a request reached 127.0.0.1 after DNS rebinding"
    assert {h for h, _ in connects} == {"127.0.0.2"}, connects
    assert [a.path for a in good.arrivals()] == ["/"]
    assert [(f.url, f.ip) for f in spider.fetched] == [(f"http://rebind.test:{port}/", "127.0.0.2")]
    # Every link of / was resolved again (TTL 0) and refused: 127.0.0.1 is not allowed.
    assert sorted(f.url for f in spider.failed) == [f"http://rebind.test:{port}/p/{i}" for i in range(4)]
    assert {f.error for f in spider.failed} == {"BlockedHost"}
    assert all("127.0.0.1" in f.message and "rebind.test" in f.message for f in spider.failed)
    assert dns_srv.lookups("rebind.test") >= 2, "the rebinding answer was never even asked for"
    assert stat(crawler, "polite/blocked/private_address") == 4
    assert_no_pins_left(crawler, "rebind.test")


@pytest_twisted.ensureDeferred
async def test_dns_rebinding_alternating_answers_only_ever_connect_to_the_allowed_address(
        same_port_servers, dns_server):
    """Every other answer is 127.0.0.1: whichever answer a request was checked against, it connects only to
    the address it was booked on — no second resolution at connect time can swap it."""
    good, victim = same_port_servers("127.0.0.2", "127.0.0.1")
    port = good.port
    dns_srv = dns_server({"flip.test": lambda n, qtype: [("127.0.0.2", 0)] if n % 2 == 0 else [("127.0.0.1", 0)]})
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.2/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_MIN_TTL=0, POLITE_DNS_TIMEOUT=1.0, POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0,
        CONCURRENT_REQUESTS=1)
    urls = [f"http://flip.test:{port}/p/{i}" for i in range(8)]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=30)
    spider = crawler.spider
    assert victim.arrivals() == []
    assert {h for h, _ in connects} <= {"127.0.0.2"}, connects
    assert len(spider.fetched) + len(spider.failed) == len(urls)
    assert spider.fetched, "no page was fetched at all: the test exercised nothing"
    assert spider.failed, "no answer was refused: the DNS server never rebound"
    assert {f.ip for f in spider.fetched} == {"127.0.0.2"}
    assert {f.error for f in spider.failed} == {"BlockedHost"}
    assert len(good.arrivals()) == len(spider.fetched)


# ---------------------------------------------------------------------------------------------------
# 4. Per-IP pacing on real timelines


def _three_hosts_on_one_address(arrival_server, dns_srv, ip_interval):
    srv = arrival_server("127.0.0.5")
    names = ["a.test", "b.test", "c.test"]
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_OVERRIDES={name: ["127.0.0.5"] for name in names},
        POLITE_HOST_INTERVAL=0.2, POLITE_IP_INTERVAL=ip_interval)
    urls = [f"http://{name}:{srv.port}/p/{i}" for i in range(2) for name in names]
    return srv, settings, urls


@pytest_twisted.ensureDeferred
async def test_hosts_sharing_one_address_are_paced_by_ip_interval(arrival_server, dns_server):
    dns_srv = dns_server({})
    srv, settings, urls = _three_hosts_on_one_address(arrival_server, dns_srv, ip_interval=1.0)
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=40)
    spider = crawler.spider
    assert sorted(spider.statuses()) == [200] * 6, (spider.fetched, spider.failed)
    arrivals = by_start(srv.arrivals())
    assert len(arrivals) == 6
    assert {a.host for a in arrivals} == {"a.test", "b.test", "c.test"}
    assert {a.server_address for a in arrivals} == {"127.0.0.5"}
    assert {h for h, _ in connects} == {"127.0.0.5"}
    # docs/spec.md §3: two requests to one IP, through any hosts: start2 >= end1 + POLITE_IP_INTERVAL.
    assert min(gaps(arrivals)) >= 1.0 - TOL, [round(g, 3) for g in gaps(arrivals)]
    assert dns_srv.total() == 0, "overrides must answer without a query"
    assert {ip for _, ip, _ in spider.booked} == {"127.0.0.5"}


@pytest_twisted.ensureDeferred
async def test_hosts_sharing_one_address_without_ip_interval_overlap(arrival_server, dns_server):
    """Negative control of the test above: with POLITE_IP_INTERVAL = 0 the three hosts go together."""
    dns_srv = dns_server({})
    srv, settings, urls = _three_hosts_on_one_address(arrival_server, dns_srv, ip_interval=0)
    crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=40)
    assert sorted(crawler.spider.statuses()) == [200] * 6
    assert min(gaps(srv.arrivals())) < 0.5


@pytest_twisted.ensureDeferred
async def test_host_on_two_addresses_spreads_and_connects_where_booked(same_port_servers, dns_server):
    """two.test resolves to 127.0.0.6 and 127.0.0.7: requests alternate over both, each address keeps its
    own spacing, and every response came from the address its request was booked on — with keep-alive on,
    a pooled connection to one address is never reused for a request booked on the other."""
    six, seven = same_port_servers("127.0.0.6", "127.0.0.7")
    dns_srv = dns_server({})
    ip_interval = 0.5
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_OVERRIDES={"two.test": ["127.0.0.7", "127.0.0.6"]},
        POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=ip_interval)
    n = 8
    urls = [f"http://two.test:{six.port}/p/{i}" for i in range(n)]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=40)
    spider = crawler.spider
    assert sorted(spider.statuses()) == [200] * n, (spider.fetched, spider.failed)
    served = {a.path: a.server_address for srv in (six, seven) for a in srv.arrivals()}
    assert len(served) == n
    hits6, hits7 = six.arrivals(), seven.arrivals()
    assert hits6 and hits7, f"requests did not spread: {len(hits6)} on .6, {len(hits7)} on .7"
    for hits in (hits6, hits7):
        if len(hits) > 1:
            assert min(gaps(hits)) >= ip_interval - TOL, [round(g, 3) for g in gaps(hits)]
    # booked address == connected address == the server that logged the request, for every request
    for url, booked, connected in spider.booked:
        path = url.split(str(six.port), 1)[1]
        assert connected == served[path], (url, connected, served[path])
        assert booked == connected, (url, booked, connected)
    assert {h for h, _ in connects} <= {"127.0.0.6", "127.0.0.7"}
    assert_no_pins_left(crawler, "two.test")
    # keep-alive was really in use (one connection served several requests), so the check above covers
    # the pool and not only fresh connections
    ports = [a.client_port for a in hits6] + [a.client_port for a in hits7]
    assert len(set(ports)) < len(ports), "no connection was reused: keep-alive not exercised"
    assert len(connects) < n


@pytest_twisted.ensureDeferred
async def test_ipv4_mapped_spelling_of_an_address_shares_its_ip_pacing(arrival_server, dns_server):
    """127.0.0.5 and ::ffff:127.0.0.5 are one destination (the filter already judges the mapped form by the
    IPv4 it embeds, docs/spec.md §4): a host answering the mapped form must not escape the per-IP interval of the
    hosts answering the plain one (docs/spec.md §3: "two requests to one IP, through any hosts")."""
    srv = arrival_server("127.0.0.5")
    dns_srv = dns_server({})
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_OVERRIDES={"plain.test": ["127.0.0.5"], "mapped.test": ["::ffff:127.0.0.5"]},
        POLITE_HOST_INTERVAL=0.2, POLITE_IP_INTERVAL=1.0)
    urls = [f"http://{name}:{srv.port}/p/{i}" for i in range(2) for name in ("plain.test", "mapped.test")]
    with guarded_connects():
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=30)
    assert sorted(crawler.spider.statuses()) == [200] * 4, crawler.spider.failed
    arrivals = by_start(srv.arrivals())
    assert {a.server_address for a in arrivals} == {"127.0.0.5"}  # one server, one address
    assert min(gaps(arrivals)) >= 1.0 - TOL, [(a.host, round(a.start, 3)) for a in arrivals]


@pytest_twisted.ensureDeferred
async def test_dns_failures_fail_the_request_and_leave_the_backoff_alone(arrival_server, dns_server, tmp_path):
    """NXDOMAIN, SERVFAIL and no answer fail their requests with HostNotFound / DNSServerFailure /
    DNSTimeout (counted), and a DNS failure never touches the host's backoff (docs/spec.md §2)."""
    from scrapy_polite.stores import open_store

    srv = arrival_server("127.0.0.8")
    dns_srv = dns_server({"sf.test": [("127.0.0.8", 300)], "slow.test": [("127.0.0.8", 300)],
                          "ok.test": [("127.0.0.8", 300)]})
    dns_srv.set_mode("servfail", "sf.test")
    dns_srv.set_mode("silent", "slow.test")
    store = f"sqlite:///{tmp_path}/pace.sqlite3"
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.8/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_TIMEOUT=0.5, POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0, POLITE_STORE=store)
    port = srv.port
    urls = [f"http://{h}:{port}/" for h in ("nx.test", "sf.test", "slow.test", "ok.test")]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=30)
    spider = crawler.spider
    assert [(f.url, f.ip) for f in spider.fetched] == [(f"http://ok.test:{port}/", "127.0.0.8")]
    errors = {f.url.split("//")[1].split(":")[0]: f.error for f in spider.failed}
    assert errors == {"nx.test": "HostNotFound", "sf.test": "DNSServerFailure", "slow.test": "DNSTimeout"}
    assert stat(crawler, "polite/dns/nxdomain") == 1
    assert stat(crawler, "polite/dns/servfail") == 1
    assert stat(crawler, "polite/dns/timeout") == 1
    assert {h for h, _ in connects} == {"127.0.0.8"}
    assert [a.host for a in srv.arrivals()] == ["ok.test"]
    table = open_store(store)
    try:
        for host in ("nx.test", "sf.test", "slow.test"):
            state = table.get(host)
            assert state is None or (state.consec == 0 and state.next_allowed <= spider.failed[0].time), (host, state)
    finally:
        table.close()


# ---------------------------------------------------------------------------------------------------
# 5. SSRF matrix: links and redirects to non-public targets


@pytest.mark.parametrize("robots", [False, True], ids=["plain", "robotstxt_obey"])
@pytest_twisted.ensureDeferred
async def test_ssrf_matrix_links_and_redirects_never_reach_non_public_targets(same_port_servers, dns_server,
                                                                               robots):
    allowed, lo4, lo6 = same_port_servers("127.0.0.8", "127.0.0.1", "::1")
    port = allowed.port
    dns_srv = dns_server({
        "evil.test": [("127.0.0.1", 300), ("::1", 300)],
        "meta.test": [("169.254.169.254", 300)],
        "lan.test": [("10.0.0.1", 300), ("192.168.0.1", 300)],
    })
    literal_targets = [
        f"http://127.0.0.1:{port}/",
        "http://169.254.169.254/",
        "http://10.0.0.1/",
        f"http://[::1]:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        "http://[64:ff9b::a00:1]/",
        "http://[::ffff:169.254.169.254]/",
        f"http://0.0.0.0:{port}/",
    ]
    name_targets = [f"http://evil.test:{port}/", "http://meta.test/", "http://lan.test/",
                    f"http://localhost:{port}/"]
    # The URL Standard reads these as IPv4 addresses (127.0.0.1, 192.168.0.1, 0.0.0.0): addresses, never names.
    spellings = ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "%31%32%37.0.0.1", "0300.0250.0.1", "0"]
    spelling_targets = [f"http://{s}:{port}/" for s in spellings]
    targets = literal_targets + name_targets + spelling_targets
    links = "".join(f'<a href="{t}link">{i}</a> <a href="/r/{i}">r{i}</a>' for i, t in enumerate(targets))
    allowed.route("/", Reply.html(f"<html><body>{links}</body></html>"))
    for i, target in enumerate(targets):
        allowed.route(f"/r/{i}", Reply.redirect(f"{target}redir"))
    settings = polite_settings(
        POLITE_ALLOWED_NETWORKS=["127.0.0.8/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address],
        POLITE_DNS_TIMEOUT=1.0, POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0, ROBOTSTXT_OBEY=robots)
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=[allowed.url("/")], follow=True,
                                  same_host=False, timeout=60)

    spider = crawler.spider

    assert lo4.arrivals() == [] and lo6.arrivals() == [], "a non-public listener was reached"
    assert {h for h, _ in connects} == {"127.0.0.8"}, f"connections attempted: {connects}"
    # (with ROBOTSTXT_OBEY the robots.txt requests of the refused hosts are refused the same way)
    expected_paths = ["/"] + [f"/r/{i}" for i in range(len(targets))] + (["/robots.txt"] if robots else [])
    assert sorted(a.path for a in allowed.arrivals()) == sorted(expected_paths)
    assert [f.url for f in spider.fetched] == [allowed.url("/")]

    # Each target as Scrapy's Request writes it: w3lib >= 2.6.0 already writes the URL Standard's IPv4
    # spellings as their address (0x7f.1 → 127.0.0.1), so two spellings of one address are one request, which
    # Scrapy's duplicate filter lets through once; before 2.6.0 each spelling reaches us as written.
    failed = {f.url: f for f in spider.failed}
    expected = {Request(f"{t}{kind}").url for t in targets for kind in ("link", "redir")}
    assert set(failed) == expected, sorted(set(failed) ^ expected)
    assert {f.error for f in failed.values()} == {"BlockedHost"}, [(f.url, f.error) for f in failed.values()]
    # the URL Standard's IPv4 spellings never reached the nameserver: only the three names did
    assert set(dns_srv.names()) == {"evil.test", "meta.test", "lan.test"}, dns_srv.queries
    blocked = stat(crawler, "polite/blocked/private_address")
    assert blocked >= 2 * len(literal_targets), blocked
    if not robots:
        assert blocked == len(expected)
    else:  # plus one robots.txt per blocked host (the redirect and the link share a host's robots.txt)
        assert blocked >= len(expected)
    assert stat(crawler, "polite/dns/nxdomain") == 0


@pytest_twisted.ensureDeferred
async def test_dont_pace_is_exempt_from_pacing_not_from_the_address_rules(same_port_servers, dns_server):
    allowed, victim = same_port_servers("127.0.0.8", "127.0.0.1")
    dns_srv = dns_server({})
    settings = polite_settings(POLITE_ALLOWED_NETWORKS=["127.0.0.8/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address])
    urls = [(f"http://127.0.0.1:{allowed.port}/", {"dont_pace": True}),
            (allowed.url("/ok"), {"dont_pace": True})]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=30)
    assert victim.arrivals() == []
    assert [f.url for f in crawler.spider.fetched] == [allowed.url("/ok")]
    assert [f.error for f in crawler.spider.failed] == ["BlockedHost"]
    assert {h for h, _ in connects} == {"127.0.0.8"}
    assert stat(crawler, "polite/dont_pace") == 2


# ---------------------------------------------------------------------------------------------------
# 6. Refusals




CUSTOM = "myproject.handlers.CustomHandler"


@pytest_twisted.ensureDeferred
async def test_crawl_with_an_unknown_handler_refuses_to_start(arrival_server, dns_server):
    """A handler the add-on knows nothing about is refused (httpx, aiohttp, HTTP/2 and scrapy-playwright have
    their modes: tests/test_e2e_handlers.py)."""
    srv = arrival_server("127.0.0.8")
    dns_srv = dns_server({})
    settings = polite_settings(DOWNLOAD_HANDLERS={"https": CUSTOM}, POLITE_DNS_NAMESERVERS=[dns_srv.address])
    with pytest.raises(UnsafeHandlerError) as info:
        await run_crawl(ListSpider, settings, urls=[srv.url("/")], timeout=20)
    assert CUSTOM in str(info.value) and "'https'" in str(info.value)
    assert srv.arrivals() == []


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("handler", [CUSTOM, "scrapy.core.downloader.handlers.s3.S3DownloadHandler"])
def test_unsafe_handlers_are_refused_by_the_addon(scheme, handler):
    settings = Settings({"DOWNLOAD_HANDLERS": {scheme: handler}})
    with pytest.raises(UnsafeHandlerError) as info:
        Addon().update_settings(settings)
    assert handler in str(info.value)


class OwnResolvingHandler:
    """Stands for any third-party handler class (h2 and aiohttp may not be installed)."""


def test_unsafe_handler_given_as_a_class_is_refused():
    with pytest.raises(UnsafeHandlerError, match="OwnResolvingHandler"):
        Addon().update_settings(Settings({"DOWNLOAD_HANDLERS": {"https": OwnResolvingHandler}}))


@pytest.mark.parametrize("handler", sorted(h for h, family in HANDLER_FAMILIES.items() if family.mode == PINNED and "H2" not in h))
def test_scrapy_http11_handlers_are_replaced_by_the_pinned_one(handler):
    settings = Settings({"DOWNLOAD_HANDLERS": {"http": handler, "https": handler}})
    Addon().update_settings(settings)
    assert settings.getdict("DOWNLOAD_HANDLERS")["http"] == PINNED_HTTP11_HANDLER
    assert settings.getdict("DOWNLOAD_HANDLERS")["https"] == PINNED_HTTP11_HANDLER


def test_unsafe_handler_is_accepted_with_allow_private():
    settings = Settings({"DOWNLOAD_HANDLERS": {"https": CUSTOM}, "POLITE_ALLOW_PRIVATE": True})
    Addon().update_settings(settings)  # the operator accepted the risk explicitly


def test_no_twisted_reactor_is_refused():
    with pytest.raises(UnsafeHandlerError, match="TWISTED_REACTOR_ENABLED"):
        Addon().update_settings(Settings({"TWISTED_REACTOR_ENABLED": False}))


def test_no_twisted_reactor_is_refused_through_the_addon_manager():
    from scrapy.addons import AddonManager
    from scrapy.utils.test import get_crawler

    crawler = get_crawler()  # CrawlerRunner itself refuses TWISTED_REACTOR_ENABLED=False
    settings = Settings({"ADDONS": {"scrapy_polite.Addon": 0}, "TWISTED_REACTOR_ENABLED": False})
    with pytest.raises(UnsafeHandlerError):
        AddonManager(crawler).load_settings(settings)


def test_pre_crawler_settings_install_the_resolver_unless_one_is_configured():
    settings = Settings({})
    Addon.update_pre_crawler_settings(settings)
    assert settings["TWISTED_DNS_RESOLVER"] == addon_module.RESOLVER
    mine = Settings({"TWISTED_DNS_RESOLVER": "scrapy.resolver.CachingThreadedResolver"}, priority="project")
    Addon.update_pre_crawler_settings(mine)
    assert mine["TWISTED_DNS_RESOLVER"] == "scrapy.resolver.CachingThreadedResolver"


class SpiderOnlyAddon(ListSpider):
    """The add-on enabled only in the spider's custom_settings (docs/spec.md §7: the resolver cannot be installed)."""

    name = "spider_only"
    custom_settings = polite_settings(POLITE_HOST_INTERVAL=0.0)


@pytest.mark.parametrize("install_resolver", [False, True])
@pytest_twisted.ensureDeferred
async def test_addon_only_in_spider_settings_refuses_to_crawl(arrival_server, install_resolver):
    """The crawl does not start (issue 9: one ERROR line, a non-zero exit status from scrapy crawl, see
    tests/test_operator_output.py), and nothing is sent."""
    srv = arrival_server("127.0.0.8")
    with guarded_connects() as connects, pytest.raises(ResolverNotInstalled, match="only in the spider's custom_"):
        await run_crawl(SpiderOnlyAddon, {}, install_resolver=install_resolver,
                        urls=[srv.url("/"), srv.url("/a")], timeout=20)
    assert srv.arrivals() == [], "a request was sent without the public-only resolver"
    assert connects == []


class NarrowerSpider(RecordingSpider):
    """Narrows the project's address exceptions in its custom_settings (README: "Every setting can be
    overridden per spider in custom_settings")."""

    name = "narrower"
    custom_settings = {"POLITE_ALLOWED_NETWORKS": ["127.0.0.8/32"], "POLITE_ALLOW_PRIVATE": False}


@pytest.mark.parametrize("project", [{"POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"]},
                                     {"POLITE_ALLOW_PRIVATE": True}], ids=["allowed_networks", "allow_private"])
@pytest_twisted.ensureDeferred
async def test_spider_narrowing_the_address_exceptions_is_not_silently_ignored(same_port_servers, dns_server,
                                                                                project):
    """The resolver is per process (docs/spec.md §7), built from the project settings. A spider whose
    custom_settings *narrow* POLITE_ALLOWED_NETWORKS / POLITE_ALLOW_PRIVATE must either get the narrower
    rule or be refused — never run with the wider one while its settings say otherwise."""
    allowed, victim = same_port_servers("127.0.0.8", "127.0.0.1")
    dns_srv = dns_server({})
    settings = polite_settings(POLITE_DNS_NAMESERVERS=[dns_srv.address], POLITE_HOST_INTERVAL=0.0, **project)
    with guarded_connects():
        crawler = await run_crawl(NarrowerSpider, settings, timeout=30,
                                  urls=[allowed.url("/"), f"http://127.0.0.1:{allowed.port}/"])
    assert crawler.settings.getlist("POLITE_ALLOWED_NETWORKS") == ["127.0.0.8/32"]
    assert victim.arrivals() == [], (
        "the spider's POLITE_ALLOWED_NETWORKS=['127.0.0.8/32'] was ignored: 127.0.0.1 was fetched "
        f"({[(f.url, f.ip) for f in crawler.spider.fetched]})")


@pytest_twisted.ensureDeferred
async def test_another_configured_resolver_refuses_to_crawl(arrival_server):
    srv = arrival_server("127.0.0.8")
    settings = polite_settings(TWISTED_DNS_RESOLVER="scrapy.resolver.CachingThreadedResolver")
    with pytest.raises(ResolverNotInstalled, match="remove the TWISTED_DNS_RESOLVER setting"):
        await run_crawl(ListSpider, settings, urls=[srv.url("/")], timeout=20)
    assert srv.arrivals() == []


@pytest_twisted.ensureDeferred
async def test_proxied_requests_are_counted_as_unpinned(arrival_server, dns_server):
    """With meta['proxy'] the proxy resolves the target: nothing is resolved or pinned here, and it is
    counted. The 'proxy' is an ArrivalServer answering 200 to the absolute-URI GET."""
    proxy = arrival_server("127.0.0.9")
    dns_srv = dns_server({})
    settings = polite_settings(POLITE_DNS_NAMESERVERS=[dns_srv.address], POLITE_HOST_INTERVAL=0.0)
    urls = ["http://proxied.test/one", "http://proxied.test/two"]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls,
                                  meta={"proxy": f"http://127.0.0.9:{proxy.port}"}, timeout=30)
    spider = crawler.spider
    assert sorted(spider.statuses()) == [200, 200], spider.failed
    hits = proxy.arrivals()
    assert sorted(a.target for a in hits) == urls  # absolute-URI requests: the proxy got them
    assert {a.host for a in hits} == {"proxied.test"}
    # one count per proxied request — not one per booking attempt (the second request is deferred
    # behind the first on the host's line and comes back: it is still one request)
    assert stat(crawler, "polite/proxy_unpinned") == len(urls), {
        k: v for k, v in crawler.stats.get_stats().items() if k.startswith("polite/")}
    assert dns_srv.total() == 0, "the target of a proxied request must not be resolved locally"
    assert {h for h, _ in connects} == {"127.0.0.9"}
    assert all(booked is None for _, booked, _ in spider.booked)


@pytest_twisted.ensureDeferred
async def test_a_dual_stack_host_is_booked_on_one_family(arrival_server, dns_server):
    """A host with an IPv4 and an IPv6 address is booked and connected on its IPv4 one (docs/spec.md §3): a machine
    without IPv6 connectivity cannot reach the other (trial: ``localhost`` with ``::1`` admitted and a server on
    127.0.0.1 only had 8 of 20 requests refused on ``::1``, each a backoff). Negative control: the IPv6 address
    takes requests whenever the IPv4 one is busy and the host is free (the IP interval is the longer), so with both
    families booked some request would go to ``::1``, where nothing listens on that port."""
    srv = arrival_server("127.0.0.21")
    dns_srv = dns_server({"dual.test": [("127.0.0.21", 300), ("::1", 300)]})
    settings = polite_settings(POLITE_DNS_NAMESERVERS=[dns_srv.address], POLITE_HOST_INTERVAL=0.1,
                               POLITE_IP_INTERVAL=0.4)
    urls = [srv.url(f"/p/{i}", host="dual.test") for i in range(4)]
    with guarded_connects() as connects:
        crawler = await run_crawl(RecordingSpider, settings, urls=urls, timeout=30)
    spider = crawler.spider
    assert sorted(spider.statuses()) == [200] * 4, spider.failed
    assert {booked for _, booked, _ in spider.booked} == {"127.0.0.21"}
    assert {h for h, _ in connects} == {"127.0.0.21"}
    assert min(gaps(by_start(srv.arrivals()))) >= 0.4 - TOL


@pytest.mark.parametrize("admitted", [False, True])
@pytest_twisted.ensureDeferred
async def test_an_ftp_request_with_a_proxy_is_checked(admitted):
    """Scrapy's FTP handler ignores ``meta['proxy']`` and connects to the URL's host itself (review: a proxy
    middleware or ``ftp_proxy`` let ``ftp://`` reach a private address unchecked). The request is checked as any
    other: 127.0.0.2, not admitted, is never contacted; admitted (the control), it is, proxy or not."""
    networks = ["127.0.0.2/32"] if admitted else ["127.0.0.9/32"]
    settings = polite_settings(POLITE_ALLOWED_NETWORKS=networks, POLITE_HOST_INTERVAL=0.0, DOWNLOAD_TIMEOUT=5)
    with tcp_listener("127.0.0.2", b"220 banner\r\n") as (port, peers):
        crawler = await run_crawl(ListSpider, settings, urls=[f"ftp://127.0.0.2:{port}/file.txt"],
                                  meta={"proxy": "http://127.0.0.9:9"}, timeout=30)
    assert len(peers) == (1 if admitted else 0), peers
    assert stat(crawler, "polite/proxy_unpinned") == 0
    assert stat(crawler, "polite/blocked/private_address") == (0 if admitted else 1), {
        k: v for k, v in crawler.stats.get_stats().items() if k.startswith("polite/")}


@pytest.mark.parametrize("admitted", [False, True], ids=["proxy_not_admitted", "proxy_admitted"])
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest_twisted.ensureDeferred
async def test_the_proxy_a_request_goes_to_must_have_an_allowed_address(scheme, admitted, caplog):
    """The proxy of ``meta['proxy']`` is contacted, so its address meets the rules of any host (docs/spec.md §4;
    trial: an ``https`` request through a proxy at a non-admitted IP literal reached it with ``CONNECT``, and an
    ``http`` one failed as an unexplained DNS error). Not admitted: nothing connects to it, the request is refused
    and the WARNING names the proxy, once for the two hosts sent through it; nothing is counted as sent unpinned through
    it. Control (admitted): it is contacted."""
    networks = ["127.0.0.2/32", "127.0.0.4/32", *(["127.0.0.3/32"] if admitted else [])]
    settings = polite_settings(POLITE_ALLOWED_NETWORKS=networks, POLITE_HOST_INTERVAL=0.0, DOWNLOAD_TIMEOUT=5,
                               RETRY_ENABLED=False)
    with tcp_listener("127.0.0.3") as (port, peers):
        crawler = await run_crawl(ListSpider, settings, urls=[f"{scheme}://127.0.0.2:9/page", f"{scheme}://127.0.0.4:9/"],
                                  meta={"proxy": f"http://127.0.0.3:{port}"}, timeout=30)
    assert bool(peers) is admitted, peers
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "refuses the proxy 127.0.0.3" in r.getMessage()]
    assert len(warned) == (0 if admitted else 1), warned
    assert stat(crawler, "polite/blocked/private_address") == (0 if admitted else 2), {
        k: v for k, v in crawler.stats.get_stats().items() if k.startswith("polite/")}
    assert stat(crawler, "polite/proxy_unpinned") == (2 if admitted else 0)  # a refused request went nowhere
