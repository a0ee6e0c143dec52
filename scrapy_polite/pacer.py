"""The per-crawler pacer: translates between Scrapy's objects and the policy + store (SPEC §5).

One :class:`Pacer` exists per crawler (:func:`get_pacer`); the downloader middleware, the extension and
the scheduler share it. It owns

* the pace table (an :class:`~scrapy_polite.store.AsyncStore`, so disk I/O stays off the reactor thread);
* each host's *line*: at most one paced request per host waits in line or is in flight in this process;
  the others are deferred (when the scheduler can hold them) or wait for the line;
* the per-host counters behind the closing summary and ``polite/...`` stats.

The rules themselves are in :mod:`scrapy_polite.policy`; nothing here decides a duration.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, error as txerror

from .addresses import AddressFilter, embedded_ipv4
from .policy import Decision, HostState, InvalidRetryAfter, host_key, parse_retry_after
from .settings import PoliteConfig
from .store import AsyncStore, StoreError, open_store

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = ["Pacer", "get_pacer", "find_pacer", "Go", "Defer", "SERVER_SIDE_FAILURES"]

#: Download failures that reached the server's side: they count as a throttle without Retry-After
#: (SPEC §2). DNS failures are not among them and never touch a host's backoff.
SERVER_SIDE_FAILURES: tuple[type[BaseException], ...] = (
    txerror.TimeoutError,
    txerror.TCPTimedOutError,
    txerror.ConnectionRefusedError,
    txerror.ConnectionLost,
    txerror.ConnectionDone,
    txerror.ConnectError,
)


def _server_side_failures() -> tuple[type[BaseException], ...]:
    extra: list[type[BaseException]] = []
    try:
        from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

        extra += [ResponseFailed, ResponseNeverReceived]
    except ImportError:  # pragma: no cover
        pass
    # Scrapy >= 2.17 wraps Twisted's errors in its own (CannotResolveHostError, a DNS failure, is not here).
    from scrapy import exceptions

    for name in ("DownloadTimeoutError", "DownloadConnectionRefusedError", "DownloadFailedError"):
        cls = getattr(exceptions, name, None)
        if cls is not None:
            extra.append(cls)
    return SERVER_SIDE_FAILURES + tuple(extra)


_SERVER_SIDE = _server_side_failures()


@dataclass
class Go:
    """The request may be sent now. ``sent_at`` is the booking time (epoch seconds); ``address`` the IP
    address it is booked on (None behind a proxy)."""

    sent_at: float
    address: str | None = None


class Redefer(Exception):
    """Raised by the download handler for a burst request whose host throttled after it was decided:
    the middleware defers it again instead of sending it into the backoff."""


class ResolverNotInstalled(RuntimeError):
    """Address filtering is on but the reactor's name resolver is not scrapy-polite's (SPEC §7)."""


@dataclass
class Booking:
    """The outcome of one booking transaction (SPEC §3)."""

    booked: bool
    host_state: HostState | None
    free_at: float
    now: float
    address: str | None = None
    host_free: float = 0.0


@dataclass
class Defer:
    """The request must leave the downloader until ``due`` (epoch seconds; None: until its host's line
    is free)."""

    due: float | None
    reason: str


@dataclass
class HostCounters:
    """What one host saw in this crawl (for the closing summary and the example's table)."""

    requests: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    deferrals: int = 0
    deferral_reasons: Counter[str] = field(default_factory=Counter)
    throttles: int = 0
    backoff_steps: int = 0
    statuses: Counter[Any] = field(default_factory=Counter)
    crawl_delay: float | None = None


@dataclass
class _Line:
    holder: Any = None  # the Request waiting in line or in flight
    freed: list[defer.Deferred[None]] = field(default_factory=list)
    recording: defer.Deferred[Any] | None = None


class Pacer:
    """Per-crawler pacing state. Built by :func:`get_pacer`; not meant to be constructed by users.

    Args:
        crawler: the Scrapy crawler.
        config: the validated settings.
        store: the pace table (opened; failures were raised as :class:`StoreError` already).
        clock: a function returning Unix epoch seconds (tests inject one).
        sleep: ``sleep(seconds) -> Deferred`` that never blocks the reactor.
    """

    def __init__(self, crawler: Crawler, config: PoliteConfig, store: AsyncStore,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], defer.Deferred[None]] | None = None) -> None:
        self.crawler = crawler
        self.config = config
        self.policy = config.policy
        self.store = store
        self.clock = clock
        self.stats = crawler.stats
        self._sleep = sleep or _reactor_sleep
        self.lines: dict[str, _Line] = {}
        self.hosts: dict[str, HostCounters] = {}
        self.scheduler: Any = None  # a PoliteScheduler, attached when it opens
        self.spider_delay: float | None = None
        self.user_agent: str = crawler.settings.get("ROBOTSTXT_USER_AGENT") or crawler.settings.get(
            "USER_AGENT") or "Scrapy"
        self._warned_no_scheduler = False
        self._clamped_hosts: set[str] = set()
        self._warned_proxy = False
        self._resolver: Any = None
        self._ip_waiting: dict[str, set[str]] = {}
        self.throttle_marks: dict[str, float] = {}
        self._blocked_logged: set[str] = set()
        self._ip_waiter: dict[str, Any] = {}
        networks = crawler.settings.get("POLITE_ALLOWED_NETWORKS") or []
        if isinstance(networks, str):
            networks = [n for n in networks.split(",") if n.strip()]
        self.address_filter = AddressFilter(allow_private=crawler.settings.getbool("POLITE_ALLOW_PRIVATE"),
                                            allowed_networks=list(networks))
        self.failed: StoreError | None = None

    # -- helpers ----------------------------------------------------------------------------------------

    def counters(self, host: str) -> HostCounters:
        c = self.hosts.get(host)
        if c is None:
            c = self.hosts[host] = HostCounters()
        return c

    def inc(self, key: str, count: float = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"polite/{key}", count)

    def override(self, host: str, request: Request | None = None) -> float | None:
        """The largest per-host (``POLITE_HOST_DELAYS``), per-spider (``crawl_delay`` attribute) and
        per-request (``meta['polite_delay']``) interval for this request, seconds, or None (SPEC §5).
        An invalid ``polite_delay`` is ignored, logged and counted (``polite/invalid_meta``)."""
        values = [v for v in (self.config.host_delays.get(host), self.spider_delay) if v is not None]
        if request is not None and "polite_delay" in request.meta:
            raw = request.meta["polite_delay"]
            try:
                value = float(raw)
            except (TypeError, ValueError):
                value = float("nan")
            if math.isfinite(value) and value >= 0:
                values.append(value)
            elif not request.meta.get("_polite_invalid_delay"):
                request.meta["_polite_invalid_delay"] = True
                self.inc("invalid_meta")
                logger.warning("Ignoring meta['polite_delay']=%r of %s: not a number of seconds >= 0",
                               raw, request)
        return max(values) if values else None

    def line(self, host: str) -> _Line:
        line = self.lines.get(host)
        if line is None:
            line = self.lines[host] = _Line()
        return line

    def line_busy(self, host: str) -> bool:
        line = self.lines.get(host)
        return line is not None and line.holder is not None

    def can_defer(self, request: Request) -> bool:
        """Whether the request can leave the downloader: only requests our scheduler handed out can be
        held and re-injected (a request from ``engine.download()``, e.g. robots.txt, must wait)."""
        if self.scheduler is None:
            if not self._warned_no_scheduler:
                self._warned_no_scheduler = True
                logger.warning(
                    "scrapy-polite: SCHEDULER is not scrapy_polite.scheduler.PoliteScheduler, so throttled "
                    "hosts cannot be deferred: their requests wait in the downloader instead (still paced). "
                    "Enable the add-on (ADDONS = {'scrapy_polite.Addon': 0}) to get deferral.")
            return False
        return bool(self.scheduler.owns(request))

    # -- before a request -------------------------------------------------------------------------------

    async def before_request(self, request: Request, host: str) -> Go | Defer:
        """Book the request on its host and one of its addresses (SPEC §2–3, §5): return :class:`Go` once
        it may be sent, or :class:`Defer` when it must leave the downloader. Waits without blocking the
        reactor.

        Raises:
            BlockedHost: (an ``IgnoreRequest``) every address of the host is non-public.
            DNSLookupError: the host cannot be resolved (NXDOMAIN, SERVFAIL, timeout).
            StoreError: the pace table cannot be read or written (the crawl is being stopped).
        """
        if self.failed is not None:
            raise self.failed
        counters = self.counters(host)
        deferrable = self.can_defer(request)
        override = self.override(host, request)
        eff_floor = self.policy.effective_interval(None, override)
        addresses = await self.addresses(request, host)

        if request.meta.get("polite_burst"):
            while True:
                # The decision answers for the host's mood at this moment, before the read: a throttle
                # recorded later makes this request's response stale (SPEC §2) and, if it has not been sent
                # yet, sends it back to be deferred (see throttled_since).
                decided_at = self.clock()
                state = await self._call(self.store.get, host)
                now = self.clock()
                if not self.policy.should_defer(state, now, override=override):
                    break
                if deferrable:
                    return self._defer(host, state.next_allowed, "throttled")  # type: ignore[union-attr]
                await self._wait(host, min(state.next_allowed - now, self.policy.max_wait))  # type: ignore[union-attr]
            self.inc("burst")
            counters.requests += 1
            return Go(sent_at=decided_at, address=addresses[0] if addresses else None)

        line = self.line(host)
        while line.holder is not None and line.holder is not request:
            if deferrable:
                return self._defer(host, None, "line")
            await _aw(self._wait_for(line))
        line.holder = request
        try:
            ip_paced = bool(addresses) and self.config.ip_interval > 0
            while True:
                now = self.clock()
                free = addresses or []
                if ip_paced:
                    free = [a for a in addresses if not self.line_busy(_ip_key(a))]  # type: ignore[union-attr]
                    if not free:  # every address has a request of ours in flight
                        ip_lines = [self.line(_ip_key(a)) for a in addresses]  # type: ignore[union-attr]
                        if deferrable and any(not d.called for ip in ip_lines for d in ip.freed):
                            self.release(request, host)
                            for a in addresses:  # type: ignore[union-attr]
                                self._ip_waiting.setdefault(_ip_key(a), set()).add(host)
                            return self._defer(host, None, "ip_line")
                        await _aw(self._wait_for(*ip_lines))
                        continue
                keys = [host] + [_ip_key(a) for a in free] if ip_paced else [host]
                booking = await self._call(self.store.update_many, keys, _book(
                    self.policy, host, free if ip_paced else [], self.clock, eff_floor, self.config.ip_interval))
                state = booking.host_state
                now = booking.now
                if booking.booked:
                    address = booking.address or (addresses[0] if addresses else None)
                    if ip_paced and address is not None:
                        self.line(_ip_key(address)).holder = request
                    counters.requests += 1
                    self.inc("requests")
                    return Go(sent_at=now, address=address)
                if self.policy.should_defer(state, now, override=override) and deferrable:
                    self.release(request, host)
                    reason = "throttled" if state.consec > 0 else "crawl_delay"  # type: ignore[union-attr]
                    return self._defer(host, state.next_allowed, reason)  # type: ignore[union-attr]
                # Waiting for an address's budget (not the host's): one request per address waits in line,
                # the next defers until that moment (SPEC §5).
                ip_key = _ip_key(booking.address) if booking.address is not None else None
                if ip_key is not None and booking.free_at > booking.host_free:
                    waiter = self._ip_waiter.get(ip_key)
                    if waiter is not None and waiter is not request and deferrable:
                        self.release(request, host)
                        return self._defer(host, booking.free_at, "ip_line")
                    self._ip_waiter[ip_key] = request
                else:
                    ip_key = None
                try:
                    await self._wait(host, min(booking.free_at - now, self.policy.max_wait))
                finally:
                    if ip_key is not None and self._ip_waiter.get(ip_key) is request:
                        del self._ip_waiter[ip_key]
        except BaseException:
            self.release(request, host)
            raise

    async def addresses(self, request: Request, host: str) -> list[str] | None:
        """The public addresses the request may connect to (sorted, IPv4 first), or None when an HTTP
        proxy resolves the target (SPEC §4: pacing by host still applies, pinning cannot).

        Raises:
            BlockedHost, DNSLookupError: see :meth:`before_request`.
        """
        if request.meta.get("proxy"):
            if not self._warned_proxy:
                self._warned_proxy = True
                logger.warning("scrapy-polite: requests through an HTTP proxy are resolved by the proxy, so "
                               "their addresses cannot be checked or pinned (pacing by host still applies)")
            if not request.meta.get("_polite_proxy_counted"):
                request.meta["_polite_proxy_counted"] = True
                self.inc("proxy_unpinned")
            return None
        resolver = self.get_resolver()
        try:
            addresses = await _aw(resolver.resolve(host))
            # The resolver is per process; a spider's own (narrower) address rules apply on top of it.
            kept, dropped = self.address_filter.split(addresses)
            if not kept:
                from .resolver import BlockedHost

                raise BlockedHost(host, dropped)
            return kept
        except Exception as exc:
            from .resolver import BlockedHost, DNSServerFailure, DNSTimeout, HostNotFound

            if isinstance(exc, BlockedHost):
                self.inc("blocked/private_address")
                if host not in self._blocked_logged:
                    self._blocked_logged.add(host)
                    logger.warning("%s (%s; further requests to this host are refused quietly)", exc, request.url)
                else:
                    logger.debug("%s (%s)", exc, request.url)
            elif isinstance(exc, HostNotFound):
                self.inc("dns/nxdomain")
            elif isinstance(exc, DNSServerFailure):
                self.inc("dns/servfail")
            elif isinstance(exc, DNSTimeout):
                self.inc("dns/timeout")
            raise

    def get_resolver(self) -> Any:
        """The process's :class:`~scrapy_polite.resolver.PublicHostnameResolver` (``TWISTED_DNS_RESOLVER``).

        Raises:
            ResolverNotInstalled: address filtering is on but the reactor's resolver is not ours (the add-on
                was enabled only in a spider's ``custom_settings``, or another ``TWISTED_DNS_RESOLVER`` is
                configured); the crawl is stopped rather than run unprotected (SPEC §7).
        """
        if self._resolver is not None:
            return self._resolver
        from twisted.internet import reactor

        from .resolver import PublicHostnameResolver

        installed = getattr(reactor, "nameResolver", None)
        if isinstance(installed, PublicHostnameResolver):
            self._resolver = installed
            return installed
        if not self.crawler.settings.getbool("POLITE_ALLOW_PRIVATE"):
            exc = ResolverNotInstalled(
                f"scrapy-polite: the reactor's name resolver is {type(installed).__name__}, not "
                "scrapy_polite.resolver.PublicHostnameResolver, so non-public addresses could be reached. "
                "Enable the add-on in the project settings (ADDONS = {'scrapy_polite.Addon': 0} in "
                "settings.py, or the settings given to CrawlerProcess), not only in a spider's "
                "custom_settings, and do not set TWISTED_DNS_RESOLVER. With CrawlerRunner, install it "
                "yourself: PublicHostnameResolver.from_crawler(runner, reactor).install_on_reactor().")
            if self.failed is None:
                self.failed = exc  # type: ignore[assignment]
                logger.error("%s", exc)
                self.inc("resolver_missing")
                _close_later(self.crawler, "polite_resolver_missing")
            raise exc
        self._resolver = PublicHostnameResolver.from_crawler(self.crawler, reactor)
        return self._resolver

    def _wait_for(self, *lines: _Line) -> defer.Deferred[None]:
        """A Deferred that fires when any of ``lines`` is freed."""
        d: defer.Deferred[None] = defer.Deferred()
        for line in lines:
            line.freed.append(d)
        return d

    async def _wait(self, host: str, seconds: float) -> None:
        if seconds <= 0:
            return
        counters = self.counters(host)
        counters.waits += 1
        counters.wait_seconds += seconds
        self.inc("waits")
        self.inc("wait_seconds", seconds)
        await _aw(self._sleep(seconds))

    def _defer(self, host: str, due: float | None, reason: str) -> Defer:
        counters = self.counters(host)
        counters.deferrals += 1
        counters.deferral_reasons[reason] += 1
        self.inc("deferrals")
        self.inc(f"deferrals/{reason}")
        return Defer(due=due, reason=reason)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await _aw(fn(*args))
        except StoreError as exc:
            self._store_failed(exc)
            raise

    def _store_failed(self, exc: StoreError) -> None:
        if self.failed is None:
            self.failed = exc
            logger.error("%s Stopping the crawl: without its pace table scrapy-polite cannot pace it.", exc)
            self.inc("store_errors")
            _close_later(self.crawler, "polite_store_error")

    def release(self, request: Request, host: str | None = None) -> None:
        """Free the host's line, and the line of the address it was booked on, if ``request`` holds them
        (idempotent); wake the requests waiting for them."""
        if host is None:
            host = request.meta.get("polite_host")
            if host is None:
                return
        self._free(host, request)
        address = request.meta.get("polite_ip")
        if address:
            if request.meta.pop("_polite_pinned", False) and self._resolver is not None:
                self._resolver.unpin(host, address)
            if self._free(_ip_key(address), request):
                for waiting in self._ip_waiting.pop(_ip_key(address), ()):
                    if self.scheduler is not None:
                        self.scheduler.wake(waiting)
        if self.scheduler is not None:
            self.scheduler.wake(host)

    def throttled_since(self, request: Request) -> bool:
        """A throttle from the request's host was seen after the request was decided (``polite_sent_at``):
        a burst request that has not been sent yet must be deferred again (SPEC §5, burst)."""
        host = request.meta.get("polite_host")
        decided = request.meta.get("polite_sent_at")
        mark = self.throttle_marks.get(host) if host is not None else None
        return mark is not None and decided is not None and mark > decided

    async def early_due(self, request: Request, host: str) -> float | None:
        """When a request of a host that should defer now (SPEC §2) may come back (epoch s), or None."""
        state = await self._call(self.store.get, host)
        now = self.clock()
        if not self.policy.should_defer(state, now, override=self.override(host, request)):
            return None
        reason = "throttled" if state.consec > 0 else "crawl_delay"  # type: ignore[union-attr]
        self._defer(host, state.next_allowed, reason)  # type: ignore[union-attr]
        return state.next_allowed  # type: ignore[union-attr]

    async def due(self, host: str) -> float:
        """When the host may be requested next (epoch seconds; now when it is free)."""
        state = await self._call(self.store.get, host)
        now = self.clock()
        return max(now, state.next_allowed) if state is not None else now

    def pin(self, request: Request, host: str, address: str) -> None:
        """Connect ``request`` to ``address`` (``meta['polite_ip']``) and pin the resolver's answer for
        ``host`` to it until the request is done (SPEC §4)."""
        request.meta["polite_ip"] = address
        if self._resolver is not None and not request.meta.get("_polite_pinned"):
            self._resolver.pin(host, address)
            request.meta["_polite_pinned"] = True

    def _free(self, key: str, request: Request) -> bool:
        line = self.lines.get(key)
        if line is None or line.holder is not request:
            return False
        line.holder = None
        waiters, line.freed = line.freed, []
        for d in waiters:
            if not d.called:
                d.callback(None)
        return True

    # -- after a response -----------------------------------------------------------------------------

    def record_response(self, request: Request, response: Response) -> defer.Deferred[Any] | None:
        """Feed a downloaded response's status and Retry-After into the table (SPEC §2).

        Returns a Deferred that fires once the table is written (the line is released only after it)."""
        host = request.meta.get("polite_host")
        if host is None:
            return None
        end = self.clock()
        counters = self.counters(host)
        counters.statuses[response.status] += 1
        if response.status in self.policy.throttle_statuses:
            self.throttle_marks[host] = end
        retry_after = None
        raw = response.headers.get(b"Retry-After")
        if raw is not None:
            try:
                retry_after = parse_retry_after(raw, now=end, date=response.headers.get(b"Date"))
            except InvalidRetryAfter as exc:
                self.inc("retry_after/invalid")
                logger.info("Ignoring invalid Retry-After from %s: %s", response.url, exc)
        sent_at = request.meta.get("polite_sent_at")
        override = self.override(host, request)
        d = self._record(host, request, lambda state: self.policy.after_response(
            state, status=response.status, end=end, retry_after=retry_after, sent_at=sent_at,
            override=override), retry_after=retry_after, label=str(response.status))
        return d

    def record_failure(self, request: Request, exception: BaseException) -> defer.Deferred[Any] | None:
        """Feed a download failure into the table: a failure that reached the server's side counts as a
        throttle without Retry-After; a DNS failure or anything else does not touch the backoff."""
        host = request.meta.get("polite_host")
        if host is None or not isinstance(exception, _SERVER_SIDE):
            return None
        end = self.clock()
        self.throttle_marks[host] = end
        self.counters(host).statuses[type(exception).__name__] += 1
        sent_at = request.meta.get("polite_sent_at")
        override = self.override(host, request)
        return self._record(host, request, lambda state: self.policy.after_response(
            state, status=None, end=end, sent_at=sent_at, override=override),
            retry_after=None, label="failure")

    def _record(self, host: str, request: Request, step: Callable[[HostState | None], Decision],
                *, retry_after: float | None, label: str) -> defer.Deferred[Any]:
        address = request.meta.get("polite_ip") if self.config.ip_interval > 0 else None
        ip_interval = self.config.ip_interval
        end = self.clock()

        def fn(states: dict[str, HostState | None]) -> tuple[dict[str, HostState], Decision]:
            decision = step(states[host])
            new = {host: decision.state}
            if address:  # the reference's finish(): ip_next >= end + ip_interval
                ip_state = states[_ip_key(address)] or HostState()
                new[_ip_key(address)] = replace(
                    ip_state, next_allowed=max(ip_state.next_allowed, end + ip_interval), updated=end)
            return new, decision

        d = self.store.update_many([host, _ip_key(address)] if address else [host], fn)

        def done(decision: Decision) -> Decision:
            if decision.throttle:
                self.throttle_marks[host] = max(self.throttle_marks.get(host, 0.0), end)
                counters = self.counters(host)
                counters.throttles += 1
                self.inc(f"throttles/{label}")
                if decision.counted:
                    counters.backoff_steps += 1
                    self.inc("backoff_steps")
                if retry_after is not None and retry_after > 0:
                    self.inc("retry_after/honoured")
                if decision.retry_after_clamped:
                    self.inc("retry_after/clamped")
                    if host not in self._clamped_hosts:
                        self._clamped_hosts.add(host)
                        logger.warning("%s asked for Retry-After %.0f s; honouring POLITE_MAX_RETRY_AFTER=%.0f s",
                                       host, retry_after, self.policy.max_retry_after)
                logger.debug("%s throttled (%s): backing off %.3f s (consec=%d)", host, label,
                             decision.delay, decision.state.consec)
            return decision

        def failed(failure: Any) -> None:
            if failure.check(StoreError):
                self._store_failed(failure.value)
            else:
                logger.error("scrapy-polite could not record %s for %s", label, host,
                             exc_info=(failure.type, failure.value, failure.getTracebackObject()))
            return None

        d.addCallbacks(done, failed)
        line = self.lines.get(host)
        if line is not None and line.holder is request:
            line.recording = d
        return d

    async def finish(self, request: Request) -> None:
        """After the response or failure was handled: wait for its record, then free the host's line."""
        host = request.meta.get("polite_host")
        if host is None:
            return
        line = self.lines.get(host)
        if line is not None and line.holder is request and line.recording is not None:
            pending, line.recording = line.recording, None
            await _aw(pending)
        self.release(request, host)

    # -- robots.txt -------------------------------------------------------------------------------------

    def set_crawl_delay(self, host: str, delay: float | None) -> defer.Deferred[Any]:
        """Record the host's published delay (seconds; None: it publishes none) in the table."""
        now = self.clock()
        value = float(delay) if delay is not None else 0.0

        def fn(state: HostState | None) -> tuple[HostState | None, bool]:
            if state is not None and state.crawl_delay == value:
                return None, False
            if state is None and value == 0.0:
                return None, False
            new = self.policy.with_crawl_delay(state, value, now=now)
            # robots.txt was itself a request to the host, just answered: the delay counts from it.
            return replace(new, next_allowed=max(new.next_allowed, now + value)), True

        d = self.store.update(host, fn)

        def done(changed: bool) -> bool:
            self.counters(host).crawl_delay = value if value > 0 else None
            if value > 0:
                self.inc("crawl_delay/adopted")
                logger.info("%s publishes a delay of %g s for %s: adopted", host, value, self.user_agent)
            return changed

        def failed(failure: Any) -> None:
            if failure.check(StoreError):
                self._store_failed(failure.value)
            return None

        d.addCallbacks(done, failed)
        return d

    # -- reporting --------------------------------------------------------------------------------------

    def host_report(self) -> dict[str, dict[str, Any]]:
        """Per host: ``requests``, ``waits``, ``wait_seconds``, ``deferrals`` (total) and
        ``deferral_reasons`` (``throttled``, ``crawl_delay``, ``line``, ``ip_line`` -> count), ``throttles``,
        ``backoff_steps``, ``statuses`` (status or failure name -> count), ``crawl_delay`` (seconds or None)."""
        return {
            host: {
                "requests": c.requests, "waits": c.waits, "wait_seconds": round(c.wait_seconds, 3),
                "deferrals": c.deferrals, "deferral_reasons": dict(c.deferral_reasons),
                "throttles": c.throttles, "backoff_steps": c.backoff_steps,
                "statuses": dict(c.statuses), "crawl_delay": c.crawl_delay,
            }
            for host, c in sorted(self.hosts.items())
        }

    def close(self) -> None:
        self.store.close()


