"""``scrapy polite`` — the operator command for the pace table and its event log (docs/guides/operating.md).

Usage (inside a Scrapy project, or with ``--store URI`` / ``-s POLITE_STORE=...``; every store URI works)::

    scrapy polite hosts [--throttled] [--json]
    scrapy polite show HOST_OR_URL [--events N] [--json]
    scrapy polite reset HOST_OR_URL... [--json]
    scrapy polite crawl-delay HOST SECONDS|--clear [--json]
    scrapy polite expire [--json]
    scrapy polite timeline [--since WHEN] [--host HOST]... [-o PATH] [--format svg|html] [--json]
    scrapy polite audit [--since WHEN] [--json]
    scrapy polite --help                 # the verbs, one line each (:data:`VERB_HELP`); VERB --help: its own

Each verb is an argparse sub-command (:class:`VerbParsers`); Scrapy's parser takes ``--store`` and Scrapy's
global options (``-s NAME=VALUE``...) before or after the verb (:func:`add_global_options`).

Exit status: :data:`EXIT_OK` 0 done; :data:`EXIT_NO_HOST` 1 no such host (or no events to draw);
:data:`EXIT_USAGE` 2 usage (an unknown verb or option, a bad value, an invalid setting); :data:`EXIT_STORE` 3
the store is unusable (missing, unreadable, unwritable, unreachable); :data:`EXIT_OUTPUT` 4 the timeline could
not be written. ``audit`` has its own: :data:`EXIT_OK` 0 every rule kept,
:data:`EXIT_VIOLATED` 1 a rule was broken, :data:`EXIT_BAD_LOG` 2 the log cannot be audited (truncated,
incomplete, corrupt, or empty), 3 the store is unusable.

One vocabulary: the columns (:data:`HOST_COLUMNS`) are the words of the closing summary and of the example's
table; a JSON key is its column's name lower-cased, with spaces and dashes as underscores (``backoff steps`` →
``backoff_steps``, ``Crawl-delay`` → ``crawl_delay``), times in epoch seconds with an ``_at`` twin in ISO 8601.

Registered through the ``scrapy.commands`` entry point of the package.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime
from typing import IO, Any, ClassVar, NoReturn

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings, Settings

from .audit import LogError, audit, format_report, report_json
from .events import clock_time, describe, process_source, throttle_cause
from .frontier_report import waiting_in_redis
from .pacer import default_store_uri
from .policy import HostState, PacingPolicy, host_key, ip_key
from .settings import PoliteConfig, SettingsError
from .stores import TABLE_KEY, Event, PaceStore, StoreCorrupt, StoreError, StoreOptions, open_store, sqlite_path
from .summary import reset_command
from .timeline import FORMATS, hosts_of, timeline_format, write_timeline
from .vocabulary import parse_seconds

__all__ = [
    "Command",
    "EXIT_BAD_LOG",
    "EXIT_NO_HOST",
    "EXIT_OK",
    "EXIT_OUTPUT",
    "EXIT_STORE",
    "EXIT_USAGE",
    "EXIT_VIOLATED",
    "HOST_COLUMNS",
    "VERBS",
    "VERB_HELP",
    "VerbParsers",
    "add_global_options",
    "format_table",
    "parse_since",
    "run_command",
]

EXIT_OK = 0
EXIT_NO_HOST = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_OUTPUT = 4
#: ``audit``: a rule was broken.
EXIT_VIOLATED = 1
#: ``audit``: the log cannot be audited (truncated, incomplete, corrupt or empty).
EXIT_BAD_LOG = 2

VERBS = ("hosts", "show", "reset", "crawl-delay", "expire", "timeline", "audit")

#: The columns of ``hosts`` (and the host part of ``show``), in the words of the summary and the example.
HOST_COLUMNS = ("host", "next allowed", "backoff steps", "Crawl-delay", "2xx seen", "updated", "last throttle")

#: The columns of an address row (``ip:ADDRESS``, the per-address budget).
ADDRESS_COLUMNS = ("address", "next allowed", "updated")

#: The columns of an event line of ``show``.
EVENT_COLUMNS = ("at", "event", "what", "url")


class _NoSuchHost(Exception):
    """Exit 1: the host (or events to draw) is not in the table; the message says which."""


class _BadLog(Exception):
    """``audit``'s exit 2: the log cannot be audited; the message says why and the fix."""


# -- words -----------------------------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    """``0.4 s``, ``12.0 s``, ``4 m 10 s``, ``2 h 5 m``, ``3 d 4 h`` (the closing summary's durations)."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} m"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def _relative(t: float, now: float) -> str:
    """``t`` relative to ``now``: ``in 12.0 s``, ``now``, ``3.0 s ago``; ``-`` for 0 (never)."""
    if not t:
        return "-"
    delta = t - now
    if abs(delta) < 0.05:
        return "now"
    return f"in {_duration(delta)}" if delta > 0 else f"{_duration(delta)} ago"


