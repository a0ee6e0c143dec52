"""The rules of the audit of a crawl's event log (docs/spec.md §8, docs/guides/operating.md, "Auditing a crawl"):
pure functions, no I/O.

:func:`audit` takes the events of a store's log (:class:`~scrapy_polite.stores.Event`, oldest first) and the
address rules the crawl ran with, and checks, per host and per address, the rules the crawl promised to keep:

* ``interval``: two requests to one host no closer than the interval the first was booked with (the
  effective interval of docs/spec.md §2, adaptive and overrides included, as the booking recorded it), and
  no request before the interval chosen after a response to the host had passed (``start₂ ≥ end₁ + delay``,
  §3);
* ``retry_after``: no request to a host inside the hold a ``Retry-After`` set (RFC 9110 §10.2.3, §2);
* ``quota``: no request inside the hold of a spent announced quota (§2, "Announced quotas");
* ``backoff``: no request inside the backoff a throttle without Retry-After set (§2);
* ``crawl_delay``: two requests to one host no closer than its Crawl-delay in force (robots.txt, or
  ``scrapy polite crawl-delay``);
* ``ip_interval``: two requests to one address, through any hosts, no closer than the address's interval,
  and none before ``end₁ + POLITE_IP_INTERVAL`` (§3); a pair whose first request was booked with
  ``POLITE_IP_INTERVAL = 0`` is not paced by address, so it is not judged per address: it is counted
  (:attr:`AddressSummary.unpaced <scrapy_polite.audit.report.AddressSummary.unpaced>`) and the report says so;
* ``in_flight``, ``ip_in_flight``: no request to a host, or to an address, booked while another paced request to
  it was in flight — booked, its answer not yet recorded — in any process (§3, "In flight");
* ``address``: every address contacted allowed by the address rules (§4).

A burst request (``polite_burst``, §5) is not booked: it is exempt from the intervals and the Crawl-delay, not
from a throttle's or a quota's hold. ``scrapy polite reset`` forgets a host's holds, so an operator's reset
ends them. A process whose log was opened and not closed (killed, or still running: its last second of events may
not be written) leaves the audit unable to vouch for the crawl (:attr:`AuditReport.unclosed
<scrapy_polite.audit.report.AuditReport.unclosed>`). A log the audit cannot vouch for — an event that cannot be
read, or events missing (their numbers, :attr:`Event.seq <scrapy_polite.stores.Event.seq>`, leave a gap or do not
start at 0) — raises :class:`~scrapy_polite.audit.log.LogError` (:mod:`.log`), never a verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..policy import ip_key
from ..reports.events import LOG_MARKS, clock_time
from ..stores.base import Event
from .log import read_log
from .report import VIOLATION_KINDS, AddressSummary, AuditReport, HostSummary, Loss, Throttle, Violation, cause

__all__ = ["TOLERANCE", "audit"]

#: Seconds two times may differ by and still count as equal: a booking at ``next_allowed`` exactly is
#: ``start + interval`` computed in floating point (a requests exactly at the interval passes).
TOLERANCE = 1e-6


@dataclass
class _Hold:
    """What a response (or failure) holds its host to: no request before ``until``."""

    event: Event
    until: float


def _is_throttle(event: Event) -> bool:
    return event.kind == "failure" or (event.reason or "").startswith("throttle")


def _hold_kind(hold: Event, at: float) -> tuple[str, float, str]:
    """Which rule a request at ``at`` broke inside ``hold``'s hold: ``(kind, required seconds, detail)``."""
    held = (hold.due if hold.due is not None else hold.at) - hold.at
    if hold.kind == "restored":  # what a process knew of the host when the table came back empty
        return ("backoff" if hold.steps else "interval"), held, \
            "its next allowed, restored after the table came back empty"
    retry_after = hold.retry_after
    if retry_after is not None and retry_after > 0:
        window = min(retry_after, held)
        if at < hold.at + window - TOLERANCE:
            clamped = " (clamped to POLITE_MAX_RETRY_AFTER)" if retry_after > held + TOLERANCE else ""
            return "retry_after", window, f"{cause(hold)}, Retry-After {retry_after:g} s{clamped}"
    if hold.hold is not None and hold.hold > 0 and at < hold.at + hold.hold - TOLERANCE:
        return "quota", hold.hold, f"{cause(hold)}, its quota spent for {hold.hold:g} s"
    if _is_throttle(hold):
        return "backoff", held, f"{cause(hold)}, backoff {held:.3f} s"
    return "interval", held, f"the delay chosen after the response ({cause(hold)}) to {hold.url or '?'}"


