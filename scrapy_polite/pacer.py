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

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, error as txerror

from .policy import Decision, HostState, InvalidRetryAfter, host_key, parse_retry_after
from .settings import PoliteConfig
from .store import AsyncStore, StoreError, open_store

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = ["Pacer", "get_pacer", "Go", "Defer", "SERVER_SIDE_FAILURES"]

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
    return SERVER_SIDE_FAILURES + tuple(extra)


_SERVER_SIDE = _server_side_failures()


@dataclass
class Go:
    """The request may be sent now. ``sent_at`` is the booking time (epoch seconds)."""

    sent_at: float


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
            else:
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
        """Book the request on its host (SPEC §2, §5): return :class:`Go` once it may be sent, or
        :class:`Defer` when it must leave the downloader. Waits without blocking the reactor.

        Raises:
            StoreError: the pace table cannot be read or written (the crawl is being stopped).
        """
        if self.failed is not None:
            raise self.failed
        counters = self.counters(host)
        deferrable = self.can_defer(request)
        override = self.override(host, request)
        eff_floor = self.policy.effective_interval(None, override)

        if request.meta.get("polite_burst"):
            state = await self._call(self.store.get, host)
            now = self.clock()
            if self.policy.should_defer(state, now):
                if deferrable:
                    return self._defer(host, state.next_allowed, "throttled")  # type: ignore[union-attr]
                await self._wait(host, state.next_allowed - now)  # type: ignore[union-attr]
            self.inc("burst")
            counters.requests += 1
            return Go(sent_at=self.clock())

        line = self.line(host)
        while line.holder is not None and line.holder is not request:
            if deferrable:
                return self._defer(host, None, "line")
            d: defer.Deferred[None] = defer.Deferred()
            line.freed.append(d)
            await _aw(d)
        line.holder = request
        try:
            while True:
                now = self.clock()
                state, booked = await self._call(self.store.update, host, _reserve(self.policy, now, eff_floor))
                if booked:
                    counters.requests += 1
                    self.inc("requests")
                    return Go(sent_at=now)
                if self.policy.should_defer(state, now) and deferrable:
                    self.release(request, host)
                    reason = "throttled" if state.consec > 0 else "crawl_delay"
                    return self._defer(host, state.next_allowed, reason)
                await self._wait(host, self.policy.wait(state, now))
        except BaseException:
            self.release(request, host)
            raise

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
        self.counters(host).deferrals += 1
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
            engine = getattr(self.crawler, "engine", None)
            if engine is not None and getattr(engine, "running", False):
                from twisted.internet import reactor

                reactor.callLater(0, _close_spider, self.crawler, "polite_store_error")

    def release(self, request: Request, host: str | None = None) -> None:
        """Free the host's line if ``request`` holds it (idempotent), waking the next request."""
        if host is None:
            host = request.meta.get("polite_host")
            if host is None:
                return
        line = self.lines.get(host)
        if line is None or line.holder is not request:
            return
        line.holder = None
        waiters, line.freed = line.freed, []
        for d in waiters:
            d.callback(None)
        if self.scheduler is not None:
            self.scheduler.wake(host)

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
        self.counters(host).statuses[type(exception).__name__] += 1
        sent_at = request.meta.get("polite_sent_at")
        override = self.override(host, request)
        return self._record(host, request, lambda state: self.policy.after_response(
            state, status=None, end=end, sent_at=sent_at, override=override),
            retry_after=None, label="failure")

    def _record(self, host: str, request: Request, step: Callable[[HostState | None], Decision],
                *, retry_after: float | None, label: str) -> defer.Deferred[Any]:
        def fn(state: HostState | None) -> tuple[HostState, Decision]:
            decision = step(state)
            return decision.state, decision

        d = self.store.update(host, fn)

        def done(decision: Decision) -> Decision:
            if decision.throttle:
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
            return self.policy.with_crawl_delay(state, value, now=now), True

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
        """Per host: ``requests``, ``waits``, ``wait_seconds``, ``deferrals``, ``throttles``,
        ``backoff_steps``, ``statuses`` (status or failure name -> count), ``crawl_delay`` (seconds or None)."""
        return {
            host: {
                "requests": c.requests, "waits": c.waits, "wait_seconds": round(c.wait_seconds, 3),
                "deferrals": c.deferrals, "throttles": c.throttles, "backoff_steps": c.backoff_steps,
                "statuses": dict(c.statuses), "crawl_delay": c.crawl_delay,
            }
            for host, c in sorted(self.hosts.items())
        }

    def close(self) -> None:
        self.store.close()


def _aw(d: Any) -> Any:
    """An awaitable for a Deferred that works under both the asyncio and the plain Twisted reactor."""
    from scrapy.utils.defer import maybe_deferred_to_future

    return maybe_deferred_to_future(d)


def _reserve(policy: Any, now: float, interval: float) -> Callable[[HostState | None], Any]:
    """The booking step run inside the store's transaction: reserve when the host is free now."""

    def fn(state: HostState | None) -> tuple[HostState | None, tuple[HostState | None, bool]]:
        if state is not None and state.next_allowed > now:
            return None, (state, False)
        eff = policy.effective_interval(state, None)
        new = policy.reserve(state, start=now, interval=max(eff, interval))
        return new, (new, True)

    return fn


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

    path = data_path("polite.sqlite3", createdir=True)
    return f"sqlite:///{os.path.abspath(path)}"


def get_pacer(crawler: Crawler) -> Pacer:
    """The crawler's :class:`Pacer`, built (settings validated, store opened) on first use.

    Raises:
        SettingsError: a bad ``POLITE_*`` setting.
        StoreError: the pace table cannot be opened (the crawl must not start).
    """
    pacer = getattr(crawler, "_polite_pacer", None)
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
        crawler._polite_pacer = pacer  # type: ignore[attr-defined]
    return pacer
