"""The pacing policy of docs/spec.md §1–2: pure functions, no I/O, the clock passed in.

Everything that decides *how long* a host must be left alone lives here:

* :func:`host_key` — the pacing key of a URL (docs/spec.md §1);
* :func:`parse_retry_after` — the ``Retry-After`` header (RFC 9110 §10.2.3);
* :class:`PacingPolicy` — the configuration (intervals and caps, in seconds) and the rules:
  :meth:`~PacingPolicy.after_response`, :meth:`~PacingPolicy.wait`, :meth:`~PacingPolicy.reset`;
  :meth:`~PacingPolicy.defer_verdict`, :meth:`~PacingPolicy.book` (the booking step over a host's
  addresses), :meth:`~PacingPolicy.finish_address`, :meth:`~PacingPolicy.robots_delay_update`;
  :meth:`~PacingPolicy.after_ratelimit` (announced quotas, parsed by :mod:`scrapy_polite.ratelimit`),
  :meth:`~PacingPolicy.quota_booking` and :meth:`~PacingPolicy.answered_without_quota` (the quota's count),
  :meth:`~PacingPolicy.retry_throttled` (the package's own retries of throttled responses), and
  :meth:`~PacingPolicy.takes_step` / :meth:`~PacingPolicy.success_delay` (no dead steps, and Retry-After sets
  the scale);
* :class:`HostState` — one host's row of the pace table, an immutable value;
* :func:`ip_key` — the pace-table key of an address's row.

Every rule takes the state and the time (Unix epoch seconds) and returns a new state; nothing here reads
a clock, a file or the network, so each rule can be tested exactly on an injected clock.
"""

from __future__ import annotations

import dataclasses
import email.utils
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .adaptive import AdaptivePolicy
from .addresses import embedded_ipv4
from .hosts import NO_NETWORK_SCHEMES, InvalidHost, url_host
from .ratelimit import REQUESTS, RateLimits, ServiceLimit
from .vocabulary import DeferralReason, parse_seconds

__all__ = [
    "HostState",
    "PacingPolicy",
    "Decision",
    "RateLimitDecision",
    "host_key",
    "parse_retry_after",
    "InvalidRetryAfter",
    "NO_NETWORK_SCHEMES",
    "Deferral",
    "Booking",
    "ip_key",
]


#: Seconds between two tries of a booking that waits for a host's first answer (docs/spec.md §2, "Quota
#: booking"): one round trip to the server is the usual wait.
FIRST_ANSWER_POLL = 0.05
#: The longest (s) a host's second booking waits for its first answer (at most ``max_wait``): a first request
#: that ends without an answer the table hears of (refused by a later middleware, a crawl stopped while it was
#: in flight) delays the host's next request this long at most.
FIRST_ANSWER_TIMEOUT = 10.0

#: The shortest (s) between two tries of a booking kept out by another process's in-flight hold (docs/spec.md §3,
#: "In flight"); a try comes one interval of the held row later, at least this.
HOLD_POLL = 0.05

#: The exponent of a backoff is capped here (``2**10`` = 1024 × the interval), as in the reference.
MAX_BACKOFF_EXPONENT = 10


@dataclass(frozen=True)
class HostState:
    """One host's row of the pace table (docs/spec.md §2). Immutable: every rule returns a new value.

    Attributes:
        next_allowed: Unix epoch seconds before which no request may start to the host.
        consec: consecutive throttles not yet earned back, an int ≥ 0.
        crawl_delay: seconds, the host's published Crawl-delay (robots.txt) or an operator override; 0 = none.
        ok_seen: the host has served a 2xx at least once.
        throttled_at: epoch seconds of the response that recorded the last throttle step (0 = never);
            used to judge a response against the host's state when its request was sent.
        updated: epoch seconds of the last write (for expiry of stale rows).
        ratelimit_interval: seconds, the interval the host's announced quota allows (``w / q`` of its
            rate-limit fields, docs/spec.md §2 "Announced quotas"); 0 = none announced.
        ratelimit_until: epoch seconds until which the host's announced quota is spent (its remaining
            units reached 0; 0 = never): the host is held until then, and its requests are deferred.
        quota_left: requests the host's announced quota still allows before ``quota_reset``, counting every
            request booked since the response that announced it (docs/spec.md §2, "Quota booking"); -1 = no
            quota known.
        quota_reset: epoch seconds at which the quota is next replenished (0 = not known).
        quota_limit: the quota's units per window (``q``, ``RateLimit-Limit``, ``X-RateLimit-Limit``) it is
            refilled to at its reset; 0 = not known (no refill: the quota is unknown after the reset).
        quota_window: seconds, the quota's window (``w``), the next reset after a refill; 0 = not known.
        quota_serial: the booking serial (``booked``) of the request whose response the quota was last
            counted from; a response to an earlier request says nothing newer.
        booked: how many requests were booked on the host (a serial number, never decreasing): the
            requests booked after a given one are ``booked`` minus its serial.
        latency: seconds, the host's smoothed download latency (docs/spec.md §2, "Adaptive pacing"); 0 = none
            measured (recorded while ``POLITE_ADAPTIVE`` is on).
        strain: the host's strain steps (5xx answers and server-side failures not yet earned back), an int ≥ 0.
        run_retry_after: seconds, the largest Retry-After of the current run of throttles while every
            throttle of it carried one (docs/spec.md §2, "Retry-After sets the scale"): the delay a success
            leaves is at most this. 0 = no run (``consec`` is 0), or a throttle of the run carried none.
        held_until: epoch seconds, the bound of the **in-flight hold** (docs/spec.md §3, "In flight"): a request
            booked on this row is on its way, in some process, and no process books the row until its outcome
            is recorded (which releases the hold) or, should that process die, until this moment. 0 = not held.
        held_by: the token of the booking that holds the row (0 = not held): a record releases only its own
            hold, never a later booking's.
    """

    next_allowed: float = 0.0
    consec: int = 0
    crawl_delay: float = 0.0
    ok_seen: bool = False
    throttled_at: float = 0.0
    updated: float = 0.0
    ratelimit_interval: float = 0.0
    ratelimit_until: float = 0.0
    quota_left: int = -1
    quota_reset: float = 0.0
    quota_limit: int = 0
    quota_window: float = 0.0
    quota_serial: int = 0
    booked: int = 0
    latency: float = 0.0
    strain: int = 0
    run_retry_after: float = 0.0
    held_until: float = 0.0
    held_by: int = 0