def _due(t: float, now: float) -> str:
    """When a host is next allowed: ``in 4 m 10 s (at 10:15:02)`` (the date too beyond a day), or ``now`` when
    that moment has passed (the closing summary's ``due``)."""
    if t - now < 0.05:
        return "now"
    at = time.strftime("%H:%M:%S" if t - now < 86400 else "%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f"in {_duration(t - now)} (at {at})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _absolute(t: float) -> str:
    return "-" if not t else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _iso(t: float | None) -> str | None:
    return None if not t else datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def format_table(rows: list[tuple[str, ...]], indent: str = "") -> str:
    """Rows of text (the first the header) as aligned columns."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# -- inputs ----------------------------------------------------------------------------------------------------

def _key(text: str) -> str:
    """The pace-table key of ``HOST_OR_URL`` (a host, a URL, or an address row ``ip:ADDRESS``).

    Raises:
        UsageError: neither a host nor a URL.
    """
    if text.lower().startswith("ip:"):
        try:
            return ip_key(text[3:].strip("[]"))
        except ValueError:
            raise UsageError(f"{text!r} is not an address row (ip:ADDRESS)", print_help=False) from None
    key = host_key(text if "://" in text else f"http://{text}/")
    if key is None:
        raise UsageError(f"{text!r} is not a host name or a URL", print_help=False)
    return key


_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?)d)?(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?$")


def parse_since(text: str, now: float) -> float:
    """``--since``: epoch seconds from a duration back from ``now`` (``90``, ``90s``, ``15m``, ``2h``, ``1d``,
    ``1h30m``), ``@EPOCH`` (epoch seconds), or a local date and time in ISO 8601 (``2026-05-01T12:00``,
    ``2026-05-01 12:00:00``; a time alone, ``12:00``, is today's).

    Raises:
        UsageError: none of these forms.
    """
    value = text.strip()
    if value.startswith("@"):
        try:
            stamp = float(value[1:])
        except ValueError:
            stamp = math.nan
        if math.isfinite(stamp):
            return stamp
    else:
        match = _DURATION.match(value.lower())
        if match and value and any(match.groups()):
            d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
            return now - (((d * 24 + h) * 60 + m) * 60 + s)
        try:
            if re.match(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$", value):
                today = datetime.fromtimestamp(now).strftime("%Y-%m-%d")
                return datetime.fromisoformat(f"{today}T{value}").timestamp()
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    raise UsageError(f"--since {text!r}: expected a duration back from now (90s, 15m, 2h, 1d), @EPOCH seconds, "
                     "or a local date and time (2026-05-01T12:00, 12:00)", print_help=False)


def _seconds(text: str) -> float:
    value = parse_seconds(text)
    if value is None:
        raise UsageError(f"expected a number of seconds >= 0, got {text!r} (--clear removes the delay)",
                         print_help=False)
    return value


def _count_arg(text: str) -> int:
    """``--events N``: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type`` that checks a value with ``check`` before any store is opened (its
    :class:`UsageError` is the usage error) and keeps the text as given."""
    def checked(text: str) -> str:
        try:
            check(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    return checked


def _since_form(text: str) -> float:
    """``--since``'s form, checked against the present (its moment is computed on the store's clock)."""
    return parse_since(text, time.time())


# -- the rows --------------------------------------------------------------------------------------------------

def _last_throttle(store: PaceStore, key: str, state: HostState) -> Event | None:
    """The event of the host's last throttle (its cause), from the event log: the throttled response, failure or
    backoff step recorded at the row's ``throttled_at`` (the latest before it when none is exactly there). A
    throttle past the step cap writes no ``backoff`` event; its response says the cause
    (:func:`~scrapy_polite.events.throttle_cause`)."""
    if not state.throttled_at:
        return None
    found = [e for e in store.events(since=state.throttled_at - 1.0, host=key, limit=100_000)
             if e.at <= state.throttled_at and throttle_cause(e) is not None]
    exact = [e for e in found if e.at == state.throttled_at]
    chosen = exact or found
    return chosen[-1] if chosen else None


def _throttle_words(event: Event | None, state: HostState, now: float) -> str:
    if not state.throttled_at:
        return "-"
    when = _relative(state.throttled_at, now)
    cause = throttle_cause(event) if event is not None else None
    if event is None or cause is None:
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
    return str(state.consec) if after is None else f"{state.consec} ({_duration(after)} after a success)"


def _host_json(key: str, state: HostState, now: float, throttle: Event | None,
               policy: PacingPolicy) -> dict[str, Any]:
    return {
        "host": key,
        "next_allowed": state.next_allowed or None,
        "next_allowed_at": _iso(state.next_allowed),
        "next_allowed_in": round(max(0.0, state.next_allowed - now), 3),
        "backoff_steps": state.consec,
        "after_success": _after_success(state, policy),
        "retry_after_scale": state.run_retry_after or None,
        "crawl_delay": state.crawl_delay or None,
        "2xx_seen": state.ok_seen,
        "updated": state.updated or None,
        "updated_at": _iso(state.updated),
        "ratelimit_interval": state.ratelimit_interval or None,
        "ratelimit_until": state.ratelimit_until or None,
        "ratelimit_until_at": _iso(state.ratelimit_until),
        "latency": state.latency or None,
        "strain": state.strain,
        "quota_left": state.quota_left if state.quota_left >= 0 else None,
        "quota_reset": state.quota_reset or None,
        "quota_reset_at": _iso(state.quota_reset),
        "quota_limit": state.quota_limit or None,
        "quota_window": state.quota_window or None,
        "booked": state.booked,
        "quota_serial": state.quota_serial,
        "last_throttle": None if not state.throttled_at else {
            "at": state.throttled_at, "at_iso": _iso(state.throttled_at),
            "cause": throttle_cause(throttle) if throttle is not None else None,
            "retry_after": throttle.retry_after if throttle is not None else None,
            "delay": throttle.delay if throttle is not None else None},
    }


def _host_cells(key: str, state: HostState, now: float, throttle: Event | None,
                policy: PacingPolicy) -> tuple[str, ...]:
    return (key, _due(state.next_allowed, now), _steps_words(state, policy),
            f"{state.crawl_delay:g} s" if state.crawl_delay else "-", "yes" if state.ok_seen else "no",
            _relative(state.updated, now), _throttle_words(throttle, state, now))


#: The row's fields ``show`` names in its own words (the host columns, the announced quota and its count,
#: adaptive pacing's numbers, the Retry-After scale); any other is shown by its name.
_SHOWN_FIELDS = ("next_allowed", "consec", "crawl_delay", "ok_seen", "updated", "throttled_at",
                 "ratelimit_interval", "ratelimit_until", "run_retry_after", "quota_left", "quota_reset",
                 "quota_limit", "quota_window", "quota_serial", "booked", "latency", "strain", "held_until",
                 "held_by")


def _quota_cells(state: HostState, now: float) -> list[tuple[str, str]]:
    """The announced quota's lines of ``show`` (docs/guides/operating.md, "The other fields show prints", and
    docs/guides/quotas.md), each only when it holds something:

    * ``rate limit``: the interval its quota allows (``w / q``, seconds);
    * ``quota spent``: the host is held until its reset, while the hold lasts;
    * ``quota left``: the requests its quota still allows before its reset, as the table counts them (every
      request booked since the answer that said it taken off); not shown while no quota is known (-1);
    * ``quota reset``: when the quota is replenished next (the moment passed: the next booking refills it);
    * ``quota size``: ``q`` requests per ``w`` seconds, as announced;
    * ``booked``: how many requests were booked on the host (their serial numbers), and which one's answer
      counted the quota last (``quota_serial``): the requests booked since are on their way, or were never
      answered with a quota.
    """
    cells = []
    if state.ratelimit_interval:
        cells.append(("rate limit", f"1 request per {state.ratelimit_interval:g} s"))
    if state.ratelimit_until > now:  # a hold whose reset has passed is history: nothing to show
        cells.append(("quota spent", f"until {_due(state.ratelimit_until, now)}"))
    if state.quota_left >= 0:
        until = "its reset" if state.quota_reset else "its reset (not known)"
        cells.append(("quota left", f"{_count(state.quota_left, 'request')} until {until}"))
    if state.quota_reset:
        when = (_due(state.quota_reset, now) if state.quota_reset > now
                else f"{_relative(state.quota_reset, now)} (the next booking refills the quota)")
        cells.append(("quota reset", when))
    if state.quota_limit:
        per = f" per {_duration(state.quota_window)}" if state.quota_window else " (no window announced)"
        cells.append(("quota size", f"{_count(state.quota_limit, 'request')}{per}"))
    if state.booked:
        since = state.booked - state.quota_serial
        counted = (f"the answer to request {state.quota_serial} counted the quota last, {since} booked since"
                   if state.quota_serial else "no answer counted yet")
        cells.append(("booked", f"{_count(state.booked, 'request')} ({counted})"))
    return cells


def _hold_cells(state: HostState, now: float) -> list[tuple[str, str]]:
    """The in-flight hold's line of ``show`` (docs/spec.md §3, "In flight"), while it lasts: ``in flight`` (a
    request booked on the host is on its way; no process books it before its answer, or this bound)."""
    if state.held_until <= now:
        return []
    return [("in flight", f"a request is on its way: no booking before its answer (should its process have "
                          f"died, its hold ends {_due(state.held_until, now)})")]


def _adaptive_cells(state: HostState) -> list[tuple[str, str]]:
    """Adaptive pacing's lines of ``show`` (docs/spec.md §2, "Adaptive pacing"), when measured: ``latency`` (the
    smoothed download time, seconds) and ``strain`` (5xx answers and failures not yet earned back)."""
    cells = []
    if state.latency:
        cells.append(("latency", f"{state.latency:.3f} s (smoothed download time)"))
    if state.strain:
        cells.append(("strain", f"{state.strain} (5xx answers and failures not yet earned back)"))
    return cells


def _event_json(event: Event) -> dict[str, Any]:
    data = event._asdict()
    data["at_iso"] = _iso(event.at)
    data["what"] = describe(event)
    return data


class _Operator:
    """The verbs on one open store; each returns its exit status and writes to ``out`` (results) and
    ``err`` (problems)."""

    def __init__(self, store: PaceStore, config: PoliteConfig, opts: argparse.Namespace, out: IO[str],
                 err: IO[str]) -> None:
        self.store = store
        self.config = config
        self.opts = opts
        self.out = out
        self.err = err
        self.now = store.now()

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def dump(self, data: Any) -> None:
        json.dump(data, self.out, indent=2, ensure_ascii=False)
        self.out.write("\n")

    def operator_event(self, key: str, reason: str, **extra: Any) -> None:
        if self.config.event_log:
            self.store.append_events([Event(self.store.now(), "operator", key, reason=reason, source=process_source(),
                                            **extra)])

    # -- hosts ----------------------------------------------------------------------------------------------

    def hosts(self) -> int:
        rows = [(k, s) for k, s in self.store.items() if k != TABLE_KEY]  # the table's identity is not a host
        addresses = sum(1 for k, _ in rows if k.startswith("ip:"))
        hosts = [(k, s) for k, s in rows if not k.startswith("ip:")]
        if self.opts.throttled:
            hosts = [(k, s) for k, s in hosts if s.consec > 0]
        hosts.sort(key=lambda item: (max(item[1].next_allowed, self.now), item[0]))
        throttles = self.last_throttles(hosts)
        if self.opts.json:
            self.dump({"store": self.store.uri, "now": self.now, "now_at": _iso(self.now), "address_rows": addresses,
                       "hosts": [_host_json(k, s, self.now, throttles[k], self.policy) for k, s in hosts]})
            return EXIT_OK
        which = _count(len(hosts), "throttled host" if self.opts.throttled else "host")
        which += " (backoff steps > 0)" if self.opts.throttled else ""
        self.print(f"pace table {self.store.uri}: {which}, {_count(addresses, 'address row')}; "
                   f"now {_absolute(self.now)}")
        if hosts:
            self.print(format_table([HOST_COLUMNS, *(_host_cells(k, s, self.now, throttles[k], self.policy)
                                                     for k, s in hosts)]))
        backing = [k for k, s in hosts if s.consec > 0]
        if backing:
            self.print(self.forgive_words(backing))
        return EXIT_OK

    @property
    def policy(self) -> PacingPolicy:
        return self.config.policy

    def forgive_words(self, hosts: list[str]) -> str:
        """How to forgive hosts: the ``reset`` command line (its ``--store`` when one was given)."""
        shown = hosts if len(hosts) <= 5 else [*hosts[:5], "..."]
        return (f"to forgive a host (forget its backoff steps and hold; its Crawl-delay stays): "
                f"{reset_command(shown, self.opts.store)}")

    def last_throttles(self, hosts: list[tuple[str, HostState]]) -> dict[str, Event | None]:
        """The event of each host's last throttle (:func:`_last_throttle`): one query per host for a few, else one
        pass over the whole log (a query per host would scan it once each)."""
        throttled = {k: s for k, s in hosts if s.throttled_at}
        found: dict[str, Event | None] = dict.fromkeys(k for k, _ in hosts)
        if len(throttled) <= 20:
            found.update({k: _last_throttle(self.store, k, s) for k, s in throttled.items()})
            return found
        since = min(s.throttled_at for s in throttled.values()) - 1.0
        for event in self.store.events(since=since, limit=self.config.event_log_size):
            state = throttled.get(event.host)
            if state is not None and event.at <= state.throttled_at and throttle_cause(event) is not None:
                found[event.host] = event  # the log is in time order: the last one at or before wins
        return found

    # -- show -----------------------------------------------------------------------------------------------

    def show(self) -> int:
        key = _key(self.opts.target)
        state = self.store.get(key)
        limit = self.opts.events if self.opts.events is not None else 20
        if key.startswith("ip:"):  # an address row: the bookings made on it (of any host)
            address = key[3:]
            recent = self.store.events(limit=max(2000, 50 * limit))
            events = [e for e in recent if e.kind == "booking" and e.address is not None and ip_key(e.address) == key
                      ][-limit:] if limit else []
        else:
            address = None
            events = self.store.events(host=key, limit=limit) if limit else []
        if state is None and not events and (address is not None or not self.store.events(host=key, limit=1)):
            raise _NoSuchHost(f"{key}: not in the pace table {self.store.uri} (and no events); "
                              "`scrapy polite hosts` lists the hosts")
        booked = self.store.events(host=key, limit=2000) if address is None else []
        address_keys = list(dict.fromkeys(ip_key(e.address) for e in reversed(booked)
                                          if e.kind == "booking" and e.address))
        if address is None:
            try:
                address_keys.insert(0, ip_key(key))  # an IP-literal host has its own address row
            except ValueError:
                pass
        address_rows = [(k, s) for k in dict.fromkeys(address_keys) if (s := self.store.get(k)) is not None]
        throttle = _last_throttle(self.store, key, state) if state is not None else None
        if self.opts.json:
            self.dump({
                "store": self.store.uri, "now": self.now, "now_at": _iso(self.now), "host": key,
                "row": None if state is None else _host_json(key, state, self.now, throttle, self.policy),
                "addresses": [{"address": k, "next_allowed": s.next_allowed or None,
                               "next_allowed_at": _iso(s.next_allowed),
                               "next_allowed_in": round(max(0.0, s.next_allowed - self.now), 3),
                               "updated": s.updated or None, "updated_at": _iso(s.updated)} for k, s in address_rows],
                "events": [_event_json(e) for e in events],
            })
            return EXIT_OK
        self.print(f"{key} in the pace table {self.store.uri}; now {_absolute(self.now)}")
        if state is None:
            self.print("  no row (its events are below)")
        else:
            cells = _host_cells(key, state, self.now, throttle, self.policy)
            width = max(len(c) for c in (*HOST_COLUMNS[1:], "Retry-After scale"))
            for column, cell in zip(HOST_COLUMNS[1:], cells[1:]):
                self.print(f"  {column:<{width}}  {cell}")
            for label, cell in (*_quota_cells(state, self.now), *_adaptive_cells(state),
                                *_hold_cells(state, self.now)):
                self.print(f"  {label:<{width}}  {cell}")
            if state.consec > 0 and state.run_retry_after:
                self.print(f"  {'Retry-After scale':<{width}}  {state.run_retry_after:g} s (the largest Retry-After of "
                           "this run of throttles: no success leaves more)")
            extra = {f.name: getattr(state, f.name) for f in fields(state)
                     if f.name not in _SHOWN_FIELDS and getattr(state, f.name)}
            for name, value in extra.items():  # a field added to HostState later: shown by its name
                self.print(f"  {name.replace('_', ' '):<{width}}  {value:g}")
            if state.consec > 0:
                self.print(f"  {self.forgive_words([key])}")
        if address is None:
            self.print("\naddress rows (the addresses it was booked on):")
            if address_rows:
                lines = [(k, _due(s.next_allowed, self.now), _relative(s.updated, self.now)) for k, s in address_rows]
                self.print(format_table([ADDRESS_COLUMNS, *lines], indent="  "))
            else:
                self.print("  none")
        which = "bookings on this address" if address is not None else "events"
        self.print(f"\nrecent {which} (the latest {limit}):" if limit else f"\nrecent {which}: --events 0")
        if events:
            self.print(format_table([EVENT_COLUMNS, *((clock_time(e.at, date=True), e.kind, describe(e), e.url or "")
                                                      for e in events)], indent="  "))
        elif limit:
            self.print("  none (POLITE_EVENT_LOG off, or nothing recorded yet)")
        return EXIT_OK

    # -- reset ----------------------------------------------------------------------------------------------

    def reset(self) -> int:
        keys = [_key(a) for a in self.opts.targets]
        status = EXIT_OK
        results = []
        for key in keys:
            def fn(state: HostState | None, now: float) -> tuple[HostState | None, HostState | None]:
                return (PacingPolicy.reset(state, now=now), state) if state is not None else (None, None)

            old = self.store.update(key, fn)
            if old is None:
                status = EXIT_NO_HOST
                print(f"{key}: not in the pace table {self.store.uri} (nothing to reset)", file=self.err)
                results.append({"host": key, "reset": False})
                continue
            new = self.store.get(key) or HostState()
            forgot = [_field_words(f.name, getattr(old, f.name), self.now) for f in fields(old)
                      if f.name not in _UNSPOKEN and getattr(old, f.name) != getattr(new, f.name)]
            kept = [_field_words(f.name, getattr(new, f.name), self.now) for f in fields(new)
                    if f.name not in _UNSPOKEN and _recorded(f.name, getattr(new, f.name))
                    and getattr(old, f.name) == getattr(new, f.name)]
            self.operator_event(key, "reset", steps=old.consec, due=old.next_allowed or None)
            results.append({"host": key, "reset": True, "forgot": forgot, "kept": kept})
            if not self.opts.json:
                self.print(f"{key}: reset; forgot {', '.join(forgot) or 'nothing (it was clear)'}; "
                           f"kept {''.join(k + ', ' for k in kept)}its address rows and its events")
        if self.opts.json:
            self.dump({"store": self.store.uri, "results": results})
        return status

    # -- crawl-delay ----------------------------------------------------------------------------------------

    def crawl_delay(self) -> int:
        clear = bool(self.opts.clear)
        key = _key(self.opts.target)
        value = 0.0 if clear else _seconds(self.opts.seconds)

        def fn(state: HostState | None, now: float) -> tuple[HostState | None, tuple[bool, float]]:
            if state is None and clear:
                return None, (False, 0.0)
            return PacingPolicy.with_crawl_delay(state, value, now=now), (True, state.crawl_delay if state else 0.0)

        changed, before = self.store.update(key, fn)
        if not changed:
            raise _NoSuchHost(f"{key}: not in the pace table {self.store.uri} (no Crawl-delay to clear)")
        self.operator_event(key, "crawl-delay cleared" if clear else f"crawl-delay {value:g} s", delay=value)
        if self.opts.json:
            self.dump({"store": self.store.uri, "host": key, "crawl_delay": value or None, "was": before or None})
        else:
            was = f"{before:g} s" if before else "none"
            now = "cleared" if clear else f"{value:g} s"
            self.print(f"{key}: Crawl-delay {now} (was {was}). It lasts until the host's robots.txt is read again "
                       "(each crawl that obeys robots.txt reads it, and records the delay it publishes); "
                       "POLITE_HOST_DELAYS sets a lasting one.")
        return EXIT_OK

    # -- expire ---------------------------------------------------------------------------------------------

    def expire(self) -> int:
        removed = self.store.expire(self.now - self.config.store_expire)
        if self.opts.json:
            self.dump({"store": self.store.uri, "expired": removed, "idle_longer_than": self.config.store_expire})
        else:
            self.print(f"expired {removed} rows from {self.store.uri} (idle longer than POLITE_STORE_EXPIRE = "
                       f"{_duration(self.config.store_expire)})")
        return EXIT_OK

    # -- timeline -------------------------------------------------------------------------------------------

    def timeline(self) -> int:
        output = _timeline_output(self.opts)
        since = parse_since(self.opts.since, self.now) if self.opts.since else None
        wanted = [_key(h) for h in (self.opts.host or [])]
        limit = self.config.event_log_size
        if wanted:
            events = sorted((e for key in dict.fromkeys(wanted) for e in self.store.events(since, key, limit)),
                            key=lambda e: e.at)
            missing = [k for k in wanted if not any(e.host == k for e in events)]
            if missing:
                raise _NoSuchHost(f"no events of {', '.join(missing)} in {self.store.uri}"
                                  f"{' since ' + _absolute(since) if since else ''}")
        else:
            events = self.store.events(since, None, limit)
        if not events:
            raise _NoSuchHost(f"no events in the event log of {self.store.uri}"
                              f"{' since ' + _absolute(since) if since else ''} (POLITE_EVENT_LOG off, or nothing "
                              "crawled with this POLITE_STORE yet)")
        try:
            written = write_timeline(events, output, store=self.store.uri, fmt=self.opts.format)
        except OSError as exc:
            print(f"scrapy polite timeline: cannot write {output}: {exc}. Fix: choose another -o path", file=self.err)
            return EXIT_OUTPUT
        hosts = hosts_of(events)
        if self.opts.json:
            self.dump({"store": self.store.uri, "output": os.path.abspath(output), "format": written,
                       "events": len(events), "hosts": hosts})
        else:
            self.print(f"timeline of {len(events)} events, {len(hosts)} hosts "
                       f"({clock_time(events[0].at, date=True)} to {clock_time(events[-1].at, date=True)}): "
                       f"{os.path.abspath(output)}")
        return EXIT_OK

    # -- audit ----------------------------------------------------------------------------------------------

    def audit(self) -> int:
        """Check the event log against the pacing rules (:mod:`scrapy_polite.audit`; docs/spec.md §8)."""
        since = parse_since(self.opts.since, self.now) if self.opts.since else None
        uri = self.store.uri
        try:
            events = self.store.events(since, None, limit=_EVERY_EVENT)
        except StoreCorrupt as exc:
            raise _BadLog(f"the event log of {uri} cannot be read: {exc}") from None
        if not events:
            raise _BadLog(f"no events to audit in the event log of {uri}"
                          f"{' since ' + _absolute(since) if since else ''} (POLITE_EVENT_LOG off, or nothing "
                          "crawled with this POLITE_STORE yet): a crawl without a record cannot be vouched for")
        rules = self.config.address_filter
        words = "the public-address rules (docs/spec.md §4)"
        if rules.allow_private:
            words += " with POLITE_ALLOW_PRIVATE"
        elif rules.allowed_networks:
            words += f" and POLITE_ALLOWED_NETWORKS {', '.join(str(n) for n in rules.allowed_networks)}"
        try:
            report = audit(events, rules.allows, rules=words, windowed=since is not None)
        except LogError as exc:
            raise _BadLog(f"the event log of {uri} cannot be audited: {exc}") from None
        if self.opts.json:
            self.dump(report_json(report, store=uri))
        else:
            for line in format_report(report, store=uri):
                self.print(line)
        if report.ok:
            return EXIT_OK
        return EXIT_VIOLATED if report.violations else EXIT_BAD_LOG  # a lost span cannot be vouched for


#: ``audit`` reads the whole log, whatever ``POLITE_EVENT_LOG_SIZE`` the crawl that wrote it had.
_EVERY_EVENT = 10**12


#: Row fields ``reset`` does not speak of: bookkeeping, not the host's numbers (the quota booking's serials).
_UNSPOKEN = frozenset({"updated", "booked", "quota_serial"})


def _recorded(name: str, value: Any) -> bool:
    """A row's field holds something (``quota_left`` -1: no quota known)."""
    return bool(value) and not (name == "quota_left" and value < 0)


