"""The audit's report in words and as JSON (``scrapy polite audit`` and its ``--json``; docs/guides/operating.md,
"Auditing a crawl").
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..reports.events import clock_time
from ..reports.words import plural
from ..stores.base import Event
from .report import VIOLATION_KINDS, AddressSummary, AuditReport, HostSummary, Throttle, Violation, cause

__all__ = ["format_report", "report_json"]


def _s(seconds: float | None) -> str:
    """Seconds to the millisecond, the precision the audit judges gaps by (``-`` for None)."""
    return "-" if seconds is None else f"{seconds:.3f} s"


def _request_words(event: Event) -> str:
    what = "request" if event.kind == "booking" else f"{cause(event)} response"
    where = f" on {event.address}" if event.address else ""
    burst = " (burst)" if event.reason == "burst" else ""
    return f"{clock_time(event.at, date=True)}  {what}{burst} {event.url or '?'}{where} from {event.source or '?'}"


def _throttle_words(throttle: Throttle) -> str:
    asked = f", Retry-After {throttle.retry_after:g} s" if throttle.retry_after is not None else ""
    honoured = "no later request" if throttle.honoured is None else f"next request after {throttle.honoured:.3f} s"
    return f"{throttle.cause}{asked}: held {throttle.held:.3f} s, {honoured}"


def _violation_words(violation: Violation) -> list[str]:
    words = VIOLATION_KINDS[violation.kind]
    if violation.kind == "address":
        head = f"VIOLATION {violation.kind} ({words}): {violation.key} contacted, not allowed by {violation.detail}"
        return [head, f"  request: {_request_words(violation.second)}"]
    head = (f"VIOLATION {violation.kind} ({words}): {violation.key}: {_s(violation.gap)} between them, "
            f"{_s(violation.required)} required ({violation.detail})")
    assert violation.first is not None
    return [head, f"  first:  {_request_words(violation.first)}", f"  second: {_request_words(violation.second)}"]


def format_report(report: AuditReport, *, store: str, throttles_shown: int = 5) -> list[str]:
    """The audit in words, one line per host and per address, then every violation with its two requests
    (docs/guides/operating.md, "Auditing a crawl").

    Args:
        report: :func:`~scrapy_polite.audit.audit`'s result.
        store: the store's URI, for the first line.
        throttles_shown: the most throttles listed on a host's line (``--json`` lists all).
    """
    lines = [f"audit of the event log of {store}: {plural(report.events, 'event')} from {len(report.sources)} "
             f"process{'es' if len(report.sources) != 1 else ''}, {clock_time(report.first, date=True)} to "
             f"{clock_time(report.last, date=True)}"]
    lines.extend(_host_line(host, throttles_shown) for host in report.hosts)
    lines.extend(_address_line(address) for address in report.addresses)
    lines.extend(f"note: {note}" for note in report.notes)
    for loss in report.losses:
        lines.append(f"LOST: the pace table came back empty between {clock_time(loss.since, date=True)} and "
                     f"{clock_time(loss.at, date=True)} ({loss.source} restored {plural(loss.rows, 'row')} it "
                     "knew): the record before that was lost with the table, and the audit cannot vouch for it")
    for source in report.unclosed:
        lines.append(f"OPEN: {source} did not close its event log (killed, or still running): the events of its last "
                     "second, and the requests they record, may be missing, and the audit cannot vouch for them; "
                     "audit again once it has closed, or --since a moment after it stopped")
    for violation in report.violations:
        lines.extend(_violation_words(violation))
    if any(violation.kind == "address" for violation in report.violations):
        lines.append(ADDRESS_RULES_NOTE)
    lines.append(_verdict(report))
    return lines


#: After an ``address`` violation: the rules judged are this audit's settings, not the crawl's
#: (docs/guides/operating.md, "What the audit reads").
ADDRESS_RULES_NOTE = ("note: the address rules are the settings this audit runs with (its project's, and -s): audit a "
                      "crawl that ran with others (a script's, a spider's) with the same, e.g. "
                      "-s POLITE_ALLOWED_NETWORKS=127.0.0.0/8")


def _gap_words(smallest: float | None, required: float | None) -> str:
    return "smallest gap -" if smallest is None else f"smallest gap {_s(smallest)} (interval {_s(required)})"


def _host_line(host: HostSummary, throttles_shown: int) -> str:
    """A host's line: its requests, its smallest gap, its throttles (the first ``throttles_shown``), its verdict."""
    burst = f" ({host.bursts} burst)" if host.bursts else ""
    gap = _gap_words(host.smallest_gap, host.gap_required)
    shown = "; ".join(_throttle_words(t) for t in host.throttles[:throttles_shown])
    more = f"; {len(host.throttles) - throttles_shown} more (--json lists them)" \
        if len(host.throttles) > throttles_shown else ""
    throttles = f"{plural(len(host.throttles), 'throttle')} ({shown}{more})" if host.throttles else "0 throttles"
    refused = f", {host.refused} refused" if host.refused else ""
    verdict = f", {plural(host.violations, 'VIOLATION')}" if host.violations else ", ok"
    return f"host {host.host}: {plural(host.requests, 'request')}{burst}, {gap}, {throttles}{refused}{verdict}"