#: A host never seen (every field its default); immutable, so shared.
NEVER_SEEN = HostState()
_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(HostState))
_D = TypeVar("_D")

# What lets state_from_fields skip __init__: HostState's __init__ sets its fields and nothing more.
if (hasattr(HostState, "__post_init__") or hasattr(HostState, "__slots__")
        or not all(f.init for f in dataclasses.fields(HostState))):  # pragma: no cover - a development error
    raise AssertionError("state_from_fields builds HostState without __init__: keep it a plain frozen dataclass")


def state_from_fields(*parts: Mapping[str, Any]) -> HostState:
    """A :class:`HostState` whose attributes are ``parts`` merged in order (a later part wins): the value
    ``HostState(**merged)`` makes, without the frozen dataclass's per-field ``__setattr__`` (5.3 µs → 1.7 µs
    for a whole row here; every booking and response builds one or more).

    The one place that builds a HostState without ``__init__``; it holds because HostState has no
    ``__post_init__``, no slots and no ``init=False`` field (checked when this module is imported). The
    caller gives every field (a store's whole row, or a row's ``__dict__`` and changes): nothing is
    defaulted or checked here.
    """
    state: HostState = object.__new__(HostState)
    attributes = state.__dict__
    for part in parts:
        attributes.update(part)
    return state


if TYPE_CHECKING:
    from dataclasses import replace  # the type checker checks the field names against the dataclass
else:
    def replace(obj: _D, /, **changes: Any) -> _D:
        """``dataclasses.replace``, for a :class:`HostState` without its per-call field introspection
        (7.4 µs → 1.1 µs here; every response and every quota booking copies a row): the row's attributes
        with ``changes`` set over them (:func:`state_from_fields`); any other type goes to
        ``dataclasses.replace``.

        Raises:
            TypeError: a name that is not a field (as ``dataclasses.replace``).
        """
        if type(obj) is not HostState:
            return dataclasses.replace(obj, **changes)
        if not _STATE_FIELDS.issuperset(changes):
            raise TypeError(f"HostState has no field {sorted(set(changes) - _STATE_FIELDS)!r}")
        return state_from_fields(obj.__dict__, changes)


@dataclass(frozen=True)
class Deferral:
    """Why and until when a request must leave the downloader (docs/spec.md §2, the deferral predicate).

    Attributes:
        reason: ``"throttled"`` (the host is backing us off), ``"ratelimit"`` (its announced quota is
            spent until its reset, or allows less than one request per ``POLITE_MAX_WAIT``) or
            ``"crawl_delay"`` (a published or configured delay longer than ``POLITE_MAX_WAIT``).
        due: epoch seconds at which the host is due again (its ``next_allowed``).
    """

    reason: DeferralReason
    due: float


@dataclass(frozen=True)
class Booking:
    """The outcome of :meth:`PacingPolicy.book` (docs/spec.md §3).

    Attributes:
        booked: the request may start now.
        host: the host's row after the booking (or as read, when not booked).
        start: epoch seconds at which the request starts (booked) or may start (not booked).
        host_free: epoch seconds at which the host alone would be free (``max(now, next_allowed)``).
        address: the address chosen (booked), or the one free first (not booked); None without addresses.
        writes: the rows to store: ``""`` for the host's row, else an address → its ``ip:`` row.
        interval: seconds, the host's interval this booking applied (booked: the interval in force for this
            request, adaptive pacing and every floor included; the booking event's ``delay``; 0 when not booked),
            recorded in the event log for ``scrapy polite audit``; derived from ``writes``, so it takes no part
            in comparing two bookings.
        held: not booked because the row that frees last (the host's, or the chosen address's) is held by a
            request in flight (docs/spec.md §3, "In flight"): ``start`` is only the hold's bound, and the row
            is released as soon as that request's outcome is recorded, so the caller asks again after ``poll``.
        poll: seconds after which a caller kept out by a hold asks again (the interval of the held row: once
            released, the row is not free sooner than that after the release); 0 when not held.
    """

    booked: bool
    host: HostState | None
    start: float
    host_free: float
    address: str | None = None
    writes: Mapping[str, HostState] = field(default_factory=dict)
    interval: float = field(default=0.0, compare=False)
    held: bool = False
    poll: float = 0.0


@dataclass(frozen=True)
class RateLimitDecision:
    """What :meth:`PacingPolicy.after_ratelimit` decided from a response's rate-limit fields.

    Attributes:
        state: the host's state with the announced quota recorded.
        interval: seconds, the interval the announced policies allow (``max(w / q)``, capped), now recorded
            as ``ratelimit_interval``; None when no policy with a window in requests was announced.
        hold: seconds from the response the host is held because a quota is spent (capped); None: none.
        clamped: the interval or the hold was larger than ``max_retry_after`` and was clamped.
        changed: the recorded interval changed.
    """

    state: HostState
    interval: float | None = None
    hold: float | None = None
    clamped: bool = False
    changed: bool = False


@dataclass(frozen=True)
class Decision:
    """What :meth:`PacingPolicy.after_response` decided, for stats and logs.

    Attributes:
        state: the host's new state.
        delay: seconds the host must now be left alone, counted from the response's end.
        throttle: the response was judged a throttle (docs/spec.md §2).
        counted: the throttle took a new backoff step (False when requests in flight together already
            answered for this moment of the host's mood).
        retry_after_clamped: the honoured Retry-After was larger than ``max_retry_after`` and was clamped.
        ratelimit: what the response's rate-limit fields decided (None: it had none, or they are not read).
    """

    state: HostState
    delay: float
    throttle: bool
    counted: bool
    retry_after_clamped: bool = False
    ratelimit: RateLimitDecision | None = None


