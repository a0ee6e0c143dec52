"""PublicHostnameResolver (docs/spec.md §4) against a scripted local DNS server (:mod:`tests.support.dns_server`).

Every test points the resolver at a :class:`~tests.support.dns_server.LocalDNSServer` on 127.0.0.1 and an
ephemeral port, with a fake clock (``clock=lambda: t[0]``) so TTLs are checked without sleeping. Nothing
is ever connected to here: the DNS answers use public literals (8.8.8.8, 1.1.1.1, 2606:4700::1111 …) or
non-public ones that must be dropped, and only the resolver's answers are inspected.

"One query" means one A query on the server (a lookup asks A then AAAA).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolutionReceiver
from zope.interface import implementer

from scrapy_polite.network.addresses import AddressFilter
from scrapy_polite.resolver import (
    BlockedHost,
    BlockedProxy,
    DNSServerFailure,
    DNSTimeout,
    HostNotFound,
    InvalidHostName,
    PublicHostnameResolver,
    parse_nameserver,
)
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)

NON_STANDARD_IPV4 = ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "017700000001",
                     "127.000.000.001", "0", "0x7f.0.0.1", "127.0.1"]


# ---------------------------------------------------------------------------------------------------
# Helpers


class Clock:
    """A fake epoch clock: ``clock()`` reads it, ``clock.advance(s)`` moves it."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.t = [now]

    def __call__(self) -> float:
        return self.t[0]

    def advance(self, seconds: float) -> None:
        self.t[0] += seconds


def make_resolver(srv, clock=None, **kwargs):
    from twisted.internet import reactor

    kwargs.setdefault("timeout", 3.0)
    return PublicHostnameResolver(reactor, nameservers=[srv.nameserver], clock=clock or Clock(), **kwargs)


async def failure_of(d):
    """The exception a Deferred fails with (AssertionError when it succeeds)."""
    try:
        result = await d
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError(f"expected a failure, got {result!r}")


@implementer(IResolutionReceiver)
class Receiver:
    """A fake Twisted IResolutionReceiver: collects the addresses; ``done`` fires at resolutionComplete."""

    def __init__(self) -> None:
        self.began = None
        self.addresses: list = []
        self.done: defer.Deferred = defer.Deferred()

    def resolutionBegan(self, resolution) -> None:
        self.began = resolution

    def addressResolved(self, address) -> None:
        self.addresses.append(address)

    def resolutionComplete(self) -> None:
        self.done.callback([a.host for a in self.addresses])


async def resolve_host_name(resolver, name, port=80, address_types=None):
    receiver = Receiver()
    resolver.resolveHostName(receiver, name, port, addressTypes=address_types)
    hosts = await receiver.done
    assert receiver.began is not None and receiver.began.name == name
    assert all(a.port == port for a in receiver.addresses)
    return hosts


# ---------------------------------------------------------------------------------------------------
# The local DNS server itself


def test_local_dns_server_answers_counts_and_fails_as_scripted(dns_server):
    import dns.message
    import dns.query
    import dns.rcode

    srv = dns_server({"www.test": [("8.8.8.8", 300), ("1.1.1.1", 200), ("2606:4700::1111", 50)]})
    srv.set_mode("servfail", "sf.test")
    answer = dns.query.udp(dns.message.make_query("WWW.test.", "A"), srv.host, port=srv.port, timeout=2)
    assert sorted(rr.address for rr in answer.answer[0]) == ["1.1.1.1", "8.8.8.8"]
    assert answer.answer[0].ttl == 200
    answer = dns.query.tcp(dns.message.make_query("www.test", "AAAA"), srv.host, port=srv.port, timeout=2)
    assert [rr.address for rr in answer.answer[0]] == ["2606:4700::1111"]
    assert dns.query.udp(dns.message.make_query("nope.test", "A"), srv.host, port=srv.port,
                         timeout=2).rcode() == dns.rcode.NXDOMAIN
    assert dns.query.udp(dns.message.make_query("sf.test", "A"), srv.host, port=srv.port,
                         timeout=2).rcode() == dns.rcode.SERVFAIL
    assert srv.lookups("www.test") == 1 and srv.lookups("www.test", "AAAA") == 1
    assert srv.names() == ["www.test", "nope.test", "sf.test"]


# ---------------------------------------------------------------------------------------------------
# TTL