class _HostAudit:
    """The checks of one host, fed its events in time order."""

    def __init__(self, host: str, report: Callable[[Violation], None]) -> None:
        self.summary = HostSummary(host)
        self.report = report
        self.previous: Event | None = None  # the last paced request
        self.holds: list[_Hold] = []
        self.crawl_delay = 0.0
        self.crawl_delay_since = -math.inf
        self.waiting: list[Throttle] = []  # throttles whose next request has not come yet
        self.flying = _InFlight(host, report)

    def feed(self, event: Event, answer: Event | None = None) -> None:
        kind = event.kind
        if kind == "booking":
            self.request(event)
            if event.reason != "burst":
                self.flying.booked(event, answer)
        elif kind in ("response", "failure"):
            self.response(event)
        elif kind == "robots_delay":
            self.crawl_delay, self.crawl_delay_since = event.delay or 0.0, event.at
        elif kind == "operator":
            reason = event.reason or ""
            if reason == "reset":  # the row's holds are forgotten (docs/spec.md §2, reset)
                self.holds.clear()
                self.previous = None
            elif reason.startswith("crawl-delay"):
                self.crawl_delay, self.crawl_delay_since = event.delay or 0.0, event.at
        elif kind == "refusal":
            self.summary.refused += 1
        elif kind == "restored":  # written back after the table came back empty (docs/spec.md §6)
            if event.delay:
                self.crawl_delay, self.crawl_delay_since = event.delay, event.at
            if event.due is not None and event.due > event.at:
                self.holds.append(_Hold(event, event.due))

    def request(self, event: Event) -> None:
        summary = self.summary
        summary.requests += 1
        if event.address is not None and event.address not in summary.addresses:
            summary.addresses.append(event.address)
        at = event.at
        for throttle in self.waiting:
            throttle.honoured = at - throttle.event.at
        self.waiting.clear()
        burst = event.reason == "burst"
        if burst:
            summary.bursts += 1
        self.holds = [h for h in self.holds if h.until > at - TOLERANCE]
        for hold in self.holds:
            if at >= hold.until - TOLERANCE:
                continue
            kind, required, detail = _hold_kind(hold.event, at)
            if burst and kind == "interval":
                continue  # a burst skips the interval (docs/spec.md §5), not a throttle's or a quota's hold
            self.report(Violation(kind, summary.host, hold.event, event, at - hold.event.at, required, detail))
            break  # one violation per request and rule group: the first hold it broke
        if burst:
            return
        previous = self.previous
        if previous is not None:
            gap = at - previous.at
            interval = _interval(previous)
            delay = self.crawl_delay if at > self.crawl_delay_since else 0.0
            required = max(interval, delay)
            if summary.smallest_gap is None or gap < summary.smallest_gap:
                summary.smallest_gap, summary.gap_required = gap, required
            if gap < delay - TOLERANCE:
                self.report(Violation("crawl_delay", summary.host, previous, event, gap, delay,
                                      f"Crawl-delay {delay:g} s"))
            elif gap < interval - TOLERANCE:
                self.report(Violation("interval", summary.host, previous, event, gap, interval,
                                      f"interval {interval:g} s"))
        self.previous = event

    def response(self, event: Event) -> None:
        if event.due is not None and event.due > event.at:
            self.holds.append(_Hold(event, event.due))
        if _is_throttle(event):
            held = max(0.0, (event.due if event.due is not None else event.at) - event.at)
            throttle = Throttle(event, cause(event), event.retry_after, held, None)
            self.summary.throttles.append(throttle)
            self.waiting.append(throttle)


class _InFlight:
    """The ``in_flight`` check of one host or address (docs/spec.md §3, "In flight"): the paced requests booked
    on it whose answer was recorded later, each in flight from its booking to its answer."""

    def __init__(self, key: str, report: Callable[[Violation], None], kind: str = "in_flight") -> None:
        self.key = key
        self.kind = kind
        self.report = report
        self.flying: list[tuple[Event, Event]] = []  # (booking, its answer), answered after the last booking

    def booked(self, event: Event, answer: Event | None) -> None:
        at = event.at
        self.flying = [(b, r) for b, r in self.flying if r.at > at + TOLERANCE]
        for booking, response in self.flying[:1]:  # one violation per request: the earliest still in flight
            self.report(Violation(self.kind, self.key, booking, event, at - booking.at, response.at - booking.at,
                                  f"{booking.url or '?'} was in flight until its answer at {clock_time(response.at)}"
                                  f" ({booking.source or '?'})"))
        if answer is not None:
            self.flying.append((event, answer))


