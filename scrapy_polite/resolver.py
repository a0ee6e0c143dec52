"""Public-only, pinned name resolution for Twisted (docs/spec.md §4).

:class:`PublicHostnameResolver` is a Twisted ``IHostnameResolver`` (IPv4 and IPv6) built on dnspython, and
Scrapy's ``TWISTED_DNS_RESOLVER`` when the add-on is enabled in the project settings. The order of a
resolution is:

1. the host as the WHATWG URL Standard reads it (:func:`~scrapy_polite.network.hosts.name_host`): an IP address in
   any of its spellings (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1`` are 127.0.0.1, as in browsers
   and curl; percent-encoded too) goes straight to the filter, **without a DNS query**; a host the Standard
   rejects (``1.2.3.4.5``) fails with :class:`InvalidHostName`, without a query; a name is IDNA-encoded;
2. ``POLITE_DNS_OVERRIDES`` (host → list of addresses), then ``localhost`` / ``*.localhost`` (RFC 6761
   §6.3: loopback, no query);
3. a fresh cache entry (the answer's TTL clamped to ``[POLITE_DNS_MIN_TTL, POLITE_DNS_MAX_TTL]``);
4. a lookup of A and AAAA with dnspython on a thread (the reactor never blocks), against
   ``POLITE_DNS_NAMESERVERS`` (``host[:port]``; default: the system's) with ``POLITE_DNS_TIMEOUT`` seconds.

The answer is sorted and de-duplicated, then every non-public address is dropped unless
``POLITE_ALLOW_PRIVATE`` or it lies in ``POLITE_ALLOWED_NETWORKS``. A host left with no address is
refused with :class:`BlockedHost` naming the host and the dropped addresses.

:meth:`PublicHostnameResolver.pin` makes the resolver answer only the booked address for a host until the
request is done, so DNS rebinding between the check and the connection is impossible.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import dns.exception
import dns.resolver
from scrapy.exceptions import IgnoreRequest
from twisted.internet import defer, threads
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IHostnameResolver, IHostResolution, IResolutionReceiver
from twisted.python.failure import Failure
from zope.interface import implementer

from .clock import process_clock
from .network.addresses import AddressFilter
from .network.hosts import InvalidHost, name_host
from .settings import DNSConfig, SettingsError, normalise_dns_name, parse_dns_overrides, parse_nameserver

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = [
    "PublicHostnameResolver",
    "BlockedHost",
    "BlockedProxy",
    "MixedAnswer",
    "HostNotFound",
    "DNSServerFailure",
    "DNSTimeout",
    "InvalidHostName",
    "parse_nameserver",
    "routed",
]


class BlockedHost(IgnoreRequest):
    """Every address of the host is non-public (docs/spec.md §4). ``host`` and ``dropped`` (list of str) say which."""

    subject = ""  #: what the message calls the host

    def __init__(self, host: str, dropped: Sequence[str]) -> None:
        self.host = host
        self.dropped = list(dropped)
        super().__init__(
            f"scrapy-polite refuses {self.subject}{host}: it resolves only to non-public addresses "
            f"({', '.join(self.dropped) or 'none'}); allow them with POLITE_ALLOWED_NETWORKS if this is intended")


class BlockedProxy(BlockedHost):
    """The proxy of ``meta['proxy']`` (``host``) has only non-public addresses, or a host the URL Standard rejects."""

    subject = "the proxy "


class MixedAnswer(BlockedHost):
    """Some addresses of the host are non-public, for a request whose handler resolves the host itself
    (a *checked* handler, the browser): it might connect to a dropped one, so the host is refused
    (docs/spec.md §4.1). ``host``, ``kept`` and ``dropped`` (lists of str) say which."""

    def __init__(self, host: str, kept: Sequence[str], dropped: Sequence[str]) -> None:
        super().__init__(host, dropped)
        self.kept = list(kept)
        self.args = (
            f"scrapy-polite refuses {host}: its answer mixes allowed addresses ({', '.join(self.kept)}) with "
            f"non-public ones ({', '.join(self.dropped)}), and the download handler resolves the host itself, "
            "so it could connect to a non-public one; allow them with POLITE_ALLOWED_NETWORKS if this is intended",)


class HostNotFound(DNSLookupError):
    """NXDOMAIN, or neither A nor AAAA records."""


class DNSServerFailure(DNSLookupError):
    """SERVFAIL or refused by every nameserver."""


class DNSTimeout(DNSLookupError):
    """No answer within ``POLITE_DNS_TIMEOUT`` seconds."""


class InvalidHostName(DNSLookupError):
    """The WHATWG URL Standard rejects the name as a host (``1.2.3.4.5``, ``a b``): it is never sent to DNS
    (docs/spec.md §4). ``reason`` says why."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        self.reason = reason
        super().__init__(f"scrapy-polite resolver: {reason}")


