"""Fuzzing every parser the package owns or feeds (Hypothesis fuzz targets, a bounded run in CI).

Each target feeds random — and randomly mangled valid — input to one parser and checks that nothing but
the parser's documented refusal comes out, so no exception escapes into the crawl:

* ``Retry-After`` (:func:`~scrapy_polite.policy.parse_retry_after`), and whole responses with random
  ``Retry-After``, ``Date`` and rate-limit headers through the :class:`~scrapy_polite.crawl.recording.Recorder`;
* host keys and URLs (:func:`~scrapy_polite.network.hosts.url_host`, :func:`~scrapy_polite.policy.host_key`,
  :func:`~scrapy_polite.network.hosts.name_host`, the middleware's refusal), IDN and IPv6 zone ids included, and
  the cache's fast path against a parse of the whole URL;
* robots.txt ingestion (:func:`~scrapy_polite.policy.robots.parse_robots_delay`);
* DNS answers: a UDP server answering the resolver with random, truncated and bit-flipped messages;
* ``JOBDIR`` files: what a crawl left under ``JOBDIR``, truncated, flipped or replaced, then resumed;
* settings (:meth:`PoliteConfig.from_settings <scrapy_polite.settings.PoliteConfig.from_settings>`).

The run is bounded and derandomised (the ``ci`` profile of tests/conftest.py: the same examples every
run); ``HYPOTHESIS_PROFILE=fuzz`` runs 20,000 random examples per target. Every crasher found is kept as an
``@example`` here or as a regular test (named below each target).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import random
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
import pytest_twisted
from ada_url import parse_url
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.internet.error import DNSLookupError

from scrapy_polite.network.hosts import InvalidHost, name_host, url_host
from scrapy_polite.policy import InvalidRetryAfter, host_key, parse_retry_after
from scrapy_polite.policy.robots import parse_robots_delay
from scrapy_polite.resolver import PublicHostnameResolver
from scrapy_polite.settings import DEFAULTS, PoliteConfig, SettingsError
from tests.support.scheduler_pacer import SchedulerPacer
from tests.test_glue import T0, finish, glue, inline, request

# --------------------------------------------------------------------------------------------------
# Retry-After


retry_after_text = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A\s*[+-]?[0-9]{0,400}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?\s*\Z"),
    st.sampled_from(["inf", "nan", "-0", "0x10", "1_000", "١٢", "\u00a05", "Wed, 21 Oct 2015 07:28:00 GMT",
                     "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
                     "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "Thu, 01 Jan 1970 00:00:00 +9999"]),
)


@given(value=st.one_of(retry_after_text, st.binary(max_size=60)), date=st.one_of(st.none(), retry_after_text),
       now=st.floats(-1e12, 1e12))
@example(value="9" * 400, date=None, now=0.0)
@example(value="Fri, 31 Dec 9999 23:59:59 GMT", date="Mon, 01 Jan 0001 00:00:00 GMT", now=0.0)
def test_fuzz_retry_after(value, date, now):
    try:
        seconds = parse_retry_after(value, now=now, date=date)
    except InvalidRetryAfter:
        return
    assert seconds is None or (seconds >= 0 and not math.isnan(seconds))


header_names = st.sampled_from(["Retry-After", "Date", "RateLimit", "RateLimit-Policy", "RateLimit-Limit",
                                "RateLimit-Remaining", "RateLimit-Reset", "X-RateLimit-Limit",
                                "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After"])
header_values = st.one_of(
    retry_after_text,
    st.binary(max_size=40),
    st.from_regex(r'\A("?[a-z0-9]{0,5}"?;(q|r|t|w|pk)=-?[0-9]{0,12}(\.[0-9]{0,3})?[;,]?){0,4}\Z'),
    st.from_regex(r"\A-?[0-9]{0,20}(, ?-?[0-9]{0,20}){0,3}\Z"),
)


@given(status=st.integers(100, 599), headers=st.dictionaries(header_names, header_values, max_size=6),
       elapsed=st.floats(0, 1000))
@example(status=429, headers={"Retry-After": "9" * 400}, elapsed=0.0)
@example(status=200, headers={"RateLimit": b"\xff\xfe", "RateLimit-Policy": '"x";q=0;w=0'}, elapsed=0.0)
def test_fuzz_response_headers_through_the_recorder(status, headers, elapsed):
    """Any response, with any Retry-After, Date and rate-limit fields, is recorded without an exception,
    and leaves a finite, never shortened row."""
    g = glue(addresses={"a.example": ["192.0.2.1"]})
    req = request("http://a.example/")
    inline(g.booker.before_request(req, "a.example"))
    req.meta["polite_sent_at"] = T0
    before = g.row("a.example")
    g.clock.advance(elapsed)
    d = g.recorder.record_response(req, Response(req.url, status=status, headers=headers, request=req))
    assert d is None or d.called
    inline(finish(g, req))
    row = g.row("a.example")
    assert row is not None and math.isfinite(row.next_allowed)
    assert before is None or row.next_allowed >= before.next_allowed
    assert g.errors == []


# --------------------------------------------------------------------------------------------------
# Host keys and URLs

label = st.one_of(
    st.from_regex(r"\A[a-zA-Z0-9-]{1,12}\Z"),
    st.from_regex(r"\A(0x[0-9a-fA-F]{0,10}|0[0-7]{0,12}|[0-9]{1,11})\Z"),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6),
    st.sampled_from(["bücher", "faß", "xn--", "xn--bcher-kva", "xn--zz", "ß", "\u200d", "\u0661", "１２７", "%31",
                     "%zz", "%2e", "%00", "a%20b", "．", "。", "-", "_", "*", "ǅ"]),
)
hosts = st.one_of(
    st.lists(label, min_size=1, max_size=5).map(".".join),
    st.lists(label, min_size=1, max_size=5).map(lambda ls: ".".join(ls) + "."),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.tuples(st.ip_addresses(v=6), st.from_regex(r"\A[a-z0-9%]{1,8}\Z")).map(lambda t: f"[{t[0]}%25{t[1]}]"),
    st.tuples(st.ip_addresses(v=6), st.from_regex(r"\A[a-z0-9]{1,8}\Z")).map(lambda t: f"[{t[0]}%{t[1]}]"),
    st.text(max_size=30),
)
urls = st.one_of(
    st.builds(lambda scheme, userinfo, host, port, rest: f"{scheme}://{userinfo}{host}{port}{rest}",
              st.sampled_from(["http", "https", "HTTP", "ftp", "ws", "s3", "foo", "file", "data"]),
              st.sampled_from(["", "u@", "u:p@", "@", "a@b@"]), hosts,
              st.sampled_from(["", ":", ":80", ":0", ":65535", ":65536", ":99999999999", ":x", ": 80"]),
              st.sampled_from(["", "/", "/p?q#f", "?q", "#f", "\\x", "/%zz", " x", "\t/"])),
    st.text(max_size=60),
)


@given(url=urls)
@example(url="http://[fe80::1%25eth0]/")
@example(url="http://[fe80::1%eth0]:80/")
@example(url="http://%30x7f.1/")
@example(url="http:\\\\x\\y")
@example(url="http://\udcff/")  # a lone surrogate: not UTF-8 encodable (Hypothesis' text() never makes one)
@example(url="http://a.b\x00c/")
@example(url="http://0../")  # crasher: the key "0" of the name "0.." was the address 0.0.0.0
@example(url="http://H.0..")  # crasher: the key "h.0" was a host the Standard rejects
def test_fuzz_url_hosts(url):
    try:
        host = url_host(url)
    except InvalidHost as exc:
        assert exc.reason and host_key(url) is None
        return
    key = host_key(url)
    if host is None:
        assert key is None
        return
    assert key == host.key and key and key == key.lower().rstrip(".") or host.ip is not None
    if host.ip is not None:
        assert ipaddress.ip_address(host.key) == host.ip
    else:
        assert host.key.isascii() or not _special(url)
    # the key read again as a bare host is the same host (the resolver reads keys so)
    if host.ip is None and _special(url):
        assert name_host(host.key).key == host.key


def _special(url: str) -> bool:
    return url.partition(":")[0].strip().lower() in ("http", "https", "ws", "wss", "ftp")


@given(url=urls)
def test_fuzz_the_cached_fast_path_agrees_with_a_whole_parse(url):
    """The cache keys a URL by ``scheme://authority``: the host a whole-URL parse gives is the same."""
    try:
        host = url_host(url)
    except InvalidHost:
        host = "invalid"
    try:
        parts = parse_url(url, attributes=("hostname", "host_type"))
    except ValueError:
        assert host in ("invalid", None), (url, host)
        return
    if host == "invalid":  # refused although the Standard accepts it: only when urlsplit disagrees
        return
    if host is None:
        return
    hostname = str(parts["hostname"])
    if host.ip is not None:
        assert ipaddress.ip_address(hostname.strip("[]")) == host.ip
    else:
        assert hostname.lower().rstrip(".") == host.key


