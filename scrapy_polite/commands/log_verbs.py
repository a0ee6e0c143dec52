"""The verbs on the event log: ``timeline`` (the picture, :mod:`scrapy_polite.reports.timeline`) and ``audit`` (the
rules, :mod:`scrapy_polite.audit`; docs/spec.md §8). Each takes the verb's run (:class:`~.context.Operator`) and returns
its exit status (:mod:`.help`); its parser names it (``set_defaults(func=...)``, :mod:`.parsing`).
"""

from __future__ import annotations

import argparse
import os

from scrapy.exceptions import UsageError

from ..audit import LogError, audit, format_report, report_json
from ..reports.events import LOG_MARKS, clock_time, crawl_events, unrepeated
from ..reports.timeline import hosts_of, timeline_format, write_timeline
from ..reports.words import format_time, plural
from ..stores import Event, StoreCorrupt
from .context import BadLog, NoSuchHost, Operator
from .help import EXIT_BAD_LOG, EXIT_OK, EXIT_OUTPUT, EXIT_VIOLATED
from .inputs import parse_since, target_key

__all__ = ["audit_log", "check_timeline", "timeline", "timeline_output"]

#: ``audit`` reads the whole log, whatever ``POLITE_EVENT_LOG_SIZE`` the crawl that wrote it had.
_EVERY_EVENT = 10**12


def _since_words(since: float | None) -> str:
    return f" since {format_time(since)}" if since else ""


# -- timeline ----------------------------------------------------------------------------------------------------

def timeline_output(opts: argparse.Namespace) -> str:
    """The file ``timeline`` writes: ``-o``, else timeline.svg for ``--format svg``, else timeline.html."""
    return str(opts.output or ("timeline.svg" if opts.format == "svg" else "timeline.html"))


def check_timeline(opts: argparse.Namespace) -> None:
    """``timeline``'s format, before any store is opened (:func:`~scrapy_polite.reports.timeline.timeline_format`).

    Raises:
        UsageError: a format it does not draw (``--format``, or ``-o`` ending in ``.png``).
    """
    try:
        timeline_format(timeline_output(opts), opts.format)
    except ValueError as exc:
        raise UsageError(str(exc), print_help=False) from None


def _timeline_events(op: Operator, since: float | None) -> list[Event]:
    """The events to draw: the log from ``since`` (epoch s; None: the whole log), or those of the ``--host`` hosts.

    Raises:
        NoSuchHost: no events (of a ``--host`` host, or at all).
    """
    wanted = [target_key(h) for h in (op.opts.host or [])]
    limit = op.config.event_log_size
    if wanted:
        events = sorted((e for key in dict.fromkeys(wanted) for e in op.store.events(since, key, limit)),
                        key=lambda e: e.at)
        missing = [k for k in wanted if not any(e.host == k for e in events)]
        if missing:
            raise NoSuchHost(f"no events of {', '.join(missing)} in {op.store.uri}{_since_words(since)}")
    else:
        events = crawl_events(op.store.events(since, None, limit))  # (not the logs' own opening and close)
    if not events:
        raise NoSuchHost(f"no events in the event log of {op.store.uri}{_since_words(since)} (POLITE_EVENT_LOG off, "
                         "or nothing crawled with this POLITE_STORE yet)")
    return events


def timeline(op: Operator) -> int:
    """``scrapy polite timeline [--since WHEN] [--host HOST]... [-o PATH] [--format svg|html] [--json]``: draw the
    event log into one file; exit 4 when it cannot be written."""
    output = timeline_output(op.opts)
    since = parse_since(op.opts.since, op.now) if op.opts.since else None
    events = _timeline_events(op, since)
    try:
        written = write_timeline(events, output, store=op.store.uri, fmt=op.opts.format)
    except OSError as exc:
        print(f"scrapy polite timeline: cannot write {output}: {exc}. Fix: choose another -o path", file=op.err)
        return EXIT_OUTPUT
    hosts = hosts_of(events)
    if op.opts.json:
        op.dump({"store": op.store.uri, "output": os.path.abspath(output), "format": written,
                 "events": len(events), "hosts": hosts})
    else:
        op.print(f"timeline of {plural(len(events), 'event')}, {plural(len(hosts), 'host')} "
                 f"({clock_time(events[0].at, date=True)} to {clock_time(events[-1].at, date=True)}): "
                 f"{os.path.abspath(output)}")
    return EXIT_OK


# -- audit -------------------------------------------------------------------------------------------------------

def _rules_words(op: Operator) -> str:
    """The address rules the crawl ran with, in words (for an ``address`` violation)."""
    rules = op.config.address_filter
    words = "the public-address rules (docs/spec.md §4)"
    if rules.allow_private:
        words += " with POLITE_ALLOW_PRIVATE"
    elif rules.allowed_networks:
        words += f" and POLITE_ALLOWED_NETWORKS {', '.join(str(n) for n in rules.allowed_networks)}"
    return words


def audit_log(op: Operator) -> int:
    """``scrapy polite audit [--since WHEN] [--json]``: check the event log against the pacing rules
    (:mod:`scrapy_polite.audit`; docs/spec.md §8); exit 0 every rule kept, 1 a rule broken, 2 the log cannot be
    audited.

    Raises:
        BadLog: the log cannot be read, is empty, truncated, incomplete or corrupt.
    """
    since = parse_since(op.opts.since, op.now) if op.opts.since else None
    uri = op.store.uri
    try:
        events = op.store.events(since, None, limit=_EVERY_EVENT)
        # From a moment on, a process that opened its log before it is still counted (docs/spec.md §8).
        marks = None if since is None else [e for e in unrepeated(op.store.events(None, "", _EVERY_EVENT))
                                            if e.kind in LOG_MARKS]
    except StoreCorrupt as exc:
        raise BadLog(f"the event log of {uri} cannot be read: {exc}") from None
    if not crawl_events(events):
        why = ("nothing crawled in that window: audit from an earlier moment" if since is not None else
               "POLITE_EVENT_LOG off, or nothing crawled with this POLITE_STORE yet")
        raise BadLog(f"no events to audit in the event log of {uri}{_since_words(since)} ({why}): a crawl without a "
                     "record cannot be vouched for")
    try:
        report = audit(events, op.config.address_filter.allows, rules=_rules_words(op), windowed=since is not None,
                       marks=marks)
    except LogError as exc:
        raise BadLog(f"the event log of {uri} cannot be audited: {exc}") from None
    if op.opts.json:
        op.dump(report_json(report, store=uri))
    else:
        for line in format_report(report, store=uri):
            op.print(line)
    if report.ok:
        return EXIT_OK
    return EXIT_VIOLATED if report.violations else EXIT_BAD_LOG  # a lost span cannot be vouched for