@pytest_twisted.ensureDeferred
async def test_ttl_is_honoured(dns_server):
    srv = dns_server({"ttl.test": [("8.8.8.8", 300)]})
    clock = Clock()
    resolver = make_resolver(srv, clock, min_ttl=0, max_ttl=3600)
    assert await resolver.resolve("ttl.test") == ["8.8.8.8"]
    assert srv.lookups("ttl.test") == 1
    clock.advance(299)
    assert await resolver.resolve("TTL.test.") == ["8.8.8.8"]  # normalised name, same cache entry
    assert srv.lookups("ttl.test") == 1, "a second resolve within the TTL must not query again"
    clock.advance(2)  # 301 s after the answer
    srv.set("ttl.test", [("1.1.1.1", 300)])
    assert await resolver.resolve("ttl.test") == ["1.1.1.1"]
    assert srv.lookups("ttl.test") == 2, "after the TTL the name must be looked up again"


@pytest.mark.parametrize("records, min_ttl, lifetime, why", [
    pytest.param([("8.8.8.8", 600), ("2606:4700::1111", 100)], 0, 100, "the smaller of the A and AAAA TTLs",
                 id="a-and-aaaa-the-smaller"),
    pytest.param([("8.8.8.8", 0)], 60, 60, "a TTL 0 answer must be cached for POLITE_DNS_MIN_TTL",
                 id="zero-cached-for-min-ttl"),
    pytest.param([("8.8.8.8", 86400)], 60, 3600, "a TTL 86400 answer must expire after POLITE_DNS_MAX_TTL",
                 id="long-capped-at-max-ttl"),
])
@pytest_twisted.ensureDeferred
async def test_an_answer_is_cached_for_its_ttl_within_the_bounds(dns_server, records, min_ttl, lifetime, why):
    """The answer is kept ``lifetime`` seconds (POLITE_DNS_MAX_TTL 3600): one second before, no query; one
    second after, a new one."""
    srv = dns_server({"name.test": records})
    clock = Clock()
    resolver = make_resolver(srv, clock, min_ttl=min_ttl, max_ttl=3600)
    assert await resolver.resolve("name.test") == [address for address, _ in records]
    clock.advance(lifetime - 1)
    await resolver.resolve("name.test")
    assert srv.lookups("name.test") == 1, why
    clock.advance(2)
    await resolver.resolve("name.test")
    assert srv.lookups("name.test") == 2, why


@pytest_twisted.ensureDeferred
async def test_min_ttl_zero_means_every_resolve_queries_a_ttl_zero_name(dns_server):
    srv = dns_server({"zero.test": [("8.8.8.8", 0)]})
    resolver = make_resolver(srv, Clock(), min_ttl=0, max_ttl=3600)
    for _ in range(3):
        await resolver.resolve("zero.test")
    assert srv.lookups("zero.test") == 3


def test_from_settings_reads_the_dns_settings():
    from scrapy.settings import Settings
    from twisted.internet import reactor

    resolver = PublicHostnameResolver.from_settings(Settings({
        "POLITE_DNS_NAMESERVERS": ["127.0.0.1:5353", "[::1]:53"],
        "POLITE_DNS_TIMEOUT": 0.5, "POLITE_DNS_MIN_TTL": 0, "POLITE_DNS_MAX_TTL": 10,
        "POLITE_DNS_OVERRIDES": {"A.Test.": ["127.0.0.9"]},
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.9/32"],
    }), reactor)
    assert resolver.nameservers == [("127.0.0.1", 5353), ("::1", 53)]
    assert (resolver.timeout, resolver.min_ttl, resolver.max_ttl) == (0.5, 0.0, 10.0)
    assert resolver.overrides == {"a.test": ("127.0.0.9",)}
    assert resolver.filter.allows("127.0.0.9") and not resolver.filter.allows("127.0.0.1")


@pytest.mark.parametrize("entry, expected", [
    ("127.0.0.1:5353", ("127.0.0.1", 5353)), ("8.8.8.8", ("8.8.8.8", 53)),
    ("[::1]:5300", ("::1", 5300)), ("::1", ("::1", 53)),
])
def test_parse_nameserver(entry, expected):
    assert parse_nameserver(entry) == expected


@pytest.mark.parametrize("entry", ["dns.google", "127.0.0.1:0", "127.0.0.1:70000", "[::1]:x"])
def test_parse_nameserver_refuses(entry):
    with pytest.raises(ValueError):
        parse_nameserver(entry)


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"min_ttl": -1}, {"min_ttl": 10, "max_ttl": 5},
                                    {"overrides": {"x.test": ["2130706433"]}},
                                    {"overrides": {"x.test": ["example.com"]}}])
