"""Recording what a host answered (docs/spec.md §2, §5): each response's status and ``Retry-After``, each
download failure that reached the server's side, and each robots.txt delay, written to the pace table in
one transaction with the address's row.

The new rows are decided by :class:`~scrapy_polite.policy.PacingPolicy` (``after_response``,
``finish_address``, ``robots_delay_update``); this module parses the inputs, counts and logs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.exceptions import IgnoreRequest
from scrapy.http import Headers
from twisted.internet import defer
from twisted.python.failure import Failure

from .._compat import server_side_failure_types
from ..clock import ClockSync
from ..policy import (
    Decision,
    HostState,
    PacingPolicy,
    RateLimitDecision,
    ip_key,
    origin_key,
    origin_of,
)
from ..policy.ratelimit import RATELIMIT_FIELDS, RateLimits, parse_rate_limits
from ..policy.retry_after import longest_retry_after
from ..policy.robots import entry_name
from ..reports.counters import Report
from ..settings import PoliteConfig
from ..stores import StoreError
from ..vocabulary import FORBIDDEN_META, HOST_META, IP_META, QUOTA_SERIAL_META, RECORDED_META, SENT_AT_META
from .lifecycle import Lifecycle
from .outage import DeferredStore
from .reactor import await_deferred

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

logger = logging.getLogger(__name__)

__all__ = ["Recorder", "SERVER_SIDE_FAILURES"]

#: Download failures that reached the server's side (timeouts, refused, reset or lost connections, and
#: Scrapy's wrappers of them): they count as a throttle without Retry-After (docs/spec.md §2). DNS failures are not
#: among them and never touch a host's backoff.
SERVER_SIDE_FAILURES: tuple[type[BaseException], ...] = server_side_failure_types()

#: The rate-limit field names as Scrapy's ``Headers`` keys them (``Headers.normkey``), to tell with one set
#: operation whether a response has any of them.
_RATELIMIT_KEYS = frozenset(Headers().normkey(name) for name in RATELIMIT_FIELDS)


def _latency(measured: Any, sent_at: Any, end: float) -> float | None:
    """An answer's download time for adaptive pacing (docs/spec.md §2, "Adaptive pacing"), seconds: Scrapy's
    measure (``measured``: the request's ``meta['download_latency']``, seconds from its start to its response's
    headers; None for a failure) when it is a number of seconds >= 0, else the time from its booking
    (``polite_sent_at``) to its record (``end``), both the table's clock; None when neither is known."""
    if isinstance(measured, (int, float)) and not isinstance(measured, bool) and math.isfinite(measured) \
            and measured >= 0:
        return float(measured)
    if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool) and end >= sent_at:
        return end - float(sent_at)
    return None


