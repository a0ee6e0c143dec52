"""What the crawl tells its user at INFO, in the words of docs/getting-started.md ("The words"): the closing summary,
the live progress line (every ``LOGSTATS_INTERVAL`` seconds) and the hosts that start in backoff.

Pure formatting: counters (:class:`~scrapy_polite.reports.counters.Report`) and times in, text out. The words are
the same everywhere (the documentation, the summary, ``scrapy polite``): **requests**, **given up**, **throttles**,
**backoff steps**, **backing off**, **turn waits**, **deferred** (``throttled``, ``Crawl-delay``),
**refused** (``non-public``, ``no host``, ``invalid host``), **held**, **due**.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .counters import HostCounters, Report, Span
from .events import DEFERRAL_WORDS, REFUSAL_WORDS
from .words import format_due, format_duration, format_table, plural

__all__ = [
    "HeldHost",
    "format_progress",
    "format_start_backoffs",
    "format_summary",
    "reason_words",
    "reset_command",
]

#: How a deferral reason is named to the user (one table for the summary, the event log and the timeline).
REASON_WORDS = DEFERRAL_WORDS

#: The per-host columns of the summary (docs/reference: stats).
COLUMNS = ("host", "requests", "given up", "throttles", "backoff steps", "backing off", "turn waits",
           "deferred", "refused")


def reason_words(reason: str) -> str:
    """The user's word for a deferral reason (``crawl_delay`` → ``Crawl-delay``)."""
    return REASON_WORDS.get(reason, reason.replace("_", " "))


def reset_command(hosts: Iterable[str], store_option: str | None = None) -> str:
    """The ``scrapy polite reset`` command line that forgets these hosts' backoffs."""
    option = f" --store {store_option}" if store_option else ""
    return f"scrapy polite reset {' '.join(hosts)}{option}"


def format_start_backoffs(hosts: Mapping[str, HostCounters], *, now: float, store_uri: str,
                          store_option: str | None = None) -> str | None:
    """The start-up line: the hosts that start this crawl in backoff from the persisted table (host, cause,
    due) and the command that clears them; None when there are none. The caller passes the hosts this crawl
    can touch (the others are named when it first meets them, if ever)."""
    backing = sorted((c.backoff_due or 0.0, host, c) for host, c in hosts.items() if c.in_backoff(now))
    if not backing:
        return None
    listed = "; ".join(f"{host} ({c.throttle_cause or 'throttled'}) due {format_due(due, now)}"
                       for due, host, c in backing)
    count = "1 host starts" if len(backing) == 1 else f"{len(backing)} hosts start"
    return (f"scrapy-polite: {count} in backoff from the pace table {store_uri}: {listed}. Its requests are "
            f"deferred until due; to forget the backoff: {reset_command([h for _, h, _ in backing], store_option)}")


def _backoff_words(c: HostCounters) -> str:
    """Why a host is backing off, with its steps: ``429, Retry-After 3 s; 9 backoff steps`` (docs/spec.md §2:
    the steps, not the last Retry-After, may be what sets the due moment)."""
    cause = c.throttle_cause or "a throttle"
    steps = c.state.consec if c.state is not None else 0
    if steps and "backoff step" not in cause:
        cause += f"; {plural(steps, 'backoff step')}"
    return cause


def _forgive(hosts: Iterable[str], store_option: str | None) -> str:
    listed = sorted(hosts)
    shown = listed if len(listed) <= 5 else [*listed[:5], "..."]
    return f"; to forgive a host: {reset_command(shown, store_option)}"


@dataclass(frozen=True)
class HeldHost:
    """Requests the scheduler holds for one host.

    Attributes:
        host: the host key; count: requests held; due: this process's epoch s at which the host is due
            (``inf``: when its line frees).
    """

    host: str
    count: int
    due: float


