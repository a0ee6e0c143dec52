"""The words the package and its users share, named once: request meta keys, deferral and refusal reasons,
event kinds, close reasons, and the reading of "a number of seconds >= 0".

A leaf module (it imports nothing of the package), so every unit, the pure policy included, can use it.
README's "Request meta keys" table cites the constants; docs/spec.md §5 and §7 define what they mean.

Reasons and kinds are ``Literal`` types, so mypy checks every place that produces one; their values are plain
strings at run time (they are stored in the pace table's event log and read back by older and newer versions),
and each has a tuple of every value for the code that validates or lists them.
"""

from __future__ import annotations

import math
from typing import Final, Literal, get_args

__all__ = [
    "BURST_META",
    "CloseReason",
    "CLOSE_REASONS",
    "DEFERRAL_REASONS",
    "DELAY_META",
    "DONT_PACE_META",
    "DeferralReason",
    "EVENT_KINDS",
    "EventKind",
    "FAILED_CLOSE_REASONS",
    "HOST_META",
    "INVALID_DELAY_META",
    "IP_META",
    "LEASE_META",
    "PINNED_META",
    "PROXY_COUNTED_META",
    "QUOTA_SERIAL_META",
    "REFUSAL_REASONS",
    "RefusalReason",
    "SENT_AT_META",
    "THROTTLE_RETRIES_META",
    "TURN_REASONS",
    "parse_seconds",
]

# -- request meta keys ---------------------------------------------------------------------------------------
# Set by the user (README, "Request meta keys"; docs/spec.md §5 and §7, public surface):

#: Seconds: a larger interval after this request's response (docs/spec.md §5, "Overrides"). A value that is not
#: a number of seconds >= 0 (:func:`parse_seconds`) is ignored, logged and counted (``polite/invalid_meta``).
DELAY_META: Final = "polite_delay"
#: ``True``: one segment of a stream; skips the ordinary interval while the host has not throttled (§5).
BURST_META: Final = "polite_burst"
#: ``True``: the request is not paced (still address-checked), counted in ``polite/dont_pace``.
DONT_PACE_META: Final = "dont_pace"

# Set by the package on a request it paces (README, "Request meta keys"):

#: The request's pacing key (docs/spec.md §1), set when the middleware first sees it.
HOST_META: Final = "polite_host"
#: The IP address the request was booked on, the one it connects to (docs/spec.md §4, pinned).
IP_META: Final = "polite_ip"
#: Epoch seconds of the pace table's clock at which the request was booked (a burst: when it was decided).
SENT_AT_META: Final = "polite_sent_at"
#: The booking's serial on its host's row, which counts the host's announced quota (docs/spec.md §2).
QUOTA_SERIAL_META: Final = "polite_quota_serial"
#: How many times the package retried this page after a throttle (``POLITE_THROTTLE_RETRIES``).
THROTTLE_RETRIES_META: Final = "polite_throttle_retries"
#: The shared frontier's lease on the request (docs/spec.md §5, "The shared frontier").
LEASE_META: Final = "polite_lease"

# The package's own marks, not for users (the leading underscore):

#: The invalid ``polite_delay`` of this request was already logged and counted.
INVALID_DELAY_META: Final = "_polite_invalid_delay"
#: The resolver holds a pin of this request's booked address until its download ends.
PINNED_META: Final = "_polite_pinned"
#: This request's proxy was already counted (``polite/proxy_unpinned``).
PROXY_COUNTED_META: Final = "_polite_proxy_counted"

# -- reasons and kinds ------------------------------------------------------------------------------------

#: Why a request left the downloader (``polite/deferrals/<reason>``; docs/spec.md §2 and §5): ``throttled`` (the
#: host is backing us off), ``ratelimit`` (its announced quota is spent or too slow), ``crawl_delay`` (a published
#: delay longer than ``POLITE_MAX_WAIT``), ``line`` / ``ip_line`` (another request of the host / of its address
#: is in flight).
DeferralReason = Literal["throttled", "ratelimit", "crawl_delay", "line", "ip_line"]
DEFERRAL_REASONS: Final[tuple[DeferralReason, ...]] = get_args(DeferralReason)
#: The deferral reasons that only mean "wait for the host's turn"; the others are the host slowing us down.
TURN_REASONS: Final[frozenset[DeferralReason]] = frozenset({"line", "ip_line"})

#: Why a request was refused (``polite/refused/<reason>``, ``polite/blocked/private_address`` for ``non_public``;
#: docs/spec.md §4): ``non_public`` (only non-public addresses), ``no_host`` (a URL without a host; the closing
#: summary's), ``invalid_host`` (a host name the resolver refuses; its words only).
RefusalReason = Literal["non_public", "no_host", "invalid_host"]
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = get_args(RefusalReason)

#: The kinds of the event log's events, in the order a request meets them (README, "The event log";
#: :class:`~scrapy_polite.stores.Event` describes the fields of each).
EventKind = Literal["booking", "wait", "deferral", "response", "failure", "backoff", "robots_delay", "refusal",
                    "operator", "restored"]
EVENT_KINDS: Final[tuple[EventKind, ...]] = get_args(EventKind)

#: The reasons the add-on closes a spider with (README, "When scrapy-polite stops a crawl"): ``polite_deferred``
#: (everything left is deferred beyond ``POLITE_MAX_IDLE_WAIT``), ``polite_stranded`` (held requests nothing will
#: wake), ``polite_store_error`` (the pace table stayed unreachable), ``polite_resolver_missing`` (address
#: filtering is on but the resolver is not ours).
CloseReason = Literal["polite_deferred", "polite_stranded", "polite_store_error", "polite_resolver_missing"]
CLOSE_REASONS: Final[tuple[CloseReason, ...]] = get_args(CloseReason)
#: The close reasons of a crawl the add-on stopped as failed: ``scrapy crawl`` exits with status 1 (§7).
FAILED_CLOSE_REASONS: Final[frozenset[CloseReason]] = frozenset({"polite_store_error", "polite_resolver_missing"})


# -- durations ----------------------------------------------------------------------------------------------


def parse_seconds(value: object) -> float | None:
    """``value`` as a duration: a finite number of seconds ``>= 0``, or None when it is not one.

    The one reading of every duration a user or a server gives (settings, ``meta['polite_delay']``, a spider's
    ``crawl_delay``, the ``@polite_delay`` contract, ``scrapy polite crawl-delay``, a robots.txt delay): what
    ``float()`` reads — an int, a float, a numeric string such as ``"5"``, ``" 2.5 "`` or ``"1e3"``, and a bool
    as 0 or 1, as Scrapy's ``getfloat`` reads it — that is finite (not NaN, not infinite) and not negative.
    Every duration is in seconds (docs/spec.md §2, Scrapy's ``DOWNLOAD_DELAY`` convention). Never raises: the
    caller decides what a bad value means (a :class:`~scrapy_polite.settings.SettingsError` for a setting, a
    counted and logged fallback for a request's meta).

    Args:
        value: anything.

    Returns:
        the seconds as a float, or None.

    >>> parse_seconds("2.5"), parse_seconds(0), parse_seconds(-1), parse_seconds("nan"), parse_seconds("soon")
    (2.5, 0.0, None, None, None)
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]  # anything float() refuses is not a duration
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
