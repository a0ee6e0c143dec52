"""The verbs' arguments read (``scrapy polite``): a host or URL as its pace-table key, ``--since WHEN``, a number of
seconds, ``--events N``. Each raises :class:`~scrapy.exceptions.UsageError` (exit 2) or, as an argparse ``type``,
:class:`argparse.ArgumentTypeError`; the parser checks them before any store is opened (:func:`checked`).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from datetime import datetime

from scrapy.exceptions import UsageError

from ..policy import host_key, ip_key
from ..vocabulary import parse_seconds

__all__ = ["checked", "count_arg", "parse_since", "read_seconds", "since_form", "target_key"]


def target_key(text: str) -> str:
    """The pace-table key of ``HOST_OR_URL`` (a host, a URL, or an address row ``ip:ADDRESS``).

    Raises:
        UsageError: neither a host nor a URL.
    """
    if text.lower().startswith("ip:"):
        try:
            return ip_key(text[3:].strip("[]"))
        except ValueError:
            raise UsageError(f"{text!r} is not an address row (ip:ADDRESS)", print_help=False) from None
    key = host_key(text if "://" in text else f"http://{text}/")
    if key is None:
        raise UsageError(f"{text!r} is not a host name or a URL", print_help=False)
    return key


_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?)d)?(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?$")


def parse_since(text: str, now: float) -> float:
    """``--since``: epoch seconds from a duration back from ``now`` (``90``, ``90s``, ``15m``, ``2h``, ``1d``,
    ``1h30m``), ``@EPOCH`` (epoch seconds), or a local date and time in ISO 8601 (``2026-05-01T12:00``,
    ``2026-05-01 12:00:00``; a time alone, ``12:00``, is today's).

    Raises:
        UsageError: none of these forms.
    """
    value = text.strip()
    if value.startswith("@"):
        try:
            stamp = float(value[1:])
        except ValueError:
            stamp = math.nan
        if math.isfinite(stamp):
            return stamp
    else:
        match = _DURATION.match(value.lower())
        if match and value and any(match.groups()):
            d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
            return now - (((d * 24 + h) * 60 + m) * 60 + s)
        try:
            if re.match(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$", value):
                today = datetime.fromtimestamp(now).strftime("%Y-%m-%d")
                return datetime.fromisoformat(f"{today}T{value}").timestamp()
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    raise UsageError(f"--since {text!r}: expected a duration back from now (90s, 15m, 2h, 1d), @EPOCH seconds, "
                     "or a local date and time (2026-05-01T12:00, 12:00)", print_help=False)


def read_seconds(text: str) -> float:
    """``crawl-delay``'s SECONDS: a number of seconds >= 0 (:func:`~scrapy_polite.vocabulary.parse_seconds`).

    Raises:
        UsageError: anything else.
    """
    value = parse_seconds(text)
    if value is None:
        raise UsageError(f"expected a number of seconds >= 0, got {text!r} (--clear removes the delay)",
                         print_help=False)
    return value


def count_arg(text: str) -> int:
    """``--events N``: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type`` that checks a value with ``check`` before any store is opened (its
    :class:`UsageError` is the usage error) and keeps the text as given."""
    def typed(text: str) -> str:
        try:
            check(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    return typed


def since_form(text: str) -> float:
    """``--since``'s form, checked against the present (its moment is computed on the store's clock)."""
    return parse_since(text, time.time())