def test_constructor_refuses_bad_values(kwargs):
    from twisted.internet import reactor

    with pytest.raises(ValueError):
        PublicHostnameResolver(reactor, **kwargs)


# ---------------------------------------------------------------------------------------------------
# The public-only filter


@pytest_twisted.ensureDeferred
async def test_mixed_answer_keeps_only_public_addresses(dns_server):
    srv = dns_server({"mixed.test": [("8.8.8.8", 300), ("10.0.0.1", 300)],
                      "mixed6.test": [("2606:4700::1111", 300), ("fd00::1", 300), ("1.1.1.1", 300),
                                      ("169.254.169.254", 300), ("::ffff:10.0.0.1", 300)]})
    resolver = make_resolver(srv)
    assert await resolver.resolve("mixed.test") == ["8.8.8.8"]
    assert await resolver.resolve("mixed6.test") == ["1.1.1.1", "2606:4700::1111"]
    assert await resolver.lookup("mixed.test") == ("8.8.8.8", "10.0.0.1")  # unfiltered, sorted
    assert resolver.counts["dropped"] == 4


@pytest_twisted.ensureDeferred
async def test_answer_is_sorted_and_deduplicated(dns_server):
    srv = dns_server({"dup.test": [("8.8.8.8", 300), ("1.1.1.1", 300), ("2606:4700::1111", 300),
                                   ("2001:4860:4860::8888", 300)]})
    resolver = make_resolver(srv)
    assert await resolver.resolve("dup.test") == ["1.1.1.1", "8.8.8.8", "2001:4860:4860::8888",
                                                  "2606:4700::1111"]


@pytest_twisted.ensureDeferred
async def test_all_private_answer_is_blocked_naming_host_and_every_address(dns_server):
    dropped = ["10.0.0.1", "169.254.169.254", "192.168.1.1", "::1", "64:ff9b::a00:1", "fd00::1"]
    srv = dns_server({"evil.test": [(a, 300) for a in dropped]})
    resolver = make_resolver(srv)
    exc = await failure_of(resolver.resolve("Evil.Test."))
    assert isinstance(exc, BlockedHost)
    from scrapy.exceptions import IgnoreRequest

    assert isinstance(exc, IgnoreRequest)  # Scrapy drops the request instead of retrying it
    assert exc.host == "evil.test"
    assert sorted(exc.dropped) == sorted(dropped)
    message = str(exc)
    assert "evil.test" in message
    for address in dropped:
        assert address in message, f"{address} missing from {message!r}"
    assert resolver.counts["blocked"] == 1


@pytest_twisted.ensureDeferred
async def test_allowed_networks_and_allow_private(dns_server):
    srv = dns_server({"lan.test": [("10.1.2.3", 300), ("192.168.1.1", 300)]})
    only_ten = make_resolver(srv, address_filter=AddressFilter(allowed_networks=["10.0.0.0/8"]))
    assert await only_ten.resolve("lan.test") == ["10.1.2.3"]
    everything = make_resolver(srv, address_filter=AddressFilter(allow_private=True))
    assert await everything.resolve("lan.test") == ["10.1.2.3", "192.168.1.1"]


# ---------------------------------------------------------------------------------------------------
# DNS failures


@pytest_twisted.ensureDeferred
async def test_nxdomain_is_host_not_found(dns_server):
    srv = dns_server({})
    resolver = make_resolver(srv)
    exc = await failure_of(resolver.resolve("missing.test"))
    assert isinstance(exc, HostNotFound) and isinstance(exc, DNSLookupError)
    assert "missing.test" in str(exc)
    assert resolver.counts["dns/nxdomain"] == 1


@pytest_twisted.ensureDeferred
async def test_name_without_address_records_is_host_not_found(dns_server):
    srv = dns_server({"empty.test": []})
    exc = await failure_of(make_resolver(srv).resolve("empty.test"))
    assert isinstance(exc, HostNotFound)


