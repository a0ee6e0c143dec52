"""A host's row of the pace table in the command's words (``scrapy polite hosts``, ``show``, ``reset``): its cells,
its lines in ``show``, its JSON, the event of its last throttle. One vocabulary: the columns
(:data:`HOST_COLUMNS`) are the words of the closing summary and of the example's table; a JSON key is its column's
name lower-cased, with spaces and dashes as underscores (``backoff steps`` → ``backoff_steps``, ``Crawl-delay`` →
``crawl_delay``), times in epoch seconds with an ``_at`` twin in ISO 8601.
"""

from __future__ import annotations

from typing import Any

from ..policy import HostState, PacingPolicy
from ..policy.robots import OPERATOR, RESTORED, published_delays
from ..reports.events import describe, throttle_cause
from ..reports.words import format_due, format_duration, format_relative, iso_time, plural
from ..stores import Event, PaceStore

__all__ = [
    "ADDRESS_COLUMNS",
    "EVENT_COLUMNS",
    "HOST_COLUMNS",
    "SHOWN_FIELDS",
    "UNSPOKEN",
    "adaptive_cells",
    "robots_cells",
    "event_json",
    "field_words",
    "hold_cells",
    "host_cells",
    "next_words",
    "host_json",
    "last_throttle",
    "last_throttles",
    "quota_cells",
    "recorded",
]

#: The columns of ``hosts`` (and the host part of ``show``), in the words of the summary and the example.
HOST_COLUMNS = ("host", "next allowed", "backoff steps", "Crawl-delay", "2xx seen", "updated", "last throttle")

#: The columns of an address row (``ip:ADDRESS``, the per-address budget).
ADDRESS_COLUMNS = ("address", "next allowed", "updated")

#: The columns of an event line of ``show``.
EVENT_COLUMNS = ("at", "event", "what", "url")


def last_throttle(store: PaceStore, key: str, state: HostState) -> Event | None:
    """The event of the host's last throttle (its cause), from the event log: the throttled response, failure or
    backoff step recorded at the row's ``throttled_at`` (the latest before it when none is exactly there). A
    throttle past the step cap writes no ``backoff`` event; its response says the cause
    (:func:`~scrapy_polite.reports.events.throttle_cause`)."""
    if not state.throttled_at:
        return None
    found = [e for e in store.events(since=state.throttled_at - 1.0, host=key, limit=100_000)
             if e.at <= state.throttled_at and throttle_cause(e) is not None]
    exact = [e for e in found if e.at == state.throttled_at]
    chosen = exact or found
    return chosen[-1] if chosen else None


#: Seconds a crawl's events may wait in its memory before they are written (its log's batches, one flush interval
#: apart, and the write itself).
_LOG_LAG = 2.0


def _throttle_words(event: Event | None, state: HostState, now: float) -> str:
    if not state.throttled_at:
        return "-"
    when = format_relative(state.throttled_at, now)
    cause = throttle_cause(event) if event is not None else None
    if event is None or cause is None:
        if now - state.throttled_at <= _LOG_LAG:  # its process writes its events in batches a second apart
            return f"{when} (cause not written to the event log yet)"
        return f"{when} (cause not in the event log)"
    if event.retry_after is not None and event.retry_after > 0:
        cause += f", Retry-After {event.retry_after:g} s"
    return f"{cause}, {when}"


def _after_success(state: HostState, policy: PacingPolicy) -> float | None:
    """The delay (s) the host's next success leaves, while it has backoff steps (None without)."""
    return policy.success_delay(state) if state.consec > 0 else None


def _steps_words(state: HostState, policy: PacingPolicy) -> str:
    """The ``backoff steps`` cell: the steps, and what the next success leaves (docs/spec.md §2: one step off, at
    most the run's largest Retry-After): ``9 (3 s after a success)``."""
    after = _after_success(state, policy)
    return str(state.consec) if after is None else f"{state.consec} ({format_duration(after)} after a success)"


def host_json(key: str, state: HostState, now: float, throttle: Event | None,
              policy: PacingPolicy) -> dict[str, Any]:
    """The host's row as ``--json`` gives it (see the module): seconds, and epoch seconds with an ``_at`` twin."""
    return {
        "host": key,
        "next_allowed": state.next_allowed or None,
        "next_allowed_at": iso_time(state.next_allowed),
        "next_allowed_in": round(max(0.0, state.next_allowed - now), 3),
        "backoff_steps": state.consec,
        "after_success": _after_success(state, policy),
        "retry_after_scale": state.run_retry_after or None,
        "crawl_delay": state.crawl_delay or None,
        "origin_delays": published_delays(state.origin_delays) or None,
        "2xx_seen": state.ok_seen,
        "updated": state.updated or None,
        "updated_at": iso_time(state.updated),
        "ratelimit_interval": state.ratelimit_interval or None,
        "ratelimit_until": state.ratelimit_until or None,
        "ratelimit_until_at": iso_time(state.ratelimit_until),
        "latency": state.latency or None,
        "strain": state.strain,
        "quota_left": state.quota_left if state.quota_left >= 0 else None,
        "quota_reset": state.quota_reset or None,
        "quota_reset_at": iso_time(state.quota_reset),
        "quota_limit": state.quota_limit or None,
        "quota_window": state.quota_window or None,
        "booked": state.booked,
        "quota_serial": state.quota_serial,
        "last_throttle": None if not state.throttled_at else {
            "at": state.throttled_at, "at_iso": iso_time(state.throttled_at),
            "cause": throttle_cause(throttle) if throttle is not None else None,
            "retry_after": throttle.retry_after if throttle is not None else None,
            "delay": throttle.delay if throttle is not None else None},
    }