@given(name=hosts)
@example(name="fe80::1%eth0")
@example(name="[::1]x")
def test_fuzz_bare_host_names(name):
    try:
        host = name_host(name)
    except InvalidHost:
        return
    assert host.key


@given(url=urls)
@settings(max_examples=60)
def test_fuzz_the_middleware_refuses_with_ignore_request_only(url):
    """A URL Scrapy accepts either gets a host key or is refused with IgnoreRequest (counted); nothing else
    escapes ``process_request`` before it reaches the pacer."""
    from scrapy_polite.middleware import PoliteDownloaderMiddleware

    try:
        req = Request(url)
    except (ValueError, TypeError):
        return  # Scrapy refuses it itself
    pacer = SchedulerPacer()  # no booker: a request that gets past its host key fails on it
    mw = PoliteDownloaderMiddleware(pacer)  # type: ignore[arg-type]
    try:
        inline(mw.process_request(req))
    except IgnoreRequest:
        assert sum(pacer.counts.values()) == 1, pacer.counts
    except AttributeError as exc:  # it got past the host key to the (fake) pacer: a host was found
        assert any(unit in str(exc) for unit in ("scheduler", "before_request", "addresses")), exc
        assert req.meta["polite_host"] == host_key(req.url)


# --------------------------------------------------------------------------------------------------
# robots.txt