def format_progress(report: Report, held: Sequence[HeldHost], *, now: float, idle: bool,
                    store_option: str | None = None, forgive: bool = True) -> str | None:
    """The progress line: requests held, hosts in backoff, the next host due and when; when ``idle`` (nothing
    else is being crawled) and everything held is due later, for something else than its host's turn, says that the
    crawl is only waiting, and on what (host, cause and backoff steps, due). A host in backoff is due at the later of
    its requests' due time and its backoff's end (the real moment its next request can go). While hosts back off,
    the line ends with the ``scrapy polite reset`` command that forgives them (``store_option``: its ``--store``; not
    with ``forgive`` False: a table no other process can reach, ``memory://``). A host that started in backoff from
    the table and that this crawl has not met yet (:attr:`Report.unannounced`) is none of its business (trial H: a
    crawl of one host named another crawl's host as next due). None when there is nothing to tell (nothing held, no
    host in backoff)."""
    holding = {h.host for h in held}
    backing = {host: c for host, c in report.hosts.items()
               if c.in_backoff(now) and (host not in report.unannounced or host in holding)}
    total = sum(h.count for h in held)
    if not total and not backing:
        # A request that cannot leave the downloader (robots.txt) waiting for another process's (trial: silent for
        # a whole download timeout after a process was killed).
        elsewhere = sorted(host for host, c in report.hosts.items() if (c.held_elsewhere_until or 0.0) > now)
        return ("scrapy-polite: waiting for " + "; ".join(f"{host} ({_elsewhere_words(report.hosts[host], now)})"
                                                         for host in elsewhere[:5])) if elsewhere else None

    def due_of(h: HeldHost) -> float:
        c = backing.get(h.host)
        return max(h.due, c.backoff_due or 0.0) if c is not None else h.due

    waiting = sorted((h for h in held if h.due != float("inf")), key=due_of)
    forgive_words = _forgive(backing, store_option) if backing and forgive else ""
    if idle and waiting and all(h.due > now for h in held):
        whys = [_held_for(report.hosts.get(h.host), now) for h in waiting]
        if any(why != TURN for why in whys):  # (held only for their turn is ordinary pacing, not a stall: trial H)
            return "scrapy-polite: only waiting for held requests: " + "; ".join(
                f"{h.host} ({why}, {h.count} held) due {format_due(due_of(h), now)}"
                for h, why in zip(waiting, whys)) + forgive_words
    line = f"scrapy-polite: {plural(total, 'request')} held"
    robots = [h for h in held if (c := report.hosts.get(h.host)) is not None and c.robots_unreachable_since is not None]
    if robots:
        line += (f" ({sum(h.count for h in robots)} for robots.txt unreachable: "
                 + ", ".join(sorted(h.host for h in robots)) + ")")
    line += f", {plural(len(backing), 'host')} in backoff"
    if waiting:
        first = waiting[0]
        line += f"; next due: {first.host} {format_due(due_of(first), now)}"
        if first.host in backing:
            line += f" ({_backoff_words(backing[first.host])})"
        elif (c := report.hosts.get(first.host)) is not None and (c.held_elsewhere_until or 0.0) > now:
            line += f" ({_elsewhere_words(c, now)})"
    elif backing:
        host, c = min(backing.items(), key=lambda item: item[1].backoff_due or 0.0)
        line += f"; next due: {host} {format_due(c.backoff_due or now, now)} ({_backoff_words(c)})"
    return line + forgive_words


#: What a host's requests are held for when nothing else holds them (:func:`_held_for`).
TURN = "its turn"


def _held_for(c: HostCounters | None, now: float) -> str:
    """What a host's held requests wait for, in words: robots.txt, a backoff, a Crawl-delay, another process's
    request, an operator's delay or a quota, else :data:`TURN`."""
    if c is None:
        return TURN
    if c.robots_unreachable_since is not None:
        return _robots_words(c, now)
    if c.in_backoff(now):
        return f"backing off after {_backoff_words(c)}"
    if c.state is not None and c.state.crawl_delay:
        return f"Crawl-delay {c.state.crawl_delay:g} s"
    if (c.held_elsewhere_until or 0.0) > now:
        return _elsewhere_words(c, now)
    if c.deferred_for in ("crawl_delay", "ratelimit"):  # an operator's delay, a quota
        return DEFERRAL_WORDS[c.deferred_for]
    return TURN


def _robots_words(c: HostCounters, now: float) -> str:
    """``robots.txt unreachable (503) for 12.0 s``: why a host's requests are held (docs/spec.md §5)."""
    since = c.robots_unreachable_since if c.robots_unreachable_since is not None else now
    cause = f" ({c.robots_cause})" if c.robots_cause else ""
    return f"robots.txt unreachable{cause} for {format_duration(now - since)}"


def _elsewhere_words(c: HostCounters, now: float) -> str:
    """``a request of another process in flight: held until its answer, at the latest in 2 m 31 s (at …)``: why a
    host's requests wait for another process (docs/spec.md §3, "In flight": a dead process's hold lasts until its
    bound, the request's download timeout and the interval after its booking)."""
    return (f"a request of another process in flight: held until its answer, at the latest "
            f"{format_due(c.held_elsewhere_until or now, now)}")


def _cell_deferred(c: HostCounters) -> str:
    slowed = c.slowed_deferrals
    return ", ".join(f"{n} {reason_words(r)}" for r, n in slowed.items()) or "-"


