"""Rate-limit header fields (docs/spec.md §2, "Announced quotas"): pure parsers, header values in, quotas out.

A server may announce its quota before it has to refuse a request. Three families of fields are read:

* the IETF httpapi fields (draft-ietf-httpapi-ratelimit-headers-08 and later), Structured Fields (RFC 9651)
  parsed with the ``http-sf`` library: ``RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400``
  (a List of quota policies: ``q`` quota units per ``w`` seconds, ``qu`` the unit, default ``"requests"``)
  and ``RateLimit: "burst";r=0;t=12`` (a List of service limits: ``r`` units remaining, ``t`` seconds until
  more are made available). The forms of drafts -04 to -07 are read too: a policy whose item is an Integer
  (``RateLimit-Policy: 100;w=60``) and the Dictionary ``RateLimit: limit=100, remaining=0, reset=12``;
* the earlier drafts' ``RateLimit-Limit`` (``100``, or ``100, 100;w=60`` with a policy), ``RateLimit-Remaining``
  and ``RateLimit-Reset`` (delta seconds), Structured Fields as well;
* the common ``X-RateLimit-Limit`` / ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` (GitHub, Twitter,
  Discord, …), plain numbers; sent twice (a gateway's quota and the origin's), each remaining count goes with the
  reset sent in the same place. Discord's ``X-RateLimit-Reset-After`` (delta seconds) wins over ``X-RateLimit-Reset``.

Every reset is **delta seconds below 10⁹ and an epoch time from 10⁹ on** (10⁹ s is 31 years: no quota resets
that far ahead, and every epoch time since 2001-09-09 is above it; GitHub's ``X-RateLimit-Reset`` and GitLab's
and Twitch's ``RateLimit-Reset`` are epoch times); from 10¹² on it is epoch *milliseconds*. An epoch time is
measured on the local clock when the response's ``Date`` agrees with it to within :data:`CLOCK_AGREEMENT`
seconds, else against ``Date`` (the server's clock).

Every reset is read with its **resolution** (:attr:`ServiceLimit.resolution`): the seconds to which the field
states it. ``t``, ``RateLimit-Reset`` and a reset without decimals are whole seconds (resolution 1 s), three
decimals are 0.001 s, epoch milliseconds 0.001 s. The drafts do not say which way a server rounds a reset to
its resolution, and many truncate (``int(reset_time)``), so the policy holds a spent quota to the end of the
announced resolution (docs/spec.md §2, "Announced quotas").

Nothing here decides a duration: :meth:`PacingPolicy.after_ratelimit
<scrapy_polite.policy.PacingPolicy.after_ratelimit>` turns the values into a hold and an interval. A field
that is present but malformed is ignored, as the drafts require, and named in :attr:`RateLimits.malformed`.

>>> limits = parse_rate_limits({"RateLimit-Policy": ['"burst";q=100;w=60'], "RateLimit": ['"burst";r=0;t=12']},
...                            now=0.0)
>>> limits.policies[0].quota, limits.policies[0].window, limits.limits[0].remaining, limits.limits[0].reset
(100, 60.0, 0, 12.0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import http_sf

from .retry_after import parse_http_date

__all__ = [
    "CLOCK_AGREEMENT",
    "EPOCH_THRESHOLD",
    "EPOCH_MS_THRESHOLD",
    "RATELIMIT_FIELDS",
    "WHOLE_SECONDS",
    "QuotaPolicy",
    "RateLimits",
    "ServiceLimit",
    "parse_rate_limits",
]

#: Every field this module reads, as servers spell them.
RATELIMIT_FIELDS: tuple[str, ...] = (
    "RateLimit-Policy", "RateLimit",
    "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
    "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After",
)

#: A reset of this many seconds or more is an epoch time, not a delay (2001-09-09T01:46:40Z).
EPOCH_THRESHOLD = 1e9
#: A reset of this value or more is an epoch time in milliseconds (10¹² ms is 2001-09-09 too).
EPOCH_MS_THRESHOLD = 1e12
#: Seconds within which the response's ``Date`` and the local clock count as the same clock (``Date`` has a
#: resolution of one second, and the response took a moment to arrive).
CLOCK_AGREEMENT = 2.0

#: The resolution (seconds) of a reset stated in whole seconds (``t``, ``RateLimit-Reset``, ``X-RateLimit-Reset: 3``).
WHOLE_SECONDS = 1.0

#: The quota unit a pace can be derived from (the other registered units: ``content-bytes``,
#: ``concurrent-requests``).
REQUESTS = "requests"

_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$", re.ASCII)
#: Between the values of an X- field's lines an intermediary joined (``0, 0``): a comma and white space (``1,000``
#: is one malformed value, not two).
_MEMBERS = re.compile(r",\s+")


@dataclass(frozen=True)
class QuotaPolicy:
    """A quota the server announces: ``quota`` units per ``window`` seconds.

    Attributes:
        quota: the units allowed per window, an int ≥ 0 (``q``, ``RateLimit-Limit``, ``X-RateLimit-Limit``).
        window: the window in seconds (``w``), or None when not announced.
        unit: the quota unit (``qu``): ``"requests"`` (the default), ``"content-bytes"``, ….
        name: the policy's name (the IETF fields' item), or None.
    """

    quota: int
    window: float | None = None
    unit: str = REQUESTS
    name: str | None = None


@dataclass(frozen=True)
class ServiceLimit:
    """What is left of a quota when the response was sent.

    Attributes:
        remaining: the units left, an int ≥ 0 (``r``, ``RateLimit-Remaining``, ``X-RateLimit-Remaining``).
        reset: seconds from the response until more units are made available (``t``, ``RateLimit-Reset``,
            ``X-RateLimit-Reset`` converted), ≥ 0, or None when not announced.
        name: the policy it belongs to, or None.
        resolution: seconds, the precision the reset was stated to (1.0: whole seconds; 0.001: three decimals
            or epoch milliseconds; 0.0: exact or not announced). The server may have truncated the reset, so more
            units may come up to ``reset + resolution`` seconds from the response (docs/spec.md §2, "Announced
            quotas"). Not part of equality (two limits announcing the same reset are the same limit).
    """

    remaining: int
    reset: float | None = None
    name: str | None = None
    resolution: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class RateLimits:
    """Everything one response announced about its quotas.

    Attributes:
        policies: the quota policies announced, in the order of the fields.
        limits: the service limits announced.
        malformed: the names of the fields that were present but malformed (ignored), lower-cased.
    """

    policies: tuple[QuotaPolicy, ...] = ()
    limits: tuple[ServiceLimit, ...] = ()
    malformed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        """True when anything usable was announced."""
        return bool(self.policies or self.limits)


class _Malformed(ValueError):
    """A field that is present but not what its definition allows."""


def parse_rate_limits(fields: Mapping[str, Sequence[str | bytes]], *, now: float,
                      date: str | bytes | None = None) -> RateLimits:
    """Read the rate-limit fields of one response.

    Args:
        fields: header name (any case) → its values, one per field line (a field split over several lines
            is one list, RFC 9651 §3.1); names that are not rate-limit fields are ignored.
        now: the local clock when the response was received, Unix epoch seconds (only for an epoch-time
            ``X-RateLimit-Reset``).
        date: the response's ``Date`` header, if any (only for an epoch-time ``X-RateLimit-Reset``).

    Returns:
        :class:`RateLimits`; empty (false) when no field is present or every present field is malformed.
        Never raises for any header value.
    """
    values = {name.lower(): [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in raw]
              for name, raw in fields.items() if raw}
    policies: list[QuotaPolicy] = []
    limits: list[ServiceLimit] = []
    malformed: list[str] = []

    def read(name: str, parse: Any, *args: Any) -> Any:
        if name not in values:
            return None
        try:
            return parse(", ".join(values[name]), *args)
        except (ValueError, TypeError, OverflowError):  # http_sf raises ValueError subclasses
            malformed.append(name)
            return None

    def members(name: str, parse: Any, *args: Any) -> list[Any] | None:
        """An X- field's values, one per field line (or per member of lines an intermediary joined: ``0, 0``)."""
        found: list[Any] | None = read(name, lambda text, *a: [parse(part, *a) for part in _MEMBERS.split(text)],
                                       *args)
        return found

    # The IETF fields (draft -08 on, and the forms of drafts -04 to -07).
    policies.extend(read("ratelimit-policy", _ietf_policies) or ())
    found = read("ratelimit", _ietf_limits, now, date)
    if found is not None:
        policies.extend(found[0])
        limits.extend(found[1])
    # The earlier drafts' three fields, and the X- fields, each a policy (limit) and a service limit.
    for prefix in ("ratelimit-", "x-ratelimit-"):
        policies.extend(read(prefix + "limit", _limit_field) or ())
        if prefix == "ratelimit-":
            remaining = read(prefix + "remaining", _sf_count)
            reset = read(prefix + "reset", _sf_delay, now, date)
            if remaining is not None:
                seconds, resolution = reset if reset is not None else (None, 0.0)
                limits.append(ServiceLimit(remaining=remaining, reset=seconds, resolution=resolution))
        else:
            after = members("x-ratelimit-reset-after", _delay)
            resets = after if after is not None else members("x-ratelimit-reset", _x_reset, now, date)
            limits.extend(_x_limits(members(prefix + "remaining", _count), resets))
    return RateLimits(policies=tuple(policies), limits=tuple(limits), malformed=tuple(malformed))


def _x_limits(remaining: list[int] | None, resets: list[tuple[float, float]] | None) -> list[ServiceLimit]:
    """The X- fields' service limits: each ``X-RateLimit-Remaining`` value with the reset sent in the same place
    (a gateway's quota and the origin's, two lines of each field: each spent one holds the host until its own
    reset); values that do not pair up make one limit of the fewest remaining and the latest reset."""
    if remaining is None:
        return []
    if resets is None:
        return [ServiceLimit(remaining=min(remaining), reset=None)]
    if len(resets) == len(remaining):
        return [ServiceLimit(remaining=left, reset=seconds, resolution=resolution)
                for left, (seconds, resolution) in zip(remaining, resets)]
    seconds, resolution = max(resets)
    return [ServiceLimit(remaining=min(remaining), reset=seconds, resolution=resolution)]


# -- the IETF fields ----------------------------------------------------------------------------------------


def _sf_list(text: str) -> list[Any]:
    parsed = http_sf.parse(text.encode("latin-1"), tltype="list")
    if not isinstance(parsed, list) or not parsed:
        raise _Malformed("not a non-empty List")
    return parsed


def _member(member: Any) -> tuple[Any, dict[str, Any]]:
    """A List member as ``(bare item, parameters)``; an Inner List is malformed here."""
    if not (isinstance(member, tuple) and len(member) == 2 and isinstance(member[1], dict)):
        raise _Malformed("not an Item with parameters")
    value, params = member
    if isinstance(value, (list, tuple)):
        raise _Malformed("an Inner List where an Item is required")
    return value, params


def _integer(value: Any, what: str, *, positive: bool = False) -> int:
    """``value`` as a non-negative (or positive) Integer of Structured Fields, else :class:`_Malformed`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if positive else 0):
        raise _Malformed(f"{what} is not a {'positive' if positive else 'non-negative'} Integer: {value!r}")
    return value


def _int_param(params: Mapping[str, Any], key: str, *, positive: bool = False) -> int | None:
    """An optional Integer parameter (None when absent)."""
    value = params.get(key)
    return None if value is None else _integer(value, repr(key), positive=positive)


def _required(params: Mapping[str, Any], key: str) -> int:
    """A required non-negative Integer parameter."""
    if key not in params:
        raise _Malformed(f"no {key!r} parameter")
    return _integer(params[key], repr(key))


def _name(value: Any) -> str | None:
    """A policy's name: a String or Token item (draft -08 on); None for the older Integer form."""
    if isinstance(value, (str, http_sf.Token)):
        return str(value)
    return None


def _ietf_policies(text: str) -> list[QuotaPolicy]:
    """``RateLimit-Policy``: ``"name";q=100;w=60;qu="requests"`` (draft -08 on) or ``100;w=60`` (-04 to -07)."""
    policies = []
    for member in _sf_list(text):
        value, params = _member(member)
        if _name(value) is not None:
            quota = _required(params, "q")
        elif isinstance(value, int):
            quota = _integer(value, "a quota")
        else:
            raise _Malformed(f"a policy must be a String, Token or Integer, got {value!r}")
        window = _int_param(params, "w", positive=True)
        unit = params.get("qu", REQUESTS)
        if not isinstance(unit, (str, http_sf.Token)):
            raise _Malformed(f"'qu' is not a String: {unit!r}")
        policies.append(QuotaPolicy(quota=quota, window=float(window) if window is not None else None,
                                    unit=str(unit), name=_name(value)))
    return policies


def _ietf_limits(text: str, now: float, date: str | bytes | None) -> tuple[list[QuotaPolicy], list[ServiceLimit]]:
    """``RateLimit``: a List ``"name";r=0;t=12`` (draft -08 on), or the Dictionary
    ``limit=100, remaining=0, reset=12`` of draft -07 (its ``limit`` is a policy without a window)."""
    try:
        members = _sf_list(text)
    except ValueError:
        return _draft7_limits(text, now, date)
    limits = []
    for member in members:
        value, params = _member(member)
        if _name(value) is None:
            raise _Malformed(f"a service limit must name its policy (a String or Token), got {value!r}")
        remaining = _required(params, "r")
        reset = _int_param(params, "t")
        seconds, resolution = _from_now(reset, WHOLE_SECONDS, now, date) if reset is not None else (None, 0.0)
        limits.append(ServiceLimit(remaining=remaining, reset=seconds, name=_name(value), resolution=resolution))
    return [], limits


def _draft7_limits(text: str, now: float, date: str | bytes | None) -> tuple[list[QuotaPolicy], list[ServiceLimit]]:
    parsed = http_sf.parse(text.encode("latin-1"), tltype="dictionary")
    if not isinstance(parsed, dict) or not parsed:
        raise _Malformed("neither a List nor a Dictionary")
    params: dict[str, Any] = {}
    for key in ("limit", "remaining", "reset"):
        if key in parsed:
            value, _ = _member(parsed[key])
            params[key] = value
    limit = _required(params, "limit")  # draft -07 §3.1: "limit" and "reset" are required, "remaining" optional
    reset = _required(params, "reset")
    remaining = _int_param(params, "remaining")
    seconds, resolution = _from_now(reset, WHOLE_SECONDS, now, date)
    limits = [ServiceLimit(remaining=remaining, reset=seconds, resolution=resolution)] if remaining is not None else []
    return [QuotaPolicy(quota=limit)], limits


def _limit_field(text: str) -> list[QuotaPolicy]:
    """``RateLimit-Limit`` / ``X-RateLimit-Limit``: an Integer, optionally followed by quota policies with a
    window (``100, 100;w=60``, drafts -00 to -03)."""
    policies = []
    for member in _sf_list(text):
        value, params = _member(member)
        quota = _integer(value, "a limit")
        window = _int_param(params, "w", positive=True)
        policies.append(QuotaPolicy(quota=quota, window=float(window) if window is not None else None))
    return policies


def _sf_count(text: str) -> int:
    value, _ = _member(http_sf.parse(text.encode("latin-1"), tltype="item"))
    return _integer(value, "the value")


def _sf_delay(text: str, now: float, date: str | bytes | None) -> tuple[float, float]:
    """``RateLimit-Reset``: an Integer of seconds (or, from 10⁹ on, an epoch time: :func:`_from_now`), as
    ``(seconds from now, resolution)``."""
    return _from_now(_sf_count(text), WHOLE_SECONDS, now, date)


# -- the X- fields: plain numbers -------------------------------------------------------------------------


def _number(text: str) -> float:
    text = text.strip()
    if not _NUMBER.match(text):
        raise _Malformed(f"not a non-negative number: {text!r}")
    value = float(text)
    if not math.isfinite(value):
        raise _Malformed(f"too large: {text!r}")
    return value


def _count(text: str) -> int:
    return int(_number(text))


def _resolution(text: str) -> float:
    """The precision (seconds) of a plain number as written: 1.0 for ``"3"``, 0.001 for ``"3.000"``."""
    _, dot, decimals = text.strip().partition(".")
    return 10.0 ** -len(decimals) if dot else WHOLE_SECONDS


def _delay(text: str) -> tuple[float, float]:
    """Delta seconds (``X-RateLimit-Reset-After``), as ``(seconds, resolution)``."""
    return _number(text), _resolution(text)


def _x_reset(text: str, now: float, date: str | bytes | None) -> tuple[float, float]:
    """``X-RateLimit-Reset`` as ``(seconds from now, resolution in seconds)``: delta seconds, an epoch time or
    epoch milliseconds (:func:`_from_now`)."""
    return _from_now(_number(text), _resolution(text), now, date)


def _from_now(value: float, resolution: float, now: float, date: str | bytes | None) -> tuple[float, float]:
    """A reset as ``(seconds from now, resolution in seconds)``: delta seconds below :data:`EPOCH_THRESHOLD`, an
    epoch time from it on (GitHub's ``X-RateLimit-Reset``; GitLab and Twitch send their ``RateLimit-Reset`` so
    too), epoch milliseconds from :data:`EPOCH_MS_THRESHOLD`. An epoch time is a moment of the local clock, or
    of the response's ``Date`` when the two disagree; a reset in the past is 0 seconds away."""
    if value < EPOCH_THRESHOLD:
        return float(value), resolution
    epoch = value
    if value >= EPOCH_MS_THRESHOLD:
        epoch, resolution = value / 1000.0, resolution / 1000.0
    reference = now
    server = _http_date(date)
    if server is not None and abs(server - now) > CLOCK_AGREEMENT:
        reference = server  # the clocks disagree: the reset is a moment of the server's clock
    return max(0.0, epoch - reference), resolution


def _http_date(value: str | bytes | None) -> float | None:
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return parse_http_date(text.strip())
