"""The verbs on the pace table: ``hosts``, ``show``, ``reset``, ``crawl-delay`` and ``expire``
(docs/guides/operating.md, "The operator command"). Each takes the verb's run (:class:`~.context.Operator`) and
returns its exit status (:mod:`.help`); its parser names it (``set_defaults(func=...)``, :mod:`.parsing`).
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from scrapy.exceptions import UsageError

from ..policy import HostState, PacingPolicy, ip_key
from ..reports.events import clock_time, describe
from ..reports.words import format_due, format_duration, format_relative, format_table, format_time, iso_time, plural
from ..stores import TABLE_KEY, Event
from .context import NoSuchHost, Operator
from .frontier import print_shared_frontier
from .help import EXIT_NO_HOST, EXIT_OK
from .inputs import read_seconds, target_key
from .rows import (
    ADDRESS_COLUMNS,
    EVENT_COLUMNS,
    HOST_COLUMNS,
    SHOWN_FIELDS,
    UNSPOKEN,
    adaptive_cells,
    event_json,
    field_words,
    hold_cells,
    host_cells,
    host_json,
    last_throttle,
    last_throttles,
    next_words,
    quota_cells,
    recorded,
    robots_cells,
)

__all__ = ["CRAWL_DELAY_ARGS", "check_crawl_delay", "crawl_delay", "expire", "hosts", "reset", "show"]

#: What ``crawl-delay`` takes.
CRAWL_DELAY_ARGS = "crawl-delay takes HOST SECONDS, or HOST --clear"


# -- hosts -------------------------------------------------------------------------------------------------------

def hosts(op: Operator) -> int:
    """``scrapy polite hosts [--throttled] [--json]``: every host, sorted by when it is due; then, with the shared
    frontier, what waits in Redis (:func:`~.frontier.print_shared_frontier`)."""
    rows = [(k, s) for k, s in op.store.items() if k != TABLE_KEY]  # the table's identity is not a host
    addresses = sum(1 for k, _ in rows if k.startswith("ip:"))
    listed = [(k, s) for k, s in rows if not k.startswith("ip:")]
    if op.opts.throttled:
        listed = [(k, s) for k, s in listed if s.consec > 0]
    listed.sort(key=lambda item: (max(item[1].next_allowed, op.now), item[0]))
    throttles = last_throttles(op.store, listed, op.config.event_log_size)
    if op.opts.json:
        op.dump({"store": op.store.uri, "now": op.now, "now_at": iso_time(op.now), "address_rows": addresses,
                 "hosts": [host_json(k, s, op.now, throttles[k], op.policy) for k, s in listed]})
        return EXIT_OK
    which = plural(len(listed), "throttled host" if op.opts.throttled else "host")
    which += " (backoff steps > 0)" if op.opts.throttled else ""
    op.print(f"pace table {op.store.uri}: {which}, {plural(addresses, 'address row')}; now {format_time(op.now)}")
    if listed:
        op.print(format_table([HOST_COLUMNS, *(host_cells(k, s, op.now, throttles[k], op.policy)
                                               for k, s in listed)]))
    backing = [k for k, s in listed if s.consec > 0]
    if backing:
        op.print(op.forgive_words(backing))
    print_shared_frontier(op.settings, op.config, op.out, op.err)
    return EXIT_OK


# -- show --------------------------------------------------------------------------------------------------------

def show(op: Operator) -> int:
    """``scrapy polite show HOST_OR_URL [--events N] [--json]``: one host's row in words, its address rows, its
    recent events; or an address row (``ip:ADDRESS``) and the bookings made on it.

    Raises:
        NoSuchHost: neither a row nor events.
    """
    key = target_key(op.opts.target)
    state = op.store.get(key)
    limit = op.opts.events if op.opts.events is not None else 20
    on_address = key.startswith("ip:")  # an address row: the bookings made on it (of any host)
    events = _recent_events(op, key, limit, on_address=on_address)
    if state is None and not events and (on_address or not op.store.events(host=key, limit=1)):
        raise NoSuchHost(f"{key}: not in the pace table {op.store.uri} (and no events); "
                         "`scrapy polite hosts` lists the hosts")
    address_rows = [] if on_address else _address_rows(op, key)
    throttle = last_throttle(op.store, key, state) if state is not None else None
    if op.opts.json:
        op.dump({
            "store": op.store.uri, "now": op.now, "now_at": iso_time(op.now), "host": key,
            "row": None if state is None else host_json(key, state, op.now, throttle, op.policy),
            "addresses": [{"address": k, "next_allowed": s.next_allowed or None,
                           "next_allowed_at": iso_time(s.next_allowed),
                           "next_allowed_in": round(max(0.0, s.next_allowed - op.now), 3),
                           "updated": s.updated or None, "updated_at": iso_time(s.updated)} for k, s in address_rows],
            "events": [event_json(e) for e in events],
        })
        return EXIT_OK
    op.print(f"{key} in the pace table {op.store.uri}; now {format_time(op.now)}")
    if state is None:
        op.print("  no row (its events are below)")
    else:
        _print_row(op, key, state, throttle)
    if not on_address:
        op.print("\naddress rows (the addresses it was booked on):")
        lines = [(k, next_words(s, op.now), format_relative(s.updated, op.now)) for k, s in address_rows]
        op.print(format_table([ADDRESS_COLUMNS, *lines], indent="  ") if lines else "  none")
    _print_events(op, events, limit, on_address=on_address)
    return EXIT_OK


def _recent_events(op: Operator, key: str, limit: int, *, on_address: bool) -> list[Event]:
    """The host's latest ``limit`` events; for an address row, the latest ``limit`` bookings made on it."""
    if not limit:
        return []
    if not on_address:
        return op.store.events(host=key, limit=limit)
    recent = op.store.events(limit=max(2000, 50 * limit))
    return [e for e in recent if e.kind == "booking" and e.address is not None and ip_key(e.address) == key][-limit:]