class Recorder:
    """Feeds responses, failures and robots.txt delays of one crawler into the pace table.

    Args:
        config: the validated settings.
        store: the pace table.
        lifecycle: the owner of the process's requests and lines (a response's record is awaited before its
            host's line is freed).
        report: counters and stats.
        clock: this process's clock and its offset to the table's clock.
        override: ``override(host, request) -> seconds | None``, the request's interval override.
        on_store_error: called with a :class:`~scrapy_polite.stores.StoreError` (stops the crawl).
        user_agent: the user agent robots.txt delays are read for (for the log).
    """

    def __init__(self, config: PoliteConfig, store: DeferredStore, lifecycle: Lifecycle, report: Report,
                 clock: ClockSync, override: Callable[[str, Any], float | None],
                 on_store_error: Callable[[StoreError], None], user_agent: str) -> None:
        self.config = config
        self.policy: PacingPolicy = config.policy
        self.store = store
        self.lifecycle = lifecycle
        self.report = report
        self.clock = clock
        self.override = override
        self.on_store_error = on_store_error
        self.user_agent = user_agent
        #: host → the table's time of the last throttle seen (for burst requests decided before it).
        self.throttle_marks: dict[str, float] = {}
        self._clamped_hosts: set[str] = set()
        #: The records of requests that hold no line (burst, robots.txt), awaited by :meth:`recorded`.
        self._unlined: weakref.WeakKeyDictionary[Any, defer.Deferred[Any]] = weakref.WeakKeyDictionary()
        #: (host, what) logged once at INFO, then at DEBUG: a bad rate-limit field or Retry-After, a clamped quota.
        self._logged_once: set[tuple[str, str]] = set()
        #: origin (``scheme://host[:port]``) → the status of its last downloaded robots.txt: only a 2xx or 4xx one
        #: may change the delay it publishes (RFC 9309 §2.3.1.4; :meth:`robots_downloaded`).
        self.robots_statuses: dict[str, int] = {}
        self._token = f"{os.getpid()}:{id(self)}"  # this recorder, in a page's 403 mark (:meth:`_forbidden`)

    def downloaded(self, request: Request, response: Response, *, refusal: str | None = None,
                   foreign: bool = False) -> None:
        """Record ``response`` as it leaves the download handler, before any downloader middleware acts on it
        (docs/spec.md §5, "Recording"), once per pass through the downloader (``meta['_polite_recorded']``): the
        add-on's pinned handlers call this themselves, the middleware's ``response_downloaded`` receiver for every
        other handler. ``refusal``: why a checked handler's response came from a non-public address (recorded as
        a failure that never throttles); ``foreign``: it came from another host than the booked one (not
        recorded; docs/spec.md §4.1). A robots.txt response's status is noted (:meth:`robots_downloaded`).

        A request the crawl's lifecycle never saw is not recorded: a copy another handler made to download through
        the add-on's (Scrapy's S3 handler downloads ``request.replace(url=...)`` through the ``https`` handler); its
        original, the request the middleware booked, is recorded from the signal."""
        meta = request.meta
        if meta.get(RECORDED_META) or self.lifecycle.stage(request) is None:
            return
        meta[RECORDED_META] = True
        try:
            if refusal is not None:
                self.record_failure(request, IgnoreRequest(refusal))
            elif not foreign:
                self.record_response(request, response)
        finally:  # a failing record never skips the robots.txt status
            # A robots.txt that Scrapy's RedirectMiddleware followed (under Scrapy's own robots.txt middleware: the
            # add-on's follows each hop itself) answers for the origin whose robots.txt was asked: the chain's first.
            redirected = meta.get("redirect_urls")
            url = redirected[0] if redirected else request.url
            if url.endswith("/robots.txt"):
                self.robots_downloaded(url, response.status)

    def robots_downloaded(self, url: str, status: int) -> None:
        """Note the status of a downloaded robots.txt for its origin (:attr:`robots_statuses`): ``url``, the URL that
        was asked (before any redirect)."""
        self.robots_statuses[origin_of(urlsplit(url))] = status

    def record_response(self, request: Request, response: Response) -> defer.Deferred[Any] | None:
        """Feed a downloaded response's status and Retry-After into the table (docs/spec.md §2).

        Returns a Deferred that fires once the table is written (the line is released only after it), or
        None for a request that was not paced."""
        host = request.meta.get(HOST_META)
        if host is None:
            return None
        status = response.status
        self.report.hosts[host].statuses[status] += 1
        if status in self.policy.throttle_statuses:
            self.throttle_marks[host] = self.clock.store_now()
        headers = response.headers
        retry_after = None
        lines = headers.getlist(b"Retry-After")
        if lines:  # every line: a gateway's and the origin's ask the longer wait
            retry_after, errors = longest_retry_after(lines, now=self.clock.clock(), date=headers.get(b"Date"))
            for exc in errors:
                self.report.inc("retry_after/invalid")
                first = (host, "retry-after") not in self._logged_once  # once per host at INFO (trial)
                self._logged_once.add((host, "retry-after"))
                (logger.info if first else logger.debug)(
                    "Ignoring invalid Retry-After from %s: %s%s", response.url, exc,
                    " (further ones from this host are logged at DEBUG)" if first else "")
        # Most responses announce no quota: one set test spares them :meth:`_ratelimits`.
        ratelimits = (self._ratelimits(host, response)
                      if self.policy.ratelimit_headers and not _RATELIMIT_KEYS.isdisjoint(headers.keys()) else None)
        return self._record(host, request, status=status, retry_after=retry_after, ratelimits=ratelimits,
                            measured=request.meta.get("download_latency"), label=str(status),
                            forbidden=status == 403 and self._forbidden(host, request))

    def _forbidden(self, host: str, request: Request) -> bool:
        """The 403 answering ``request`` refuses its page, it is no throttle: the page was answered 403 before (a
        throttle then, ``meta['_polite_forbidden']``) and the host served this process a 2xx since (docs/spec.md §2,
        "After a response"; trial: two always-forbidden pages, each retried as a throttle, took a host's crawl from
        6 s to 55 s). The mark names its page (its URL): a redirect, or a request made with a copy of the meta, is
        another page (review). Another process's mark is no evidence (its counts are not ours): a throttle still."""
        statuses = self.report.counters(host).statuses
        served = sum(n for status, n in statuses.items() if type(status) is int and 200 <= status < 300)
        mark = request.meta.get(FORBIDDEN_META)
        request.meta[FORBIDDEN_META] = (self._token, request.url, served)
        if not (isinstance(mark, tuple) and len(mark) == 3):
            return False
        token, url, before = mark
        return bool(token == self._token and url == request.url and served > before)

    def _ratelimits(self, host: str, response: Response) -> RateLimits | None:
        """The response's rate-limit fields (docs/spec.md §2, "Announced quotas"), or None when it has none;
        malformed ones are counted (``polite/ratelimit/malformed``), logged once per host and field, ignored."""
        headers = response.headers
        fields = {name: headers.getlist(name) for name in RATELIMIT_FIELDS if name in headers}
        if not fields:
            return None
        limits = parse_rate_limits(fields, now=self.clock.clock(), date=headers.get(b"Date"))
        for name in limits.malformed:
            self.report.inc("ratelimit/malformed")
            if (host, name) not in self._logged_once:
                self._logged_once.add((host, name))
                logger.info("Ignoring the malformed %s field of %s (further ones from %s are counted only)",
                            name, response.url, host)
        return limits if limits else None

    def record_failure(self, request: Request, exception: BaseException) -> defer.Deferred[Any] | None:
        """Feed a download failure into the table: a failure that reached the server's side counts as a
        throttle without Retry-After; a DNS failure or anything else does not touch the backoff."""
        host = request.meta.get(HOST_META)
        if host is None or not isinstance(exception, SERVER_SIDE_FAILURES):
            return None
        self.throttle_marks[host] = self.clock.store_now()
        cause = type(exception).__name__
        self.report.counters(host).statuses[cause] += 1
        return self._record(host, request, status=None, retry_after=None, ratelimits=None, measured=None,
                            label="failure", cause=cause)

    def _record(self, host: str, request: Request, *, status: int | None, retry_after: float | None,
                ratelimits: RateLimits | None, measured: Any, label: str,
                cause: str | None = None, forbidden: bool = False) -> defer.Deferred[Any]:
        """Write the record of a response (``status``) or of a server-side failure (``status`` None, ``cause``:
        its name) in one transaction: the host's new row (:meth:`PacingPolicy.after_response
        <scrapy_polite.policy.PacingPolicy.after_response>`, the response ending at the transaction's ``now``,
        ``measured``: Scrapy's ``download_latency``, see :func:`_latency`), the booking's in-flight hold released,
        and the address's row finished; then count and log it (:meth:`_written`)."""
        meta = request.meta
        sent_at = meta.get(SENT_AT_META)
        serial = meta.get(QUOTA_SERIAL_META)
        override = self.override(host, request)
        ip_interval = self.config.ip_interval
        address = meta.get(IP_META) if ip_interval > 0 else None
        address_key = ip_key(address) if address else None
        policy = self.policy
        # The record releases the booking's in-flight hold, in the same transaction (docs/spec.md §3, "In flight").
        hold = self.lifecycle.take_hold(request)
        token = hold.token if hold is not None else None

        def fn(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], Decision]:
            # The response ends now, by the table's clock. Scrapy's measure is a float of seconds >= 0 on an
            # ordinary page: _latency's first rule then, without its call.
            latency = (measured if type(measured) is float and 0.0 <= measured < math.inf
                       else _latency(measured, sent_at, now))
            decision = policy.after_response(states[host], status=status, end=now, retry_after=retry_after,
                                             sent_at=sent_at, override=override, ratelimits=ratelimits,
                                             serial=serial, latency=latency, forbidden=forbidden)
            if token is not None:
                released = policy.release_hold(decision.state, token)
                if released is not None:
                    decision = dataclasses.replace(decision, state=released)
            new = {host: decision.state}
            if address_key is not None:
                new[address_key] = policy.finish_address(states[address_key], end=now, ip_interval=ip_interval,
                                                         hold=token)
            return new, decision

        d = self.store.update_many([host, address_key] if address_key else [host], fn)
        d.addCallbacks(self._written, self._failed, callbackArgs=(host, request, retry_after, label, status, cause),
                       errbackArgs=(host, label))
        if not self.lifecycle.set_recording(host, request, d):
            self._unlined[request] = d
        return d

    def _written(self, decision: Decision, host: str, request: Request, retry_after: float | None, label: str,
                 status: int | None, cause: str | None) -> Decision:
        """The record is in the table: count it (a throttle: :meth:`_throttled`; an announced quota:
        :meth:`_ratelimit_recorded`; the host's counters: :meth:`Report.recorded
        <scrapy_polite.reports.counters.Report.recorded>`), then log its event, and its backoff step
        (:meth:`EventLog.response <scrapy_polite.reports.events.EventLog.response>`). One callback: a page's
        record runs a Deferred's callbacks once."""
        if decision.throttle:
            self._throttled(decision, host, retry_after, label)
        quota = decision.ratelimit
        if quota is not None:
            self._ratelimit_recorded(host, quota)
        report = self.report
        report.recorded(host, decision, offset=self.clock.offset, label=label, retry_after=retry_after)
        state = decision.state
        meta = request.meta
        address = meta.get(IP_META)
        report.events.response(
            host, request.url, at=state.updated, status=status,
            failure=cause, retry_after=retry_after, delay=decision.delay, due=state.next_allowed,
            steps=state.consec, started=meta.get(SENT_AT_META), throttle=decision.throttle,
            counted=decision.counted, address=address, ip_interval=self.config.ip_interval if address else None,
            hold=quota.hold if quota is not None else None)
        return decision

    def _throttled(self, decision: Decision, host: str, retry_after: float | None, label: str) -> None:
        """Count and log a recorded throttle (``label``: its status, or ``"failure"``; ``retry_after``: seconds
        asked, or None): ``polite/throttles/<label>``, its backoff step, its Retry-After honoured or clamped (one
        WARNING per host), and the mark that defers burst requests decided before it (:meth:`throttled_since`)."""
        self.throttle_marks[host] = max(self.throttle_marks.get(host, 0.0), decision.state.updated)
        counters = self.report.counters(host)
        counters.throttles += 1
        self.report.inc(f"throttles/{label}")
        if decision.counted:
            counters.backoff_steps += 1
            self.report.inc("backoff_steps")
        if retry_after is not None and retry_after > 0:
            self.report.inc("retry_after/honoured")
        if decision.retry_after_clamped:
            self.report.inc("retry_after/clamped")
            if host not in self._clamped_hosts:
                self._clamped_hosts.add(host)
                logger.warning("%s asked for Retry-After %.0f s; honouring POLITE_MAX_RETRY_AFTER=%.0f s",
                               host, retry_after, self.policy.max_retry_after)
        logger.debug("%s throttled (%s): backing off %.3f s (consec=%d)", host, label,
                     decision.delay, decision.state.consec)

    def _ratelimit_recorded(self, host: str, quota: RateLimitDecision) -> None:
        """Count and log what a response's announced quota decided (``polite/ratelimit/...``)."""
        report = self.report
        counters = report.counters(host)
        report.inc("ratelimit/responses")
        if quota.interval is not None:
            counters.ratelimit_interval = quota.interval
            if quota.changed:
                report.inc("ratelimit/adopted")
                logger.info("%s announces a quota of one request per %.3g s: adopted", host, quota.interval)
        if quota.hold is not None:
            counters.ratelimit_holds += 1
            report.inc("ratelimit/holds")
            # A burst request decided before this moment must not be sent into the spent quota.
            self.throttle_marks[host] = max(self.throttle_marks.get(host, 0.0), quota.state.updated)
            logger.debug("%s: its announced quota is spent; holding it %.3f s, until its reset", host, quota.hold)
        if quota.clamped:
            report.inc("ratelimit/clamped")
            if (host, "clamped") not in self._logged_once:
                self._logged_once.add((host, "clamped"))
                logger.warning("%s announces a quota longer than POLITE_MAX_RETRY_AFTER=%.0f s; honouring that cap",
                               host, self.policy.max_retry_after)

    def _failed(self, failure: Failure, host: str, label: str) -> None:
        if isinstance(failure.value, StoreError):
            self.on_store_error(failure.value)
        else:
            logger.error("scrapy-polite could not record %s for %s", label, host, exc_info=failure.value)

    async def recorded(self, request: Request) -> Decision | None:
        """Wait for the record of ``request``'s response or failure (docs/spec.md §5, "Recording"); the caller
        then ends the request's life (:meth:`Booker.end <scrapy_polite.crawl.booking.Booker.end>`).

        Returns the record's :class:`~scrapy_polite.policy.Decision` (None: nothing was recorded, the request never
        reached the booking, or the table could not be written)."""
        host = request.meta.get(HOST_META)
        if host is None:
            return None
        pending = self._unlined.pop(request, None)
        recording = self.lifecycle.take_recording(host, request)
        if recording is not None:
            pending = recording
        result = await await_deferred(pending) if pending is not None else None
        return result if isinstance(result, Decision) else None

    def throttled_since(self, request: Request) -> bool:
        """A throttle from the request's host was seen after the request was decided (``polite_sent_at``):
        a burst request that has not been sent yet must be deferred again (docs/spec.md §5, burst)."""
        host = request.meta.get(HOST_META)
        decided = request.meta.get(SENT_AT_META)
        mark = self.throttle_marks.get(host) if host is not None else None
        return mark is not None and decided is not None and mark > decided

    def set_crawl_delay(self, host: str, delay: float | None, origin: str | None = None) -> defer.Deferred[Any]:
        """Record the delay (seconds; None: none) the robots.txt of ``origin`` (:func:`origin_of`; None: the host's
        only one) publishes for ``host`` in the table (docs/spec.md §2, §5); a Deferred of whether the delay in force
        changed.

        A host's origins (``http`` and ``https``, other ports) each publish their own robots.txt, and share the host's
        row (docs/spec.md §1): the row keeps each origin's delay for each user agent (:func:`entry_name`, the origin
        named by :func:`origin_key`), as any process recorded it, and the largest is in force
        (:meth:`~scrapy_polite.policy.PacingPolicy.robots_delay_update`), so one origin's robots.txt without a delay
        does not clear, or lower, another's. An invalid delay is refused by the policy, and the refusal is logged
        (the Deferred then fires None)."""
        mine = float(delay) if delay is not None else 0.0
        policy = self.policy
        in_force = [mine]
        key = entry_name(origin_key(origin), self.user_agent) if origin is not None else None

        def fn(state: HostState | None, now: float) -> tuple[HostState | None, bool]:
            new = policy.robots_delay_update(state, mine, now=now, entry=key)
            before = state.crawl_delay if state is not None else 0.0
            in_force[0] = new.crawl_delay if new is not None else before
            return new, in_force[0] != before

        d = self.store.update(host, fn)

        def done(changed: bool) -> bool:
            value = in_force[0]
            self.report.counters(host).crawl_delay = value if value > 0 else None
            if changed:
                self.report.events.robots_delay(host, value)
            if mine > 0:
                self.report.inc("crawl_delay/adopted")
                logger.info("%s publishes a delay of %g s for %s: %s", origin or host, mine, self.user_agent,
                            "adopted" if value == mine else f"recorded; the host's Crawl-delay is {value:g} s")
            return changed

        d.addCallbacks(done, self._failed, errbackArgs=(host, "its robots.txt delay"))
        return d