def _field_words(name: str, value: Any, now: float) -> str:
    """A row's field in the command's words, for ``reset``."""
    if name == "next_allowed":
        return f"next allowed {_due(value, now)}"
    if name == "consec":
        return f"{value} backoff steps"
    if name == "ok_seen":
        return "2xx seen" if value else "2xx not seen"
    if name == "crawl_delay":
        return f"Crawl-delay {value:g} s" if value else "no Crawl-delay"
    if name == "throttled_at":
        return f"last throttle ({_relative(value, now)})" if value else "no throttle"
    if name == "quota_left":
        return f"{value} requests left of the quota" if value >= 0 else "no quota left known"
    if name == "quota_reset":
        return f"quota reset ({_relative(value, now)})" if value else "no quota reset"
    if isinstance(value, float):
        words = name.replace("_", " ")
        return f"{words} ({_relative(value, now)})" if name.endswith(("_until", "_at")) else f"{words} {value:g} s"
    return f"{name.replace('_', ' ')} {value}"


# -- the command line: argparse sub-commands ---------------------------------------------------------------------

#: Each verb's line in ``scrapy polite --help`` (docs/guides/operating.md's command block says the same, word for
#: word).
VERB_HELP = {
    "hosts": "every host, sorted by when it is due",
    "show": "one host, its address rows, its recent events",
    "reset": "forget a host's backoff (its Crawl-delay, address rows and events are kept)",
    "crawl-delay": "set the host's Crawl-delay; --clear removes it",
    "expire": "remove rows idle longer than POLITE_STORE_EXPIRE",
    "timeline": "draw the event log: a standalone SVG, or an HTML page around it",
    "audit": "check the event log against every pacing rule",
}