async def _aw(d: Any) -> Any:
    """Await a Deferred under both the asyncio and the plain Twisted reactor. A Deferred that has already
    fired (an inline store call, a cached DNS answer) is read directly, without a round trip through the
    event loop."""
    from twisted.python.failure import Failure

    if (isinstance(d, defer.Deferred) and d.called and not getattr(d, "paused", 0)
            and not isinstance(d.result, defer.Deferred)):
        result = d.result
        if isinstance(result, Failure):
            d.addErrback(lambda _: None)  # handled here: no "Unhandled error in Deferred"
            result.raiseException()
        return result
    from scrapy.utils.defer import maybe_deferred_to_future

    return await maybe_deferred_to_future(d)


def _ip_key(address: str) -> str:
    """The pace-table key of an address's row (host keys never start with ``ip:``). An IPv4-mapped, NAT64
    or 6to4 address reaches the IPv4 address it embeds, so it shares that address's row."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6:
        ip = embedded_ipv4(ip) or ip  # type: ignore[arg-type]
    return f"ip:{ip}"


def _book(policy: Any, host: str, addresses: list[str], clock: Callable[[], float], interval: float,
          ip_interval: float) -> Callable[[dict[str, HostState | None]], tuple[dict[str, HostState], Booking]]:
    """The booking step run inside one store transaction (SPEC §3, the reference's ``reserve``): over the
    host's sorted addresses pick the earliest ``free = max(now, host_next, ip_next[ip])`` (ties: the lowest
    address); when that moment is now, book the host for its interval and the address for
    ``ip_interval``."""

    def fn(states: dict[str, HostState | None]) -> tuple[dict[str, HostState], Booking]:
        now = clock()  # inside the transaction: a wait for the lock does not book a moment in the past
        state = states[host]
        host_free = max(now, state.next_allowed if state is not None else 0.0)
        free_at, address = host_free, None
        for candidate in addresses:  # sorted: the first of equal moments is the lowest address
            ip_state = states[_ip_key(candidate)]
            at = max(host_free, ip_state.next_allowed if ip_state is not None else 0.0)
            if address is None or at < free_at:
                free_at, address = at, candidate
        if free_at > now:
            return {}, Booking(False, state, free_at, now, address, host_free)
        eff = max(policy.effective_interval(state, None), interval)
        # A zero interval books nothing in the future: no row needs writing for it.
        new = {host: policy.reserve(state, start=now, interval=eff)} if eff > 0 else {}
        if address is not None and ip_interval > 0:
            new[_ip_key(address)] = policy.reserve(states[_ip_key(address)], start=now, interval=ip_interval)
        return new, Booking(True, new.get(host, state), now, now, address, host_free)

    return fn


def _close_later(crawler: Crawler, reason: str) -> None:
    engine = getattr(crawler, "engine", None)
    if engine is not None and getattr(engine, "running", False):
        from twisted.internet import reactor

        reactor.callLater(0, _close_spider, crawler, reason)


def _reactor_sleep(seconds: float) -> defer.Deferred[None]:
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)


def _close_spider(crawler: Crawler, reason: str) -> None:
    engine = crawler.engine
    if engine is None or engine.spider is None:
        return
    close = getattr(engine, "close_spider_async", None)
    if close is not None:
        from scrapy.utils.defer import deferred_from_coro

        deferred_from_coro(close(reason=reason))
    else:  # pragma: no cover - older Scrapy
        engine.close_spider(engine.spider, reason)


def default_store_uri() -> str:
    """``sqlite:///<project data dir>/polite.sqlite3`` — inside ``.scrapy/`` of the Scrapy project."""
    from scrapy.utils.project import data_path

    path = data_path("polite.sqlite3")  # SQLiteStore creates the directory (createdir would make the file one)
    return f"sqlite:///{os.path.abspath(path)}"


