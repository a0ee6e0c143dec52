"""The rules of the hosts' announced quotas (docs/spec.md §2, "Announced quotas" and "Quota booking"), which
:class:`~scrapy_polite.policy.PacingPolicy` inherits from :class:`QuotaRules`: what a response's rate-limit
fields leave in the host's row (:meth:`~QuotaRules.after_ratelimit`, the fields parsed by
:mod:`scrapy_polite.policy.ratelimit`), what an answer without them leaves (:meth:`~QuotaRules.answered_without_quota`),
and the request each booking takes from the quota (:meth:`~QuotaRules.quota_booking`, refilled at its reset).
"""

from __future__ import annotations

import math

from .ratelimit import REQUESTS, RateLimits, ServiceLimit
from .state import NEVER_SEEN, HostState, RateLimitDecision, replace

__all__ = ["QuotaRules", "FIRST_ANSWER_POLL", "FIRST_ANSWER_TIMEOUT"]

#: Seconds between two tries of a booking that waits for a host's first answer (docs/spec.md §2, "Quota
#: booking"): one round trip to the server is the usual wait.
FIRST_ANSWER_POLL = 0.05
#: The longest (s) a host's second booking waits for its first answer (at most ``max_wait``): a first request
#: that ends without an answer the table hears of (refused by a later middleware, a crawl stopped while it was
#: in flight) delays the host's next request this long at most.
FIRST_ANSWER_TIMEOUT = 10.0

#: The binding service limit of a response, as counted: ``(left, seconds from the response until it is
#: replenished (-1: not said), quota, window (s), the reset's resolution (s))``.
_Binding = tuple[int, float, int, float, float]


class QuotaRules:
    """The announced quotas' rules, a part of :class:`~scrapy_polite.policy.PacingPolicy` (it inherits them):
    methods only, reading the policy's settings."""

    max_wait: float
    max_retry_after: float
    ratelimit_headers: bool

    def after_ratelimit(self, state: HostState | None, limits: RateLimits, *, end: float,
                        serial: int | None = None) -> RateLimitDecision:
        """The host's state after a response announced its quotas (docs/spec.md §2, "Announced quotas"): the
        largest ``w / q`` of its policies becomes the host's ``ratelimit_interval``; the limit with the least left
        binds (:meth:`_count_binding`); a limit with nothing left holds the host until its reset
        (:func:`_replenished_by`; not said: one window, else ``max_wait``). Both capped at ``max_retry_after``.

        Args:
            state: the host's state (None: never seen).
            limits: the response's rate-limit fields.
            end: epoch seconds at which the response ended (the store's clock).
            serial: the booking serial of the request answered (``HostState.booked`` after its booking);
                None when unknown (the response then counts as the latest, with nothing booked after it).

        Returns:
            A :class:`~scrapy_polite.policy.RateLimitDecision`.
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
        binding: _Binding | None = None
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
            new, spent[binding_at], reset_clamped = self._count_binding(old, new, binding, end=end, serial=serial)
            clamped = clamped or reset_clamped
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

    def _count_binding(self, old: HostState, new: HostState, binding: _Binding, *, end: float,
                       serial: int | None) -> tuple[HostState, tuple[int, float], bool]:
        """The binding limit of a response ending at ``end`` (epoch s) recorded in ``new``, the row ``old`` being
        as it was before the response (docs/spec.md §2, "Quota booking"): what is left, with the reset (capped at
        ``max_retry_after``, not refilled then), the quota and the window.

        Returns:
            ``(row, (left, seconds until the reset: -1 not known), clamped)``: the row, the limit as recorded
            (its hold is decided from it), and whether its reset was clamped.
        """
        left, reset, quota, window, resolution = binding
        clamped = False
        if reset > self.max_retry_after:
            reset, quota, clamped = self.max_retry_after, 0, True  # not the real reset: no refill there
        if serial is None and old.quota_left >= 0 and old.quota_reset > end:
            left = min(left, old.quota_left)  # unknown order: never more than already counted
        reset_at = end + reset if reset >= 0 else 0.0
        # The same reset said again (docs/spec.md §2, "The same reset said again"): the recorded one has not
        # passed, the quota did not go up (a new window would have), and both bounds lie within two resolutions
        # (a reset R stated to the second is bounded in [R, R + 2 s); the next window's lies a window later).
        # The earliest bound then holds.
        if (resolution > 0 and reset_at > 0 and old.quota_reset > end and 0 <= left <= old.quota_left
                and abs(reset_at - old.quota_reset) < 2 * resolution):
            reset_at = min(reset_at, old.quota_reset)
        new = replace(new, quota_left=left, quota_reset=reset_at, quota_limit=quota, quota_window=window,
                      quota_serial=serial if serial is not None else old.quota_serial, updated=end)
        # The recorded quota decides the binding limit's hold: spent (in-flight requests counted) until its reset.
        return new, (left, reset_at - end if reset_at > 0 else -1.0), clamped

    def quota_booking(self, state: HostState, *, now: float) -> tuple[HostState, float | None]:
        """Take one request from the host's announced quota at ``now`` (epoch s), part of :meth:`book`, by the
        rules of docs/spec.md §2, "Quota booking". A reset that has passed refills the quota first
        (:meth:`_refill`). With nothing left no booking goes before the reset, or, the reset not known, before an
        answer to a request booked since the last counted one (tried every :data:`FIRST_ANSWER_POLL` s, for
        :data:`FIRST_ANSWER_TIMEOUT` s at most, at most ``max_wait``; the quota is unknown after). A host booked
        once waits for its first answer the same way (docs/spec.md §2, "The first answer"). Taking the last holds
        the host until the reset. Every moment returned is after ``now``. ``booked`` (the serial) grows by one
        with every booking, quota or not (while ``ratelimit_headers`` is on).

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
        (docs/spec.md §2, "Quota booking"): its ``quota_limit`` less the requests booked since the last counted
        answer, those only within one window of the recorded reset; unknown without a known limit."""
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
        the request of booking serial ``serial``, ending at ``end`` (epoch s), by the rules of docs/spec.md §2,
        "An answer without a quota" and "Spent with its reset not known": answered before the recorded reset (or
        none recorded), the request is no longer subtracted at the refill (``quota_serial`` becomes ``serial``);
        a spent quota whose reset is not known becomes unknown (``quota_left = -1``). Only an answer to a request
        booked after the one last counted (``serial > quota_serial``) changes the row.
        """
        if not self.ratelimit_headers or serial is None or serial <= state.quota_serial \
                or (state.quota_left < 0 and state.quota_limit <= 0):  # no quota counted: nothing to tell
            return state
        if state.quota_left == 0 and state.quota_reset == 0:
            return replace(state, quota_left=-1)
        if state.quota_reset == 0 or end < state.quota_reset:
            return replace(state, quota_serial=serial)
        return state


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
