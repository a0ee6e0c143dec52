"""The pacing policy of docs/spec.md §1–3: pure functions, no I/O, the clock passed in.

Everything that decides *how long* a host must be left alone lives here, one module per job:

* :mod:`.state` — :class:`HostState`, one host's row of the pace table, an immutable value (with
  :data:`NEVER_SEEN`, :func:`state_from_fields` and :func:`replace`), and what the rules decide:
  :class:`Decision`, :class:`RateLimitDecision`, :class:`Booking`, :class:`Deferral`;
* :mod:`.keys` — :func:`host_key`, the pacing key of a URL (docs/spec.md §1), :func:`ip_key`, the pace-table
  key of an address's row, :func:`origin_of`, a URL's origin (its robots.txt's), and :func:`origin_key`, the name
  a host's row keeps that origin's delay under;
* :mod:`.retry_after` — :func:`parse_retry_after`, the ``Retry-After`` header (RFC 9110 §10.2.3);
* :mod:`.pacing` — :class:`PacingPolicy`, the configuration (intervals and caps, in seconds) and the rules:
  :meth:`~PacingPolicy.effective_interval`, :meth:`~PacingPolicy.after_response`, :meth:`~PacingPolicy.wait`,
  :meth:`~PacingPolicy.defer_verdict`, :meth:`~PacingPolicy.reset`, :meth:`~PacingPolicy.robots_delay_update`,
  :meth:`~PacingPolicy.retry_throttled` (the package's own retries of throttled responses), and
  :meth:`~PacingPolicy.takes_step` / :meth:`~PacingPolicy.success_delay` (no dead steps, and Retry-After sets
  the scale);
* :mod:`.quota` — the announced quotas' rules, which :class:`PacingPolicy` inherits:
  :meth:`~PacingPolicy.after_ratelimit` (parsed by :mod:`.ratelimit`),
  :meth:`~PacingPolicy.quota_booking` and :meth:`~PacingPolicy.answered_without_quota` (the quota's count);
* :mod:`.booking` — the booking step's rules, which :class:`PacingPolicy` inherits: :meth:`~PacingPolicy.book`
  (over a host's addresses), the in-flight hold (:meth:`~PacingPolicy.held_until`,
  :meth:`~PacingPolicy.release_hold`, :meth:`~PacingPolicy.finish_address`) and :meth:`~PacingPolicy.restore`;
* the inputs of those rules, each imported from its own module: :mod:`.ratelimit` (the rate-limit fields a
  response announces), :mod:`.adaptive` (adaptive pacing's interval) and :mod:`.robots` (the robots.txt
  lifecycle of RFC 9309 per origin, and a robots.txt's delay).

Every rule takes the state and the time (Unix epoch seconds) and returns a new state; nothing here reads
a clock, a file or the network, so each rule can be tested exactly on an injected clock. Import the names of
the rules from here (``scrapy_polite.policy``): the split of those modules is not part of the API.
"""

from __future__ import annotations

from ..network.hosts import NO_NETWORK_SCHEMES
from .booking import HOLD_POLL as HOLD_POLL
from .keys import host_key, ip_key, origin_key, origin_of
from .pacing import MAX_BACKOFF_EXPONENT as MAX_BACKOFF_EXPONENT
from .pacing import PacingPolicy
from .quota import FIRST_ANSWER_POLL as FIRST_ANSWER_POLL
from .quota import FIRST_ANSWER_TIMEOUT as FIRST_ANSWER_TIMEOUT
from .retry_after import InvalidRetryAfter, parse_retry_after
from .state import NEVER_SEEN as NEVER_SEEN
from .state import Booking, Decision, Deferral, HostState, RateLimitDecision
from .state import replace as replace
from .state import state_from_fields as state_from_fields

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
    "origin_key",
    "origin_of",
]