robots_lines = st.one_of(
    st.from_regex(r"\A(User-agent|user-agent|Crawl-delay|crawl-delay|Request-rate|Disallow|Allow|Sitemap|Host)"
                  r"[ \t]*:[ \t]*[^\n]{0,30}\Z"),
    st.from_regex(r"\ACrawl-delay: ?[-+]?[0-9]{0,400}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,5})?\Z"),
    st.from_regex(r"\ARequest-rate: ?[-+]?[0-9]{0,20}/[-+]?[0-9]{0,20}[smhd]?( [0-9]{4}-[0-9]{4})?\Z"),
    st.sampled_from(["Crawl-delay: inf", "Crawl-delay: nan", "Crawl-delay: 1e309", "Request-rate: 0/0",
                     "Request-rate: 1/0", "Request-rate: 9" * 3, "User-agent: *", "User-agent: test-agent"]),
    st.text(max_size=40),
)


@given(body=st.one_of(st.lists(robots_lines, max_size=12).map("\n".join), st.binary(max_size=300)),
       agent=st.sampled_from(["test-agent", "*", "Scrapy/2.19 (+https://scrapy.org)", ""]))
@example(body="User-agent: *\nCrawl-delay: 1e309", agent="test-agent")
@example(body="User-agent: *\nRequest-rate: 1/0", agent="test-agent")
def test_fuzz_robots_txt(body, agent):
    delay = parse_robots_delay(body, agent)
    assert delay is None or (math.isfinite(delay) and delay >= 0)


@given(body=st.lists(robots_lines, max_size=12).map("\n".join))
@settings(max_examples=60)
def test_fuzz_robots_delays_are_recorded_or_refused_cleanly(body):
    """What robots.txt publishes reaches the pace table (or is refused with a logged ValueError), never an
    exception out of ``set_crawl_delay``."""
    g = glue()
    delay = parse_robots_delay(body, "test-agent")
    d = g.recorder.set_crawl_delay("a.example", delay)
    assert d.called
    failures: list[Any] = []
    d.addErrback(failures.append)
    assert not failures, failures


# --------------------------------------------------------------------------------------------------
# DNS answers