def _answers(ordered: Sequence[Event]) -> dict[int, Event]:
    """``id(booking)`` → the response or failure that answered it: the same process, host and URL, ``started`` at
    the booking's moment. A booking without one (its process died, or it ended without an answer) is not held
    to the ``in_flight`` rule: the log does not say how long it was in flight."""
    bookings = {(e.source, e.host, e.url, e.at): e for e in ordered if e.kind == "booking" and e.reason != "burst"}
    answers: dict[int, Event] = {}
    for event in ordered:
        if event.kind in ("response", "failure") and event.started is not None:
            booking = bookings.get((event.source, event.host, event.url, event.started))
            if booking is not None and event.at >= booking.at:
                answers.setdefault(id(booking), event)
    return answers


def _interval(booking: Event) -> float:
    """The host interval a booking applied: recorded (``interval``), or in an older log its ``delay`` (the
    host's next allowed after it, less its time)."""
    if booking.interval is not None:
        return booking.interval
    return max(0.0, booking.delay or 0.0)


class _AddressAudit:
    """The checks of one address, fed the requests and responses on it in time order."""

    def __init__(self, address: str, allowed: bool, report: Callable[[Violation], None]) -> None:
        self.summary = AddressSummary(address, allowed=allowed)
        self.report = report
        self.previous: Event | None = None
        self.free_at: tuple[float, Event] | None = None  # (end + ip interval, the response) of the last finish
        self.flying = _InFlight(address, report, "ip_in_flight")

    def request(self, event: Event, rules: str, answer: Event | None = None) -> None:
        summary = self.summary
        summary.requests += 1
        if event.host not in summary.hosts:
            summary.hosts.append(event.host)
        if not summary.allowed:
            self.report(Violation("address", summary.address, None, event, None, None, rules))
        if event.reason == "burst":
            return
        at = event.at
        if event.ip_interval:
            self.flying.booked(event, answer)
        if self.free_at is not None and event.ip_interval and at < self.free_at[0] - TOLERANCE:
            finish = self.free_at[1]
            required = finish.ip_interval or 0.0
            self.report(Violation("ip_interval", summary.address, finish, event, at - finish.at, required,
                                  f"POLITE_IP_INTERVAL {required:g} s after the response from {finish.host} ended"))
        previous = self.previous
        if previous is not None and previous.ip_interval == 0:
            summary.unpaced += 1  # booked with POLITE_IP_INTERVAL = 0: no address interval to judge the pair by
        if previous is not None and previous.ip_interval:
            gap = at - previous.at
            required = previous.ip_interval
            if summary.smallest_gap is None or gap < summary.smallest_gap:
                summary.smallest_gap, summary.gap_required = gap, required
            if gap < required - TOLERANCE:
                self.report(Violation("ip_interval", summary.address, previous, event, gap, required,
                                      f"POLITE_IP_INTERVAL {required:g} s"))
        self.previous = event

    def response(self, event: Event) -> None:
        if event.ip_interval:
            until = event.at + event.ip_interval
            if self.free_at is None or until > self.free_at[0]:
                self.free_at = (until, event)


def audit(events: Iterable[Event], allows: Callable[[str], bool], *, rules: str = "the address rules",
          windowed: bool = False, marks: Iterable[Event] | None = None) -> AuditReport:
    """Check the event log of a crawl (see the module for the rules; docs/spec.md §8).

    Args:
        events: the log's events (any order; they are checked in time order, then in the order given).
        allows: ``allows(address) -> bool``, the address rules the crawl ran with
            (:meth:`AddressFilter.allows <scrapy_polite.network.addresses.AddressFilter.allows>`).
        rules: the rules in words, for an ``address`` violation (e.g. ``POLITE_ALLOWED_NETWORKS 127.0.0.0/8``).
        windowed: the events are the log from a moment on (``--since``): a process's numbers need not start
            at 0, and holds set before that moment are not known.
        marks: the ``opened`` and ``closed`` events of the whole log (with ``windowed``: a process that opened its
            log before the window and did not close it is named); None: those among ``events``.

    Returns:
        An :class:`AuditReport`.

    Raises:
        LogError: an event cannot be read, or events are missing (the log is truncated or incomplete).
    """
    ordered = read_log(events, windowed=windowed)
    auditors = _Auditors(allows, rules)
    answers = _answers(ordered)
    for event in ordered:
        auditors.feed(event, answers.get(id(event)) if event.kind == "booking" else None)
    if marks is not None:
        auditors.open_logs = Counter()
        for mark in marks:
            auditors.mark(mark)
    return auditors.report(ordered, windowed=windowed)


