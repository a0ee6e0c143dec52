"""Reading a crawl's event log for the audit (docs/spec.md §8): every event as the crawl writes it, and none
missing. A log the audit cannot vouch for raises :class:`LogError`, never a verdict.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from ..policy import ip_key
from ..reports.events import unrepeated
from ..reports.words import plural
from ..stores.base import EVENT_KINDS, Event

__all__ = ["LogError", "read_log"]


class LogError(ValueError):
    """The event log cannot be audited: an event that cannot be read (a wrong type, a time that is not a
    number, an unknown kind) or events missing (trimmed to ``POLITE_EVENT_LOG_SIZE``, or dropped while the
    crawl ran). The message names the events and the fix."""



def read_log(events: Iterable[Event], *, windowed: bool) -> list[Event]:
    """The log's events checked (:func:`_validate`, :func:`_check_complete`), in time order (then in the order
    given); an event repeated whole (its source, number and fields) is read once.

    Args:
        events: the log's events, any order.
        windowed: the events are the log from a moment on (``--since``): a process's numbers need not start at 0.

    Raises:
        LogError: an event cannot be read, or events are missing (the log is truncated or incomplete).
    """
    given = list(events)
    for event in given:
        _validate(event)
    given = unrepeated(given)  # a batch written again where it had landed (EventLog._keep): read once
    ordered = [e for _, e in sorted(enumerate(given), key=lambda item: (item[1].at, item[0]))]
    _check_complete(ordered, windowed=windowed)
    return ordered


def _where(event: Event) -> str:
    seq = f" #{event.seq}" if event.seq is not None else ""
    return f"the {event.kind} event of {event.host or '(no host)'} from {event.source or '?'}{seq}"


def _number(event: Event, name: str, *, required: bool = False, minimum: float | None = None) -> None:
    value = getattr(event, name)
    if value is None:
        if required:
            raise LogError(f"{_where(event)} has no {name}: the log is corrupt")
        return
    kind = type(value)
    if (kind is float or kind is int) and math.isfinite(value) and (minimum is None or value >= minimum):
        return  # a bool is not a number of seconds: its type is bool, not int
    raise LogError(f"{_where(event)} has {name} = {value!r}, not a number of seconds"
                   f"{' >= 0' if minimum is not None else ''}: the log is corrupt")


def _validate(event: Event) -> None:
    """Raises :class:`LogError` when ``event`` cannot be read as the crawl writes it."""
    if not isinstance(event.kind, str) or event.kind not in EVENT_KINDS:
        raise LogError(f"an event has kind {event.kind!r}, which this scrapy-polite does not know (a log "
                       f"written by a newer version, or a corrupt log); the known kinds: {', '.join(EVENT_KINDS)}")
    if not isinstance(event.host, str):
        raise LogError(f"an event has host {event.host!r}: the log is corrupt")
    _number(event, "at", required=True)
    for name in ("due", "retry_after"):
        _number(event, name)
    for name in ("interval", "ip_interval", "hold"):
        _number(event, name, minimum=0.0)
    if event.kind in ("booking", "response", "failure", "robots_delay", "operator"):
        _number(event, "delay")
    if event.seq is not None and (isinstance(event.seq, bool) or not isinstance(event.seq, int) or event.seq < 0):
        raise LogError(f"{_where(event)} has the number {event.seq!r}: the log is corrupt")
    if event.address is not None:
        if not isinstance(event.address, str):
            raise LogError(f"{_where(event)} has address {event.address!r}: the log is corrupt")
        try:
            ip_key(event.address)
        except ValueError:
            raise LogError(f"{_where(event)} has address {event.address!r}, not an IP address: the log is "
                           "corrupt") from None


def _check_complete(events: Sequence[Event], *, windowed: bool) -> None:
    """Every source's events numbered 0, 1, 2, ... without a gap (from its first, when ``windowed``); a source
    that restored a table that came back empty (a ``restored`` event of the table) may miss the events numbered
    before that one: they were lost with the table (docs/spec.md §8).

    Raises:
        LogError: a source's numbers leave a gap, repeat, or (unless ``windowed``) do not start at 0.
    """
    numbers: dict[str, list[int]] = defaultdict(list)
    restored: dict[str, int] = {}
    times: dict[tuple[str, int], float] = {}
    for event in events:
        if event.seq is not None:
            numbers[event.source].append(event.seq)
            times[event.source, event.seq] = event.at
            if event.kind == "restored" and not event.host:
                restored[event.source] = min(event.seq, restored.get(event.source, event.seq))
    for source, seqs in sorted(numbers.items()):
        seqs.sort()
        lost_below = restored.get(source, 0)
        seqs = [seqs[0], *(n for n in seqs[1:] if n >= lost_below)] if lost_below else seqs
        if not windowed and seqs[0] > 0 and seqs[0] > lost_below:
            raise LogError(
                f"the log is truncated: the first {seqs[0]} events of {source} are missing (the oldest events are "
                "deleted once the log holds POLITE_EVENT_LOG_SIZE). Fix: audit what is left with --since WHEN, a "
                "moment after the first event kept, or raise POLITE_EVENT_LOG_SIZE for the next crawl")
        for before, after in itertools.pairwise(seqs):
            if after <= lost_below:
                continue  # events lost with the table, before its restore
            if after == before:
                raise LogError(f"event #{after} of {source} appears twice: the log is corrupt")
            if after > before + 1:
                raise LogError(
                    f"the log is incomplete: {plural(after - before - 1, 'event')} of {source} (#{before + 1} to "
                    f"#{after - 1}) missing (dropped while the crawl ran — polite/events/dropped counts them — "
                    "or deleted). The audit cannot vouch for a crawl whose record has holes. Fix: audit what was "
                    f"recorded after them with --since @{_after(times, source, before):.3f}")


def _after(times: dict[tuple[str, int], float], source: str, before: int) -> float:
    """The first millisecond after every event of ``source`` numbered up to ``before`` (an event's time need not
    follow its number: a booking's is its transaction's): a ``--since`` from it leaves the hole out (review: the
    time of the next event could let an earlier one in, and the audit gave the same hint again)."""
    latest = max(at for (name, seq), at in times.items() if name == source and seq <= before)
    return (math.floor(latest * 1000) + 1) / 1000