@pytest_twisted.ensureDeferred
async def test_servfail_is_dns_server_failure(dns_server):
    srv = dns_server({"sf.test": [("8.8.8.8", 300)]}, mode="servfail")
    resolver = make_resolver(srv)
    exc = await failure_of(resolver.resolve("sf.test"))
    assert isinstance(exc, DNSServerFailure) and isinstance(exc, DNSLookupError)
    assert "sf.test" in str(exc)
    assert resolver.counts["dns/servfail"] == 1
    # A server failure is not cached as a negative answer: the next resolve asks again.
    srv.set_mode("answer")
    assert await resolver.resolve("sf.test") == ["8.8.8.8"]


@pytest_twisted.ensureDeferred
async def test_no_answer_is_dns_timeout_within_the_configured_time(dns_server):
    srv = dns_server({"slow.test": [("8.8.8.8", 300)]}, mode="silent")
    resolver = make_resolver(srv, timeout=0.5)
    started = time.monotonic()
    exc = await failure_of(resolver.resolve("slow.test"))
    elapsed = time.monotonic() - started
    assert isinstance(exc, DNSTimeout) and isinstance(exc, DNSLookupError)
    assert "slow.test" in str(exc) and "POLITE_DNS_TIMEOUT" in str(exc)
    assert elapsed < 0.5 + 1.0, f"a 0.5 s timeout took {elapsed:.2f} s"
    assert srv.lookups("slow.test") >= 1
    assert resolver.counts["dns/timeout"] == 1


@pytest.mark.parametrize("mode", ["servfail", "silent"])
@pytest_twisted.ensureDeferred
async def test_a_failing_aaaa_query_does_not_lose_the_a_answer(dns_server, mode):
    """Some authoritative servers SERVFAIL or never answer AAAA queries while serving A fine (and the other
    way round). The host has a perfectly good address; like getaddrinfo and Happy Eyeballs (RFC 8305 §3),
    the answer that came back is used rather than the whole host failing."""
    srv = dns_server({"v4only.test": [("8.8.8.8", 300)], "v6only.test": [("2606:4700::1111", 300)]})
    srv.set_mode(mode, "v4only.test", "AAAA")
    srv.set_mode(mode, "v6only.test", "A")
    resolver = make_resolver(srv, timeout=0.5)
    assert await resolver.resolve("v4only.test") == ["8.8.8.8"]
    assert await resolver.resolve("v6only.test") == ["2606:4700::1111"]


@pytest_twisted.ensureDeferred
async def test_nxdomain_is_cached_negatively_for_at_most_min_ttl(dns_server):
    srv = dns_server({})
    clock = Clock()
    resolver = make_resolver(srv, clock, min_ttl=30)
    await failure_of(resolver.resolve("gone.test"))
    await failure_of(resolver.resolve("gone.test"))
    assert srv.lookups("gone.test") == 1
    clock.advance(31)
    srv.set("gone.test", [("8.8.8.8", 300)])
    assert await resolver.resolve("gone.test") == ["8.8.8.8"]


# ---------------------------------------------------------------------------------------------------
# Overrides and literals: no query


@pytest_twisted.ensureDeferred
async def test_overrides_win_over_dns_without_a_query(dns_server):
    srv = dns_server({"over.test": [("8.8.8.8", 300)]})
    resolver = make_resolver(srv, overrides={"Over.Test": ["1.1.1.1", "2606:4700::1111", "1.1.1.1"]})
    assert await resolver.resolve("over.test") == ["1.1.1.1", "2606:4700::1111"]
    assert await resolver.resolve("over.test.") == ["1.1.1.1", "2606:4700::1111"]
    assert srv.total() == 0


@pytest_twisted.ensureDeferred
async def test_override_to_a_private_address_is_still_filtered(dns_server):
    srv = dns_server({})
    resolver = make_resolver(srv, overrides={"meta.test": ["169.254.169.254"]})
    exc = await failure_of(resolver.resolve("meta.test"))
    assert isinstance(exc, BlockedHost) and exc.dropped == ["169.254.169.254"]
    assert srv.total() == 0


@pytest.mark.parametrize("host, expected", [
    ("8.8.8.8", ["8.8.8.8"]),
    ("2606:4700::1111", ["2606:4700::1111"]),
    ("[2606:4700::1111]", ["2606:4700::1111"]),
    ("[2606:4700:0:0::1111]", ["2606:4700::1111"]),
])
@pytest_twisted.ensureDeferred
async def test_ip_literal_is_not_queried(dns_server, host, expected):
    srv = dns_server({})
    resolver = make_resolver(srv)
    assert await resolver.resolve(host) == expected
    assert srv.total() == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "::ffff:127.0.0.1", "169.254.169.254", "10.0.0.1",
                                  "64:ff9b::a00:1", "0.0.0.0", "fe80::1%eth0", "2001:db8::1", "::a00:1"])