class InvalidRetryAfter(ValueError):
    """A ``Retry-After`` value that is neither delay-seconds nor an HTTP-date (RFC 9110 §10.2.3).

    The pacer treats it as absent and counts it (``polite/retry_after/invalid``)."""


_DECIMAL = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)$", re.ASCII)


def parse_retry_after(value: str | bytes | None, *, now: float, date: str | bytes | None = None) -> float | None:
    """Parse a ``Retry-After`` header value into seconds to wait.

    RFC 9110 §10.2.3: delay-seconds (a non-negative integer) or an HTTP-date. An HTTP-date is taken
    relative to the response's ``Date`` header when it is present and valid, else relative to ``now``;
    a date in the past gives ``0.0``. delay-seconds may have any number of digits (the RFC sets no limit):
    a value too large for a float is ``math.inf``, which the policy clamps to ``POLITE_MAX_RETRY_AFTER``.
    **Deviation (docs/spec.md §2):** a non-negative decimal such as ``1.5`` is honoured as that many seconds.

    Args:
        value: the header value, or None when the header is absent.
        now: the local clock, Unix epoch seconds (only used for the HTTP-date form without ``Date``).
        date: the response's ``Date`` header value, if any.

    Returns:
        Seconds (float ≥ 0, ``inf`` for delay-seconds too large for a float), or None when the header is
        absent.

    Raises:
        InvalidRetryAfter: the value is present but negative, empty, garbage, ``inf``/``nan`` spelled out,
            or an unparseable date.

    >>> parse_retry_after("120", now=0)
    120.0
    >>> parse_retry_after(None, now=0) is None
    True
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = value.strip()
    if not text:
        raise InvalidRetryAfter("empty Retry-After")
    if _DECIMAL.match(text):
        return float(text)  # a run of digits too long for a float is inf ("longer than any cap"), never invalid
    if text[0] in "+-" or text[0].isdigit():
        # A number that is not a non-negative decimal: negative, exponent, "1,5", "inf" spelled oddly.
        raise InvalidRetryAfter(f"Retry-After is not a non-negative number: {text!r}")
    target = _parse_http_date(text)
    if target is None:
        raise InvalidRetryAfter(f"Retry-After is neither seconds nor an HTTP-date: {text!r}")
    reference = now
    if date is not None:
        if isinstance(date, bytes):
            date = date.decode("latin-1")
        parsed_date = _parse_http_date(date.strip())
        if parsed_date is not None:
            reference = parsed_date
    return max(0.0, target - reference)


def _parse_http_date(text: str) -> float | None:
    """An HTTP-date (IMF-fixdate, RFC 850 or asctime form) as epoch seconds, or None."""
    try:
        parsed = email.utils.parsedate_tz(text)
    except (TypeError, ValueError, IndexError):  # pragma: no cover - defensive, parsedate_tz rarely raises
        return None
    if parsed is None:
        return None
    try:
        stamp = float(email.utils.mktime_tz(parsed))
    except (OverflowError, ValueError):
        return None
    return stamp if math.isfinite(stamp) else None


def host_key(url: str) -> str | None:
    """The pacing key of a URL (docs/spec.md §1): its host as the WHATWG URL Standard reads it
    (:func:`scrapy_polite.hosts.url_host`: percent-decoded, IDNA-encoded, lower-cased, an IPv4 address in
    any of the Standard's spellings written as a dotted quad), without trailing dots or IPv6 brackets. The
    port is not part of the key.

    Args:
        url: an absolute URL.

    Returns:
        The key (``str``), or None when the URL has no host (``data:``, ``file:``) or the Standard rejects
        its host (:class:`~scrapy_polite.hosts.InvalidHost` says why).

    >>> host_key("HTTP://Bücher.Example.:8080/x")
    'xn--bcher-kva.example'
    >>> host_key("http://[2001:DB8::1]/")
    '2001:db8::1'
    >>> host_key("http://0x7f.1/")
    '127.0.0.1'
    """
    try:
        host = url_host(url)
    except InvalidHost:
        return None
    return host.key if host is not None else None


@dataclass(frozen=True)
class PacingPolicy:
    """The pacing rules of docs/spec.md §2, configured by the ``POLITE_*`` settings. All durations in seconds.

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
        adaptive: ``POLITE_ADAPTIVE``'s rules (:class:`~scrapy_polite.adaptive.AdaptivePolicy`), or None when it
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
        interval (:meth:`AdaptivePolicy.interval <scrapy_polite.adaptive.AdaptivePolicy.interval>`, docs/spec.md
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

    def is_throttle(self, status: int, state: HostState | None) -> bool:
        """A throttle status, or a 403 from a host that has already served a 2xx (docs/spec.md §2)."""
        if status in self.throttle_statuses:
            return True
        return status == 403 and state is not None and state.ok_seen

    def after_response(
        self,
        state: HostState | None,
        *,
        status: int | None,
        end: float,
        retry_after: float | None = None,
        sent_at: float | None = None,
        override: float | None = None,
        ratelimits: RateLimits | None = None,
        serial: int | None = None,
        latency: float | None = None,
    ) -> Decision:
        """The host's new state after a response (docs/spec.md §2).

        Args:
            state: the host's state now (None: never seen).
            status: the HTTP status, or None for a download failure that reached the server's side
                (timeout, connection refused or reset), which counts as a throttle without Retry-After; its
                backoff is capped at ``max_failure_backoff``, and it takes a new step only while that backoff
                is below the cap (so a host that was down never decays through longer delays).
            end: epoch seconds at which the response ended.
            retry_after: parsed Retry-After seconds, or None.
            sent_at: epoch seconds at which the request was sent; when a throttle was recorded after that
                moment, this response answers for the same moment of the host's mood: a throttle takes
                no second step and a success takes no step off. None: judge against the current state.
            override: a per-host, per-spider or per-request interval (seconds), see
                :meth:`effective_interval`.
            ratelimits: the response's rate-limit fields (:func:`~scrapy_polite.ratelimit.parse_rate_limits`),
                applied first by :meth:`after_ratelimit` (so this response's delay already honours them);
                ignored when ``ratelimit_headers`` is off.
            serial: the request's booking serial (``HostState.booked`` after its booking,
                ``meta['polite_quota_serial']``), for the quota booking; None: not known.
            latency: seconds, this answer's download time (None: not measured); it updates the host's smoothed
                ``latency``, and a 5xx or a failure adds a strain step, any other answer takes one off
                (:meth:`AdaptivePolicy.observe <scrapy_polite.adaptive.AdaptivePolicy.observe>`; only with
                ``adaptive`` on). The new values count in this response's delay.

        Returns:
            A :class:`Decision` whose ``state.next_allowed`` is ``end + delay``.
        """
        quota = None
        old = state or NEVER_SEEN
        if ratelimits and self.ratelimit_headers:
            quota = self.after_ratelimit(state, ratelimits, end=end, serial=serial)
            old = quota.state
        else:  # an answer without a quota still tells when its request was counted (docs/spec.md §2)
            old = self.answered_without_quota(old, end=end, serial=serial)
        if old.quota_serial == 0 and old.booked > 0 and self.ratelimit_headers:
            # The host's first answer: the others may be booked now (the serial not known: all so far answered).
            old = replace(old, quota_serial=serial if serial is not None else old.booked)
        old = self._observe(old, status=status, latency=latency, override=override)
        eff = self.effective_interval(old, override)
        # A throttle recorded at the very moment the request was booked counts as recorded after it: a request
        # booked after a throttle waits at least eff, so a tie is a request that was in flight with it.
        stale = sent_at is not None and old.throttled_at > 0 and old.throttled_at >= sent_at
        failure = status is None
        throttle = status is None or self.is_throttle(status, state)
        # ok_seen is set after the decision (is_throttle read the old state): the first 2xx-then-403 pair has
        # no history yet. Set in the same replace() as the rest of the row (one copy of it, not two).
        ok_seen = old.ok_seen or (status is not None and 200 <= status < 300)
        clamped = False
        if throttle:
            if stale:  # this moment of the host's mood was already counted: no second step
                consec = old.consec
                step_from = max(consec - 1, 0)
            else:
                step_from = old.consec
                # No dead steps: a throttle whose backoff is at its cap already takes no further step (a
                # failure's cap is its own, the first throttle always steps).
                takes = self.takes_step(eff, step_from, cap=self.max_failure_backoff if failure else None)
                consec = step_from + 1 if takes else step_from
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
        else:
            # Sent before a recorded throttle: it says nothing about the host's mood since.
            consec = old.consec if stale else max(old.consec - 1, 0)
            # One step off (none when stale), at most the run's largest Retry-After: the server told us the size
            # of its window, and guessing above it only loses reach.
            delay = eff if consec == 0 else self.success_delay(replace(old, consec=consec + 1), override)
            next_allowed = max(end + delay, old.next_allowed)
            new = replace(old, consec=consec, next_allowed=next_allowed, updated=end, ok_seen=ok_seen,
                          run_retry_after=old.run_retry_after if consec > 0 else 0.0)
        return Decision(state=new, delay=new.next_allowed - end, throttle=throttle,
                        counted=throttle and consec > old.consec, retry_after_clamped=clamped, ratelimit=quota)

    def _observe(self, old: HostState, *, status: int | None, latency: float | None,
                 override: float | None) -> HostState:
        """``old`` with this answer's latency sample and strain step recorded (docs/spec.md §2, "Adaptive pacing")."""
        if self.adaptive is None:
            return old
        error = status is None or status >= 500
        floor = self.effective_interval(replace(old, latency=0.0, strain=0), override)
        smoothed, strain = self.adaptive.observe(old.latency, old.strain, sample=latency, error=error, floor=floor)
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

    def after_ratelimit(self, state: HostState | None, limits: RateLimits, *, end: float,
                        serial: int | None = None) -> RateLimitDecision:
        """The host's state after a response announced its quotas (docs/spec.md §2, "Announced quotas").

        * A policy of ``q`` requests per ``w`` seconds allows one request per ``w / q`` seconds: the largest
          such interval over the announced policies (every quota must hold) is recorded as the host's
          ``ratelimit_interval``, replacing the one recorded before (the latest announcement wins); it takes
          part in :meth:`effective_interval`, so it only ever slows the host down. A policy in another unit
          than requests, without a window, or with ``q = 0`` gives no interval.
        * **Quota booking**: what remains is counted from the response to the latest-booked request (its
          ``serial``): ``left = remaining − (requests booked after it)``, since those were sent on the same
          quota; the binding limit (the smallest ``left``) is recorded with its reset (``end + reset``), its
          quota and its window, and every later booking takes one from it (:meth:`book`). A response to a
          request booked before the one the quota was last counted from says nothing newer and is not
          counted.
        * A service limit with nothing left (``left = 0``, in-flight requests counted) holds the host until its
          reset: ``next_allowed`` and ``ratelimit_until`` become at least ``end + reset`` (the largest such
          reset), so no request goes before the quota is replenished, before any 429 arrives.
        * **The reset's resolution**: a reset stated to ``resolution`` seconds (1 s for ``t``, ``RateLimit-Reset``
          and whole-second ``X-RateLimit-Reset``) may have been truncated by the server, so the quota is taken
          as replenished ``reset + resolution`` seconds after the response — but no later than one window
          (``w`` of its policy, when announced) unless the reset itself says more (:func:`_replenished_by`).
        * **The same reset said again**: the responses of one window each bound its reset; the earliest bound
          holds (:func:`_same_reset`), so a server that rounds up costs at most one resolution per window.
        * **A spent quota whose reset is not said** is held one window (``w`` of its policy), or, with no window
          announced, ``max_wait`` seconds (not a real reset: not refilled, the quota is unknown after it). Every
          spent quota thus has a due moment; none waits for an answer that may never come.
        * Both are capped at ``max_retry_after``, like a Retry-After; a clamped reset is not refilled (the
          quota is unknown after it, until a response says again).

        Args:
            state: the host's state (None: never seen).
            limits: the response's rate-limit fields.
            end: epoch seconds at which the response ended (the store's clock).
            serial: the booking serial of the request answered (``HostState.booked`` after its booking);
                None when unknown (the response then counts as the latest, with nothing booked after it).

        Returns:
            A :class:`RateLimitDecision`.
        """
        old = state or NEVER_SEEN
        interval = None
        for policy in limits.policies:
            if policy.unit == REQUESTS and policy.window is not None and policy.quota > 0:
                interval = max(interval or 0.0, policy.window / policy.quota)
        # Only the answer to a request booked after the one last counted says something newer (None: not known).
        counted = serial is None or serial > old.quota_serial
        after = max(old.booked - serial, 0) if serial is not None and counted else 0
        # Each limit: (left, seconds until it is replenished: -1 when not said, a guess when spent).
        spent: list[tuple[int, float]] = []
        binding: tuple[int, float, int, float, float] | None = None  # (left, reset, quota, window, resolution)
        binding_at = -1
        for limit in limits.limits:
            quota, window, unit = _policy_of(limits, limit.name)
            requests = unit == REQUESTS
            left = max(limit.remaining - after, 0) if requests else limit.remaining
            reset = _replenished_by(limit, window)  # -1: not said
            if left <= 0 and reset < 0:  # spent, its reset not said: a window at most, else max_wait (no refill)
                reset, quota = (window, quota) if window > 0 else (self.max_wait, 0)
            if requests and (binding is None or (left, -reset) < (binding[0], -binding[1])):
                binding, binding_at = (left, reset, quota, window, limit.resolution), len(spent)
            spent.append((left, reset))
        clamped = False
        if interval is not None and interval > self.max_retry_after:
            interval, clamped = self.max_retry_after, True
        new = old
        changed = interval is not None and interval != old.ratelimit_interval
        if interval is not None and changed:
            new = replace(new, ratelimit_interval=interval, updated=end)
        if binding is not None and counted:
            left, reset, quota, window, resolution = binding
            if reset > self.max_retry_after:
                reset, quota, clamped = self.max_retry_after, 0, True  # not the real reset: no refill there
            if serial is None and old.quota_left >= 0 and old.quota_reset > end:
                left = min(left, old.quota_left)  # unknown order: never more than already counted
            reset_at = end + reset if reset >= 0 else 0.0
            if _same_reset(old, left, reset_at, resolution, end=end):
                reset_at = min(reset_at, old.quota_reset)  # the same reset said again: the earliest bound holds
            new = replace(new, quota_left=left, quota_reset=reset_at, quota_limit=quota,
                          quota_window=window, quota_serial=serial if serial is not None else old.quota_serial,
                          updated=end)
            # The recorded quota decides the binding limit's hold: spent (in-flight requests counted) until its reset.
            spent[binding_at] = (left, reset_at - end if reset_at > 0 else -1.0)
        hold = None
        for left, reset in spent:
            if left <= 0 and reset > 0:
                hold = max(hold or 0.0, reset)
        if hold is not None:
            if hold > self.max_retry_after:
                hold, clamped = self.max_retry_after, True
            until = end + hold
            new = replace(new, ratelimit_until=max(new.ratelimit_until, until),
                          next_allowed=max(new.next_allowed, until), updated=end)
        return RateLimitDecision(state=new, interval=interval, hold=hold, clamped=clamped, changed=changed)

    def quota_booking(self, state: HostState, *, now: float) -> tuple[HostState, float | None]:
        """Take one request from the host's announced quota at ``now`` (epoch s; docs/spec.md §2, "Quota
        booking"), part of :meth:`book`.

        * A reset that has passed replenishes the quota: ``quota_left`` becomes its ``quota_limit`` less the
          requests booked since the last counted response (they may reach the server after the reset), and the
          next reset is one ``quota_window`` later (not known without a window); without a known limit the quota
          is unknown (``quota_left = -1``) until a response says again.
        * **One window at most**: requests booked before a reset can fall into the window that follows it, never
          into a later one, so from the second window after the recorded reset on they are not subtracted: a
          refill that leaves nothing (as many in flight, or never answered, as the quota) holds the host until the
          next reset and no longer, though this hold is never written (the row keeps the reset it recorded).
        * Nothing left with the reset known: no booking before the reset (a moment after ``now``: a reset that
          has passed was refilled above).
        * Nothing left with the reset not known (a refill without a window, then spent): while requests booked
          since the last counted response are unanswered, no booking until one answers (tried every
          :data:`FIRST_ANSWER_POLL` s) or for :data:`FIRST_ANSWER_TIMEOUT` s (at most ``max_wait``) after the row's
          last write; with none unanswered, nothing can say more: the quota is unknown and the booking goes.
        * Otherwise one is taken; taking the last holds the host until the reset (``ratelimit_until``,
          ``next_allowed``), so every later request, in any process, waits or is deferred.

        * **The first answer**: a host booked once that has not answered yet (``quota_serial`` 0) takes no
          second booking, in any process, until it answers (its quota is known only then) or for
          :data:`FIRST_ANSWER_TIMEOUT` (at most ``max_wait``) seconds; the others try again every
          :data:`FIRST_ANSWER_POLL` seconds.

        Every moment returned is after ``now``: a held host is due then (the two waits for an answer are the
        only moments that are tries again, each bounded as said, and never past its bound).

        ``booked`` (the serial) grows by one with every booking, quota or not (while ``ratelimit_headers``
        is on).

        Returns:
            ``(state, None)`` with the booking taken, or ``(state, moment)``: no booking before ``moment``
            (epoch s), ``state`` with only a refill applied.
        """
        new = state
        if not self.ratelimit_headers:
            return new, None
        answer_by = new.updated + min(self.max_wait, FIRST_ANSWER_TIMEOUT)
        if new.booked > 0 and new.quota_serial == 0 and now < answer_by:
            return new, min(now + FIRST_ANSWER_POLL, answer_by)  # not answered yet: its quota is not known
        if new.quota_reset > 0 and now >= new.quota_reset:
            new = self._refill(new, now)
        if new.quota_left == 0 and new.quota_reset == 0:  # spent, its reset not known
            if new.booked > new.quota_serial and now < answer_by:
                return new, min(now + FIRST_ANSWER_POLL, answer_by)  # an answer to one booked since may say more
            new = replace(new, quota_left=-1)  # nothing can say more: the quota is unknown
        if new.quota_left < 0:
            return replace(new, booked=new.booked + 1), None
        if new.quota_left == 0:
            return new, new.quota_reset  # after now: a reset that has passed was refilled
        left = new.quota_left - 1
        new = replace(new, quota_left=left, booked=new.booked + 1)
        if left == 0 and new.quota_reset > now:
            new = replace(new, ratelimit_until=max(new.ratelimit_until, new.quota_reset),
                          next_allowed=max(new.next_allowed, new.quota_reset))
        return new, None

    @staticmethod
    def _refill(state: HostState, now: float) -> HostState:
        """The quota replenished at its reset, ``now`` (epoch s) being at or after ``state.quota_reset``
        (docs/spec.md §2, "Quota booking"; see :meth:`quota_booking`)."""
        if state.quota_limit <= 0:
            return replace(state, quota_left=-1, quota_reset=0.0)  # its size not known: the quota is unknown
        since = max(state.booked - state.quota_serial, 0)
        reset = 0.0
        if state.quota_window > 0:
            periods = math.floor((now - state.quota_reset) / state.quota_window) + 1
            reset = state.quota_reset + periods * state.quota_window
            if periods > 1:
                since = 0  # booked before the recorded reset: in the window after it at the latest
        return replace(state, quota_left=max(state.quota_limit - since, 0), quota_reset=reset,
                       quota_serial=state.booked)

    def answered_without_quota(self, state: HostState, *, end: float, serial: int | None) -> HostState:
        """The host's row after an answer that announced no quota (no rate-limit field, or a download failure) to
        the request of booking serial ``serial``, ending at ``end`` (epoch s; docs/spec.md §2, "Quota booking").

        * The request reached the server (if it did) before ``end``: an answer before the recorded reset (or with
          none recorded) says the request was counted in the window the row counts, never the next one, so it is
          no longer subtracted at the refill (``quota_serial`` becomes ``serial``; ``quota_left`` already counted
          it when it was booked).
        * Spent with its reset not known: such an answer says nothing more, and the quota is unknown
          (``quota_left = -1``): the host is not held for ever.

        Only an answer to a request booked after the one last counted (``serial > quota_serial``) changes the row.
        """
        if not self.ratelimit_headers or serial is None or serial <= state.quota_serial \
                or (state.quota_left < 0 and state.quota_limit <= 0):  # no quota counted: nothing to tell
            return state
        if state.quota_left == 0 and state.quota_reset == 0:
            return replace(state, quota_left=-1)
        if state.quota_reset == 0 or end < state.quota_reset:
            return replace(state, quota_serial=serial)
        return state

    # -- before a request -------------------------------------------------------------------------

    def wait(self, state: HostState | None, now: float) -> float:
        """``clamp(next_allowed - now, 0, max_wait)`` in seconds (docs/spec.md §2): how long a request of the
        host waits in line now, at most (no state: no wait)."""
        if state is None:
            return 0.0
        return min(max(state.next_allowed - now, 0.0), self.max_wait)

    def defer_verdict(self, state: HostState | None, now: float, *,
                      override: float | None = None) -> Deferral | None:
        """The deferral predicate of docs/spec.md §2, with its reason and due time: a :class:`Deferral` when the
        request must leave the downloader, None when it may wait in line.

        * no state → False (deferral is never a default);
        * ``crawl_delay > max_wait`` and ``next_allowed > now`` → True (a published delay no in-line wait
          can honour; strictly greater-than). ``override`` (seconds: a per-host, per-spider or per-request
          interval) counts as a published delay here (docs/spec.md §2: "from robots.txt or an override");
        * ``consec > 0`` and ``next_allowed > now`` → True (the host actively refused us);
        * ``ratelimit_until > now`` → True (the host's announced quota is spent until its reset), and the
          interval of an announced quota counts as a published delay (both only while
          ``ratelimit_headers`` is on);
        * otherwise None: the discriminator is *why* we wait, never how long.

        A throttled host defers with reason ``"throttled"`` (it takes precedence: the host refused us); a
        spent quota, or a quota allowing less than one request per ``max_wait``, with reason ``"ratelimit"``;
        a long published delay with reason ``"crawl_delay"``. ``due`` is ``next_allowed``.
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

    def book(self, host: HostState | None, addresses: Mapping[str, HostState | None], *, now: float,
             floor: float = 0.0, ip_interval: float = 0.0, hold: tuple[int, float] | None = None) -> Booking:
        """The booking step of docs/spec.md §3 (the reference's ``reserve``), run inside one store transaction.

        Over the host's addresses (sorted; the mapping's order is the order of preference, lowest
        first) pick the one with the earliest ``free = max(now, host.next_allowed, ip.next_allowed)``,
        where a row held by a request in flight (:meth:`held_until`) is free only at its hold's bound;
        ties go to the first (lowest) address. When that moment is ``now``, the request is booked: the
        host for ``max(effective interval, floor)`` seconds and the address for ``ip_interval`` seconds, and
        one request is taken from the host's announced quota (:meth:`quota_booking`); a spent quota books
        nothing and holds the host until its reset. With ``hold``, both rows are also **held** while the
        request is in flight (docs/spec.md §3, "In flight"): no process books them until the request's outcome
        releases the hold (:meth:`release_hold`), or for ``download_timeout`` plus the row's interval at most.

        Args:
            host: the host's row (None: never seen).
            addresses: address → its ``ip:`` row (None: never booked); empty: pace by host only.
            now: the store's clock, epoch seconds.
            floor: seconds, the request's per-host, per-spider or per-request interval (0: none).
            ip_interval: ``POLITE_IP_INTERVAL``, seconds between two requests to one address.
            hold: ``(token, download_timeout)``: the hold's token (an int ≠ 0, unique to this booking) and the
                request's download timeout (seconds > 0); None: hold nothing (a booking that is not sent as one
                request, e.g. a test of the interval alone).

        Returns:
            A :class:`Booking`; ``writes`` holds the rows to store (host key ``""`` is the host's row,
            other keys are addresses) — empty when nothing was booked or every interval is zero.
        """
        host_at, host_held = self.held_until(host, now)
        host_free = max(now, host_at)
        free_at, address, held = host_free, None, host_held
        for candidate, ip_state in addresses.items():
            ip_at, ip_held = self.held_until(ip_state, now)
            at = max(host_free, ip_at)
            if address is None or at < free_at:
                free_at, address = at, candidate
                held = (host_held and at == host_free) or (ip_held and at == ip_at)
        if free_at > now:
            poll = 0.0
            if held:  # ask again one interval of the held row later (never before its release: docs/spec.md §3)
                poll = self.effective_interval(host, floor) if host_held and free_at == host_free else ip_interval
                poll = min(max(poll, HOLD_POLL), self.max_wait)
            return Booking(booked=False, host=host, start=free_at, host_free=host_free, address=address, held=held,
                           poll=poll)
        counted, held_until = self.quota_booking(host or NEVER_SEEN, now=now)
        if held_until is not None:  # the announced quota is spent: the host is held (docs/spec.md §2)
            if counted.quota_reset > now:
                counted = replace(counted, ratelimit_until=max(counted.ratelimit_until, held_until),
                                  next_allowed=max(counted.next_allowed, held_until))
            return Booking(booked=False, host=counted, start=held_until, host_free=held_until, address=address)
        writes: dict[str, HostState] = {}
        eff = self.effective_interval(host, floor)  # floor >= 0: an override of 0 changes nothing
        holding = hold is not None and self.in_flight_hold
        token, timeout = hold if hold is not None else (0, 0.0)
        # A zero interval books nothing in the future: no row needs writing for it, unless the host announces
        # a quota (its bookings are counted: the serial, ``booked``, grows with every one).
        if eff > 0 or (self.ratelimit_headers and host is not None and _announces_quota(host)):
            row = self.reserve(counted, start=now, interval=eff)
            if holding and eff > 0:
                row = replace(row, held_until=now + timeout + eff, held_by=token)
            writes[""] = row
        if address is not None and ip_interval > 0:
            row = self.reserve(addresses[address], start=now, interval=ip_interval)
            if holding:
                row = replace(row, held_until=now + timeout + ip_interval, held_by=token)
            writes[address] = row
        return Booking(booked=True, host=writes.get("", host), start=now, host_free=host_free,
                       address=address, writes=writes, interval=eff)

    def held_until(self, state: HostState | None, now: float) -> tuple[float, bool]:
        """When the row frees (epoch s, the table's clock), and whether an in-flight hold decides it: a row held
        by a request in flight (``held_until > now``) frees at the hold's bound at the latest, and sooner when
        the request's outcome releases it (docs/spec.md §3, "In flight"). Holds are ignored while
        :attr:`in_flight_hold` is off (a test's negative control)."""
        if state is None:
            return 0.0, False
        if self.in_flight_hold and state.held_until > now and state.held_until > state.next_allowed:
            return state.held_until, True
        return state.next_allowed, False

    @staticmethod
    def release_hold(state: HostState | None, token: int | None, *, end: float | None = None,
                     interval: float = 0.0) -> HostState | None:
        """The row with the in-flight hold of booking ``token`` released (docs/spec.md §3, "In flight"), or None
        when the row is not held by that booking (a later booking's hold is never released: nothing to write).

        Args:
            state: the row.
            token: the booking's hold token (None or 0: none).
            end: epoch seconds at which the request ended without a recorded answer (it was dropped after its
                booking, or failed before the server answered): the row is then also kept free of requests
                until ``end + interval``, as after an answer. None: the caller's record set ``next_allowed``.
            interval: seconds, the row's interval (with ``end``).
        """
        if state is None or not token or state.held_by != token:
            return None
        if end is None:
            return replace(state, held_until=0.0, held_by=0)
        return replace(state, held_until=0.0, held_by=0, next_allowed=max(state.next_allowed, end + interval),
                       updated=end)

    @staticmethod
    def finish_address(state: HostState | None, *, end: float, ip_interval: float, hold: int | None = None
                       ) -> HostState:
        """An address's row after a response from it ended at ``end`` (epoch s): the reference's
        ``finish``, ``next_allowed >= end + ip_interval`` (docs/spec.md §3), and the in-flight hold of booking
        ``hold`` released (if it is still that booking's). Never shortens a recorded ``next_allowed``."""
        old = state or NEVER_SEEN
        if hold and old.held_by == hold:
            return replace(old, next_allowed=max(old.next_allowed, end + ip_interval), updated=end,
                           held_until=0.0, held_by=0)
        return replace(old, next_allowed=max(old.next_allowed, end + ip_interval), updated=end)

    def robots_delay_update(self, state: HostState | None, delay: float | None, *,
                            now: float) -> HostState | None:
        """A host's row after its robots.txt (answered 2xx or 4xx at ``now``) published ``delay``
        seconds (None or 0: no delay), or None when nothing changes (docs/spec.md §2, §5).

        The delay is recorded as ``crawl_delay``, and since robots.txt was itself a request to the host,
        just answered, the host's next request is at least ``delay`` seconds after it.

        Raises:
            ValueError: a negative or non-finite delay.
        """
        value = float(delay) if delay is not None else 0.0
        if state is not None and state.crawl_delay == value:
            return None
        if state is None and value == 0.0:
            return None
        new = self.with_crawl_delay(state, value, now=now)
        return replace(new, next_allowed=max(new.next_allowed, now + value))

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
        return HostState(crawl_delay=state.crawl_delay, ratelimit_interval=state.ratelimit_interval,
                         quota_limit=state.quota_limit, quota_window=state.quota_window,
                         quota_serial=state.quota_serial, booked=state.booked, updated=now,
                         held_until=state.held_until, held_by=state.held_by)

    @staticmethod
    def restore(current: HostState | None, known: HostState) -> HostState:
        """A row written back into a table that came back empty (docs/spec.md §6, "A table that comes back
        empty"): what this process knew of it (``known``, the last it read or wrote), merged with what the
        table holds now (``current``: None, or a row another process wrote or restored since). Only more
        waiting can follow: every hold and backoff as long as the longer of the two, every published number
        (Crawl-delay, an announced quota's interval) the larger, the quota's count from the later-counted
        response, the in-flight hold of the later booking."""
        if current is None:
            return known
        newer, older = (known, current) if known.quota_serial > current.quota_serial else (current, known)
        held = known if known.held_until > current.held_until else current
        adaptive = known if known.updated > current.updated else current
        return replace(
            current, next_allowed=max(current.next_allowed, known.next_allowed),
            consec=max(current.consec, known.consec),
            crawl_delay=max(current.crawl_delay, known.crawl_delay), ok_seen=current.ok_seen or known.ok_seen,
            throttled_at=max(current.throttled_at, known.throttled_at), updated=max(current.updated, known.updated),
            ratelimit_interval=max(current.ratelimit_interval, known.ratelimit_interval),
            ratelimit_until=max(current.ratelimit_until, known.ratelimit_until), quota_left=newer.quota_left,
            quota_reset=newer.quota_reset, quota_limit=newer.quota_limit or older.quota_limit,
            quota_window=newer.quota_window or older.quota_window, quota_serial=newer.quota_serial,
            booked=max(current.booked, known.booked), latency=adaptive.latency,
            strain=max(current.strain, known.strain),
            run_retry_after=max(current.run_retry_after, known.run_retry_after),
            held_until=held.held_until, held_by=held.held_by)

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
    def with_crawl_delay(state: HostState | None, crawl_delay: float, *, now: float) -> HostState:
        """The state with the host's published Crawl-delay recorded (seconds ≥ 0).

        Raises:
            ValueError: a negative or non-finite delay.
        """
        if parse_seconds(crawl_delay) is None:
            raise ValueError(f"crawl_delay must be a finite number of seconds >= 0, got {crawl_delay!r}")
        return replace(state or NEVER_SEEN, crawl_delay=float(crawl_delay), updated=now)

    @staticmethod
    def reserve(state: HostState | None, *, start: float, interval: float) -> HostState:
        """Book a request starting at ``start``: no other request (in any process) may start within
        ``interval`` seconds of it (docs/spec.md §3, the reference's ``reserve``)."""
        old = state or NEVER_SEEN
        return replace(old, next_allowed=max(old.next_allowed, start + interval), updated=start)


def _announces_quota(state: HostState) -> bool:
    """The host has announced a quota (an interval, a remaining count or a quota's size) at some point."""
    return state.ratelimit_interval > 0 or state.quota_left >= 0 or state.quota_limit > 0 or state.booked > 0


def _policy_of(limits: RateLimits, name: str | None) -> tuple[int, float, str]:
    """The quota (0: not known), window (s, 0: not known) and unit of the policy a service limit belongs to:
    the announced policies of the same name (unnamed with unnamed); the smallest quota and the longest window
    when several match (``RateLimit-Limit: 5, 5;w=4`` is one quota of 5 per 4 s)."""
    quota, window, unit = 0, 0.0, REQUESTS
    for policy in limits.policies:
        if policy.name != name:
            continue
        if policy.quota > 0 and (quota == 0 or policy.quota < quota):
            quota = policy.quota
        if policy.window is not None and policy.window > window:
            window = policy.window
        unit = policy.unit if policy.unit != REQUESTS else unit
    return quota, window, unit


def _same_reset(old: HostState, left: int, reset_at: float, resolution: float, *, end: float) -> bool:
    """Whether a response ending at ``end`` (epoch s) that leaves ``left`` and bounds the reset at ``reset_at``
    (epoch s, its resolution ``resolution`` seconds included) says again the reset the row recorded: the recorded
    one has not passed, the quota did not go up (a new window would have), and both bounds lie within two
    resolutions (a reset ``R`` stated to the second is bounded in ``[R, R + 2 s)``: ``R`` rounded either way, plus
    the second; the next window's lies a window later). Only then is the earlier bound kept (docs/spec.md §2,
    "Announced quotas")."""
    return (resolution > 0 and reset_at > 0 and old.quota_reset > end and 0 <= left <= old.quota_left
            and abs(reset_at - old.quota_reset) < 2 * resolution)


def _replenished_by(limit: ServiceLimit, window: float) -> float:
    """Seconds from the response by which the service limit's quota is surely replenished (docs/spec.md §2,
    "Announced quotas"), or -1 when its reset is not said.

    The announced reset plus its resolution (a server may truncate ``t`` = 2.7 s to 2), but never more than the
    policy's ``window`` (s, 0 = not known; a quota of ``q`` per ``w`` seconds is replenished within ``w``) unless
    the reset itself says more (a server may hold a client past its window)."""
    if limit.reset is None:
        return -1.0
    by = limit.reset + limit.resolution
    if window > 0:
        by = min(by, max(limit.reset, window))
    return by


@lru_cache(maxsize=16384)  # called for every booking and release: parse each address once
def ip_key(address: str) -> str:
    """The pace-table key of an address's row: ``ip:`` + the canonical address (host keys never start with
    ``ip:``). An IPv4-mapped, NAT64 or 6to4 address reaches the IPv4 address it embeds and shares its row
    (docs/spec.md §3–4).

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return f"ip:{embedded}"
    return f"ip:{ip}"

