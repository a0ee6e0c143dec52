"""The ``Retry-After`` header (RFC 9110 §10.2.3, docs/spec.md §2 "Retry-After"): :func:`parse_retry_after` reads
it into seconds, :class:`InvalidRetryAfter` is a value it refuses; :func:`longest_retry_after` reads one sent on
several field lines."""

from __future__ import annotations

import datetime
import email.utils
import math
import re
from collections.abc import Sequence

__all__ = ["parse_retry_after", "longest_retry_after", "InvalidRetryAfter"]


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
    if "," in text and all(_DECIMAL.match(part.strip()) for part in text.split(",")):
        # Field lines joined by an intermediary (``120, 120``): the longest wait asked (RFC 9110 §5.3).
        return max(float(part) for part in text.split(","))
    if text[0] in "+-" or text[0].isdigit():
        # A number that is not a non-negative decimal: negative, exponent, "1,5", "inf" spelled oddly.
        raise InvalidRetryAfter(f"Retry-After is not a non-negative number: {text!r}")
    target = parse_http_date(text)
    if target is None:
        raise InvalidRetryAfter(f"Retry-After is neither seconds nor an HTTP-date: {text!r}")
    reference = now
    if date is not None:
        if isinstance(date, bytes):
            date = date.decode("latin-1")
        parsed_date = parse_http_date(date.strip())
        if parsed_date is not None:
            reference = parsed_date
    return max(0.0, target - reference)


def longest_retry_after(lines: Sequence[str | bytes], *, now: float, date: str | bytes | None = None,
                        ) -> tuple[float | None, list[InvalidRetryAfter]]:
    """A ``Retry-After`` sent on several field lines (a gateway's and the origin's; Scrapy's ``Headers.get`` keeps
    only the last): the longest wait the valid ones ask (:func:`parse_retry_after`, RFC 9110 §5.3), and the errors of
    the invalid ones.

    Returns:
        ``(seconds, errors)``: seconds is None when no line is valid (or there is none).
    """
    waits: list[float] = []
    errors: list[InvalidRetryAfter] = []
    for line in lines:
        try:
            wait = parse_retry_after(line, now=now, date=date)
        except InvalidRetryAfter as exc:
            errors.append(exc)
        else:
            if wait is not None:
                waits.append(wait)
    return (max(waits) if waits else None), errors


def parse_http_date(text: str) -> float | None:
    """An HTTP-date (IMF-fixdate, RFC 850 or asctime form, RFC 9110 §5.6.7) as epoch seconds, or None: not a date,
    or a date no calendar has (hour 25, 32 January: ``email.utils`` would roll them over into another moment)."""
    try:
        parsed = email.utils.parsedate_tz(text)
    except (TypeError, ValueError, IndexError):  # pragma: no cover - defensive, parsedate_tz rarely raises
        return None
    if parsed is None:
        return None
    year, month, day, hour, minute, second = parsed[:6]
    try:
        datetime.datetime(year, month, day, hour, minute, min(second, 59))  # (60: a leap second)
        stamp = float(email.utils.mktime_tz(parsed))
    except (OverflowError, ValueError):
        return None
    return stamp if math.isfinite(stamp) else None