@pytest_twisted.ensureDeferred
async def test_non_public_literal_is_blocked_without_a_query(dns_server, host):
    srv = dns_server({})
    resolver = make_resolver(srv)
    exc = await failure_of(resolver.resolve(host))
    assert isinstance(exc, BlockedHost), exc
    assert srv.total() == 0
    assert await resolve_host_name(resolver, host) == []


@pytest_twisted.ensureDeferred
async def test_localhost_is_loopback_without_a_query(dns_server):
    srv = dns_server({"localhost": [("8.8.8.8", 300)], "x.localhost": [("8.8.8.8", 300)]})
    resolver = make_resolver(srv)
    for host in ("localhost", "x.localhost", "LOCALHOST."):
        exc = await failure_of(resolver.resolve(host))
        assert isinstance(exc, BlockedHost) and sorted(exc.dropped) == ["127.0.0.1", "::1"]
    assert srv.total() == 0


@pytest.mark.parametrize("spelling", NON_STANDARD_IPV4)
@pytest_twisted.ensureDeferred
async def test_url_standard_ipv4_spellings_are_addresses_never_names(dns_server, spelling):
    """``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1`` … are IPv4 addresses by the URL Standard's IPv4
    parser (as in browsers and curl): no query is sent, and the address goes through the filter."""
    srv = dns_server({spelling: [("8.8.8.8", 300)]})  # a server that would lie about the name, if asked
    want = "0.0.0.0" if spelling == "0" else "127.0.0.1"
    assert await make_resolver(srv, address_filter=AddressFilter(allow_private=True)).lookup(spelling) == (want,)
    exc = await failure_of(make_resolver(srv).resolve(spelling))
    assert isinstance(exc, BlockedHost) and exc.dropped == [want] and exc.host == want, exc
    assert await resolve_host_name(make_resolver(srv), spelling) == []
    assert srv.total() == 0, srv.queries
    # Negative control: with a last label that is no number, it is a name, and it is asked.
    srv.set(f"{spelling}.test", [("8.8.8.8", 300)])
    assert await make_resolver(srv).resolve(f"{spelling}.test") == ["8.8.8.8"]
    assert srv.names() == [f"{spelling}.test"]


@pytest.mark.parametrize("name", ["1.2.3.4.5", "256.0.0.1", "0x100000000", "4294967296", "09", "a b", "x/y",
                                  "a%zz", "[v1.x]"])
@pytest_twisted.ensureDeferred
async def test_hosts_the_url_standard_rejects_fail_without_a_query(dns_server, name):
    srv = dns_server({name: [("8.8.8.8", 300)]})
    resolver = make_resolver(srv, address_filter=AddressFilter(allow_private=True))
    exc = await failure_of(resolver.lookup(name))
    assert isinstance(exc, InvalidHostName) and isinstance(exc, DNSLookupError), exc
    assert exc.reason in str(exc)
    assert await resolve_host_name(resolver, name) == []
    assert srv.total() == 0, srv.queries
    assert resolver.counts["invalid_host"] == 2


@pytest_twisted.ensureDeferred
async def test_names_are_asked_in_their_url_standard_form(dns_server):
    """Percent-encoded and IDN names are asked as the URL Standard writes them (decoded, IDNA ASCII)."""
    srv = dns_server({"xn--bcher-kva.test": [("8.8.8.8", 300)], "example.test": [("8.8.4.4", 300)]})
    resolver = make_resolver(srv)
    assert await resolver.resolve("Bücher.test") == ["8.8.8.8"]
    assert await resolver.resolve("ex%61mple.test") == ["8.8.4.4"]
    assert await resolver.resolve("EXAMPLE.test.") == ["8.8.4.4"]  # the cache: one name
    assert srv.names() == ["xn--bcher-kva.test", "example.test"]
    assert srv.lookups("example.test") == 1


# ---------------------------------------------------------------------------------------------------
# Pinning and Twisted's IHostnameResolver