class _FuzzDNS:
    """A UDP DNS server on loopback whose every reply is made by ``self.reply(query) -> bytes | None``."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.reply: Any = lambda query: None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                out = self.reply(wire)
            except Exception:  # noqa: BLE001 - a broken reply maker must not kill the server
                out = None
            if out is not None:
                try:
                    self.sock.sendto(out, peer)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="module")
def fuzz_dns():
    srv = _FuzzDNS()
    yield srv
    srv.stop()


records = st.lists(st.tuples(
    st.sampled_from(["qname", "other.test.", "cname.test."]),
    st.sampled_from(["A", "AAAA", "CNAME", "TXT", "MX"]),
    st.one_of(st.integers(0, 2**31 - 1), st.just(2**32 - 1)),
    st.one_of(st.ip_addresses().map(str), st.sampled_from(["cname.test.", '"txt"', "10 mx.test."])),
), max_size=5)
mangles = st.one_of(st.none(), st.tuples(st.just("truncate"), st.integers(0, 600)),
                    st.tuples(st.just("flip"), st.lists(st.integers(0, 600), min_size=1, max_size=4)),
                    st.tuples(st.just("garbage"), st.binary(max_size=80)),
                    st.tuples(st.just("tc"), st.just(0)), st.tuples(st.just("silent"), st.just(0)))


def _answer(query_wire: bytes, rcode: int, answers: list[Any], mangle: Any) -> bytes | None:
    query = dns.message.from_wire(query_wire)
    response = dns.message.make_response(query)
    response.flags |= dns.flags.RA
    response.set_rcode(rcode)
    qname = query.question[0].name
    for owner, rdtype, ttl, data in answers:
        name = qname if owner == "qname" else dns.name.from_text(owner)
        try:
            rrset = dns.rrset.from_text_list(name, ttl, dns.rdataclass.IN, dns.rdatatype.from_text(rdtype), [data])
        except Exception:  # noqa: BLE001 - data that does not fit the type: leave it out
            continue
        response.answer.append(rrset)
    if mangle is not None and mangle[0] == "tc":
        response.flags |= dns.flags.TC
    wire = response.to_wire()
    if mangle is None or mangle[0] == "tc":
        return wire
    kind, arg = mangle
    if kind == "silent":
        return None
    if kind == "truncate":
        return wire[:arg]
    if kind == "garbage":
        return wire[:2] + arg  # the query id kept, so the resolver reads it
    data = bytearray(wire)
    for index in arg:
        if data:
            data[index % len(data)] ^= 0xFF
    return bytes(data)


@given(rcode=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 9, 16]), answers=records, mangle=mangles)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(rcode=0, answers=[("qname", "A", 2**32 - 1, "192.0.2.1")], mangle=None)
@example(rcode=0, answers=[("qname", "CNAME", 5, "cname.test."), ("cname.test.", "A", 5, "8.8.8.8")], mangle=None)
@example(rcode=0, answers=[("other.test.", "A", 5, "8.8.8.8")], mangle=None)
def test_fuzz_dns_answers(fuzz_dns, rcode, answers, mangle):
    """Whatever a nameserver answers, the resolver's query (the step that runs on a thread and reads the
    answers; called here on the test's thread, the reactor cannot be driven from a Hypothesis example)
    gives valid addresses and a TTL, or fails with a DNSLookupError."""
    fuzz_dns.reply = lambda wire: _answer(wire, rcode, answers, mangle)
    resolver = PublicHostnameResolver(None, nameservers=[("127.0.0.1", fuzz_dns.port)], timeout=0.3,
                                      min_ttl=0, max_ttl=3600)
    try:
        addresses, ttl = resolver._query("fuzz.test")
    except DNSLookupError:
        return
    assert addresses and all(str(ipaddress.ip_address(a)) == a for a in addresses)
    assert 0 <= ttl and math.isfinite(ttl)
    kept, _dropped = resolver.filter.split(addresses)
    assert all(isinstance(a, str) for a in kept)


# --------------------------------------------------------------------------------------------------
# Settings


setting_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.lists(st.one_of(st.integers(-1000, 1000), st.text(max_size=8)), max_size=4),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-5, 5), st.text(max_size=8), st.floats()),
                    max_size=3),
    st.sampled_from(["[429, 503]", '{"a.test": 5}', '{"a.test": ["8.8.8.8"]}', "1e309", "nan", "-1", "0",
                     "127.0.0.0/8,::1/128", "[", "{", "sqlite:///", "memory://", "redis://", "bogus://x",
                     "scrapy.core.scheduler.Scheduler", "scrapy_polite.scheduler.PoliteScheduler", "1.2.3.4:99999"]),
)


@given(values=st.dictionaries(st.sampled_from(sorted(DEFAULTS)), setting_values, max_size=4))
@example(values={"POLITE_DNS_NAMESERVERS": "1.2.3.4:99999"})
@example(values={"POLITE_HOST_INTERVAL": 301.0})  # crasher: PacingPolicy's ValueError, not a SettingsError
@example(values={"POLITE_HOST_DELAYS": {"": 5}})
@example(values={"POLITE_DNS_OVERRIDES": {"0x7f.1": ["8.8.8.8"]}})
def test_fuzz_settings(values):
    try:
        PoliteConfig.from_settings(values)
    except SettingsError as exc:
        assert str(exc)


def test_a_host_interval_above_the_backoff_cap_is_a_settings_error():
    """The fuzz target's crasher as a regular test: the message names both settings."""
    with pytest.raises(SettingsError, match="POLITE_MAX_BACKOFF.*POLITE_HOST_INTERVAL"):
        PoliteConfig.from_settings({"POLITE_HOST_INTERVAL": 301.0})
    PoliteConfig.from_settings({"POLITE_HOST_INTERVAL": 300.0})  # negative control: equal is allowed