def _address_line(address: AddressSummary) -> str:
    """An address's line: its requests and hosts, its smallest gap, its pairs not paced by address, its verdict."""
    gap = _gap_words(address.smallest_gap, address.gap_required)
    if address.unpaced:
        gap += (f", {plural(address.unpaced, 'pair')} booked with POLITE_IP_INTERVAL 0: not judged per address "
                "(their hosts' rules judge them)")
    allowed = "allowed" if address.allowed else "NOT ALLOWED"
    verdict = f", {plural(address.violations, 'VIOLATION')}" if address.violations else ", ok"
    hosts = ", ".join(address.hosts)
    requests = plural(address.requests, "request")
    return f"address {address.address}: {requests} ({hosts}), {gap}, {allowed}{verdict}"


def _verdict(report: AuditReport) -> str:
    """The last line: ``OK``, ``NOT VOUCHED FOR`` (a table that came back empty) or ``FAILED`` with the counts."""
    requests = plural(sum(h.requests for h in report.hosts), "request")
    if (report.losses or report.unclosed) and not report.violations:
        why = [*(["the table came back empty: the record before that is lost"] if report.losses else []),
               *([("a process did not close its event log: its last events" if len(report.unclosed) == 1
                   else f"{len(report.unclosed)} processes did not close their event logs: their last events")
                  + " may be missing"] if report.unclosed else [])]
        return f"NOT VOUCHED FOR: no violation in the {requests} recorded, but " + "; and ".join(why)
    if report.ok:
        return f"OK: no violation in {requests} to {plural(sum(1 for h in report.hosts if h.requests), 'host')}"
    counts: dict[str, int] = defaultdict(int)
    for violation in report.violations:
        counts[violation.kind] += 1
    return (f"FAILED: {plural(len(report.violations), 'violation')} ("
            + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")")


def _event_json(event: Event | None) -> dict[str, Any] | None:
    if event is None:
        return None
    return {"at": event.at, "kind": event.kind, "host": event.host, "url": event.url, "status": event.status,
            "address": event.address, "source": event.source, "seq": event.seq}


def report_json(report: AuditReport, *, store: str) -> dict[str, Any]:
    """The audit as JSON data (``scrapy polite audit --json``; docs/guides/operating.md, "Auditing a crawl"): the keys
    are the words of :func:`format_report`, underscored; durations in seconds, times in epoch seconds."""
    return {
        "store": store, "ok": report.ok, "events": report.events, "sources": report.sources,
        "losses": [{"at": loss.at, "source": loss.source, "rows": loss.rows, "since": loss.since}
                   for loss in report.losses],
        "unclosed": report.unclosed,
        "first": report.first or None, "last": report.last or None, "notes": report.notes,
        "hosts": [{"host": h.host, "requests": h.requests, "bursts": h.bursts, "smallest_gap": h.smallest_gap,
                   "interval": h.gap_required, "addresses": h.addresses, "refused": h.refused,
                   "violations": h.violations,
                   "throttles": [{"at": t.event.at, "url": t.event.url, "cause": t.cause, "retry_after": t.retry_after,
                                  "held": t.held, "honoured": t.honoured} for t in h.throttles]}
                  for h in report.hosts],
        "addresses": [{"address": a.address, "requests": a.requests, "hosts": a.hosts, "smallest_gap": a.smallest_gap,
                       "interval": a.gap_required, "unpaced_pairs": a.unpaced, "allowed": a.allowed,
                       "violations": a.violations}
                      for a in report.addresses],
        "violations": [{"kind": v.kind, "words": VIOLATION_KINDS[v.kind], "key": v.key, "gap": v.gap,
                        "required": v.required, "detail": v.detail, "first": _event_json(v.first),
                        "second": _event_json(v.second)} for v in report.violations],
    }