#: The verb options: their flags and their argparse keywords.
_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "throttled": (("--throttled",), {"action": "store_true", "help": "only hosts with backoff steps > 0"}),
    "events": (("--events",), {"type": _count_arg, "metavar": "N", "default": None,
                               "help": "the latest N events (default 20; 0: none)"}),
    "clear": (("--clear",), {"action": "store_true", "help": "remove the host's Crawl-delay (instead of SECONDS)"}),
    "since": (("--since",), {"metavar": "WHEN", "default": None, "type": _checked(_since_form),
                             "help": "from WHEN: a duration back from now (90s, 15m, 2h, 1d), @EPOCH seconds, or a "
                                     "local date and time (2026-05-01T12:00, 12:00); default: the whole log"}),
    "host": (("--host",), {"metavar": "HOST", "action": "append", "default": None, "type": _checked(_key),
                           "help": "only this host (repeatable)"}),
    "output": (("-o", "--output"), {"metavar": "PATH", "default": None,
                                    "help": "the file to write, .svg or .html (default timeline.html, or "
                                            "timeline.svg with --format svg)"}),
    "format": (("--format",), {"choices": FORMATS, "default": None,
                               "help": "svg (a standalone image) or html (the picture, a table per host and "
                                       "tooltips); default: by the -o name's ending, else html"}),
    "json": (("--json",), {"action": "store_true",
                           "help": "print JSON (keys: the column names lower-cased, underscored)"}),
}