def host_cells(key: str, state: HostState, now: float, throttle: Event | None,
               policy: PacingPolicy) -> tuple[str, ...]:
    """The host's cells under :data:`HOST_COLUMNS` (``now``: the store's clock, epoch s; ``throttle``: the event of
    its last throttle, :func:`last_throttle`)."""
    return (key, next_words(state, now), _steps_words(state, policy),
            f"{state.crawl_delay:g} s" if state.crawl_delay else "-", "yes" if state.ok_seen else "no",
            format_relative(state.updated, now), _throttle_words(throttle, state, now))


#: The row's fields ``show`` names in its own words (the host columns, the announced quota and its count,
#: adaptive pacing's numbers, the Retry-After scale); any other is shown by its name.
SHOWN_FIELDS = ("next_allowed", "consec", "crawl_delay", "ok_seen", "updated", "throttled_at",
                 "ratelimit_interval", "ratelimit_until", "run_retry_after", "quota_left", "quota_reset",
                 "quota_limit", "quota_window", "quota_serial", "booked", "latency", "strain", "held_until",
                 "held_by", "origin_delays")


def quota_cells(state: HostState, now: float) -> list[tuple[str, str]]:
    """The announced quota's lines of ``show`` (docs/guides/operating.md, "The other fields show prints", and
    docs/guides/quotas.md), each only when it holds something:

    * ``rate limit``: the interval its quota allows (``w / q``, seconds);
    * ``quota spent``: the host is held until its reset, while the hold lasts;
    * ``quota left``: the requests its quota still allows before its reset, as the table counts them (every
      request booked since the answer that said it taken off); not shown while no quota is known (-1);
    * ``quota reset``: when the quota is replenished next (the moment passed: the next booking refills it);
    * ``quota size``: ``q`` requests per ``w`` seconds, as announced;
    * ``booked``: how many requests were booked on the host (their serial numbers), and, when the host has
      announced a quota, which one's answer counted it last (``quota_serial``): the requests booked since are on
      their way, or were never answered with a quota.
    """
    cells = []
    if state.ratelimit_interval:
        cells.append(("rate limit", f"1 request per {state.ratelimit_interval:g} s"))
    if state.ratelimit_until > now:  # a hold whose reset has passed is history: nothing to show
        cells.append(("quota spent", f"until {format_due(state.ratelimit_until, now)}"))
    if state.quota_left >= 0:
        until = "its reset" if state.quota_reset else "its reset (not known)"
        cells.append(("quota left", f"{plural(state.quota_left, 'request')} until {until}"))
    if state.quota_reset:
        when = (format_due(state.quota_reset, now) if state.quota_reset > now
                else f"{format_relative(state.quota_reset, now)} (the next booking refills the quota)")
        cells.append(("quota reset", when))
    if state.quota_limit:
        per = f" per {format_duration(state.quota_window)}" if state.quota_window else " (no window announced)"
        cells.append(("quota size", f"{plural(state.quota_limit, 'request')}{per}"))
    if state.booked:
        booked = plural(state.booked, "request")
        if state.quota_limit or state.quota_left >= 0 or state.ratelimit_interval:  # (a quota is or was announced)
            since = state.booked - state.quota_serial
            counted = (f"the answer to request {state.quota_serial} counted the quota last, {since} booked since"
                       if state.quota_serial else "no answer counted yet")
            booked += f" ({counted})"
        cells.append(("booked", booked))
    return cells


def next_words(state: HostState, now: float) -> str:
    """The ``next allowed`` cell: when the next request may start; while a request is on its way (its in-flight
    hold, docs/spec.md §3), after its answer (trial: "now" for a host no crawl would book for another 20 s)."""
    if state.held_until > now and state.next_allowed < state.held_until:
        return f"one interval after the answer in flight (at the latest {format_due(state.held_until, now)})"
    return format_due(state.next_allowed, now)


