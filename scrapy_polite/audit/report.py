"""The audit's findings (docs/spec.md §8): what it saw of each host and address, the rules broken, the spans it
cannot vouch for, and the report that holds them (:class:`AuditReport`). Data only; :mod:`.rules` finds them and
:mod:`.words` says them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..stores.base import Event

__all__ = ["VIOLATION_KINDS", "AddressSummary", "AuditReport", "HostSummary", "Loss", "Throttle", "Violation",
           "cause"]

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
        unclosed: the processes whose event log was opened and not closed (killed, or still running): the events of
            their last second (written in batches) may be missing, and the audit cannot vouch for them.
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
    unclosed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation, and nothing the audit cannot vouch for (a table that came back empty, a process's log not
        closed)."""
        return not self.violations and not self.losses and not self.unclosed



def cause(event: Event) -> str:
    """The cause of a ``response`` or ``failure`` event in words: its status (``"429"``), or the failure's name."""
    if event.kind == "failure":
        return event.reason or "failure"
    return str(event.status)