@pytest_twisted.ensureDeferred
async def test_resolve_host_name_delivers_the_public_addresses(dns_server):
    srv = dns_server({"www.test": [("8.8.8.8", 300), ("10.0.0.1", 300), ("2606:4700::1111", 300)]})
    resolver = make_resolver(srv)
    assert await resolve_host_name(resolver, "www.test", 8080) == ["8.8.8.8", "2606:4700::1111"]
    assert await resolve_host_name(resolver, "www.test", address_types=[IPv4Address]) == ["8.8.8.8"]
    assert await resolve_host_name(resolver, "www.test", address_types=[IPv6Address]) == ["2606:4700::1111"]
    assert srv.lookups("www.test") == 1


@pytest_twisted.ensureDeferred
async def test_pin_answers_only_the_pinned_address_until_unpinned(dns_server):
    srv = dns_server({"pin.test": [("8.8.8.8", 300), ("1.1.1.1", 300)]})
    resolver = make_resolver(srv)
    assert await resolve_host_name(resolver, "pin.test") == ["1.1.1.1", "8.8.8.8"]
    resolver.pin("pin.test", "8.8.8.8")
    resolver.pin("PIN.test.", "8.8.8.8")  # a second request booked on the same address
    assert resolver.pinned("pin.test") == ["8.8.8.8"]
    assert await resolve_host_name(resolver, "pin.test") == ["8.8.8.8"]
    resolver.unpin("pin.test", "8.8.8.8")
    assert await resolve_host_name(resolver, "pin.test") == ["8.8.8.8"], "pins are counted per request"
    resolver.unpin("pin.test", "8.8.8.8")
    assert resolver.pinned("pin.test") == []
    assert await resolve_host_name(resolver, "pin.test") == ["1.1.1.1", "8.8.8.8"]
    resolver.unpin("pin.test", "8.8.8.8")  # an extra unpin is harmless
    assert resolver.pinned("pin.test") == []
    resolver.pin("pin.test", "1.1.1.1")
    resolver.unpin("pin.test", "8.8.8.8")  # harmless too while another address of the host is pinned
    assert resolver.pinned("pin.test") == ["1.1.1.1"]


@pytest_twisted.ensureDeferred
async def test_pin_holds_while_dns_rebinds(dns_server):
    """Between the check and the connection the name is rebound to a private address: the pinned answer
    is what Twisted gets, and no new query is even made."""
    srv = dns_server({"rebind.test": [("8.8.8.8", 0)]})
    clock = Clock()
    resolver = make_resolver(srv, clock, min_ttl=0)
    assert await resolver.resolve("rebind.test") == ["8.8.8.8"]
    resolver.pin("rebind.test", "8.8.8.8")
    srv.set("rebind.test", [("10.0.0.1", 0)])
    clock.advance(1)
    assert await resolve_host_name(resolver, "rebind.test") == ["8.8.8.8"]
    assert srv.lookups("rebind.test") == 1
    resolver.unpin("rebind.test", "8.8.8.8")
    assert await resolve_host_name(resolver, "rebind.test") == []  # re-resolved: now blocked
    assert srv.lookups("rebind.test") == 2


@pytest_twisted.ensureDeferred
async def test_a_pin_on_a_non_public_address_delivers_nothing(dns_server):
    srv = dns_server({})
    resolver = make_resolver(srv, overrides={"pin.test": ["8.8.8.8"]})
    resolver.pin("pin.test", "10.0.0.1")
    assert await resolve_host_name(resolver, "pin.test") == []


@pytest_twisted.ensureDeferred
async def test_resolve_host_name_on_blocked_or_unknown_host_delivers_zero_addresses(dns_server):
    srv = dns_server({"evil.test": [("127.0.0.1", 300), ("::1", 300)]})
    srv.set_mode("servfail", "sf.test")
    resolver = make_resolver(srv)
    assert await resolve_host_name(resolver, "evil.test") == []
    assert await resolve_host_name(resolver, "missing.test") == []
    assert await resolve_host_name(resolver, "sf.test") == []


@pytest_twisted.ensureDeferred
async def test_concurrent_resolves_of_one_name_make_one_query(dns_server):
    srv = dns_server({"busy.test": [("8.8.8.8", 300)]}, delay=0.1)
    resolver = make_resolver(srv, min_ttl=0)
    results = await defer.gatherResults([resolver.resolve("busy.test") for _ in range(10)]
                                        + [resolver.resolve("BUSY.test.")])
    assert results == [["8.8.8.8"]] * 11
    assert srv.lookups("busy.test") == 1
    assert resolver.counts["lookups"] == 1