#: Which options each verb takes (any other is a usage error with it).
_VERB_OPTIONS = {"hosts": ("throttled", "json"), "show": ("events", "json"), "reset": ("json",),
                 "crawl-delay": ("clear", "json"), "expire": ("json",),
                 "timeline": ("since", "host", "output", "format", "json"), "audit": ("since", "json")}

_HOST_OR_URL = "a host (busy.example), any URL of it, or an address row (ip:192.0.2.7)"

#: Each verb's positional arguments: (dest, argparse keywords).
_POSITIONALS: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {
    "show": (("target", {"metavar": "HOST_OR_URL", "type": _checked(_key), "help": _HOST_OR_URL}),),
    "reset": (("targets", {"metavar": "HOST_OR_URL", "nargs": "+", "type": _checked(_key),
                           "help": _HOST_OR_URL + "; several may be given"}),),
    "crawl-delay": (("target", {"metavar": "HOST", "type": _checked(_key), "help": "a host, or any URL of it"}),
                    ("seconds", {"metavar": "SECONDS", "nargs": "?", "type": _checked(_seconds),
                                 "help": "the Crawl-delay, seconds >= 0"})),
}

_CRAWL_DELAY_ARGS = "crawl-delay takes HOST SECONDS, or HOST --clear"

#: What a verb says of a positional argument it has no place for (``{got}``: the arguments).
_STRAY = {
    "hosts": "hosts takes no HOST (got {got}); `scrapy polite show HOST` shows one",
    "show": "show takes one HOST_OR_URL (got {got} too); `scrapy polite hosts` lists them all",
    "reset": "reset takes HOST_OR_URL arguments only (got {got})",
    "crawl-delay": _CRAWL_DELAY_ARGS + " (got {got} too)",
    "expire": "expire takes no argument (got {got})",
    "timeline": "timeline takes no positional argument (got {got}); use --host HOST",
    "audit": "audit takes no positional argument (got {got})",
}