#: The most hosts whose allowed answer :meth:`PublicHostnameResolver.resolve_known` remembers (emptied when full).
_ALLOWED_MAX = 10_000


@lru_cache(maxsize=4096)
def _canonical(host: str) -> str:
    """The resolver's key of ``host``: the URL Standard's host (:func:`~scrapy_polite.network.hosts.name_host`), or
    the name lower-cased without trailing dots or brackets when the Standard rejects it. Cached (a pure
    function of the text): every request's pin and unpin asks it."""
    try:
        return name_host(host).key
    except InvalidHost:
        return normalise_dns_name(host)


@lru_cache(maxsize=4096)
def _canonical_address(address: str) -> str:
    """The canonical text of an IP address literal (``str(ipaddress.ip_address(address))``), cached.

    Raises:
        ValueError: ``address`` is not an IP address literal (not cached).
    """
    return str(ipaddress.ip_address(address))


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:  # pragma: no cover - nothing to cancel once started
        pass


@lru_cache(maxsize=4096)
def routed(address: str) -> bool:
    """Whether this machine has a route to ``address`` (an IP literal): asked of the routing table by a UDP socket's
    ``connect``, which sends nothing (no lookup, no packet: it does not block); cached. Decides the family a
    dual-stack host is booked on (:func:`~scrapy_polite.network.addresses.one_family`)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 53))
    except OSError:
        return False
    return True


@lru_cache(maxsize=4096)
def _sort_key(address: str) -> tuple[int, Any]:
    """IPv4 first, then by address (cached: a pinned host is sorted on every connection)."""
    ip = ipaddress.ip_address(address)
    return (ip.version, ip)


@implementer(IHostnameResolver)
class PublicHostnameResolver:
    """A public-only, pinning ``IHostnameResolver`` (docs/spec.md §4).

    Args:
        reactor: the Twisted reactor.
        address_filter: which addresses may be contacted.
        overrides: host → addresses (``POLITE_DNS_OVERRIDES``); entries must be IP literals.
        nameservers: ``(address, port)`` pairs; empty: the system's (``/etc/resolv.conf``).
        timeout: seconds for one lookup (A and AAAA together).
        min_ttl, max_ttl: seconds; an answer is cached for its TTL clamped to this range.
        clock: epoch seconds, for the cache's expiry: the monotonic process clock by default (docs/spec.md §5;
            tests inject one).
        stats: optional callable ``inc(key)`` counting under ``polite/``.

    Raises:
        SettingsError: (a ValueError) an override that is not an IP literal (see
            :func:`~scrapy_polite.settings.parse_dns_overrides`), ``timeout <= 0``, ``min_ttl < 0`` or
            ``min_ttl > max_ttl``.
    """

    def __init__(self, reactor: Any, *, address_filter: AddressFilter | None = None,
                 overrides: Mapping[str, Iterable[str]] | None = None,
                 nameservers: Sequence[tuple[str, int]] = (), timeout: float = 5.0,
                 min_ttl: float = 60.0, max_ttl: float = 3600.0,
                 clock: Callable[[], float] = process_clock) -> None:
        if timeout <= 0 or min_ttl < 0 or max_ttl < min_ttl:
            raise SettingsError(f"need POLITE_DNS_TIMEOUT > 0 and 0 <= POLITE_DNS_MIN_TTL <= POLITE_DNS_MAX_TTL "
                                f"(seconds), got timeout={timeout!r}, min_ttl={min_ttl!r}, max_ttl={max_ttl!r}")
        self.reactor = reactor
        self.filter = address_filter or AddressFilter()
        # Keyed as lookups are (the URL Standard's host: an IDNA name is its ASCII form).
        self.overrides: dict[str, tuple[str, ...]] = {
            _canonical(name): addresses for name, addresses in parse_dns_overrides(overrides).items()}
        self.nameservers = list(nameservers)
        self.timeout = float(timeout)
        self.min_ttl = float(min_ttl)
        self.max_ttl = float(max_ttl)
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self._cache: dict[str, tuple[tuple[str, ...], float]] = {}
        self._negative: dict[str, tuple[DNSLookupError, float]] = {}
        self._pending: dict[str, list[defer.Deferred[tuple[str, ...]]]] = {}
        self._pins: dict[str, dict[str, int]] = {}  # host -> address -> pins
        self._verdicts: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
        #: host as asked → (its answer, every address allowed; until when it holds): :meth:`resolve_known`'s.
        self._allowed: dict[str, tuple[tuple[str, ...], float | None]] = {}
        self._local = threading.local()

    @classmethod
    def from_settings(cls, settings: Any, reactor: Any) -> Self:
        """Build from the ``POLITE_*`` settings (only ``settings`` is used, so a ``CrawlerProcess`` works).

        Raises:
            SettingsError: a bad address or DNS setting (see :meth:`DNSConfig.from_settings`).
        """
        return cls.from_config(DNSConfig.from_settings(settings), reactor)

    @classmethod
    def from_config(cls, config: DNSConfig, reactor: Any) -> Self:
        """Build from validated settings (:class:`~scrapy_polite.settings.DNSConfig`)."""
        return cls(reactor, address_filter=config.address_filter, overrides=config.overrides,
                   nameservers=config.nameservers, timeout=config.timeout, min_ttl=config.min_ttl,
                   max_ttl=config.max_ttl)

    @classmethod
    def from_crawler(cls, crawler: Any, reactor: Any) -> Self:
        """Scrapy's factory for ``TWISTED_DNS_RESOLVER`` (``crawler`` may be a ``CrawlerProcess``)."""
        return cls.from_settings(crawler.settings, reactor)

    def install_on_reactor(self) -> None:
        """Make this the reactor's name resolver (Scrapy calls it for ``TWISTED_DNS_RESOLVER``)."""
        self.reactor.installNameResolver(self)

    # -- the resolution ---------------------------------------------------------------------------------

    def _known(self, host: str) -> tuple[tuple[str, ...], float | None] | None:
        """:meth:`lookup`'s answer when it needs no query, with the time (:attr:`clock`'s seconds) until which
        it holds: an address, an override, ``localhost`` (None: they never change), a fresh cached
        answer (its expiry; it counts a ``cache_hit``); None otherwise (an invalid name included)."""
        try:
            parsed = name_host(host)
        except InvalidHost:
            return None
        if parsed.ip is not None:  # an address in any of the URL Standard's spellings: never a DNS name
            return (str(parsed.ip),), None
        host = parsed.key
        if host in self.overrides:
            return self.overrides[host], None
        if host == "localhost" or host.endswith(".localhost"):
            return ("127.0.0.1", "::1"), None
        cached = self._cache.get(host)
        if cached is not None and cached[1] > self.clock():
            self.counts["cache_hit"] += 1
            return cached
        return None

    def resolve_known(self, host: str) -> list[str] | None:
        """:meth:`resolve`'s answer without a Deferred, when it is known now and every address of it may be
        contacted (the crawl's usual case: a cached answer of public addresses); None otherwise: then
        :meth:`resolve` (which queries, refuses, or drops and counts) gives the answer. The same rules.

        Such an answer is remembered under ``host`` as given until :meth:`_known` says it expires (a cached
        answer is replaced only after it expired: a lookup starts only then), so a host's next requests skip
        the reading of its name and the address rules; one that expired counts its ``cache_hit`` as before."""
        remembered = self._allowed.get(host)
        if remembered is not None:
            if remembered[1] is None:  # an address, an override, localhost: no clock read
                return list(remembered[0])
            if remembered[1] > self.clock():  # a cached answer (even one cached for ever) counts its hit
                self.counts["cache_hit"] += 1
                return list(remembered[0])
        known = self._known(host)
        if known is None:
            return None
        kept, dropped = self._verdict(known[0])
        if not kept or dropped:
            return None
        if len(self._allowed) >= _ALLOWED_MAX:
            self._allowed.clear()
        self._allowed[host] = (tuple(kept), known[1])
        return list(kept)

    def _verdict(self, addresses: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """The address rules' split of an answer (kept, dropped), remembered per answer."""
        verdict = self._verdicts.get(addresses)
        if verdict is None:
            if len(self._verdicts) > 100_000:
                self._verdicts.clear()
            verdict = self._verdicts[addresses] = self.filter.split(addresses)
        return verdict

    def lookup(self, host: str) -> defer.Deferred[tuple[str, ...]]:
        """All addresses of ``host`` (unfiltered, sorted, de-duplicated), from literal, override, cache or
        DNS. Fails with :class:`InvalidHostName` (no query sent), :class:`HostNotFound`,
        :class:`DNSServerFailure` or :class:`DNSTimeout`."""
        known = self._known(host)
        if known is not None:
            return defer.succeed(known[0])
        try:
            host = name_host(host).key
        except InvalidHost as exc:
            self.counts["invalid_host"] += 1
            return defer.fail(InvalidHostName(host, exc.reason))
        now = self.clock()
        negative = self._negative.get(host)
        if negative is not None and negative[1] > now:
            return defer.fail(negative[0])
        waiters = self._pending.get(host)
        if waiters is None:
            waiters = self._pending[host] = []
            self.counts["lookups"] += 1
            query = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self._query, host)
            query.addCallbacks(self._cache_answer, self._cache_failure, callbackArgs=(host,),
                               errbackArgs=(host,))
            query.addBoth(self._fire, host)
        result: defer.Deferred[tuple[str, ...]] = defer.Deferred()
        waiters.append(result)
        return result

    def resolve(self, host: str) -> defer.Deferred[list[str]]:
        """The addresses of ``host`` that may be contacted (sorted; IPv4 first).

        Fails with :class:`BlockedHost` (an ``IgnoreRequest``) when every address is dropped, or with a
        ``DNSLookupError`` subclass."""
        d = self.lookup(host)

        def check(addresses: tuple[str, ...]) -> list[str]:
            verdict = self._verdict(addresses)
            kept, dropped = list(verdict[0]), verdict[1]
            if not kept:
                self.counts["blocked"] += 1
                raise BlockedHost(_canonical(host), dropped)
            if dropped:
                self.counts["dropped"] += len(dropped)
                logger.debug("%s: dropped non-public addresses %s", host, dropped)
            return kept

        return d.addCallback(check)

    def resolve_whole(self, host: str) -> defer.Deferred[list[str]]:
        """The addresses of ``host`` when *every* address of its answer may be contacted (sorted; IPv4
        first): for a handler that resolves the host itself and may connect to any of them (docs/spec.md
        §4.1).

        Fails with :class:`BlockedHost` when every address is non-public, :class:`MixedAnswer` when some
        are, or with a ``DNSLookupError`` subclass."""

        def check(addresses: tuple[str, ...]) -> list[str]:
            kept, dropped = self.filter.split(addresses)
            if dropped:
                self.counts["blocked"] += 1
                raise MixedAnswer(_canonical(host), kept, dropped) if kept else BlockedHost(_canonical(host), dropped)
            return kept

        return self.lookup(host).addCallback(check)

    def _query(self, host: str) -> tuple[tuple[str, ...], float]:
        """On a thread: A and AAAA with dnspython; (addresses, ttl)."""
        resolver = getattr(self._local, "resolver", None)
        if resolver is None:
            if self.nameservers:
                resolver = dns.resolver.Resolver(configure=False)
                resolver.nameservers = [ns for ns, _ in self.nameservers]
                resolver.nameserver_ports = {ns: port for ns, port in self.nameservers}
            else:
                resolver = dns.resolver.Resolver()
            resolver.cache = None
            self._local.resolver = resolver
        addresses: list[str] = []
        ttls: list[float] = []
        deadline = time.monotonic() + self.timeout
        failure: DNSLookupError | None = None
        for rdtype in ("A", "AAAA"):
            remaining = max(0.05, deadline - time.monotonic())
            try:
                answer = resolver.resolve(host, rdtype, lifetime=remaining, search=False,
                                          raise_on_no_answer=False)
            except dns.resolver.NXDOMAIN:
                if not addresses:  # an NXDOMAIN for AAAA after an A answer is a broken server (RFC 4074)
                    raise HostNotFound(f"DNS lookup of {host}: no such domain (NXDOMAIN)") from None
                continue
            except (dns.resolver.LifetimeTimeout, dns.exception.Timeout):
                failure = DNSTimeout(f"DNS lookup of {host} timed out after {self.timeout:g} s (POLITE_DNS_TIMEOUT)")
                continue
            except dns.resolver.NoNameservers as exc:
                failure = DNSServerFailure(f"DNS lookup of {host} failed on every nameserver (SERVFAIL): {exc}")
                continue
            except dns.exception.DNSException as exc:
                failure = HostNotFound(f"DNS lookup of {host} failed: {exc}")
                continue
            if answer.rrset is not None:
                ttls.append(float(answer.rrset.ttl))
                addresses.extend(rr.address for rr in answer.rrset)
        if not addresses:  # one record type failing is not fatal when the other answered (RFC 8305 §3)
            raise failure or HostNotFound(f"DNS lookup of {host}: no A or AAAA records")
        unique = tuple(sorted({str(ipaddress.ip_address(a)) for a in addresses}, key=_sort_key))
        return unique, min(ttls) if ttls else self.min_ttl

    def _fire(self, result: Any, host: str) -> None:
        for waiter in self._pending.pop(host, []):
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    def _cache_answer(self, result: tuple[tuple[str, ...], float], host: str) -> tuple[str, ...]:
        addresses, ttl = result
        ttl = min(max(ttl, self.min_ttl), self.max_ttl)
        self._cache[host] = (addresses, self.clock() + ttl)
        return addresses

    def _cache_failure(self, failure: Any, host: str) -> Any:
        if failure.check(HostNotFound):
            self._negative[host] = (failure.value, self.clock() + min(self.min_ttl, 60.0))
        for name, cls in (("dns/nxdomain", HostNotFound), ("dns/servfail", DNSServerFailure),
                          ("dns/timeout", DNSTimeout)):
            if failure.check(cls):
                self.counts[name] += 1
        return failure

    # -- pinning ----------------------------------------------------------------------------------------

    def pin(self, host: str, address: str) -> None:
        """Answer only ``address`` for ``host`` until :meth:`unpin` (pins are counted per request)."""
        host = _canonical(host)
        address = _canonical_address(address)
        pins = self._pins.get(host)
        if pins is None:  # a plain dict, built only when needed: a host's pins end with its request, as a rule
            self._pins[host] = {address: 1}
        else:
            pins[address] = pins.get(address, 0) + 1

    def unpin(self, host: str, address: str) -> None:
        """Release one pin of ``address`` for ``host``."""
        host = _canonical(host)
        pins = self._pins.get(host)
        if not pins:
            return
        address = _canonical_address(address)
        count = pins.get(address, 0) - 1  # (an address not pinned: nothing to release)
        if count > 0:
            pins[address] = count
        else:
            pins.pop(address, None)
        if not pins:
            del self._pins[host]

    def pinned(self, host: str) -> list[str]:
        """The addresses pinned for ``host`` (sorted), or []."""
        return sorted(self._pins.get(_canonical(host), ()), key=_sort_key)

    # -- IHostnameResolver ------------------------------------------------------------------------------

    def resolveHostName(self, resolutionReceiver: IResolutionReceiver, hostName: str, portNumber: int = 0,
                        addressTypes: Sequence[type] | None = None,
                        transportSemantics: str = "TCP") -> IHostResolution:
        """Twisted's entry point: answer the pinned or the public addresses of ``hostName``; none when it
        is refused or unknown (Twisted then fails the connection with ``DNSLookupError``)."""
        resolution = _Resolution(hostName)
        resolutionReceiver.resolutionBegan(resolution)
        pinned = self.pinned(hostName)
        d = defer.succeed(pinned) if pinned else self.resolve(hostName)

        def deliver(addresses: list[str]) -> None:
            for address in addresses:
                if not self.filter.allows(address):  # a pin is checked again: defence in depth
                    continue
                version = 6 if ":" in _canonical_address(address) else 4  # canonical IPv4 text has no colon
                if version == 4 and (addressTypes is None or IPv4Address in addressTypes):
                    resolutionReceiver.addressResolved(IPv4Address("TCP", address, portNumber))
                elif version == 6 and (addressTypes is None or IPv6Address in addressTypes):
                    resolutionReceiver.addressResolved(IPv6Address("TCP", address, portNumber))

        def refused(failure: Any) -> None:
            logger.info("scrapy-polite resolver: %s: %s", hostName, failure.getErrorMessage())

        d.addCallbacks(deliver, refused)
        d.addBoth(lambda _: resolutionReceiver.resolutionComplete())
        return resolution
