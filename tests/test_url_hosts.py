"""Hosts per the WHATWG URL Standard (docs/spec.md §1, §4): one table of URL → host key → address verdict,
checked through ``policy.host_key``, the middleware's refusal and the real resolver, under a socket guard
that fails the test if any DNS query leaves the process for a host the Standard reads as an address.

The guard (:func:`no_dns`) wraps the socket layer itself — ``socket.socket`` sends and connects of every
UDP socket and of any socket to port 53, and ``getaddrinfo`` / ``gethostbyname`` of anything that is not an
IP literal — so it catches a query whatever library would send it; its negative control shows it catching
the query for a name. Then one real crawl: the URL Standard's spellings of 127.0.0.1 reach a loopback server
(allowed) with zero DNS queries, and are refused with zero DNS queries when not allowed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
import pytest_twisted
from packaging.version import Version
from scrapy import Request
from scrapy.exceptions import IgnoreRequest

from scrapy_polite.network.hosts import InvalidHost, name_host, url_host
from scrapy_polite.policy import host_key
from scrapy_polite.resolver import BlockedHost, InvalidHostName, PublicHostnameResolver
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)
from tests.test_e2e_addresses import guarded_connects

PUBLIC, REFUSED, NAME, INVALID = "public address", "refused address", "name", "invalid"

#: URLs that Scrapy's Request rewrites to another host: w3lib's safe_url_string before 2.6.0 maps a name by
#: IDNA2003 (faß.de → fass.de); from 2.6.0 it follows the URL Standard, as we do.
W3LIB_FOLLOWS_THE_URL_STANDARD = Version(metadata.version("w3lib")) >= Version("2.6.0")
SCRAPY_REMAPS = {} if W3LIB_FOLLOWS_THE_URL_STANDARD else {"http://faß.de/": "fass.de"}

#: (URL, host key or None, verdict). A verdict of an address is the resolver's, with no query; a name is
#: resolved by DNS; an invalid host is refused before any resolution.
CASES: list[tuple[str, str | None, str]] = [
    # The five numeric forms: IPv4 by the URL Standard's IPv4 parser
    ("http://0x7f.1/", "127.0.0.1", REFUSED),
    ("http://127.1/", "127.0.0.1", REFUSED),
    ("http://0/", "0.0.0.0", REFUSED),
    ("http://2130706433/", "127.0.0.1", REFUSED),
    ("http://0300.0250.0.1/", "192.168.0.1", REFUSED),
    # More of the parser: octal, hex, mixed, a trailing dot, the top of the range, public addresses
    ("http://0177.0.0.1/", "127.0.0.1", REFUSED),
    ("http://0x7f000001/", "127.0.0.1", REFUSED),
    ("http://127.0.0.1./", "127.0.0.1", REFUSED),
    ("http://0xA9.0xFE.0xA9.0xFE/", "169.254.169.254", REFUSED),
    ("http://4294967295/", "255.255.255.255", REFUSED),
    ("http://134744072/", "8.8.8.8", PUBLIC),
    ("http://0x08.0x08.0x08.0x08:8080/", "8.8.8.8", PUBLIC),
    ("http://8.8.8.8/", "8.8.8.8", PUBLIC),
    # Percent-encoded hosts are decoded first
    ("http://%31%32%37.0.0.1/", "127.0.0.1", REFUSED),
    ("http://%30x7f.1/", "127.0.0.1", REFUSED),
    ("http://ex%61mple.com/", "example.com", NAME),
    # IDN: UTS #46, non-transitional (as the URL Standard requires)
    ("http://Bücher.Example/", "xn--bcher-kva.example", NAME),
    ("http://faß.de/", "xn--fa-hia.de", NAME),
    ("http://xn--ls8h.la/", "xn--ls8h.la", NAME),
    ("http://ＥＸＡＭＰＬＥ.com/", "example.com", NAME),  # full-width letters are mapped
    ("http://example。com/", "example.com", NAME),  # an ideographic full stop is a dot
    ("http://１２７.0.0.1/", "127.0.0.1", REFUSED),  # full-width digits map to an IPv4 address
    # IPv6, with and without a zone id
    ("http://[::1]/", "::1", REFUSED),
    ("http://[2001:4860:4860:0:0:0:0:8888]:443/", "2001:4860:4860::8888", PUBLIC),
    ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1", REFUSED),
    ("http://[fe80::1%25eth0]/", None, INVALID),
    ("http://[fe80::1%eth0]/", None, INVALID),
    # Trailing dots
    ("http://example.com./", "example.com", NAME),
    ("http://example.com../", None, INVALID),  # an empty label: no DNS name (and "0.." is no "0")
    ("http://0../", None, INVALID),
    ("http://a..b/", None, INVALID),
    # Hosts the Standard rejects
    ("http://1.2.3.4.5/", None, INVALID),
    ("http://256.0.0.1/", None, INVALID),
    ("http://0x100000000/", None, INVALID),
    ("http://4294967296/", None, INVALID),
    ("http://09/", None, INVALID),
    ("http://foo.09/", None, INVALID),
    ("http://a%zz.com/", None, INVALID),
    ("http://a^b.com/", None, INVALID),
    ("http://%25/", None, INVALID),
    ("http://x:99999/", None, INVALID),
    ("http://./", None, INVALID),
]


# --------------------------------------------------------------------------------------------------
# The socket guard


@contextlib.contextmanager
def no_dns(ignore_ports: tuple[int, ...] = ()) -> Iterator[list[str]]:
    """Record (and stop) every DNS query attempt in this process while active: a UDP send or connect, a
    connect to port 53, a ``getaddrinfo`` / ``gethostbyname(_ex)`` of a host that is no IP literal.
    Sockets bound to ``ignore_ports`` (a local DNS server's own replies) are not watched. Yields the log."""
    log: list[str] = []
    originals: dict[str, Any] = {}

    def literal(host: Any) -> bool:
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        try:
            ipaddress.ip_address(str(host).split("%")[0])
        except ValueError:
            return host is None
        return True

    def watched(sock: socket.socket) -> bool:
        try:
            port = sock.getsockname()[1]
        except (OSError, IndexError):
            port = 0
        return port not in ignore_ports

    def wrap_send(name: str) -> None:
        original = originals[name] = getattr(socket.socket, name)

        def send(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if self.type == socket.SOCK_DGRAM and watched(self):
                log.append(f"{name} on a UDP socket: {args[-1] if args else ''}")
                raise OSError("no_dns guard: a UDP datagram (a DNS query?) was about to leave the process")
            return original(self, *args, **kwargs)

        setattr(socket.socket, name, send)

    def wrap_connect(name: str) -> None:
        original = originals[name] = getattr(socket.socket, name)

        def connect(self: socket.socket, address: Any, *args: Any, **kwargs: Any) -> Any:
            port = address[1] if isinstance(address, tuple) and len(address) > 1 else None
            if (self.type == socket.SOCK_DGRAM or port == 53) and watched(self):
                log.append(f"{name} to {address!r}")
                raise OSError("no_dns guard: a DNS connection was about to be opened")
            return original(self, address, *args, **kwargs)

        setattr(socket.socket, name, connect)

    for name in ("sendto", "sendmsg", "send", "sendall"):
        wrap_send(name)
    for name in ("connect", "connect_ex"):
        wrap_connect(name)
    module_originals = {name: getattr(socket, name) for name in ("getaddrinfo", "gethostbyname",
                                                                 "gethostbyname_ex")}

    def lookup_guard(name: str) -> Any:
        original = module_originals[name]

        def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
            if not literal(host):
                log.append(f"{name}({host!r})")
                raise OSError(f"no_dns guard: {name}({host!r}) would query DNS")
            return original(host, *args, **kwargs)

        return guarded

    for name in module_originals:
        setattr(socket, name, lookup_guard(name))
    try:
        yield log
    finally:
        for name, original in originals.items():
            setattr(socket.socket, name, original)
        for name, original in module_originals.items():
            setattr(socket, name, original)


def _resolver(srv: Any, **kwargs: Any) -> PublicHostnameResolver:
    from twisted.internet import reactor

    return PublicHostnameResolver(reactor, nameservers=[srv.nameserver], timeout=1.0, **kwargs)


async def _outcome(d: Any) -> Any:
    try:
        return await d
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc


# --------------------------------------------------------------------------------------------------
# The table


@pytest.mark.parametrize("url, key, verdict", CASES, ids=[c[0] for c in CASES])
def test_host_key_follows_the_url_standard(url, key, verdict):
    assert host_key(url) == key
    if verdict == INVALID:
        with pytest.raises(InvalidHost) as info:
            url_host(url)
        assert info.value.reason and info.value.url == url
        return
    host = url_host(url)
    assert host is not None and host.key == key
    assert (host.ip is not None) == (verdict != NAME)
    # Scrapy's own spelling of the URL names the same host, except where Scrapy (w3lib < 2.6.0) maps a name
    # by IDNA2003 before we see it (faß.de → fass.de): the request then names fass.de, and fass.de is paced.
    if url not in SCRAPY_REMAPS:
        assert host_key(Request(url).url) == key
    else:
        assert host_key(Request(url).url) == SCRAPY_REMAPS[url]


@pytest.mark.parametrize("url, key, verdict", [c for c in CASES if c[2] != INVALID],
                         ids=[c[0] for c in CASES if c[2] != INVALID])
@pytest_twisted.ensureDeferred
async def test_address_verdict_without_a_dns_query(dns_server, url, key, verdict):
    """Addresses go straight to the address rules: no query leaves the process (the guard and the server's
    log agree). Names are asked — the guard's negative control."""
    srv = dns_server({key: [("8.8.4.4", 300)]})
    resolver = _resolver(srv)
    raw = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0] if "]" not in url else key
    with no_dns(ignore_ports=(srv.port,)) as log:
        by_key = await _outcome(resolver.resolve(key))
        by_raw = await _outcome(resolver.resolve(raw))  # what Twisted hands the resolver: the raw host
    if verdict == NAME:
        assert log, "the guard saw no query for a name: it guards nothing"
        return
    assert log == [], f"a DNS query left the process for {url}: {log}"
    assert srv.total() == 0, srv.queries
    for outcome in (by_key, by_raw):
        if verdict == PUBLIC:
            assert outcome == [key], outcome
        else:
            assert isinstance(outcome, BlockedHost) and outcome.dropped == [key], outcome
    assert resolver.counts["lookups"] == 0


@pytest.mark.parametrize("url", [c[0] for c in CASES if c[2] == INVALID])
@pytest_twisted.ensureDeferred
async def test_rejected_hosts_are_refused_with_a_reason_and_no_query(dns_server, url):
    from scrapy_polite.middleware import PoliteDownloaderMiddleware
    from tests.support.scheduler_pacer import SchedulerPacer

    pacer = SchedulerPacer()
    mw = PoliteDownloaderMiddleware(pacer)  # type: ignore[arg-type]
    with no_dns() as log:
        try:
            request = Request(url)
        except ValueError:  # Scrapy itself refuses it: nothing to check further
            return
        with pytest.raises(IgnoreRequest) as info:
            await mw.process_request(request)
    assert log == []
    message = str(info.value)
    assert "scrapy-polite refuses" in message and url.split("//")[1][:3] in message
    assert pacer.counts in ({"refused/invalid_host": 1}, {"refused/no_host": 1}), pacer.counts
    # The resolver refuses the raw host the same way, without a query
    srv = dns_server({})
    raw = url.split("//", 1)[1].rstrip("/")
    with no_dns(ignore_ports=(srv.port,)) as log:
        outcome = await _outcome(_resolver(srv).resolve(raw))
    if "%" in raw and raw.startswith("["):  # an IPv6 address with a zone id: an address, never public
        assert isinstance(outcome, BlockedHost), (raw, outcome)
    elif not raw.startswith("x:"):  # a port is no part of a host name
        assert isinstance(outcome, InvalidHostName), (raw, outcome)
    assert log == [] and srv.total() == 0


def test_name_host_reads_bare_hosts_as_the_url_standard_does():
    assert name_host("0x7f.1").key == "127.0.0.1"
    assert name_host("[2001:DB8::1]").key == "2001:db8::1" == name_host("2001:db8::1").key
    assert str(name_host("fe80::1%eth0").ip) == "fe80::1%eth0"  # kept, so is_public refuses it
    assert name_host("Bücher.test.").key == "xn--bcher-kva.test"
    for bad in ("1.2.3.4.5", "a b", "x/y", "a@b", "", " ", "a\\b", "[1.2.3.4]"):
        with pytest.raises(InvalidHost):
            name_host(bad)
    with pytest.raises(TypeError):
        name_host(b"example.com")  # type: ignore[arg-type]


@pytest.mark.parametrize("url, key", [
    ("HTTP://EXAMPLE.com/", "example.com"),
    ("  http://example.com/  ", "example.com"),
    ("http://exa\tmple.com/", "example.com"),
    ("http://exa\nmple.com/", "example.com"),
])
def test_urls_off_the_simple_form_are_parsed_whole(url, key):
    assert host_key(url) == key


@pytest.mark.parametrize("url", ["http://user:pw@example.com:81/", "http://a@b@example.com/", "HTTPS://u@h.example/",
                                 "  http://user:pw@exa\tmple.com/", "ws://u:p@h.example/"])
def test_an_http_url_with_user_info_is_refused(url):
    """Its user info would be sent in the Host header (a trial's server received ``Host: user:pw@robo.test``;
    Scrapy's own handler fails such a URL): refused, saying how to give credentials. The control: an FTP URL
    (whose handler takes its credentials from meta, and sends no Host header) keeps its host."""
    with pytest.raises(InvalidHost, match="user info .* HttpAuthMiddleware"):
        url_host(url)
    assert host_key("ftp://user:pw@Example.com/f") == "example.com"


@pytest.mark.parametrize("url", ["http:///x", "http:x", "http://evil.com\\@good.com/", "http:\\\\x\\y"])
def test_a_url_other_parsers_read_differently_is_refused(url):
    """The URL Standard and Python's urlsplit (hence Twisted's Host header) disagree — ``evil.com`` against
    ``good.com``, ``x`` against none: refused, not guessed. (Scrapy's Request rewrites the last three into
    the simple form first, so a crawl meets them only through a URL built without Scrapy.)"""
    with pytest.raises(InvalidHost, match="Python's and Twisted's"):
        url_host(url)
    assert host_key(url) is None


@pytest.mark.parametrize("url, key", [
    ("s3://my-bucket/data/x.json", "my-bucket.s3.amazonaws.com"),
    ("S3://My.Bucket/k?x=1", "my.bucket.s3.amazonaws.com"),
    ("s3://key:secret@my-bucket/k", "my-bucket.s3.amazonaws.com"),
    ("s3://127.0.0.1/k", "127.0.0.1.s3.amazonaws.com"),  # a domain under amazonaws.com, never the address
])
def test_an_s3_url_is_keyed_by_the_host_scrapys_s3_handler_contacts(url, key):
    """Scrapy's S3 handler downloads ``s3://BUCKET/KEY`` from ``BUCKET.s3.amazonaws.com`` (docs/spec.md §1); any
    other scheme without special meaning keeps the host it names (the control)."""
    assert host_key(url) == key
    assert host_key(url.replace("s3:", "s3x:", 1).replace("S3:", "s3x:", 1)) != key


def test_an_s3_url_whose_bucket_makes_no_host_is_refused():
    with pytest.raises(InvalidHost, match="its bucket makes no host name") as refused:
        url_host("s3://a%2fb/k")
    assert refused.value.url == "s3://a%2fb/k"


# --------------------------------------------------------------------------------------------------
# A real crawl


class _Spider(ListSpider):
    name = "numeric"


NUMERIC_LOOPBACK = ["0x7f.1", "127.1", "2130706433", "0177.0.0.1", "%31%32%37.0.0.1", "0x7f.0.0.1"]


@pytest.mark.parametrize("allowed", [True, False], ids=["allowed", "not allowed"])
@pytest_twisted.ensureDeferred
async def test_a_crawl_of_numeric_hosts_sends_no_dns_query(arrival_server, dns_server, allowed):
    """The URL Standard's spellings of 127.0.0.1 are 127.0.0.1: fetched from the loopback server when
    127.0.0.0/8 is allowed, refused as non-public when it is not — and no DNS query either way."""
    srv = arrival_server("127.0.0.1")
    dns_srv = dns_server({s: [("127.0.0.1", 300)] for s in NUMERIC_LOOPBACK})  # would answer, if asked
    urls = [f"http://{s}:{srv.port}/{i}" for i, s in enumerate(NUMERIC_LOOPBACK)]
    settings = polite_settings(POLITE_DNS_NAMESERVERS=[dns_srv.address], POLITE_DNS_TIMEOUT=1.0,
                               POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0,
                               POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"] if allowed else [])
    with no_dns(ignore_ports=(dns_srv.port,)) as log, guarded_connects() as connects:
        crawler = await run_crawl(_Spider, settings, urls=urls, timeout=60)
    spider = crawler.spider
    assert log == [] and dns_srv.total() == 0, (log, dns_srv.queries)
    if allowed:
        # (w3lib >= 2.6.0 already writes each spelling as 127.0.0.1 in the Request; before, we read them)
        assert sorted(f.url for f in spider.fetched) == sorted(Request(u).url for u in urls) and not spider.failed
        assert {f.ip for f in spider.fetched} == {"127.0.0.1"}
        assert sorted(a.path for a in srv.arrivals()) == sorted(f"/{i}" for i in range(len(urls)))
        assert {h for h, _ in connects} == {"127.0.0.1"}
    else:
        assert spider.fetched == [] and srv.arrivals() == [] and connects == []
        assert {f.error for f in spider.failed} == {"BlockedHost"} and len(spider.failed) == len(urls)
        assert crawler.stats.get_value("polite/blocked/private_address") == len(urls)
