"""Resolution and pinning for the pacer (docs/spec.md §4): the public addresses a request may connect to,
through the process's :class:`~scrapy_polite.resolver.PublicHostnameResolver`, and the pin that makes the
resolver answer only the booked address until the request is done."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..network.addresses import AddressFilter, one_family
from ..policy.keys import host_key
from ..reports.counters import Report
from ..resolver import (
    BlockedHost,
    BlockedProxy,
    DNSServerFailure,
    DNSTimeout,
    HostNotFound,
    MixedAnswer,
    PublicHostnameResolver,
    routed,
)
from ..vocabulary import IP_META, PINNED_META, PROXY_COUNTED_META
from .reactor import await_deferred, installed_reactor
from .seams import ResolverNotInstalled

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["Resolution"]

#: The most answers whose split by the crawl's address rules :class:`Resolution` keeps (emptied when full).
_SPLITS_MAX = 10_000


class Resolution:
    """The crawler's view of the process-wide resolver, narrowed by the spider's own address rules.

    Args:
        crawler: the crawler (its settings build a resolver when address filtering is off).
        address_filter: the crawler's address rules (``POLITE_ALLOW_PRIVATE``, ``POLITE_ALLOWED_NETWORKS``).
        report: counters and stats.
        on_missing: called once with the :class:`ResolverNotInstalled` error (stops the crawl).
    """

    def __init__(self, crawler: Crawler, address_filter: AddressFilter, report: Report,
                 on_missing: Callable[[ResolverNotInstalled], None]) -> None:
        self.crawler = crawler
        self.address_filter = address_filter
        self.report = report
        self._on_missing = on_missing
        self._resolver: PublicHostnameResolver | None = None
        self._warned_proxy = False
        self._blocked_logged: set[str] = set()
        #: answer → its split ``(kept, dropped)`` by :attr:`address_filter`, whose rules never change: a host's
        #: answer is split once, not on every request (at most :data:`_SPLITS_MAX` kept).
        self._splits: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
        #: Whether a request's handler resolves its host itself (a *checked* handler): then every address of
        #: the answer must be allowed (docs/spec.md §4.1). Set by the pacer from the handler modes.
        self.resolves_itself: Callable[[Request], bool] | None = None  # None: no handler does
        #: Whether a request goes to its ``meta['proxy']``, which resolves its host (its handler honours the proxy):
        #: then nothing is resolved, checked or pinned here. Set by the pacer from the handler modes.
        self.through_proxy: Callable[[Request], bool] | None = None  # None: no request does

    def resolver(self) -> PublicHostnameResolver:
        """The process's :class:`~scrapy_polite.resolver.PublicHostnameResolver` (``TWISTED_DNS_RESOLVER``).

        Raises:
            ResolverNotInstalled: address filtering is on but the reactor's resolver is not ours (the add-on
                was enabled only in a spider's ``custom_settings``, or another ``TWISTED_DNS_RESOLVER`` is
                configured); the crawl is stopped rather than run unprotected (docs/spec.md §7).
        """
        if self._resolver is not None:
            return self._resolver
        reactor = installed_reactor()
        installed = getattr(reactor, "nameResolver", None)
        if isinstance(installed, PublicHostnameResolver):
            self._resolver = installed
            return installed
        if not self.address_filter.allow_private:
            exc = ResolverNotInstalled(
                f"scrapy-polite: the reactor's name resolver is {type(installed).__name__}, not "
                "scrapy_polite.resolver.PublicHostnameResolver, so non-public addresses could be reached. "
                "Enable the add-on in the project settings (ADDONS = {'scrapy_polite.Addon': 0} in "
                "settings.py, or the settings given to CrawlerProcess), not only in a spider's "
                "custom_settings, and do not set TWISTED_DNS_RESOLVER. With CrawlerRunner, install it "
                "yourself: PublicHostnameResolver.from_crawler(runner, reactor).install_on_reactor().")
            self._on_missing(exc)
            raise exc
        self._resolver = PublicHostnameResolver.from_crawler(self.crawler, reactor)
        return self._resolver

    async def addresses(self, request: Request, host: str) -> list[str] | None:
        """The public addresses the request may connect to (sorted, IPv4 first), or None when an HTTP
        proxy resolves the target (:attr:`through_proxy`: pacing by host still applies, pinning cannot). A request
        whose handler ignores ``meta['proxy']`` (``ftp``, scrapy-playwright) is resolved and checked as any other.

        For a request whose handler resolves the host itself (:attr:`resolves_itself`), the whole answer
        must be allowed: one non-public address refuses the host (:class:`MixedAnswer`), since the handler
        could connect to it (docs/spec.md §4.1).

        Raises:
            BlockedHost: (an ``IgnoreRequest``) every address of the host is non-public; its subclass
                :class:`MixedAnswer`: some are, and the request's handler resolves the host itself.
            DNSLookupError: the host cannot be resolved (NXDOMAIN, SERVFAIL, timeout).
            ResolverNotInstalled: see :meth:`resolver`.
        """
        try:
            if request.meta.get("proxy") and self.through_proxy is not None and self.through_proxy(request):
                await self._check_proxy(request.meta["proxy"])
                self._count_proxied(request)
                return None
            resolver = self._resolver if self._resolver is not None else self.resolver()
            whole = self.resolves_itself is not None and self.resolves_itself(request)
            if whole:
                addresses = await await_deferred(resolver.resolve_whole(host))
            else:
                known = resolver.resolve_known(host)  # a cached public answer: no Deferred
                addresses = known if known is not None else await await_deferred(resolver.resolve(host))
            # The resolver is per process; a spider's own (narrower) address rules apply on top of it.
            split = self._splits.get(answer := tuple(addresses))
            if split is None:
                if len(self._splits) >= _SPLITS_MAX:
                    self._splits.clear()
                kept, dropped = self.address_filter.split(answer)
                split = self._splits[answer] = (one_family(kept, routed), dropped)
            kept, dropped = split
            if not kept:
                raise BlockedHost(host, dropped)
            if whole and dropped:
                raise MixedAnswer(host, kept, dropped)
            return list(kept)  # a list of its own: the caller may change it
        except BlockedHost as exc:
            self.report.refused(host, "non_public", request.url)
            proxy = isinstance(exc, BlockedProxy)  # logged once per proxy, not per host sent through it (review)
            if (key := f"proxy {exc.host}" if proxy else host) not in self._blocked_logged:
                self._blocked_logged.add(key)
                logger.warning("%s (%s; further requests %s are refused quietly)", exc, request.url,
                               "through this proxy" if proxy else "to this host")
            else:
                logger.debug("%s (%s)", exc, request.url)
            raise
        except HostNotFound:
            self.report.inc("dns/nxdomain")
            raise
        except DNSServerFailure:
            self.report.inc("dns/servfail")
            raise
        except DNSTimeout:
            self.report.inc("dns/timeout")
            raise

    async def _check_proxy(self, proxy: str) -> None:
        """The proxy a request goes to (``meta['proxy']``) is contacted, so it must have an allowed address, as any
        host (docs/spec.md §4; trial: an HTTPS request through a proxy at a non-admitted IP literal reached it, and an
        HTTP one failed as an unexplained DNS error). A proxy URL that names no host is left to Scrapy; with
        ``POLITE_ALLOW_PRIVATE`` every address is allowed, so nothing is asked.

        Raises:
            BlockedProxy: the proxy's host has only non-public addresses (or a DNS error, as for any host)."""
        if self.address_filter.allow_private:
            return
        try:
            name = urlsplit(proxy if "://" in proxy else f"http://{proxy}").hostname
        except ValueError:  # "http://[::1": Scrapy cannot use it either
            return
        if not name:
            return
        host = host_key(f"http://[{name}]/" if ":" in name else f"http://{name}/")
        if host is None:  # a host the URL Standard rejects, e.g. an IPv6 zone id Twisted would connect to (review)
            raise BlockedProxy(name, [name])
        resolver = self._resolver if self._resolver is not None else self.resolver()
        try:
            known = resolver.resolve_known(host)
            answer = known if known is not None else await await_deferred(resolver.resolve(host))
            kept, dropped = self.address_filter.split(tuple(answer))
        except BlockedHost as exc:
            kept, dropped = [], exc.dropped
        if not kept:
            raise BlockedProxy(host, dropped)

    def _count_proxied(self, request: Request) -> None:
        """``request`` goes to its allowed ``meta['proxy']`` (:attr:`through_proxy`): counted once per request
        (``polite/proxy_unpinned``), logged once per crawl."""
        if not self._warned_proxy:
            self._warned_proxy = True
            logger.warning("scrapy-polite: requests through an HTTP proxy are resolved by the proxy, so "
                           "their addresses cannot be checked or pinned (pacing by host still applies)")
        if not request.meta.get(PROXY_COUNTED_META):
            request.meta[PROXY_COUNTED_META] = True
            self.report.inc("proxy_unpinned")

    def pin(self, request: Request, host: str, address: str) -> None:
        """Connect ``request`` to ``address`` (``meta['polite_ip']``) and pin the resolver's answer for
        ``host`` to it until the request is done (docs/spec.md §4)."""
        meta = request.meta
        meta[IP_META] = address
        if self._resolver is not None and not meta.get(PINNED_META):
            self._resolver.pin(host, address)
            meta[PINNED_META] = True

    def unpin(self, request: Request, host: str) -> None:
        """Release the request's pin, if it holds one (idempotent)."""
        meta = request.meta
        address = meta.get(IP_META)
        if address and meta.pop(PINNED_META, False) and self._resolver is not None:
            self._resolver.unpin(host, address)