def _cell_refused(c: HostCounters) -> str:
    return ", ".join(f"{n} {REFUSAL_WORDS.get(r, r)}" for r, n in sorted(c.refusals.items()) if n) or "-"


def format_summary(report: Report, *, now: float, unhosted: Mapping[str, int] | None = None) -> str:
    """The closing summary: a totals line, then one row per host this crawl touched (:data:`COLUMNS`; a host
    only listed at start as in backoff from the pace table is left out) and the pages given up.

    The totals never add per-host times into a figure longer than the crawl: "backing off" and "turn
    waits" are the time during which *some* host was backing off / *some* request waited in line.

    Args:
        report: the crawl's counters.
        now: the crawl's end, epoch seconds (this process's clock).
        unhosted: requests refused with no host to count them on, by reason: ``no_host`` (their URL has none,
            ``polite/refused/no_host``) and ``invalid_host`` (the URL Standard rejects it,
            ``polite/refused/invalid_host``).
    """
    # A host this crawl never touched (only listed at start as in backoff from the pace table) is not in it.
    hosts = {host: c for host, c in report.hosts.items() if c.active}
    elapsed = max(0.0, now - report.started)
    turn = sum(c.turn_waits for c in hosts.values())
    parts = _totals(hosts, unhosted or {})
    backing_off = format_duration(min(elapsed, Span.union(c.backing_off for c in hosts.values()).seconds(until=now)))
    in_line = format_duration(min(elapsed, report.turn_span.seconds(until=now)))
    lines = [f"scrapy-polite summary: {plural(len(hosts), 'host')} in {format_duration(elapsed)}: "
             + ", ".join(parts) + f"; backing off during {backing_off} of the crawl; {plural(turn, 'turn wait')} "
             f"(held out of the downloader or in line; some request in line during {in_line} of the crawl)"]
    if hosts:
        rows = [COLUMNS, *(_host_row(host, c, now) for host, c in sorted(hosts.items()))]
        lines.append(format_table(rows, "  ", right=range(1, len(COLUMNS))))  # counts to the right
    for host, c in sorted(hosts.items()):
        if c.robots_unreachable_since is not None:
            lines.append(f"  {host}: {_robots_words(c, now)} at close: its requests were held, not sent")
    for host, c in sorted(hosts.items()):
        if c.given_up:
            more = f" and {c.given_up - len(c.given_up_urls)} more" if c.given_up > len(c.given_up_urls) else ""
            lines.append(f"  given up on {host}: {', '.join(c.given_up_urls)}{more}")
    return "\n".join(lines)


def _totals(hosts: Mapping[str, HostCounters], unhosted: Mapping[str, int]) -> list[str]:
    """The totals line's counts: requests, pages given up, throttles and backoff steps, deferred and refused by
    reason (``unhosted``: the refusals with no host to count them on, by reason)."""
    deferred: dict[str, int] = {}
    refused: dict[str, int] = {}
    for c in hosts.values():
        for reason, n in c.slowed_deferrals.items():
            deferred[reason] = deferred.get(reason, 0) + n
        for reason, n in c.refusals.items():
            refused[reason] = refused.get(reason, 0) + n
    for reason, n in unhosted.items():
        if n:
            refused[reason] = refused.get(reason, 0) + n
    throttles = sum(c.throttles for c in hosts.values())
    steps = sum(c.backoff_steps for c in hosts.values())
    parts = [plural(sum(c.requests for c in hosts.values()), "request"),
             f"{plural(sum(c.given_up for c in hosts.values()), 'page')} given up",
             f"{plural(throttles, 'throttle')} ({plural(steps, 'backoff step')})"]
    if deferred:
        parts.append(f"{sum(deferred.values())} deferred ("
                     + ", ".join(f"{n} {reason_words(r)}" for r, n in sorted(deferred.items())) + ")")
    else:
        parts.append("0 deferred")
    if refused:
        parts.append(f"{sum(refused.values())} refused ("
                     + ", ".join(f"{n} {REFUSAL_WORDS.get(r, r)}" for r, n in sorted(refused.items())) + ")")
    else:
        parts.append("0 refused")
    return parts


def _host_row(host: str, c: HostCounters, now: float) -> tuple[str, ...]:
    """A host's cells under :data:`COLUMNS` (``now``: the crawl's end, epoch s)."""
    backing = c.backing_off.seconds(until=now)
    return (host, str(c.requests), str(c.given_up), str(c.throttles), str(c.backoff_steps),
            format_duration(backing) if backing else "-",
            f"{c.turn_waits} ({format_duration(c.turn_wait_seconds)})" if c.turn_waits else "-",
            _cell_deferred(c), _cell_refused(c))
