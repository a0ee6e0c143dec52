"""The core of the pacing rules (docs/spec.md §2): :class:`PacingPolicy`, the ``POLITE_*`` settings that shape
them, and the rules of the interval (:meth:`~PacingPolicy.effective_interval`, :meth:`~PacingPolicy.backoff`,
:meth:`~PacingPolicy.takes_step`), of a response (:meth:`~PacingPolicy.after_response`,
:meth:`~PacingPolicy.success_delay`), before a request (:meth:`~PacingPolicy.wait`,
:meth:`~PacingPolicy.defer_verdict`), of robots.txt's delay, of the operator's reset and of the package's own
retries. The announced quotas' rules (:mod:`.quota`) and the booking's (:mod:`.booking`) are its too, by
inheritance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..vocabulary import parse_seconds
from .adaptive import AdaptivePolicy
from .booking import BookingRules
from .quota import QuotaRules
from .ratelimit import RateLimits
from .robots import current_entries, with_operator_delay, with_origin_delay
from .state import NEVER_SEEN, Decision, Deferral, HostState, RateLimitDecision, replace

__all__ = ["PacingPolicy", "MAX_BACKOFF_EXPONENT"]

#: The exponent of a backoff is capped here (``2**10`` = 1024 × the interval), as in the reference.
MAX_BACKOFF_EXPONENT = 10


@dataclass(frozen=True)
class PacingPolicy(QuotaRules, BookingRules):
    """The pacing rules of docs/spec.md §2–3, configured by the ``POLITE_*`` settings. All durations in seconds.

    Its rules of announced quotas are :class:`~scrapy_polite.policy.quota.QuotaRules`'s, those of the booking
    step :class:`~scrapy_polite.policy.booking.BookingRules`' (it inherits both).

    Attributes:
        host_interval: ``POLITE_HOST_INTERVAL``, the base interval between two requests to one host.
        max_backoff: ``POLITE_MAX_BACKOFF``, the cap of a computed backoff.
        max_wait: ``POLITE_MAX_WAIT``, the longest a single request may wait in line.
        max_retry_after: ``POLITE_MAX_RETRY_AFTER``, the cap of an honoured Retry-After.
        throttle_statuses: ``POLITE_THROTTLE_STATUSES``, statuses that mean "slow down".
        max_failure_backoff: ``POLITE_MAX_FAILURE_BACKOFF``, the cap of the backoff after a download failure
            (a host that is down is retried sooner than one that asked us to go away).
        throttle_retries: ``POLITE_THROTTLE_RETRIES``, how many times the package retries a page whose
            response was a throttle before it hands the response on (an int ≥ 0).
        ratelimit_headers: ``POLITE_RATELIMIT_HEADERS``, read the hosts' announced quotas (and honour the
            ones recorded in the table).
        adaptive: ``POLITE_ADAPTIVE``'s rules (:class:`~scrapy_polite.policy.adaptive.AdaptivePolicy`), or None when it
            is off: each host's interval then also follows its smoothed latency and strain steps.

    Raises:
        ValueError: a negative or non-finite duration, ``max_backoff < host_interval``, or a
            ``throttle_retries`` that is not an int ≥ 0.
    """

    host_interval: float = 1.0
    max_backoff: float = 300.0
    max_wait: float = 60.0
    max_retry_after: float = 3600.0
    throttle_statuses: frozenset[int] = frozenset({429, 503})
    max_failure_backoff: float = 60.0
    throttle_retries: int = 10
    ratelimit_headers: bool = True
    adaptive: AdaptivePolicy | None = None
    #: Hold a booked request's rows while it is in flight (docs/spec.md §3, "In flight"). Always on; a test
    #: turns it off in a crawl's process to show what the hold prevents (its negative control).
    in_flight_hold: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("host_interval", "max_backoff", "max_wait", "max_retry_after", "max_failure_backoff"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.max_backoff < self.host_interval:
            raise ValueError(f"max_backoff ({self.max_backoff!r} s) must not be below host_interval "
                             f"({self.host_interval!r} s)")
        if isinstance(self.throttle_retries, bool) or not isinstance(self.throttle_retries, int) \
                or self.throttle_retries < 0:
            raise ValueError(f"throttle_retries must be an int >= 0, got {self.throttle_retries!r}")
        object.__setattr__(self, "throttle_statuses", frozenset(int(s) for s in self.throttle_statuses))

    # -- the interval -------------------------------------------------------------------------------

    def effective_interval(self, state: HostState | None, override: float | None = None) -> float:
        """``eff = max(host_interval, crawl_delay, ratelimit_interval, override)`` in seconds (docs/spec.md §2).

        A published Crawl-delay larger than an override always wins; an override can only slow us down
        below the base interval when it is larger than it. The interval of an announced quota counts only
        while ``ratelimit_headers`` is on. With ``adaptive`` on, that ``eff`` is the floor of the host's adaptive
        interval (:meth:`AdaptivePolicy.interval <scrapy_polite.policy.adaptive.AdaptivePolicy.interval>`, docs/spec.md
        §2 "Adaptive pacing"), which is returned instead: never below the floor.
        """
        eff = self.host_interval
        if state is not None:
            if state.crawl_delay > eff:
                eff = state.crawl_delay
            if self.ratelimit_headers and state.ratelimit_interval > eff:
                eff = state.ratelimit_interval
        if override is not None and override > eff:
            eff = override
        if self.adaptive is not None and state is not None and (state.latency > 0 or state.strain > 0):
            eff = self.adaptive.interval(state.latency, state.strain, eff)
        return eff

    def backoff(self, eff: float, consec: int, *, cap: float | None = None) -> float:
        """The computed backoff ``min(eff * 2**min(consec, 10), cap)`` in seconds, never below ``eff`` (a
        published Crawl-delay above the cap is still honoured in full). ``cap`` defaults to ``max_backoff``."""
        limit = self.max_backoff if cap is None else cap
        return max(eff, min(eff * 2.0 ** min(consec, MAX_BACKOFF_EXPONENT), limit))

    def takes_step(self, eff: float, consec: int, *, cap: float | None = None) -> bool:
        """Whether a throttle at ``consec`` steps adds one (docs/spec.md §2, "No dead steps"): the first always
        does (it marks the host as throttling us); a later one only while ``eff * 2**consec`` is below ``cap``
        (``max_backoff`` by default) and the exponent below its own cap of 10. A step past either could only
        be repaid at the cap, one success per capped delay, and would change no delay.

        >>> PacingPolicy().takes_step(1.0, 8), PacingPolicy().takes_step(1.0, 9)
        (True, False)
        """
        if consec <= 0:
            return True
        limit = self.max_backoff if cap is None else cap
        return consec < MAX_BACKOFF_EXPONENT and eff * 2.0 ** consec < limit

    # -- after a response -------------------------------------------------------------------------

    def is_throttle(self, status: int, state: HostState | None, *, forbidden: bool = False) -> bool:
        """A throttle status, or a 403 from a host that has already served a 2xx, unless it refuses its page
        (``forbidden``: see :meth:`after_response`; docs/spec.md §2)."""
        if status in self.throttle_statuses:
            return True
        return status == 403 and state is not None and state.ok_seen and not forbidden

    def after_response(self, state: HostState | None, *, status: int | None, end: float,
                       retry_after: float | None = None, sent_at: float | None = None, override: float | None = None,
                       ratelimits: RateLimits | None = None, serial: int | None = None,
                       latency: float | None = None, forbidden: bool = False) -> Decision:
        """The host's new state after a response (docs/spec.md §2, "After a response"): its quota counted first,
        its latency observed, then a throttle's step (:meth:`_throttled`) or a success's.

        Args:
            state: the host's state now (None: never seen).
            status: the HTTP status, or None for a download failure that reached the server's side (timeout,
                connection refused or reset): a throttle without Retry-After, its backoff capped at
                ``max_failure_backoff`` (docs/spec.md §2, "Download failures").
            end: epoch seconds at which the response ended.
            retry_after: parsed Retry-After seconds, or None.
            sent_at: epoch seconds at which the request was sent; when a throttle was recorded after that
                moment, this response answers for the same moment of the host's mood: a throttle takes
                no second step and a success takes no step off. None: judge against the current state.
            override: a per-host, per-spider or per-request interval (seconds), see :meth:`effective_interval`.
            ratelimits: the response's rate-limit fields (:func:`~scrapy_polite.policy.ratelimit.parse_rate_limits`),
                applied first by :meth:`after_ratelimit` (so this response's delay already honours them);
                ignored when ``ratelimit_headers`` is off.
            serial: the request's booking serial (``HostState.booked`` after its booking,
                ``meta['polite_quota_serial']``), for the quota booking; None: not known.
            latency: seconds, this answer's download time (None: not measured), for adaptive pacing
                (:meth:`_observe`, only with ``adaptive`` on); it counts in this response's delay.
            forbidden: the page was answered 403 before and the host served a 2xx since: this 403 refuses the page,
                it is no throttle (docs/spec.md §2).

        Returns:
            A :class:`Decision` whose ``state.next_allowed`` is ``end + delay``.
        """
        quota = None
        if ratelimits and self.ratelimit_headers:
            quota = self.after_ratelimit(state, ratelimits, end=end, serial=serial)
            old = quota.state
        else:  # an answer without a quota still tells when its request was counted (docs/spec.md §2)
            old = self.answered_without_quota(state or NEVER_SEEN, end=end, serial=serial)
        if old.quota_serial == 0 and old.booked > 0 and self.ratelimit_headers:
            # The host's first answer: the others may be booked now (the serial not known: all so far answered).
            old = replace(old, quota_serial=serial if serial is not None else old.booked)
        if self.adaptive is not None:
            old = self._observe(self.adaptive, old, status=status, latency=latency, override=override)
        eff = self.effective_interval(old, override)
        # A throttle recorded at the very moment the request was booked counts as recorded after it: a request
        # booked after a throttle waits at least eff, so a tie is a request that was in flight with it.
        stale = sent_at is not None and old.throttled_at > 0 and old.throttled_at >= sent_at
        # ok_seen is set after the decision (is_throttle read the old state): the first 2xx-then-403 pair has
        # no history yet. Set in the same replace() as the rest of the row (one copy of it, not two).
        ok_seen = old.ok_seen or (status is not None and 200 <= status < 300)
        if status is None or self.is_throttle(status, state, forbidden=forbidden):
            return self._throttled(old, eff, failure=status is None, stale=stale, retry_after=retry_after, end=end,
                                   sent_at=sent_at, ok_seen=ok_seen, quota=quota)
        # Sent before a recorded throttle: it says nothing about the host's mood since.
        consec = old.consec if stale else max(old.consec - 1, 0)
        # One step off (none when stale), at most the run's largest Retry-After: the server told us the size
        # of its window, and guessing above it only loses reach.
        delay = eff if consec == 0 else self.success_delay(replace(old, consec=consec + 1), override)
        new = replace(old, consec=consec, next_allowed=max(end + delay, old.next_allowed), updated=end,
                      ok_seen=ok_seen, run_retry_after=old.run_retry_after if consec > 0 else 0.0)
        return Decision(state=new, delay=new.next_allowed - end, throttle=False, counted=False, ratelimit=quota)

    def _throttled(self, old: HostState, eff: float, *, failure: bool, stale: bool, retry_after: float | None,
                   end: float, sent_at: float | None, ok_seen: bool, quota: RateLimitDecision | None) -> Decision:
        """The step of a response judged a throttle (docs/spec.md §2, "After a response"), ``old`` being the row
        with its quota counted and its latency observed and ``eff`` its interval: one backoff step unless
        ``stale`` (docs/spec.md §2, "Requests in flight together answer for one moment of the host's mood") or
        dead (:meth:`takes_step`), the delay the honoured Retry-After or the backoff, and the run's Retry-After
        scale (docs/spec.md §2, "Retry-After sets the scale"). ``failure``: a download failure, its own cap."""
        if stale:  # this moment of the host's mood was already counted: no second step
            consec = old.consec
            step_from = max(consec - 1, 0)
        else:
            step_from = old.consec
            # No dead steps: a throttle whose backoff is at its cap already takes no further step (a
            # failure's cap is its own, the first throttle always steps).
            takes = self.takes_step(eff, step_from, cap=self.max_failure_backoff if failure else None)
            consec = step_from + 1 if takes else step_from
        clamped = False
        honoured = 0.0  # the Retry-After honoured (seconds, capped); 0: none given
        if retry_after is not None and retry_after > 0:
            honoured = retry_after
            if honoured > self.max_retry_after:
                honoured, clamped = self.max_retry_after, True
            delay = honoured
        else:
            delay = self.backoff(eff, step_from, cap=self.max_failure_backoff if failure else None)
        delay = max(delay, eff)
        # Retry-After sets the scale: the run's largest Retry-After, while every throttle of it carried one
        # (a run starts at consec 0; one throttle without a Retry-After ends the cap for the whole run).
        if old.consec == 0 and not stale:
            run_retry_after = honoured
        else:
            run_retry_after = max(old.run_retry_after, honoured) if honoured and old.run_retry_after else 0.0
        if consec == 0:
            run_retry_after = 0.0
        # A later hold already recorded (another process's booking, a robots delay) is never shortened.
        next_allowed = max(end + delay, old.next_allowed)
        # The step's moment is never before the request it answers for, nor before the row's last write
        # (a booking of a request still in flight): a clock that jumped back while they were in flight
        # must not make the others' throttles look like a new moment (found by tests/test_properties.py).
        moment = max(end, old.updated, sent_at if sent_at is not None else end)
        new = replace(old, consec=consec, next_allowed=next_allowed, updated=end,
                      throttled_at=old.throttled_at if stale else moment, ok_seen=ok_seen,
                      run_retry_after=run_retry_after)
        return Decision(state=new, delay=new.next_allowed - end, throttle=True, counted=consec > old.consec,
                        retry_after_clamped=clamped, ratelimit=quota)

    def _observe(self, adaptive: AdaptivePolicy, old: HostState, *, status: int | None, latency: float | None,
                 override: float | None) -> HostState:
        """``old`` with this answer's latency sample and strain step recorded by ``adaptive``, the policy's
        (docs/spec.md §2, "Adaptive pacing")."""
        error = status is None or status >= 500
        floor = self.effective_interval(replace(old, latency=0.0, strain=0), override)
        smoothed, strain = adaptive.observe(old.latency, old.strain, sample=latency, error=error, floor=floor)
        if smoothed == old.latency and strain == old.strain:
            return old
        return replace(old, latency=smoothed, strain=strain)

    def success_delay(self, state: HostState | None, override: float | None = None) -> float:
        """The delay (seconds) the host's next success would leave, counted from its end: the backoff of one
        step fewer, at most the run's largest Retry-After, never below ``eff`` (docs/spec.md §2). What the
        progress line and ``scrapy polite hosts`` tell the user a backoff will become.

        >>> PacingPolicy().success_delay(HostState(consec=9, run_retry_after=3.0))
        3.0
        >>> PacingPolicy().success_delay(HostState(consec=9))
        256.0
        """
        old = state or NEVER_SEEN
        eff = self.effective_interval(old, override)
        consec = max(old.consec - 1, 0)
        if consec == 0:
            return eff
        delay = self.backoff(eff, consec)
        if old.run_retry_after > 0:
            delay = max(eff, min(delay, old.run_retry_after))
        return delay

    # -- before a request -------------------------------------------------------------------------

    def wait(self, state: HostState | None, now: float) -> float:
        """``clamp(next_allowed - now, 0, max_wait)`` in seconds (docs/spec.md §2): how long a request of the
        host waits in line now, at most (no state: no wait)."""
        if state is None:
            return 0.0
        return min(max(state.next_allowed - now, 0.0), self.max_wait)

    def defer_verdict(self, state: HostState | None, now: float, *,
                      override: float | None = None) -> Deferral | None:
        """The deferral predicate of docs/spec.md §2 ("Deferral predicate", its one prose copy), with its reason
        and due time: a :class:`Deferral` when the request must leave the downloader, None when it may wait in
        line. The reason is ``"throttled"`` (``consec > 0``: the host refused us; it takes precedence),
        ``"ratelimit"`` (a spent quota, or one allowing less than one request per ``max_wait``; only while
        ``ratelimit_headers`` is on) or ``"crawl_delay"`` (a published delay, ``override`` included, strictly
        longer than ``max_wait``); ``due`` is ``next_allowed``. The discriminator is *why* we wait, never how long.
        """
        if state is None or state.next_allowed <= now:
            return None
        if state.consec > 0:
            return Deferral(reason="throttled", due=state.next_allowed)
        quota = state.ratelimit_interval if self.ratelimit_headers else 0.0
        if self.ratelimit_headers and state.ratelimit_until > now:
            return Deferral(reason="ratelimit", due=state.next_allowed)
        published = max(state.crawl_delay, override or 0.0)  # an operator's or spider's delay counts too
        if max(published, quota) > self.max_wait:
            return Deferral(reason="ratelimit" if quota > published else "crawl_delay", due=state.next_allowed)
        return None

    def robots_delay_update(self, state: HostState | None, delay: float | None, *, now: float,
                            entry: str | None = None) -> HostState | None:
        """A host's row after a robots.txt answered 2xx or 4xx at ``now`` published ``delay`` seconds (None or 0: no
        delay) for ``entry`` (:func:`~scrapy_polite.policy.robots.entry_name`: its origin and user agent; None:
        the host's only one), or None when nothing changes (docs/spec.md §2 "A host's origins", §5).

        The row keeps each entry's delay (``origin_delays``, :func:`~scrapy_polite.policy.robots.with_origin_delay`)
        and the largest as ``crawl_delay``: one origin's robots.txt without a delay does not clear another's, in any
        process. Entries that did not make the row's delay are stale, and dropped
        (:func:`~scrapy_polite.policy.robots.current_entries`). Without an entry, the delay replaces what the row
        held. Since robots.txt was itself a request to the host, just answered, the host's next request is at least
        the delay in force after it.

        Raises:
            ValueError: a negative or non-finite delay.
        """
        value = float(delay) if delay is not None else 0.0
        if parse_seconds(value) is None:
            raise ValueError(f"crawl_delay must be a finite number of seconds >= 0, got {delay!r}")
        kept = _entries(state)
        text, in_force = with_origin_delay(kept, entry, value) if entry is not None else ("", value)
        if state is None and in_force == 0.0:
            return None
        if state is not None and state.crawl_delay == in_force and state.origin_delays == text:
            return None
        return replace(state or NEVER_SEEN, crawl_delay=in_force, origin_delays=text, updated=now,
                       next_allowed=max((state or NEVER_SEEN).next_allowed, now + in_force))

    # -- operator verbs -------------------------------------------------------------------------------

    @staticmethod
    def reset(state: HostState | None, *, now: float) -> HostState:
        """Forget ``next_allowed``, ``consec``, ``ok_seen``, a spent quota's hold (``ratelimit_until``), what is
        left of it (``quota_left``, ``quota_reset``) and the adaptive ``latency`` and ``strain``; keep
        ``crawl_delay``, ``ratelimit_interval`` and the quota's size (``quota_limit``, ``quota_window``), the host's
        own numbers, the booking serial (``booked``, ``quota_serial``: requests in flight are still counted by
        it) and an in-flight hold (``held_until``, ``held_by``: the request is still on its way) (docs/spec.md §2,
        §3)."""
        if state is None:
            return HostState(updated=now)
        return HostState(crawl_delay=state.crawl_delay, origin_delays=state.origin_delays,
                         ratelimit_interval=state.ratelimit_interval,
                         quota_limit=state.quota_limit, quota_window=state.quota_window,
                         quota_serial=state.quota_serial, booked=state.booked, updated=now,
                         held_until=state.held_until, held_by=state.held_by)

    def retry_throttled(self, *, throttle: bool, retries: int) -> bool:
        """Whether the package retries a page whose response was judged a throttle (``throttle``), after
        ``retries`` earlier throttle retries of that page (docs/spec.md §2, "A throttle is not a failure"):
        while fewer than ``throttle_retries`` were made. The request then goes back to be deferred until its
        host is due, without consuming Scrapy's ``RETRY_TIMES``; once the budget is spent the response goes
        on as Scrapy would handle it.

        >>> PacingPolicy(throttle_retries=2).retry_throttled(throttle=True, retries=1)
        True
        >>> PacingPolicy(throttle_retries=2).retry_throttled(throttle=True, retries=2)
        False
        """
        return throttle and retries < self.throttle_retries

    @staticmethod
    def with_crawl_delay(state: HostState | None, crawl_delay: float | None, *, now: float) -> HostState:
        """The state with an operator's Crawl-delay set at ``now`` (seconds ≥ 0; None: the operator's removed;
        ``scrapy polite crawl-delay``): in force until a robots.txt of the host changes a delay it published,
        when the largest delay the host's origins publish holds again; removed, that one holds at once
        (:func:`~scrapy_polite.policy.robots.with_operator_delay`). As a robots.txt delay does, a delay set holds the
        host at least that long from ``now`` (``scrapy polite reset`` forgets the hold).

        Raises:
            ValueError: a negative or non-finite delay.
        """
        if crawl_delay is not None and parse_seconds(crawl_delay) is None:
            raise ValueError(f"crawl_delay must be a finite number of seconds >= 0, got {crawl_delay!r}")
        old = state or NEVER_SEEN
        text, value = with_operator_delay(_entries(state), None if crawl_delay is None else float(crawl_delay))
        held = old.next_allowed if crawl_delay is None else max(old.next_allowed, now + value)
        return replace(old, crawl_delay=value, origin_delays=text, updated=now, next_allowed=held)


def _entries(state: HostState | None) -> str:
    """The row's current origin delays (:func:`~scrapy_polite.policy.robots.current_entries`)."""
    return current_entries(state.origin_delays, state.crawl_delay) if state is not None else ""