_STORE_HELP = "the pace table (default: POLITE_STORE, or the project's .scrapy/polite.sqlite3)"

_EXIT_WORDS = ("exit status: 0 done, 1 no such host (or no events to draw), 2 usage, 3 the store is unusable,\n"
               "4 the timeline could not be written; audit: 0 every rule kept, 1 a rule broken, 2 the log\n"
               "cannot be audited (truncated, incomplete, corrupt, empty), 3 the store is unusable.")

#: Each verb's exit statuses, in its ``--help``.
_VERB_EXITS = {
    "hosts": "0 done, 2 usage, 3 the store is unusable",
    "show": "0 done, 1 no such host, 2 usage, 3 the store is unusable",
    "reset": "0 done, 1 a host is not in the table (the others are reset), 2 usage, 3 the store is unusable",
    "crawl-delay": "0 done, 1 no such host (--clear), 2 usage, 3 the store is unusable",
    "expire": "0 done, 2 usage, 3 the store is unusable",
    "timeline": "0 done, 1 no events to draw, 2 usage, 3 the store is unusable, 4 the file could not be written",
    "audit": "0 every rule kept, 1 a rule broken, 2 the log cannot be audited (truncated, incomplete, corrupt,\n"
             "empty) or a usage error, 3 the store is unusable",
}

_GLOBAL_WORDS = ("Before or after the verb: --store URI (the pace table; default: POLITE_STORE, or the project's\n"
                 ".scrapy/polite.sqlite3) and Scrapy's global options (-s NAME=VALUE or --set NAME=VALUE,\n"
                 "-L LEVEL, --logfile FILE, --nolog, --profile FILE, --pidfile FILE, --pdb).")


class _Usage(Exception):
    """A usage error found by ``parser`` (exit 2): printed as argparse does, the parser's usage line first."""

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(message)
        self.parser = parser