@pytest_twisted.ensureDeferred
async def test_concurrent_resolves_of_a_failing_name_all_fail_with_one_query(dns_server):
    srv = dns_server({}, delay=0.1)
    resolver = make_resolver(srv)
    results = await defer.DeferredList([resolver.resolve("none.test") for _ in range(5)], consumeErrors=True)
    assert all(not ok and failure.check(HostNotFound) for ok, failure in results)
    assert srv.lookups("none.test") == 1


@pytest_twisted.ensureDeferred
async def test_concurrent_resolves_of_different_names_run_in_parallel(dns_server):
    srv = dns_server({f"n{i}.test": [("8.8.8.8", 300)] for i in range(4)}, delay=0.3)
    resolver = make_resolver(srv)
    started = time.monotonic()
    await defer.gatherResults([resolver.resolve(f"n{i}.test") for i in range(4)])
    elapsed = time.monotonic() - started
    # Each lookup is A + AAAA = 0.6 s; four in series would be 2.4 s.
    assert elapsed < 1.8, f"4 lookups took {elapsed:.2f} s: the reactor's thread pool serialised them?"


@pytest_twisted.ensureDeferred
async def test_resolve_known_is_resolve_without_a_deferred_only_when_nothing_is_to_be_asked_or_refused(dns_server):
    """The crawl's fast path (resolve_known) gives resolve's answer for a literal, an override and a fresh cached
    answer of public addresses; for anything resolve must query, refuse or trim it gives None."""
    srv = dns_server({"cached.test": [("8.8.8.8", 300)], "mixed.test": [("8.8.4.4", 300), ("10.0.0.1", 300)],
                      "later.test": [("9.9.9.9", 300)]})
    clock = Clock()
    resolver = make_resolver(srv, clock, min_ttl=0, max_ttl=3600,
                             overrides={"over.test": ["1.1.1.1"], "meta.test": ["169.254.169.254"]})
    assert resolver.resolve_known("later.test") is None and srv.lookups("later.test") == 0  # never asks itself
    assert await resolver.resolve("cached.test") == ["8.8.8.8"]
    assert await resolver.resolve("mixed.test") == ["8.8.4.4"]
    for host in ("8.8.8.8", "[2606:4700::1111]", "over.test", "cached.test", "CACHED.test."):
        assert resolver.resolve_known(host) == await resolver.resolve(host), host
    hits = resolver.counts["cache_hit"]
    resolver.resolve_known("cached.test")
    assert resolver.counts["cache_hit"] == hits + 1  # counted as resolve counts it
    # Negative controls: a refusal, a trimmed answer, an invalid name, an expired answer go through resolve.
    for host in ("meta.test", "10.0.0.1", "mixed.test", "exa mple.test"):
        assert resolver.resolve_known(host) is None, host
    clock.advance(301)
    assert resolver.resolve_known("cached.test") is None
    assert srv.lookups("cached.test") == 1  # and resolve_known did not query


@pytest_twisted.ensureDeferred
async def test_resolve_known_remembers_an_allowed_answer_until_it_expires(dns_server):
    """A host's allowed answer is remembered: an address or an override without reading the clock again, a cached
    answer until its expiry (each hit counted); a refused answer is never remembered."""
    srv = dns_server({"cached.test": [("8.8.8.8", 300)], "other.test": [("9.9.9.9", 300)]})
    clock = Clock()
    reads = [0]

    def counting() -> float:
        reads[0] += 1
        return clock()

    resolver = make_resolver(srv, counting, min_ttl=0, max_ttl=3600,
                             overrides={"over.test": ["1.1.1.1"], "meta.test": ["169.254.169.254"]})
    for host in ("8.8.8.8", "over.test"):
        first = resolver.resolve_known(host)
        before = reads[0]
        again = resolver.resolve_known(host)
        assert again == first and again is not first and reads[0] == before, host  # a list of its own, no clock
        again.append("10.0.0.1")  # the caller's list: the next answer is untouched
        assert resolver.resolve_known(host) == first, host
    assert await resolver.resolve("cached.test") == ["8.8.8.8"]
    assert resolver.resolve_known("cached.test") == ["8.8.8.8"]
    hits = resolver.counts["cache_hit"]
    assert [resolver.resolve_known("cached.test") for _ in range(3)] == [["8.8.8.8"]] * 3
    assert resolver.counts["cache_hit"] == hits + 3  # each remembered answer counted as the cache's
    clock.advance(299)
    assert resolver.resolve_known("cached.test") == ["8.8.8.8"]  # not expired yet
    clock.advance(2)
    assert resolver.resolve_known("cached.test") is None  # expired with the cache entry: resolve queries again
    assert await resolver.resolve("cached.test") == ["8.8.8.8"] and srv.lookups("cached.test") == 2
    assert resolver.resolve_known("cached.test") == ["8.8.8.8"]  # the new answer, remembered anew
    # Negative controls: a refused answer is asked each time, never remembered.
    for _ in range(2):
        assert resolver.resolve_known("meta.test") is None and resolver.resolve_known("10.0.0.1") is None