class _Auditors:
    """One audit's checks: a :class:`_HostAudit` per host and an :class:`_AddressAudit` per address, each made
    when the log first names it, and what the audit could not check (:meth:`notes`).

    Args:
        allows: the address rules (see :func:`audit`); asked once per address.
        rules: the rules in words, for an ``address`` violation.
    """

    def __init__(self, allows: Callable[[str], bool], rules: str) -> None:
        self.allows = allows
        self.rules = rules
        self.violations: list[Violation] = []
        self.hosts: dict[str, _HostAudit] = {}
        self.addresses: dict[str, _AddressAudit] = {}
        self.verdicts: dict[str, bool] = {}
        self.losses: list[Loss] = []
        #: Per process, its logs opened less those closed (``opened`` / ``closed`` events).
        self.open_logs: Counter[str] = Counter()
        #: Requests logged before their interval (``old_intervals``) or address interval was recorded.
        self.old_intervals = self.old_addresses = 0

    def host(self, host: str) -> _HostAudit:
        found = self.hosts.get(host)
        if found is None:
            found = self.hosts[host] = _HostAudit(host, self.violations.append)
        return found

    def address(self, address: str) -> _AddressAudit:
        key = ip_key(address)[3:]
        found = self.addresses.get(key)
        if found is None:
            if address not in self.verdicts:
                self.verdicts[address] = bool(self.allows(address))
            found = self.addresses[key] = _AddressAudit(key, self.verdicts[address], self.violations.append)
        return found

    def mark(self, event: Event) -> None:
        """Count a log's ``opened`` or ``closed`` event (:data:`~scrapy_polite.reports.events.LOG_MARKS`) for its
        source; any other kind is ignored."""
        if event.kind in LOG_MARKS:
            self.open_logs[event.source] += 1 if event.kind == "opened" else -1

    def feed(self, event: Event, answer: Event | None) -> None:
        """The next event of the log, in time order; ``answer``: a booking's response or failure (:func:`_answers`)."""
        kind = event.kind
        if kind in ("wait", "deferral", "backoff"):
            return  # a wait or a deferral contacts nobody; a backoff repeats its response
        if kind == "refusal" and not event.host:
            return
        if kind in LOG_MARKS:
            self.mark(event)
            return
        if kind == "restored" and not event.host:
            self.losses.append(Loss(event.at, event.source, event.steps or 0, event.started or 0.0))
            return
        if kind in ("booking", "response", "failure", "robots_delay", "operator", "refusal", "restored"):
            self.host(event.host).feed(event, answer)
        if event.address is None:
            return
        if kind == "booking":
            if event.interval is None and event.reason != "burst":
                self.old_intervals += 1
            if event.ip_interval is None and event.reason != "burst":  # a burst is on no address line
                self.old_addresses += 1
            self.address(event.address).request(event, self.rules, answer)
        elif kind in ("response", "failure"):
            self.address(event.address).response(event)

    def notes(self, ordered: Sequence[Event], *, windowed: bool) -> list[str]:
        """What the audit could not check, in words (an older log without the recorded intervals, ...)."""
        notes = []
        if self.old_intervals:
            notes.append(f"{self.old_intervals} requests were logged before the interval in force was recorded: their "
                         "interval is read from the host's next allowed after them")
        if self.old_addresses:
            notes.append(f"{self.old_addresses} requests were logged before the address interval was recorded: their "
                         "address gaps are not checked")
        if ordered and not any(e.seq is not None for e in ordered):
            notes.append("the log predates event numbers: a truncated or incomplete log cannot be detected")
        if windowed:
            notes.append("audited from --since on: holds set before it are not known")
        return notes

    def report(self, ordered: Sequence[Event], *, windowed: bool) -> AuditReport:
        """The report, once every event of ``ordered`` (the log, in time order) was fed."""
        for violation in self.violations:
            if violation.kind in ("ip_interval", "ip_in_flight", "address"):
                self.addresses[violation.key].summary.violations += 1
            else:
                self.hosts[violation.key].summary.violations += 1
        self.violations.sort(key=lambda v: (v.second.at, list(VIOLATION_KINDS).index(v.kind)))
        hosts = [self.hosts[h].summary for h in sorted(self.hosts)]
        present = {e.source for e in ordered}
        return AuditReport(
            events=len(ordered), sources=sorted({e.source for e in ordered if e.source}),
            first=ordered[0].at if ordered else 0.0, last=ordered[-1].at if ordered else 0.0,
            hosts=[h for h in hosts if h.requests or h.throttles or h.refused],
            addresses=[self.addresses[a].summary for a in sorted(self.addresses)], violations=self.violations,
            notes=self.notes(ordered, windowed=windowed), losses=self.losses,
            unclosed=sorted(source for source, count in self.open_logs.items()
                            if count > 0 and source in present))