def _address_rows(op: Operator, key: str) -> list[tuple[str, HostState]]:
    """The address rows of the addresses the host was booked on, latest first (an IP-literal host's own first)."""
    booked = op.store.events(host=key, limit=2000)
    address_keys = list(dict.fromkeys(ip_key(e.address) for e in reversed(booked) if e.kind == "booking" and e.address))
    try:
        address_keys.insert(0, ip_key(key))  # an IP-literal host has its own address row
    except ValueError:
        pass
    return [(k, s) for k in dict.fromkeys(address_keys) if (s := op.store.get(k)) is not None]


def _print_row(op: Operator, key: str, state: HostState, throttle: Event | None) -> None:
    """The host's row, a line per field in words (docs/guides/operating.md, "The other fields show prints")."""
    cells = host_cells(key, state, op.now, throttle, op.policy)
    width = max(len(c) for c in (*HOST_COLUMNS[1:], "Retry-After scale"))
    on_address = key.startswith("ip:")  # an address row has a pace, no backoff, Crawl-delay or 2xx of its own
    for column, cell in zip(HOST_COLUMNS[1:], cells[1:]):
        if not on_address or column in ADDRESS_COLUMNS:
            op.print(f"  {column:<{width}}  {cell}")
    for label, cell in (*robots_cells(state), *quota_cells(state, op.now), *adaptive_cells(state),
                        *hold_cells(state, op.now)):
        op.print(f"  {label:<{width}}  {cell}")
    if state.consec > 0 and state.run_retry_after:
        op.print(f"  {'Retry-After scale':<{width}}  {state.run_retry_after:g} s (the largest Retry-After of "
                 "this run of throttles: no success leaves more)")
    extra = {f.name: getattr(state, f.name) for f in fields(state)
             if f.name not in SHOWN_FIELDS and getattr(state, f.name)}
    for name, value in extra.items():  # a field added to HostState later: shown by its name
        op.print(f"  {name.replace('_', ' '):<{width}}  {f'{value:g}' if isinstance(value, float) else value}")
    if state.consec > 0:
        op.print(f"  {op.forgive_words([key])}")


def _print_events(op: Operator, events: list[Event], limit: int, *, on_address: bool) -> None:
    which = "bookings on this address" if on_address else "events"
    op.print(f"\nrecent {which} (the latest {limit}):" if limit else f"\nrecent {which}: --events 0")
    if events:
        op.print(format_table([EVENT_COLUMNS, *((clock_time(e.at, date=True), e.kind, describe(e), e.url or "")
                                                for e in events)], indent="  "))
    elif limit:
        op.print("  none (POLITE_EVENT_LOG off, or nothing recorded yet)")


# -- reset -------------------------------------------------------------------------------------------------------

def _forget(state: HostState | None, now: float) -> tuple[HostState | None, HostState | None]:
    """``reset``'s update of one row: the row forgiven (:meth:`PacingPolicy.reset`), and the row as it was."""
    return (PacingPolicy.reset(state, now=now), state) if state is not None else (None, None)


