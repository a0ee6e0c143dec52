"""The values the pacing rules read and return (docs/spec.md §2–3): a host's row of the pace table
(:class:`HostState`, with :data:`NEVER_SEEN`, :func:`state_from_fields` and :func:`replace`, the cheap ways to
build one), and what a rule decided (:class:`Deferral`, :class:`Booking`, :class:`RateLimitDecision`,
:class:`Decision`). Every one is immutable: a rule returns a new value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..vocabulary import DeferralReason

__all__ = [
    "HostState",
    "NEVER_SEEN",
    "state_from_fields",
    "replace",
    "Deferral",
    "Booking",
    "RateLimitDecision",
    "Decision",
]


@dataclass(frozen=True)
class HostState:
    """One host's row of the pace table (docs/spec.md §2). Immutable: every rule returns a new value.

    Attributes:
        next_allowed: Unix epoch seconds before which no request may start to the host.
        consec: consecutive throttles not yet earned back, an int ≥ 0.
        crawl_delay: seconds, the host's published Crawl-delay (robots.txt: the largest of ``origin_delays``) or an
            operator override; 0 = none.
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
        origin_delays: the delay each origin of the host (``scheme://host[:port]``) publishes in its robots.txt for
            each user agent, as recorded by any process, and an operator's: a JSON object of seconds by entry
            (:func:`~scrapy_polite.policy.robots.published_delays`), ``""`` = none; ``crawl_delay`` is the
            operator's, else the largest (docs/spec.md §2, "A host's origins").
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
    origin_delays: str = ""


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

    The one way a HostState is built without ``__init__`` (:func:`replace` builds its copy the same way, inline);
    it holds because HostState has no ``__post_init__``, no slots and no ``init=False`` field (checked when this
    module is imported). The caller gives every field (a store's whole row, or a row's ``__dict__`` and
    changes): nothing is defaulted or checked here.
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
        # state_from_fields(obj.__dict__, changes), without its call (two per page): built as it builds.
        state: HostState = object.__new__(HostState)
        attributes = state.__dict__
        attributes.update(obj.__dict__)
        attributes.update(changes)
        return state


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
    """The outcome of :meth:`PacingPolicy.book <scrapy_polite.policy.PacingPolicy.book>` (docs/spec.md §3).

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
    """What :meth:`PacingPolicy.after_ratelimit <scrapy_polite.policy.PacingPolicy.after_ratelimit>` decided
    from a response's rate-limit fields.

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
    """What :meth:`PacingPolicy.after_response <scrapy_polite.policy.PacingPolicy.after_response>` decided, for
    stats and logs.

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
