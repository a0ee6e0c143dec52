"""How the package writes numbers and times for a person (docs/getting-started.md, "The words"): one copy of each
formatter, for the closing summary, the progress and start-up lines (:mod:`scrapy_polite.reports.summary`), the
``scrapy check`` contracts, the operator command (:mod:`scrapy_polite.commands`), the audit's report and the
timeline.

Pure: numbers and epoch times in, text out. Durations are seconds (a float); times are epoch seconds (local
time when printed).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from datetime import datetime

__all__ = [
    "format_due",
    "format_duration",
    "format_relative",
    "format_table",
    "format_time",
    "iso_time",
    "plural",
]

#: Seconds within which a moment counts as "now" (:func:`format_relative`, :func:`format_due`).
NOW = 0.05

_DAY = 86400


def plural(n: int, word: str) -> str:
    """``1 request``, ``3 requests``: a count and its (regular) noun."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def format_duration(seconds: float) -> str:
    """A span of ``seconds``, rounded for reading: ``0.4 s``, ``12.0 s``, ``4 m 10 s``, ``2 h 5 m``, ``3 d 4 h``;
    a negative span reads ``0.0 s`` (the caller says which way a moment lies: :func:`format_relative`)."""
    if seconds < 60:
        return f"{max(0.0, seconds):.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60} s"
    if whole < _DAY:
        return f"{whole // 3600} h {whole % 3600 // 60} m"
    return f"{whole // _DAY} d {whole % _DAY // 3600} h"


def format_relative(t: float, now: float) -> str:
    """The epoch time ``t`` from ``now`` (epoch s): ``in 12.0 s``, ``now`` (within :data:`NOW`), ``3.0 s ago``;
    ``-`` for 0 (never)."""
    if not t:
        return "-"
    delta = t - now
    if abs(delta) < NOW:
        return "now"
    return f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"


def format_due(due: float, now: float) -> str:
    """When the epoch time ``due`` comes, from ``now`` (epoch s): ``in 4 m 10 s (at 10:15:02)`` (local time of
    day; the date too when it is a day or more away), or ``now`` once it has come (within :data:`NOW`)."""
    if due - now < NOW:
        return "now"
    at = time.strftime("%H:%M:%S" if due - now < _DAY else "%Y-%m-%d %H:%M:%S", time.localtime(due))
    return f"in {format_duration(due - now)} (at {at})"


def format_time(t: float) -> str:
    """The epoch time ``t`` as a local date and time, ``2026-05-01 12:00:00``; ``-`` for 0 (never)."""
    return "-" if not t else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def iso_time(t: float | None) -> str | None:
    """The epoch time ``t`` in ISO 8601 with the local offset, to the millisecond (the ``_at`` twin of a JSON
    time); None for 0 or None (never)."""
    return None if not t else datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def format_table(rows: Sequence[Sequence[str]], indent: str = "", *, right: Collection[int] = ()) -> str:
    """Rows of text (the first the header) as aligned columns two spaces apart, each line after ``indent``,
    trailing spaces dropped; the columns numbered in ``right`` are aligned right (counts), the others left.
    ``""`` for no rows."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                                        for i, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows)