def reset(op: Operator) -> int:
    """``scrapy polite reset HOST_OR_URL... [--json]``: forget each host's backoff steps and hold (its Crawl-delay,
    address rows and events are kept); exit 1 when a host is not in the table (the others are reset)."""
    status = EXIT_OK
    results = []
    for key in [target_key(a) for a in op.opts.targets]:
        old = op.store.update(key, _forget)
        if old is None:
            status = EXIT_NO_HOST
            print(f"{key}: not in the pace table {op.store.uri} (nothing to reset)", file=op.err)
            results.append({"host": key, "reset": False})
            continue
        new = op.store.get(key) or HostState()
        forgot = [field_words(f.name, getattr(old, f.name), op.now) for f in fields(old)
                  if f.name not in UNSPOKEN and getattr(old, f.name) != getattr(new, f.name)
                  and not (f.name == "next_allowed" and old.next_allowed <= op.now)]  # (a moment passed held nothing)
        kept = [field_words(f.name, getattr(new, f.name), op.now) for f in fields(new)
                if f.name not in UNSPOKEN and recorded(f.name, getattr(new, f.name))
                and getattr(old, f.name) == getattr(new, f.name)]
        op.operator_event(key, "reset", steps=old.consec, due=old.next_allowed or None)
        results.append({"host": key, "reset": True, "forgot": forgot, "kept": kept})
        if not op.opts.json:
            op.print(f"{key}: reset; forgot {', '.join(forgot) or 'nothing (it was clear)'}; "
                     f"kept {''.join(k + ', ' for k in kept)}its address rows and its events")
    if op.opts.json:
        op.dump({"store": op.store.uri, "results": results})
    return status


# -- crawl-delay -------------------------------------------------------------------------------------------------

def check_crawl_delay(opts: argparse.Namespace) -> None:
    """``crawl-delay``'s arguments, before any store is opened: SECONDS or ``--clear``, one of them.

    Raises:
        UsageError: both, or neither.
    """
    if opts.clear == (opts.seconds is not None):
        raise UsageError(CRAWL_DELAY_ARGS, print_help=False)


def crawl_delay(op: Operator) -> int:
    """``scrapy polite crawl-delay HOST SECONDS|--clear [--json]``: set the operator's Crawl-delay of the host, until a
    robots.txt of the host changes its delay, or remove it (the largest delay the host's origins publish then
    holds; docs/spec.md §2, "A host's origins").

    Raises:
        NoSuchHost: ``--clear`` on a host not in the table.
    """
    clear = bool(op.opts.clear)
    key = target_key(op.opts.target)
    value = None if clear else read_seconds(op.opts.seconds)

    def fn(state: HostState | None, now: float) -> tuple[HostState | None, tuple[HostState | None, float]]:
        if state is None and clear:
            return None, (None, 0.0)
        new = PacingPolicy.with_crawl_delay(state, value, now=now)
        return new, (new, state.crawl_delay if state else 0.0)

    new, before = op.store.update(key, fn)
    if new is None:
        raise NoSuchHost(f"{key}: not in the pace table {op.store.uri} (no Crawl-delay to clear)")
    delay = new.crawl_delay
    op.operator_event(key, "crawl-delay cleared" if clear else f"crawl-delay {delay:g} s", delay=delay)
    if op.opts.json:
        op.dump({"store": op.store.uri, "host": key, "crawl_delay": delay or None, "was": before or None})
        return EXIT_OK
    was = f"{before:g} s" if before else "none"
    if clear:
        now = f"{delay:g} s, the largest its origins' robots.txt publish" if delay else "none"
        op.print(f"{key}: the operator's Crawl-delay removed (was {was}); the host's Crawl-delay is now {now}.")
    else:
        op.print(f"{key}: Crawl-delay {delay:g} s (was {was}), for every port of the host, until a robots.txt of the "
                 f"host changes a delay it published (the largest delay the host's origins publish then "
                 f"holds again); next allowed {format_due(new.next_allowed, op.now)} "
                 f"(scrapy polite reset {key} forgets the hold); POLITE_HOST_DELAYS sets a lasting delay.")
    return EXIT_OK


# -- expire ------------------------------------------------------------------------------------------------------

def expire(op: Operator) -> int:
    """``scrapy polite expire [--json]``: remove the rows idle longer than ``POLITE_STORE_EXPIRE`` (seconds)."""
    removed = op.store.expire(op.now - op.config.store_expire)
    if op.opts.json:
        op.dump({"store": op.store.uri, "expired": removed, "idle_longer_than": op.config.store_expire})
    else:
        op.print(f"expired {plural(removed, 'row')} from {op.store.uri} (idle longer than POLITE_STORE_EXPIRE = "
                 f"{format_duration(op.config.store_expire)})")
    return EXIT_OK