@pytest_twisted.ensureDeferred
async def test_an_answer_cached_for_ever_still_counts_each_hit(dns_server):
    """A cached answer that never expires (a TTL floor of infinity) is still the cache's: each answer remembered from
    it counts its ``cache_hit``. Negative control: an override, which is no cached answer, counts none."""
    srv = dns_server({"cached.test": [("8.8.8.8", 300)]})
    resolver = make_resolver(srv, Clock(), min_ttl=float("inf"), max_ttl=float("inf"),
                             overrides={"over.test": ["1.1.1.1"]})
    assert await resolver.resolve("cached.test") == ["8.8.8.8"]
    hits = resolver.counts["cache_hit"]
    assert [resolver.resolve_known("cached.test") for _ in range(3)] == [["8.8.8.8"]] * 3
    assert resolver.counts["cache_hit"] == hits + 3
    assert [resolver.resolve_known("over.test") for _ in range(2)] == [["1.1.1.1"]] * 2
    assert resolver.counts["cache_hit"] == hits + 3


@pytest_twisted.ensureDeferred
async def test_the_crawls_resolution_splits_each_answer_once_and_refuses_the_same_way(dns_server):
    """Resolution.addresses applies the crawl's own (narrower) rules to the resolver's answer: the split is kept per
    answer, and a host refused once is refused again (never answered from a kept split of another answer)."""
    from scrapy import Request

    from scrapy_polite.crawl.resolution import Resolution
    from scrapy_polite.reports.counters import Report

    srv = dns_server({})
    resolver = make_resolver(srv, address_filter=AddressFilter(allowed_networks=["127.0.0.0/8"]),
                             overrides={"two.test": ["8.8.8.8", "127.0.0.9"], "local.test": ["127.0.0.9"]})
    resolution = Resolution(SimpleNamespace(), AddressFilter(), Report(None), lambda exc: None)  # type: ignore[arg-type]
    resolution._resolver = resolver
    request = Request("http://two.test/")
    first = await resolution.addresses(request, "two.test")
    again = await resolution.addresses(request, "two.test")
    assert first == again == ["8.8.8.8"] and first is not again  # 127.0.0.9: not allowed by the crawl's rules
    assert len(resolution._splits) == 1
    for _ in range(2):
        with pytest.raises(BlockedHost):
            await resolution.addresses(Request("http://local.test/"), "local.test")


@pytest.mark.parametrize(("proxy", "refused"), [
    ("http://[::1%251]:8080", True),  # a zone id: the URL Standard rejects it, Twisted would connect (review)
    ("http://[fe80::1%25eth0]:3128", True),
    ("http://127.0.0.3:8080", True),  # control: a non-admitted literal, refused by the address rules
    ("http://user:secret@8.8.8.8:3128", False),  # control: a public proxy, user info and all
    ("8.8.4.4:3128", False),  # no scheme, as Scrapy accepts it
])
@pytest_twisted.ensureDeferred
async def test_the_proxy_of_a_request_meets_the_address_rules(dns_server, proxy, refused):
    """``Resolution._check_proxy``: the proxy a request goes to is contacted, so its host must have an allowed
    address (docs/spec.md §4); one the URL Standard rejects is refused, not left to Scrapy."""
    from scrapy_polite.crawl.resolution import Resolution
    from scrapy_polite.reports.counters import Report

    resolution = Resolution(SimpleNamespace(), AddressFilter(allowed_networks=["127.0.0.2/32"]), Report(None),
                            lambda exc: None)  # type: ignore[arg-type]
    resolution._resolver = make_resolver(dns_server({}), address_filter=AddressFilter(allowed_networks=["127.0.0.0/8"]))
    if refused:
        with pytest.raises(BlockedProxy, match="the proxy"):
            await resolution._check_proxy(proxy)
    else:
        await resolution._check_proxy(proxy)
