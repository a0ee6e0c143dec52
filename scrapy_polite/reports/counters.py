"""What one crawl saw, per host: the counters behind the closing summary, the example's table and the
``polite/...`` stats (docs/reference: stats).

The counters speak the user's words, the same in the documentation (docs/getting-started.md), the closing summary
(:mod:`scrapy_polite.reports.summary`), the progress lines and ``scrapy polite``:

* **requests** — requests sent to the host (booked on it);
* **given up** — pages given up after the host kept throttling;
* **throttles** — responses that told us to slow down; **backoff steps** — throttles that doubled its backoff;
* **backing off** — seconds of this crawl during which the host was in backoff (no request allowed);
* **turn waits** — requests that waited for the host's turn: in line (count and seconds), or held out of
  the downloader while another request of the host, or of its address, was in flight;
* **deferred** — requests held out of the downloader because the host is throttling us (``throttled``) or
  publishes a Crawl-delay longer than ``POLITE_MAX_WAIT`` (``Crawl-delay``);
* **refused** — requests never sent: ``non-public`` (the host has only non-public addresses), ``no host``.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._compat import stats_incrementer
from ..clock import process_clock
from ..policy import Decision, HostState
from ..vocabulary import TURN_REASONS, DeferralReason, RefusalReason
from .events import EventLog

__all__ = ["HostCounters", "Report", "Span", "TURN_REASONS"]


#: How many URLs of pages given up each host keeps for the summary.
GIVEN_UP_URLS = 5


class Span:
    """The length of a union of time intervals (epoch seconds): "during how much of the crawl was this going
    on" — never longer than the time the intervals cover. Intervals may be added in any order (adding them
    in increasing start order, as the crawl does, is O(1)). Memory is bounded: beyond :data:`KEPT` intervals
    the oldest is folded into a sum (an interval added later that reaches back into the folded time counts
    only from its end)."""

    #: How many disjoint intervals a span keeps apart (a long crawl of one host waits in line millions of times).
    KEPT = 1024

    def __init__(self) -> None:
        #: The disjoint intervals ``[start, end]``, sorted by start.
        self._intervals: list[list[float]] = []
        #: Seconds of the intervals folded away, and where the folded time ends (epoch s).
        self._folded = 0.0
        self._folded_until = float("-inf")

    def add(self, start: float, end: float) -> None:
        """Add ``[start, end)``; intervals that overlap or touch it are merged with it."""
        start = max(start, self._folded_until)
        if end <= start:
            return
        intervals = self._intervals
        if not intervals or start > intervals[-1][1]:  # the usual case: after everything so far
            intervals.append([start, end])
            if len(intervals) > self.KEPT:
                first_start, first_end = intervals.pop(0)
                self._folded += first_end - first_start
                self._folded_until = first_end
            return
        i = bisect.bisect_left(intervals, [start, start])
        if i > 0 and intervals[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(intervals) and intervals[j][0] <= end:
            start, end = min(start, intervals[j][0]), max(end, intervals[j][1])
            j += 1
        intervals[i:j] = [[start, end]]

    def intervals(self) -> list[tuple[float, float]]:
        """The disjoint intervals kept, sorted (epoch s)."""
        return [(a, b) for a, b in self._intervals]

    def seconds(self, until: float | None = None) -> float:
        """The seconds covered, counted only up to ``until`` (epoch s) when given (folded time is before it)."""
        if until is None:
            return self._folded + sum(b - a for a, b in self._intervals)
        return self._folded + sum(min(b, until) - a for a, b in self._intervals if a < until)

    @classmethod
    def union(cls, spans: Iterable[Span]) -> Span:
        """One span covering every moment any of ``spans`` covers (time folded away in a span is added as it
        is, so the union of folded spans may count an overlap twice; the summary caps it at the crawl)."""
        spans = list(spans)
        merged = cls()
        for start, end in sorted(i for span in spans for i in span.intervals()):
            merged.add(start, end)
        merged._folded += sum(span._folded for span in spans)
        return merged


@dataclass
class HostCounters:
    """What one host saw in this crawl.

    Attributes:
        requests: paced requests booked; waits / wait_seconds: waits in line and their seconds (every reason);
        turn_waits_in_line / turn_wait_seconds: the waits in line for the host's turn (its interval, its
            address's budget), not for a backoff;
        deferrals / deferral_reasons: requests deferred, by reason; throttles: responses judged a throttle;
        backoff_steps: throttles that took a new step; statuses: status (or failure name) → count;
        crawl_delay: the delay (s) the host's robots.txt published, or None;
        ratelimit_interval: the interval (s) the host's announced quota allows (``w / q``), or None;
        ratelimit_holds: responses that said the host's quota was spent (the host was held until its reset);
        given_up / given_up_urls: pages given up after throttles (and the first :data:`GIVEN_UP_URLS` URLs);
        refusals: requests refused, by reason (``non_public``);
        state: the host's row as this process last knew it: its last record, the table's at start (a host in
            backoff), or the table's when a booking deferred (None: none yet);
        throttle_cause: what the last throttle was (``"429, Retry-After 30 s"``, ``"a TimeoutError"``,
            ``"3 backoff steps already in the pace table"``), None before any;
        backoff_due: this process's epoch s at which the host's backoff ends (None: not backing off);
        backing_off: the windows of this crawl during which the host was in backoff;
        robots_unreachable_since: this process's epoch s since which the host's robots.txt has been unreachable
            with no rules read before, so that its requests are held (None: it is not);
        robots_cause: that robots.txt's last answer, in words (``"503"``, ``"TimeoutError"``).
        held_elsewhere_until: this process's epoch s at which, at the latest, the in-flight hold of another
            process's request on the host (or its address) ends, as the last booking kept out by it found (docs/spec.md
            §3, "In flight"; a dead process's hold lasts until then); None: none found.
        deferred_for: the reason of the host's last deferral (None: none yet).
    """

    requests: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    deferrals: int = 0
    deferral_reasons: Counter[str] = field(default_factory=Counter)
    throttles: int = 0
    backoff_steps: int = 0
    statuses: Counter[Any] = field(default_factory=Counter)
    crawl_delay: float | None = None
    ratelimit_interval: float | None = None
    ratelimit_holds: int = 0
    turn_waits_in_line: int = 0
    turn_wait_seconds: float = 0.0
    given_up: int = 0
    given_up_urls: list[str] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    state: HostState | None = None
    throttle_cause: str | None = None
    backoff_due: float | None = None
    backing_off: Span = field(default_factory=Span)
    robots_unreachable_since: float | None = None
    robots_cause: str | None = None
    held_elsewhere_until: float | None = None
    deferred_for: DeferralReason | None = None

    @property
    def turn_waits(self) -> int:
        """Requests that waited for the host's turn: in line, or held while its line (or its address's) was
        busy."""
        return self.turn_waits_in_line + sum(self.deferral_reasons[r] for r in TURN_REASONS)

    @property
    def slowed_deferrals(self) -> dict[str, int]:
        """Deferrals because the host slows us down (``throttled``, ``crawl_delay``, …), by reason."""
        return {r: n for r, n in sorted(self.deferral_reasons.items()) if r not in TURN_REASONS and n}

    @property
    def active(self) -> bool:
        """This crawl did something with the host: booked, held, deferred, refused or recorded a request of it
        (a host only listed at start as in backoff from the pace table is not active)."""
        return bool(self.requests or self.waits or self.deferrals or self.throttles or self.statuses
                    or self.refusals or self.given_up)

    def in_backoff(self, now: float) -> bool:
        """The host is backing us off at ``now`` (this process's epoch s): no request may start to it."""
        return self.backoff_due is not None and self.backoff_due > now


class Report:
    """Per-host counters and ``polite/...`` stats of one crawler.

    Args:
        stats: the crawler's stats collector (None: counters only).
        clock: this process's clock, epoch seconds (when waits start; the crawl's start): the monotonic
            process clock by default (docs/spec.md §5).

    Attributes:
        started: when the crawl started (epoch s).
        turn_span: the moments of the crawl when some request waited in line for its host's turn (the
            total the summary gives: never longer than the crawl, unlike sums over hosts).
    """

    def __init__(self, stats: Any, clock: Callable[[], float] = process_clock) -> None:
        self.stats = stats
        # Scrapy 2.19's StatsCollector runs a Python __getattribute__ on every attribute read: its own collectors
        # are added to directly (stats_incrementer), once per page.
        self._inc_value: Callable[[str, float], None] | None = stats_incrementer(stats) if stats is not None else None
        self.clock = clock
        self.started = clock()
        self.turn_span = Span()
        #: host → its counters, created on first use (``hosts[host]``, as :meth:`counters`; ``hosts.get(host)``
        #: reads without creating): a ``defaultdict``, so that the lookup of every page costs no Python call.
        self.hosts: defaultdict[str, HostCounters] = defaultdict(HostCounters)
        #: The event log the glue units write to (:class:`~scrapy_polite.reports.events.EventLog`; the pacer attaches
        #: the store's, off until then).
        self.events: EventLog = EventLog.off()
        #: Hosts that start in backoff and are named only when this crawl first meets them, and what names them
        #: (the extension's start-up line for one host).
        self.unannounced: set[str] = set()
        self.on_first_touch: Callable[[str], None] | None = None

    def counters(self, host: str) -> HostCounters:
        """The host's counters (created on first use: :attr:`hosts`)."""
        return self.hosts[host]

    def known(self, host: str) -> HostState | None:
        """The host's row as this process last knew it (:attr:`HostCounters.state`), or None. A row the table has moved
        on from since says too little (the booking then reads the table and defers, and its row is known next) or a
        ``next_allowed`` the table still holds (it only moves back by a reset): docs/spec.md §5, "The early
        deferral"."""
        counters = self.hosts.get(host)
        return counters.state if counters is not None else None

    def know(self, host: str, state: HostState | None) -> None:
        """Remember ``state`` as the host's row this process knows (:meth:`known`): the row a booking that deferred
        found in the table (docs/spec.md §5, "The early deferral")."""
        self.counters(host).state = state

    def reread(self, host: str, state: HostState | None, offset: float) -> None:
        """The host's row read again (``offset``: this process's clock less the table's): known (:meth:`know`), and its
        backoff ends where the row says — at once when the row no longer backs off (``scrapy polite reset``)."""
        counters = self.counters(host)
        counters.state = state
        in_backoff = state is not None and state.consec > 0
        counters.backoff_due = state.next_allowed + offset if in_backoff and state is not None else None

    def inc(self, key: str, count: float = 1) -> None:
        """Add ``count`` to the stat ``polite/<key>``."""
        if self._inc_value is not None:
            self._inc_value(f"polite/{key}", count)

    def booked(self, host: str) -> None:
        """A paced request was booked on ``host`` (no other process's request holds it back any more)."""
        if self.unannounced:  # most crawls name no host late: no call to _touch
            self._touch(host)
        counters = self.hosts[host]
        counters.requests += 1
        counters.held_elsewhere_until = None
        self.inc("requests")

    def waited(self, host: str, seconds: float) -> None:
        """A request of ``host`` waits ``seconds`` in line, from now. It waits for the host's turn unless the
        host is backing us off now (a request that could not be deferred waits the backoff out: that time
        is in **backing off**, not in the turn waits)."""
        if self.unannounced:
            self._touch(host)
        counters = self.counters(host)
        counters.waits += 1
        counters.wait_seconds += seconds
        self.inc("waits")
        self.inc("wait_seconds", seconds)
        now = self.clock()
        if not counters.in_backoff(now):
            counters.turn_waits_in_line += 1
            counters.turn_wait_seconds += seconds
            self.turn_span.add(now, now + seconds)

    def recorded(self, host: str, decision: Decision, *, offset: float = 0.0, label: str = "",
                 retry_after: float | None = None) -> None:
        """The host's row after a response (or failure) was recorded (``decision``, times in the store's
        clock; ``offset``: this process's clock minus the store's). A throttle, or a success that leaves
        backoff steps to earn back, opens a backoff window until the host's ``next_allowed``; a throttle's
        cause is kept: ``label`` (the status, or ``"failure"``) and the
        ``Retry-After`` honoured (seconds), e.g. ``"429, Retry-After 30 s"``."""
        counters = self.hosts[host]
        state = decision.state
        counters.state = state
        due = state.next_allowed + offset
        if decision.throttle:
            cause = "a connection failure" if label == "failure" else label
            if retry_after is not None and retry_after > 0:
                cause += f", Retry-After {retry_after:g} s"
            counters.throttle_cause = cause
        if decision.throttle or state.consec > 0:
            # A throttle opens a backoff window; so does a success that leaves steps to earn back (docs/spec.md
            # §2: the delay after it is still the backoff, not the interval).
            counters.backing_off.add(state.updated + offset, due)
        if state.consec > 0 and due > state.updated + offset:
            counters.backoff_due = due
        elif state.consec == 0:
            counters.backoff_due = None

    def starts_in_backoff(self, host: str, state: HostState, *, offset: float = 0.0, announce: bool = False) -> None:
        """The host starts the crawl in backoff, from the persisted table (recorded by an earlier run, or by
        another process still running: the table does not say which, so neither do the words).

        ``announce``: the host is to be named (:attr:`on_first_touch`) when this crawl first books, holds or
        defers one of its requests, not at start (the crawl may never touch it)."""
        counters = self.counters(host)
        counters.state = state
        counters.backoff_due = state.next_allowed + offset
        if counters.throttle_cause is None:
            steps = "1 backoff step" if state.consec == 1 else f"{state.consec} backoff steps"
            after = f"Retry-After {state.run_retry_after:g} s; " if state.run_retry_after else ""
            counters.throttle_cause = f"{after}{steps} already in the pace table"
        counters.backing_off.add(self.started, counters.backoff_due)
        if announce:
            self.unannounced.add(host)

    def _touch(self, host: str) -> None:
        """This crawl meets ``host``: name it once if it started in backoff and was not named at start (the
        callers skip the call while :attr:`unannounced` is empty)."""
        if host in self.unannounced:
            self.unannounced.discard(host)
            if self.on_first_touch is not None:
                self.on_first_touch(host)

    def gave_up(self, host: str, url: str) -> None:
        """A page of ``host`` was given up after throttles (``polite/throttle/given_up``)."""
        counters = self.counters(host)
        counters.given_up += 1
        if len(counters.given_up_urls) < GIVEN_UP_URLS:
            counters.given_up_urls.append(url)
        self.inc("throttle/given_up")

    def refused(self, host: str, reason: RefusalReason, url: str | None = None) -> None:
        """A request of ``host`` (``url``, when known) was refused: ``non_public``
        (``polite/blocked/private_address``). Also an event of the event log."""
        self.counters(host).refusals[reason] += 1
        self.events.refusal(host, url, reason)
        self.inc("blocked/private_address" if reason == "non_public" else f"refused/{reason}")

    def robots_unreachable(self, host: str, since: float | None, cause: str | None = None) -> None:
        """The host's robots.txt is unreachable since ``since`` (this process's epoch s; its requests are held),
        its last answer ``cause``; None: it is not (any more)."""
        counters = self.counters(host)
        counters.robots_unreachable_since = since
        counters.robots_cause = cause if since is not None else None

    def robots_given_up(self, limit: float) -> set[str]:
        """The hosts whose robots.txt has been unreachable (their requests held) for longer than ``limit`` seconds
        (``POLITE_MAX_IDLE_WAIT``): the idle check does not keep the spider open for them (docs/spec.md §5, "The
        robots.txt lifecycle")."""
        now = self.clock()
        return {host for host, c in self.hosts.items()
                if c.robots_unreachable_since is not None and now - c.robots_unreachable_since > limit}

    def deferred(self, host: str, reason: DeferralReason, url: str | None = None, due: float | None = None) -> None:
        """A request of ``host`` (``url``, when known) was deferred for ``reason`` until ``due`` (this process's
        epoch s; None: unknown, or when its line frees). Also an event of the event log."""
        if self.unannounced:
            self._touch(host)
        self.events.deferral(host, url, reason, due)
        counters = self.counters(host)
        counters.deferrals += 1
        counters.deferral_reasons[reason] += 1
        counters.deferred_for = reason
        self.inc("deferrals")
        self.inc(f"deferrals/{reason}")

    def host_report(self) -> dict[str, dict[str, Any]]:
        """Per host: ``requests``, ``waits``, ``wait_seconds``, ``deferrals`` (total) and
        ``deferral_reasons`` (``throttled``, ``crawl_delay``, ``line``, ``ip_line`` -> count), ``throttles``,
        ``backoff_steps``, ``statuses`` (status or failure name -> count), ``crawl_delay`` (seconds or None);
        in the summary's words: ``given_up``, ``turn_waits`` (in line and held for a busy line),
        ``turn_wait_seconds`` (in line), ``backing_off_seconds`` (up to now), ``refused`` (reason -> count),
        ``throttle_cause`` (the last one, or None)."""
        now = self.clock()
        return {
            host: {
                "requests": c.requests, "waits": c.waits, "wait_seconds": round(c.wait_seconds, 3),
                "deferrals": c.deferrals, "deferral_reasons": dict(c.deferral_reasons),
                "throttles": c.throttles, "backoff_steps": c.backoff_steps,
                "statuses": dict(c.statuses), "crawl_delay": c.crawl_delay,
                "given_up": c.given_up, "turn_waits": c.turn_waits,
                "turn_wait_seconds": round(c.turn_wait_seconds, 3),
                "backing_off_seconds": round(c.backing_off.seconds(until=now), 3),
                "refused": dict(c.refusals), "throttle_cause": c.throttle_cause,
            }
            for host, c in sorted(self.hosts.items())
        }