# --------------------------------------------------------------------------------------------------
# JOBDIR files


def _mutations() -> list[tuple[str, int]]:
    """The kept seeds of the JOBDIR target: (mutation, seed)."""
    return [("truncate", 1), ("flip", 2), ("garbage", 3), ("empty", 4), ("delete", 5)]


@pytest.fixture(scope="module")
def saved_jobdir(tmp_path_factory):
    """A JOBDIR as a crawl left it: five requests of a throttled host held when the crawl closed."""
    return tmp_path_factory.mktemp("jobdir-fuzz")


@pytest.mark.parametrize("kind, seed", _mutations())
@pytest_twisted.ensureDeferred
async def test_fuzz_jobdir_files(arrival_server, saved_jobdir, tmp_path, caplog, kind, seed):
    """Every file the package left under JOBDIR is truncated, flipped, replaced, emptied or deleted; the
    next run opens, resumes what it can and finishes, and no exception escapes to Scrapy or Twisted."""
    from tests.support.crawl import ListSpider, polite_settings, run_crawl
    from tests.support.server import Reply

    srv = arrival_server("127.0.2.77")
    pristine = saved_jobdir / "pristine"
    urls = [srv.url(f"/j/{i}") for i in range(5)]
    base = polite_settings(POLITE_STORE="memory://", POLITE_HOST_INTERVAL=0.2, POLITE_MAX_IDLE_WAIT=0.5)
    if not pristine.exists():
        srv.route("/*", Reply.throttle(429, "1"))
        await run_crawl(ListSpider, dict(base, JOBDIR=str(pristine)), urls=urls, timeout=30)
        srv.route("/*", Reply.html("<html></html>"))
    ours = [p for p in pristine.rglob("*") if p.is_file() and "polite" in str(p.relative_to(pristine))]
    assert ours, f"the first run left nothing of the package under JOBDIR: {list(pristine.rglob('*'))}"
    jobdir = tmp_path / "job"
    shutil.copytree(pristine, jobdir)
    rng = random.Random(seed)
    for path in [jobdir / p.relative_to(pristine) for p in ours]:
        data = path.read_bytes()
        if kind == "truncate":
            path.write_bytes(data[: rng.randrange(max(len(data), 1))])
        elif kind == "flip":
            buf = bytearray(data)
            for _ in range(max(1, len(buf) // 50)):
                if buf:
                    buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(buf))
        elif kind == "garbage":
            path.write_bytes(rng.randbytes(rng.randrange(1, 200)))
        elif kind == "empty":
            path.write_bytes(b"")
        else:
            path.unlink()
    srv.route("/*", Reply.html("<html></html>"))
    caplog.set_level(logging.ERROR)
    crawler = await run_crawl(ListSpider, dict(base, JOBDIR=str(jobdir)), urls=urls, timeout=60)
    # An unreadable file may be reported by the package (an ERROR naming it); nothing may escape to Scrapy
    # or Twisted as an unhandled error.
    unhandled = [r for r in caplog.records if r.levelno >= logging.ERROR and not r.name.startswith("scrapy_polite")]
    assert unhandled == [], [r.getMessage() for r in unhandled]
    assert crawler.stats.get_value("finish_reason") in ("finished", "polite_deferred"), crawler.stats.get_stats()
    resumed = crawler.stats.get_value("polite/deferred/resumed", 0)
    assert 0 <= resumed <= 5
    assert len(crawler.spider.fetched) <= 5


def test_mutation_seeds_are_kept():
    assert len(_mutations()) == 5 and Path(__file__).name == "test_fuzz.py"