#: One pacer per crawler, without a private attribute on the crawler.
_PACERS: weakref.WeakKeyDictionary[Any, Pacer] = weakref.WeakKeyDictionary()


def get_pacer(crawler: Crawler) -> Pacer:
    """The crawler's :class:`Pacer`, built (settings validated, store opened) on first use.

    Raises:
        SettingsError: a bad ``POLITE_*`` setting.
        StoreError: the pace table cannot be opened (the crawl must not start).
    """
    pacer = _PACERS.get(crawler)
    if pacer is None:
        config = PoliteConfig.from_settings(crawler.settings)
        uri = config.store_uri or default_store_uri()
        backend = open_store(uri)
        try:
            expired = backend.expire(time.time() - config.store_expire)
        except StoreError:
            backend.close()
            raise
        if expired:
            logger.info("scrapy-polite: expired %d stale hosts from %s", expired, backend.uri)
        logger.info("scrapy-polite: pace table %s", backend.uri)
        pacer = Pacer(crawler, config, AsyncStore(backend))
        _PACERS[crawler] = pacer
    return pacer


def find_pacer(crawler: Crawler) -> Pacer | None:
    """The crawler's :class:`Pacer` if :func:`get_pacer` has built it, else None (never builds one)."""
    return _PACERS.get(crawler)
