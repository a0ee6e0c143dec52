"""The audit of a crawl's event log (docs/spec.md §8, docs/guides/operating.md, "Auditing a crawl"): pure functions,
no I/O.

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
  (:attr:`AddressSummary.unpaced`) and the report says so;
* ``in_flight``, ``ip_in_flight``: no request to a host, or to an address, booked while another paced request to
  it was in flight — booked, its answer not yet recorded — in any process (§3, "In flight");
* ``address``: every address contacted allowed by the address rules (§4).

A burst request (``polite_burst``, §5) is not booked: it is exempt from the intervals and the Crawl-delay, not
from a throttle's or a quota's hold. ``scrapy polite reset`` forgets a host's holds, so an operator's reset
ends them. A log the audit cannot vouch for — an event that cannot be read, or events missing (their numbers,
:attr:`Event.seq <scrapy_polite.stores.Event.seq>`, leave a gap or do not start at 0) — raises
:class:`LogError`, never a verdict.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .events import clock_time
from .policy import ip_key
from .stores.base import EVENT_KINDS, Event

__all__ = ["AddressSummary", "AuditReport", "HostSummary", "LogError", "Loss", "Throttle", "VIOLATION_KINDS",
           "Violation", "audit", "format_report", "report_json"]

#: Seconds two times may differ by and still count as equal: a booking at ``next_allowed`` exactly is
#: ``start + interval`` computed in floating point (a requests exactly at the interval passes).
TOLERANCE = 1e-6

#: Every kind of violation, in the order they are listed; the words each is printed with.
VIOLATION_KINDS = {
    "interval": "short gap",
    "retry_after": "inside a Retry-After hold",
    "quota": "inside a quota hold",
    "backoff": "inside a backoff",
    "crawl_delay": "Crawl-delay not honoured",
    "ip_interval": "short gap on an address",
    "in_flight": "booked while another request was in flight",
    "ip_in_flight": "booked on an address while another request was in flight there",
    "address": "address outside the rules",
}


class LogError(ValueError):
    """The event log cannot be audited: an event that cannot be read (a wrong type, a time that is not a
    number, an unknown kind) or events missing (trimmed to ``POLITE_EVENT_LOG_SIZE``, or dropped while the
    crawl ran). The message names the events and the fix."""


@dataclass(frozen=True)
class Violation:
    """One rule broken by one request.

    Attributes:
        kind: a key of :data:`VIOLATION_KINDS`.
        key: the host (or, for ``ip_interval``, ``ip_in_flight`` and ``address``, the address) it concerns.
        first: the earlier event the rule counts from (the previous request, or the response whose hold it
            broke); None for ``address``.
        second: the request that broke it (a ``booking`` event).
        gap: seconds from ``first`` to ``second`` (None for ``address``).
        required: seconds the rule required between them (None for ``address``).
        detail: the rule's numbers in words (``Retry-After 3 s``, ``Crawl-delay 2 s``, the rules' networks).
    """

    kind: str
    key: str
    first: Event | None
    second: Event
    gap: float | None
    required: float | None
    detail: str = ""


@dataclass
class Throttle:
    """A throttle of a host and how it was honoured.

    Attributes:
        event: the ``response`` (429, 503, ...) or ``failure`` event that recorded it.
        cause: its status, or the failure's name.
        retry_after: the Retry-After it carried, seconds (None: none).
        held: seconds the crawl held the host after it (``due - at``, the hold it recorded).
        honoured: seconds until the host's next request (None: no request followed in the log).
    """

    event: Event
    cause: str
    retry_after: float | None
    held: float
    honoured: float | None


@dataclass
class HostSummary:
    """What the audit saw of one host.

    Attributes:
        host: the host key.
        requests: requests sent to it (bookings, bursts included).
        bursts: of those, burst requests (not paced, docs/spec.md §5).
        smallest_gap: the smallest gap between two of its paced requests, seconds (None: fewer than two).
        gap_required: the interval that gap was held to (the first request's interval, or the Crawl-delay if
            larger), seconds.
        throttles: its throttles, in time order.
        addresses: the addresses it was contacted on.
        refused: requests refused before any contact (a non-public address, no host).
        violations: how many violations name it.
    """

    host: str
    requests: int = 0
    bursts: int = 0
    smallest_gap: float | None = None
    gap_required: float | None = None
    throttles: list[Throttle] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    refused: int = 0
    violations: int = 0


@dataclass
class AddressSummary:
    """What the audit saw of one address (its ``ip:`` row's canonical form, docs/spec.md §3).

    Attributes:
        address: the address.
        requests: requests sent to it.
        hosts: the hosts requested through it.
        smallest_gap: the smallest gap between two of its paced requests, seconds (None: fewer than two, or
            not paced by address).
        gap_required: the address interval that gap was held to, seconds.
        allowed: the address rules allow it.
        violations: how many violations name it.
        unpaced: pairs of consecutive requests whose first was booked with ``POLITE_IP_INTERVAL = 0``: not paced
            by address, so not judged per address (their host's rules still judge them); not in ``smallest_gap``.
    """

    address: str
    requests: int = 0
    hosts: list[str] = field(default_factory=list)
    smallest_gap: float | None = None
    gap_required: float | None = None
    allowed: bool = True
    violations: int = 0
    unpaced: int = 0


@dataclass(frozen=True)
class Loss:
    """The pace table came back empty, and a process wrote back what it knew (docs/spec.md §6): the record
    before that moment was lost with the table.

    Attributes:
        at: when the process restored it (epoch s, the store's clock).
        source: the process.
        rows: the rows it wrote back.
        since: when that process last found the table whole (the loss came after it).
    """

    at: float
    source: str
    rows: int
    since: float


@dataclass
class AuditReport:
    """The audit's result.

    Attributes:
        events: events read.
        sources: the processes that wrote them.
        first, last: the times of the first and the last event (epoch seconds, the store's clock; 0: none).
        hosts: per host, sorted by host.
        addresses: per address, sorted.
        violations: every violation, in time order of the request that broke the rule.
        notes: what the audit could not check, in words (an older log without the recorded intervals).
        losses: the times the table came back empty (:class:`Loss`): the record before each is lost, and the
            audit cannot vouch for it.
    """

    events: int
    sources: list[str]
    first: float
    last: float
    hosts: list[HostSummary]
    addresses: list[AddressSummary]
    violations: list[Violation]
    notes: list[str]
    losses: list[Loss] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation, and no span the audit cannot vouch for (a table that came back empty)."""
        return not self.violations and not self.losses


# -- reading the log ---------------------------------------------------------------------------------------

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
    for event in events:
        if event.seq is not None:
            numbers[event.source].append(event.seq)
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
                    f"the log is incomplete: {after - before - 1} events of {source} (#{before + 1} to "
                    f"#{after - 1}) are missing (dropped while the crawl ran — polite/events/dropped counts them — "
                    "or deleted). The audit cannot vouch for a crawl whose record has holes")


# -- the checks --------------------------------------------------------------------------------------------

@dataclass
class _Hold:
    """What a response (or failure) holds its host to: no request before ``until``."""

    event: Event
    until: float


def _cause(event: Event) -> str:
    if event.kind == "failure":
        return event.reason or "failure"
    return str(event.status)


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
            return "retry_after", window, f"{_cause(hold)}, Retry-After {retry_after:g} s{clamped}"
    if hold.hold is not None and hold.hold > 0 and at < hold.at + hold.hold - TOLERANCE:
        return "quota", hold.hold, f"{_cause(hold)}, its quota spent for {hold.hold:g} s"
    if _is_throttle(hold):
        return "backoff", held, f"{_cause(hold)}, backoff {held:.3f} s"
    return "interval", held, f"the delay chosen after the response ({_cause(hold)}) to {hold.url or '?'}"


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
            throttle = Throttle(event, _cause(event), event.retry_after, held, None)
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
          windowed: bool = False) -> AuditReport:
    """Check the event log of a crawl (see the module for the rules; docs/spec.md §8).

    Args:
        events: the log's events (any order; they are checked in time order, then in the order given).
        allows: ``allows(address) -> bool``, the address rules the crawl ran with
            (:meth:`AddressFilter.allows <scrapy_polite.addresses.AddressFilter.allows>`).
        rules: the rules in words, for an ``address`` violation (e.g. ``POLITE_ALLOWED_NETWORKS 127.0.0.0/8``).
        windowed: the events are the log from a moment on (``--since``): a process's numbers need not start
            at 0, and holds set before that moment are not known.

    Returns:
        An :class:`AuditReport`.

    Raises:
        LogError: an event cannot be read, or events are missing (the log is truncated or incomplete).
    """
    ordered = list(events)
    for event in ordered:
        _validate(event)
    ordered = [e for _, e in sorted(enumerate(ordered), key=lambda item: (item[1].at, item[0]))]
    _check_complete(ordered, windowed=windowed)
    violations: list[Violation] = []
    hosts: dict[str, _HostAudit] = {}
    addresses: dict[str, _AddressAudit] = {}
    verdicts: dict[str, bool] = {}

    def host_audit(host: str) -> _HostAudit:
        found = hosts.get(host)
        if found is None:
            found = hosts[host] = _HostAudit(host, violations.append)
        return found

    def address_audit(address: str) -> _AddressAudit:
        key = ip_key(address)[3:]
        found = addresses.get(key)
        if found is None:
            if address not in verdicts:
                verdicts[address] = bool(allows(address))
            found = addresses[key] = _AddressAudit(key, verdicts[address], violations.append)
        return found

    old_intervals = old_addresses = 0
    answers = _answers(ordered)
    losses: list[Loss] = []
    for event in ordered:
        kind = event.kind
        if kind in ("wait", "deferral", "backoff"):
            continue  # a wait or a deferral contacts nobody; a backoff repeats its response
        if kind == "refusal" and not event.host:
            continue
        if kind == "restored" and not event.host:
            losses.append(Loss(event.at, event.source, event.steps or 0, event.started or 0.0))
            continue
        answer = answers.get(id(event)) if kind == "booking" else None
        if kind in ("booking", "response", "failure", "robots_delay", "operator", "refusal", "restored"):
            host_audit(event.host).feed(event, answer)
        if event.address is None:
            continue
        if kind == "booking":
            if event.interval is None and event.reason != "burst":
                old_intervals += 1
            if event.ip_interval is None:
                old_addresses += 1
            address_audit(event.address).request(event, rules, answer)
        elif kind in ("response", "failure"):
            address_audit(event.address).response(event)
    for violation in violations:
        if violation.kind in ("ip_interval", "ip_in_flight", "address"):
            addresses[violation.key].summary.violations += 1
        else:
            hosts[violation.key].summary.violations += 1
    notes = []
    if old_intervals:
        notes.append(f"{old_intervals} requests were logged before the interval in force was recorded: their interval "
                     "is read from the host's next allowed after them")
    if old_addresses:
        notes.append(f"{old_addresses} requests were logged before the address interval was recorded: their address "
                     "gaps are not checked")
    if ordered and not any(e.seq is not None for e in ordered):
        notes.append("the log predates event numbers: a truncated or incomplete log cannot be detected")
    if windowed:
        notes.append("audited from --since on: holds set before it are not known")
    violations.sort(key=lambda v: (v.second.at, list(VIOLATION_KINDS).index(v.kind)))
    return AuditReport(
        events=len(ordered), sources=sorted({e.source for e in ordered if e.source}),
        first=ordered[0].at if ordered else 0.0, last=ordered[-1].at if ordered else 0.0,
        hosts=[hosts[h].summary for h in sorted(hosts)
               if hosts[h].summary.requests or hosts[h].summary.throttles or hosts[h].summary.refused],
        addresses=[addresses[a].summary for a in sorted(addresses)], violations=violations, notes=notes,
        losses=losses)


# -- words -------------------------------------------------------------------------------------------------

def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def _request_words(event: Event) -> str:
    what = "request" if event.kind == "booking" else f"{_cause(event)} response"
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
        report: :func:`audit`'s result.
        store: the store's URI, for the first line.
        throttles_shown: the most throttles listed on a host's line (``--json`` lists all).
    """
    lines = [f"audit of the event log of {store}: {report.events} events from {len(report.sources)} "
             f"process{'es' if len(report.sources) != 1 else ''}, {clock_time(report.first, date=True)} to "
             f"{clock_time(report.last, date=True)}"]
    for host in report.hosts:
        burst = f" ({host.bursts} burst)" if host.bursts else ""
        gap = ("smallest gap -" if host.smallest_gap is None else
               f"smallest gap {_s(host.smallest_gap)} (interval {_s(host.gap_required)})")
        shown = "; ".join(_throttle_words(t) for t in host.throttles[:throttles_shown])
        more = f"; {len(host.throttles) - throttles_shown} more (--json lists them)" \
            if len(host.throttles) > throttles_shown else ""
        throttles = f"{_n(len(host.throttles), 'throttle')} ({shown}{more})" if host.throttles else "0 throttles"
        refused = f", {host.refused} refused" if host.refused else ""
        verdict = f", {_n(host.violations, 'VIOLATION')}" if host.violations else ", ok"
        lines.append(f"host {host.host}: {_n(host.requests, 'request')}{burst}, {gap}, {throttles}{refused}{verdict}")
    for address in report.addresses:
        gap = ("smallest gap -" if address.smallest_gap is None else
               f"smallest gap {_s(address.smallest_gap)} (interval {_s(address.gap_required)})")
        if address.unpaced:
            gap += (f", {_n(address.unpaced, 'pair')} booked with POLITE_IP_INTERVAL 0: not judged per address "
                    "(their hosts' rules judge them)")
        allowed = "allowed" if address.allowed else "NOT ALLOWED"
        verdict = f", {_n(address.violations, 'VIOLATION')}" if address.violations else ", ok"
        hosts = ", ".join(address.hosts)
        requests = _n(address.requests, "request")
        lines.append(f"address {address.address}: {requests} ({hosts}), {gap}, {allowed}{verdict}")
    lines.extend(f"note: {note}" for note in report.notes)
    for loss in report.losses:
        lines.append(f"LOST: the pace table came back empty between {clock_time(loss.since, date=True)} and "
                     f"{clock_time(loss.at, date=True)} ({loss.source} restored {_n(loss.rows, 'row')} it knew): the "
                     "record before that was lost with the table, and the audit cannot vouch for it")
    for violation in report.violations:
        lines.extend(_violation_words(violation))
    if report.losses and not report.violations:
        lines.append(f"NOT VOUCHED FOR: no violation in the {_n(sum(h.requests for h in report.hosts), 'request')} "
                     "recorded, but the table came back empty: the record before that is lost")
    elif report.ok:
        lines.append(f"OK: no violation in {_n(sum(h.requests for h in report.hosts), 'request')} to "
                     f"{_n(len(report.hosts), 'host')}")
    else:
        counts: dict[str, int] = defaultdict(int)
        for violation in report.violations:
            counts[violation.kind] += 1
        lines.append(f"FAILED: {_n(len(report.violations), 'violation')} ("
                     + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")")
    return lines


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