class _Exit(Exception):
    """argparse is done (``--help`` printed): the command's exit status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`_Usage` / :class:`_Exit` instead of ending the process (the
    command also runs in-process, :func:`run_command`) and prints its help to the command's output."""

    def __init__(self, *args: Any, out: IO[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out

    def print_help(self, file: Any = None) -> None:  # typeshed: SupportsWrite[str] | None
        super().print_help(file or self.out)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Exit(status)

    def error(self, message: str) -> NoReturn:
        raise _Usage(message, self)


class VerbParsers:
    """``scrapy polite``'s verbs as argparse sub-commands: one parser per verb, with its own arguments and
    ``--help``, under a top-level parser whose help lists them (one line each, :data:`VERB_HELP`).

    Scrapy's own parser (``scrapy.cmdline``: :meth:`Command.add_options`, ``parse_known_args``) takes
    ``--store`` and Scrapy's global options wherever they are, before or after the verb; what it leaves (the
    verb and its arguments) is parsed here, strictly: an unknown verb, an unknown option, an option of another
    verb or an argument without a place is a usage error (exit 2).
    """

    def __init__(self, out: IO[str] | None = None) -> None:
        width = max(map(len, VERBS))
        listing = "\n".join(f"  {verb:<{width}}  {VERB_HELP[verb]}" for verb in VERBS)
        self.top = _Parser(
            prog="scrapy polite", out=out, formatter_class=argparse.RawDescriptionHelpFormatter,
            usage="scrapy polite [-h] [--store URI] [-s NAME=VALUE] VERB [ARGUMENTS]",
            description=f"Look at and steer scrapy-polite's pace table and event log.\n\nverbs:\n{listing}\n\n"
                        "`scrapy polite VERB --help` shows a verb's arguments.",
            epilog=f"Scrapy's other global options work too (-L LEVEL, --logfile FILE, --nolog, --profile FILE,\n"
                   f"--pidfile FILE, --pdb).\n\n{_EXIT_WORDS}")
        shown = self.top.add_argument_group("global options (before or after the verb)")
        shown.add_argument("--store", metavar="URI", default=argparse.SUPPRESS, help=_STORE_HELP)
        shown.add_argument("-s", "--set", metavar="NAME=VALUE", default=argparse.SUPPRESS,
                           help="set a Scrapy setting (repeatable), e.g. -s POLITE_STORE_PREFIX=crawl1:")
        subparsers = self.top.add_subparsers(title="verbs", dest="verb", metavar="VERB", prog="scrapy polite",
                                             parser_class=_Parser, help=argparse.SUPPRESS)
        self.verbs: dict[str, _Parser] = {}
        for verb in VERBS:
            words = VERB_HELP[verb]
            parser = subparsers.add_parser(verb, help=words, description=f"{words[0].upper()}{words[1:]}.",
                                           formatter_class=argparse.RawDescriptionHelpFormatter,
                                           epilog=f"{_GLOBAL_WORDS}\n\nexit status: {_VERB_EXITS[verb]}.", out=out)
            for dest, keywords in _POSITIONALS.get(verb, ()):
                parser.add_argument(dest, **keywords)
            for name in _VERB_OPTIONS[verb]:
                flags, keywords = _OPTIONS[name]
                parser.add_argument(*flags, dest=name, **keywords)
            self.verbs[verb] = parser

    def parse(self, args: list[str]) -> argparse.Namespace:
        """The verb (``verb``) and its arguments, every option's default set (``None`` or ``False``).

        Raises:
            _Usage: a usage error (its parser names the verb).
            _Exit: ``--help`` was printed.
        """
        first = args[0] if args else None
        if first in ("-h", "--help"):
            self.top.print_help()
            raise _Exit(EXIT_OK)
        if first is None or first not in VERBS:
            expected = f"expected a verb: {', '.join(VERBS)}"
            if first is not None and first.startswith("-"):
                flag = first.split("=", 1)[0]
                owners = _owners(flag)
                if owners:
                    self.top.error(f"{flag} is an option of {', '.join(owners)}: it goes after the verb "
                                   f"(scrapy polite {owners[0]} {flag})")
                self.top.error(f"unknown option {flag}; {expected}")
            self.top.error(expected + ("" if first is None else f" (got {first!r})"))
        parser = self.verbs[first]
        namespace = argparse.Namespace(verb=first, **{name: None for name in _OPTIONS})
        for name in ("throttled", "clear", "json"):
            setattr(namespace, name, False)
        namespace, extras = parser.parse_known_intermixed_args(args[1:], namespace)
        if extras:
            parser.error(_unrecognized(first, extras, namespace))
        if first == "crawl-delay" and namespace.clear == (namespace.seconds is not None):
            parser.error(_CRAWL_DELAY_ARGS)
        return namespace


def _owners(flag: str) -> list[str]:
    """The verbs that take the option ``flag``."""
    return [verb for verb, names in _VERB_OPTIONS.items() if any(flag in _OPTIONS[n][0] for n in names)]


def _unrecognized(verb: str, extras: list[str], namespace: argparse.Namespace) -> str:
    """The usage error for what ``verb``'s parser left: an option of another verb, an unknown option, or an
    argument without a place (``-inf``, which argparse takes for an option, as ``crawl-delay``'s SECONDS)."""
    numbers = [a for a in extras if _number(a)]
    if verb == "crawl-delay" and numbers and namespace.seconds is None and not namespace.clear:
        try:
            _seconds(numbers[0])
        except UsageError as exc:
            return f"argument SECONDS: {exc}"
    options = [a for a in extras if a.startswith("-") and a != "-" and not _number(a)]
    if options:
        flag = options[0].split("=", 1)[0]
        owners = _owners(flag)
        if owners:
            return f"{flag} does not apply to `{verb}` (it is an option of {', '.join(owners)})"
        return f"unrecognized arguments: {' '.join(options)}"
    return _STRAY[verb].format(got=" ".join(extras))


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class Command(ScrapyCommand):
    """``scrapy polite hosts|show|reset|crawl-delay|expire|timeline|audit`` on the project's pace table."""

    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] VERB [ARGUMENTS]  (`scrapy polite --help` lists the verbs)"

    def short_desc(self) -> str:
        return "Look at and steer scrapy-polite's pace table and event log"

    def long_desc(self) -> str:
        return (__doc__ or "").split("\n\n", 1)[0].replace("``", "") + (
            " Exit status: 0 done, 1 no such host (or no events to draw), 2 usage, 3 the store is unusable, "
            "4 the timeline could not be written; audit: 0 every rule kept, 1 a rule broken, 2 the log "
            "cannot be audited (truncated, incomplete, corrupt, empty), 3 the store is unusable.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        add_global_options(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        self.exitcode = execute(args, opts, self.settings, out=sys.stdout, err=sys.stderr)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options of Scrapy's parser for ``scrapy polite`` (beside Scrapy's global ones): ``--store``, and a
    ``-h/--help`` that defers to the verb parsers (:class:`VerbParsers`: the verbs, or one verb's arguments).
    Scrapy's parser takes them before or after the verb; it is built with ``conflict_handler="resolve"``, so
    this ``--help`` replaces its own (the same in Scrapy 2.18 and later: scrapy/cmdline.py)."""
    group = parser.add_argument_group("scrapy polite")
    group.add_argument("--store", metavar="URI", default=None, help=_STORE_HELP)
    group.add_argument("-h", "--help", action="store_true", dest="verb_help", default=False,
                       help="the verbs (or, after a verb, its arguments), and exit")


def print_shared_frontier(settings: Any, config: PoliteConfig, out: IO[str], err: IO[str]) -> None:
    """With scrapy-redis's scheduler in the settings (``SCHEDULER`` or ``POLITE_SCHEDULER_BASE``) and the
    shared frontier on, list what waits in Redis per host, and what each worker leases (renewing or not, and
    when the leases of one that stopped renewing come back) (docs/spec.md §5, "The shared frontier"); a
    Redis that cannot be reached is reported on ``err`` (the pace table's listing stands)."""
    names = {str(settings.get("SCHEDULER") or ""), str(config.scheduler_base)}
    if not config.shared_frontier or not any(n.startswith("scrapy_redis.") for n in names):
        return
    try:
        connection = importlib.import_module("scrapy_redis.connection")  # the optional extra
        server = connection.from_settings(settings)
        frontiers = waiting_in_redis(server, config.frontier_key)
    except Exception as exc:  # ImportError without the extra, a RedisError: the listing above stands
        print(f"shared frontier: cannot be read ({exc})", file=err)
        return
    for key, returned, hosts, workers in frontiers:
        held = sum(count for _, count, _ in hosts)
        leased = sum(w.leases for w in workers)
        print(f"shared frontier {key}: {_count(held, 'request')} held in Redis, {returned} returned, "
              f"{leased} leased by {_count(len(workers), 'worker')}", file=out)
        if hosts:
            print(format_table([("host", "held", "due in"),
                                *((host, str(count), f"{max(0.0, due):.0f} s") for host, count, due in hosts)]),
                  file=out)
        if workers:
            print(format_table([("worker", "leased", "last renewal", "state"),
                                *((w.worker, str(w.leases),
                                   "-" if w.renewed_ago is None else f"{w.renewed_ago:.0f} s ago",
                                   "renewing" if w.renewing(config.lease_time)
                                   else f"stopped renewing: its requests come back in {w.back_in:.0f} s")
                                  for w in workers)]), file=out)


class _ReaderMayLeave:
    """The command's output, whose reader may stop reading early (``scrapy polite hosts | head``): once a write
    finds the pipe closed (``BrokenPipeError``), the rest of the output is dropped, quietly, and the stream's file
    descriptor is pointed at the null device so that no later flush (the interpreter's, at exit) fails again —
    the pattern of Python's documentation ("Note on SIGPIPE", the ``signal`` module). The verb goes on and its
    exit status is its own (0 for ``hosts`` and ``show``; README, "Exit status")."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        #: The reader has gone: nothing more is written.
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
        except OSError:  # pragma: no cover - no null device: the interpreter's own flush may complain
            return
        try:
            os.dup2(devnull, self.stream.fileno())
        except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): nothing to silence
            pass
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _print_usage_error(parser: argparse.ArgumentParser, message: str, err: IO[str]) -> None:
    """A usage error as argparse prints one: the parser's usage line, then ``PROG: error: MESSAGE``."""
    parser.print_usage(err)
    print(f"{parser.prog}: error: {message}", file=err)


def execute(args: list[str], opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str],
            store: PaceStore | None = None) -> int:
    """Run one verb; its exit status (see the module). A usage error (an unknown verb or option, an option of
    another verb, a bad value, an invalid setting) is printed on ``err`` with the verb's usage line, as argparse
    does, and gives :data:`EXIT_USAGE`; ``--help`` prints on ``out`` and gives :data:`EXIT_OK`.

    Args:
        args: the verb and its arguments (what Scrapy's parser left, :func:`add_global_options`).
        opts: the options Scrapy's parser took (``store``, ``verb_help``).
        settings: the Scrapy settings (``POLITE_*``).
        out, err: where results and problems are written; a reader of ``out`` that stops reading early (a closed
            pipe) ends the output quietly, and the status is the verb's own (:class:`_ReaderMayLeave`).
        store: an open store to use instead of opening ``--store`` / ``POLITE_STORE`` (tests, a ``memory://``
            table of this process); it is not closed.
    """
    reader = _ReaderMayLeave(out)
    try:
        return _execute(args, opts, settings, out=reader, err=err, store=store)  # type: ignore[arg-type]
    finally:
        reader.flush()  # a reader gone before the last line: quiet, as above


def _execute(args: list[str], opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str],
             store: PaceStore | None) -> int:
    """:func:`execute` on an output whose reader may leave."""
    parsers = VerbParsers(out)
    if getattr(opts, "verb_help", False):
        args = [*args, "--help"]
    try:
        verb_opts = parsers.parse(args)
    except _Exit as done:
        return done.status
    except _Usage as exc:
        _print_usage_error(exc.parser, str(exc), err)
        return EXIT_USAGE
    verb_opts.store = getattr(opts, "store", None)
    try:
        return _run(verb_opts, settings, out=out, err=err, store=store)
    except UsageError as exc:
        _print_usage_error(parsers.verbs[verb_opts.verb], str(exc), err)
        return EXIT_USAGE


def _run(opts: argparse.Namespace, settings: Any, *, out: IO[str], err: IO[str], store: PaceStore | None) -> int:
    """Run the parsed verb ``opts.verb`` (see :func:`execute`).

    Raises:
        UsageError: a bad value or an invalid setting (exit 2).
    """
    verb = str(opts.verb)
    if verb == "timeline":
        try:
            timeline_format(_timeline_output(opts), opts.format)  # a format we don't draw: before the store
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None
    try:
        config = PoliteConfig.from_settings(settings)
    except SettingsError as exc:
        raise UsageError(str(exc), print_help=False) from None
    owned = store is None
    try:
        if store is None:
            store = _open(opts, config)
        try:
            operator = _Operator(store, config, opts, out, err)
            status = int(getattr(operator, verb.replace("-", "_"))())
            if verb == "hosts" and not opts.json:
                print_shared_frontier(settings, config, out, err)
            return status
        finally:
            if owned:
                store.close()
    except _NoSuchHost as exc:
        print(exc, file=err)
        return EXIT_NO_HOST
    except _BadLog as exc:
        print(f"scrapy polite audit: {exc}", file=err)
        return EXIT_BAD_LOG
    except StoreCorrupt as exc:
        print(f"scrapy polite audit: the event log cannot be read: {exc}" if verb == "audit" else exc, file=err)
        return EXIT_BAD_LOG if verb == "audit" else EXIT_STORE
    except StoreError as exc:
        print(exc, file=err)
        return EXIT_STORE


def _timeline_output(opts: argparse.Namespace) -> str:
    """The file ``timeline`` writes: ``-o``, else timeline.svg for ``--format svg``, else timeline.html."""
    return str(opts.output or ("timeline.svg" if opts.format == "svg" else "timeline.html"))


def _open(opts: argparse.Namespace, config: PoliteConfig) -> PaceStore:
    uri = opts.store or config.store_uri or default_store_uri()
    path = sqlite_path(uri)
    if path is not None and not os.path.exists(path):  # a look must not create a table
        raise StoreError(f"no pace table at {os.path.abspath(path)} (nothing crawled with this POLITE_STORE yet). "
                         "Fix: run it inside the Scrapy project, or pass --store URI")
    return open_store(uri, StoreOptions(prefix=config.store_prefix, timeout=config.store_timeout,
                                        expire=config.store_expire, events_max=config.event_log_size))


def run_command(argv: list[str], settings: Any = None, *, store: PaceStore | None = None,
                out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """``scrapy polite ARGV...`` in this process, parsed as Scrapy parses it (``scrapy.cmdline``: the command's
    ``default_settings``, :meth:`Command.add_options` on a parser with ``conflict_handler="resolve"``,
    ``parse_known_args``, ``process_options`` for ``-s``), then the verb (:func:`execute`); its exit status.

    Args:
        argv: the arguments after ``scrapy polite``.
        settings: Scrapy settings or a mapping (default: none, the ``POLITE_*`` defaults); not changed (``-s``
            applies to a copy).
        store: an open store to use (e.g. a ``memory://`` table of this process); not closed.
        out, err: default ``sys.stdout`` / ``sys.stderr``.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    base = Settings(settings.copy_to_dict() if isinstance(settings, BaseSettings) else (settings or {}))
    command = Command()
    base.setdict(command.default_settings, priority="command")
    command.settings = base
    parser = _Parser(prog="scrapy polite", usage=f"scrapy polite {command.syntax()}", add_help=False,
                     conflict_handler="resolve")
    command.add_options(parser)
    try:
        opts, args = parser.parse_known_args(argv)
        command.process_options(args, opts)
    except _Usage as exc:
        _print_usage_error(parser, str(exc), err)
        return EXIT_USAGE
    except UsageError as exc:  # an invalid -s
        _print_usage_error(parser, str(exc), err)
        return EXIT_USAGE
    return execute(args, opts, base, out=out, err=err, store=store)