def hold_cells(state: HostState, now: float) -> list[tuple[str, str]]:
    """The in-flight hold's line of ``show`` (docs/spec.md §3, "In flight"), while it lasts: ``in flight`` (a
    request booked on the host is on its way; no process books it before its answer, or this bound)."""
    if state.held_until <= now:
        return []
    return [("in flight", f"a request is on its way: no booking before its answer (should its process have "
                          f"died, its hold ends {format_due(state.held_until, now)})")]


def adaptive_cells(state: HostState) -> list[tuple[str, str]]:
    """Adaptive pacing's lines of ``show`` (docs/spec.md §2, "Adaptive pacing"), when measured: ``latency`` (the
    smoothed download time, seconds) and ``strain`` (5xx answers and failures not yet earned back)."""
    cells = []
    if state.latency:
        cells.append(("latency", f"{state.latency:.3f} s (smoothed download time)"))
    if state.strain:
        cells.append(("strain", f"{state.strain} (5xx answers and failures not yet earned back)"))
    return cells


def robots_cells(state: HostState) -> list[tuple[str, str]]:
    """The ``robots.txt delays`` line of ``show``, when the host's origins publish any (docs/spec.md §2, "A host's
    origins"): each origin's delay, the largest (the Crawl-delay in force) first."""
    delays = published_delays(state.origin_delays)
    if not delays:
        return []
    return [("robots.txt delays", _delays_words(delays))]


def _delays_words(delays: dict[str, float]) -> str:
    """Each entry's delay, the operator's first, then the largest: ``the operator's 5 s (until a robots.txt
    changes)``, ``https://example.com 2 s (for mybot/1.0)``."""
    words = []
    for name, delay in sorted(delays.items(), key=lambda item: (item[0] not in (OPERATOR, RESTORED), -item[1])):
        origin, _, agent = name.partition(" ")
        if name == OPERATOR:
            words.append(f"the operator's {delay:g} s (until a robots.txt changes)")
        elif name == RESTORED:
            words.append(f"restored {delay:g} s (until a robots.txt is read)")
        else:
            words.append(f"{origin} {delay:g} s" + (f" (for {agent})" if agent else ""))
    return ", ".join(words)


def event_json(event: Event) -> dict[str, Any]:
    """An event as ``show --json`` gives it: its fields, its time in ISO 8601 (``at_iso``), and in words (``what``)."""
    data = event._asdict()
    data["at_iso"] = iso_time(event.at)
    data["what"] = describe(event)
    return data


def last_throttles(store: PaceStore, hosts: list[tuple[str, HostState]], log_size: int) -> dict[str, Event | None]:
    """The event of each host's last throttle (:func:`last_throttle`): one query per host for a few, else one
    pass over the whole log (a query per host would scan it once each; ``log_size``: ``POLITE_EVENT_LOG_SIZE``)."""
    throttled = {k: s for k, s in hosts if s.throttled_at}
    found: dict[str, Event | None] = dict.fromkeys(k for k, _ in hosts)
    if len(throttled) <= 20:
        found.update({k: last_throttle(store, k, s) for k, s in throttled.items()})
        return found
    since = min(s.throttled_at for s in throttled.values()) - 1.0
    for event in store.events(since=since, limit=log_size):
        state = throttled.get(event.host)
        if state is not None and event.at <= state.throttled_at and throttle_cause(event) is not None:
            found[event.host] = event  # the log is in time order: the last one at or before wins
    return found


#: Row fields ``reset`` does not speak of: bookkeeping, not the host's numbers (the quota booking's serials).
UNSPOKEN = frozenset({"updated", "booked", "quota_serial"})


def recorded(name: str, value: Any) -> bool:
    """A row's field holds something (``quota_left`` -1: no quota known)."""
    return bool(value) and not (name == "quota_left" and value < 0)


def field_words(name: str, value: Any, now: float) -> str:
    """A row's field in the command's words, for ``reset``."""
    if name == "next_allowed":
        return f"next allowed {format_due(value, now)}"
    if name == "consec":
        return plural(value, "backoff step")
    if name == "ok_seen":
        return "2xx seen" if value else "2xx not seen"
    if name == "crawl_delay":
        return f"Crawl-delay {value:g} s" if value else "no Crawl-delay"
    if name == "origin_delays":
        delays = published_delays(value)
        return f"robots.txt delays {_delays_words(delays)}" if delays else "no robots.txt delays"
    if name == "throttled_at":
        return f"last throttle ({format_relative(value, now)})" if value else "no throttle"
    if name == "quota_left":
        return f"{plural(value, 'request')} left of the quota" if value >= 0 else "no quota left known"
    if name == "quota_reset":
        return f"quota reset ({format_relative(value, now)})" if value else "no quota reset"
    if isinstance(value, float):
        words = name.replace("_", " ")
        if name.endswith(("_until", "_at")):
            return f"{words} ({format_relative(value, now)})"
        return f"{words} {value:g} s"
    return f"{name.replace('_', ' ')} {value}"
