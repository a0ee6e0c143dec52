"""The ``POLITE_*`` settings: defaults (docs/spec.md §2, §4, §6), reading and validation, in one place.

Every duration is in seconds (Scrapy's convention, as ``DOWNLOAD_DELAY``). Settings are read once, when the
crawler builds the components (:meth:`PoliteConfig.from_settings`) or Scrapy builds the per-process resolver
(:meth:`DNSConfig.from_settings`), and a bad value stops the crawl at start with a :class:`SettingsError`
that names the setting, the value and the accepted form — never a silently unpaced or unfiltered crawl.

Every value is read by Scrapy's own getters (``getbool``, ``getint``, ``getfloat``, ``getlist``, ``getdict``;
a plain mapping is copied into a ``BaseSettings`` first, :func:`as_settings`), their ``ValueError`` or
``TypeError`` becoming a :class:`SettingsError` that names the setting. Where a getter takes more than the
setting means, our check follows it: a duration is finite and ``>= 0``
(:func:`~scrapy_polite.vocabulary.parse_seconds`: ``getfloat`` takes ``'nan'`` and ``-1``), a count is whole
(``getint`` truncates ``2.5``), a dict is a dict or a JSON object (``getdict`` takes a list of pairs). So the
forms accepted are what Scrapy users write in ``settings.py`` and pass with ``-s`` on the command line:

* a list setting (``POLITE_ALLOWED_NETWORKS``, ``POLITE_DNS_NAMESERVERS``, ``POLITE_THROTTLE_STATUSES``):
  a Python list or tuple, a comma-separated string (``-s POLITE_ALLOWED_NETWORKS=127.0.0.0/8,::1/128``,
  as ``getlist``, with items stripped and empty ones dropped) or a JSON list
  (``-s 'POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"]'``, ``[]``), which ``getlist`` does not read;
* a dict setting (``POLITE_HOST_DELAYS``, ``POLITE_DNS_OVERRIDES``): a dict or a JSON object string (as
  ``getdict``);
* a boolean (``POLITE_ENABLED``, ``POLITE_ALLOW_PRIVATE``): ``getbool``'s values, ``True``/``False``,
  ``1``/``0``, ``'1'``/``'0'``, ``'True'``/``'False'``, ``'true'``/``'false'``.

``POLITE_ENABLED`` is read in one place, :func:`polite_enabled`.

A ``POLITE_*`` name that is not a setting (a typo such as ``POLITE_HOST_INTERVALS``) is reported by
:func:`warn_unknown_settings`, with the closest known name.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from scrapy.settings import BaseSettings

from .adaptive import AdaptivePolicy
from .addresses import AddressFilter, parse_ip_literal
from .policy import PacingPolicy, host_key
from .vocabulary import parse_seconds

__all__ = [
    "DEFAULTS",
    "DNSConfig",
    "as_settings",
    "polite_enabled",
    "PoliteConfig",
    "checked_handlers",
    "SETTINGS",
    "Setting",
    "SettingsError",
    "normalise_dns_name",
    "parse_dict_setting",
    "parse_dns_overrides",
    "parse_list_setting",
    "parse_nameserver",
    "unknown_settings",
    "warn_unknown_settings",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")



@dataclass(frozen=True)
class Setting:
    """One ``POLITE_*`` setting, declared once: its name, how it is read, its default and what it does (the
    settings reference, Scrapy's defaults of the add-on (:data:`DEFAULTS`) and the unknown-setting check are made
    from it).

    Attributes:
        name: the setting's name.
        kind: how it is read: ``"bool"``, ``"seconds"`` (a finite number >= 0), ``"number"`` (a finite number),
            ``"count"`` (a whole number), ``"list"``, ``"dict"`` or ``"string"`` (anything else, checked by its
            own reader).
        default: the value when the project sets none.
        doc: what it does, one paragraph of Markdown (units always given).
        notes: the caveats a user can trip on, each ``(kind, text)`` with kind ``"note"`` or ``"warning"``;
            the reference shows each as an admonition beside the setting.
        guide: the documentation page (``guides/...``) that explains the setting at length.
        default_words: how the reference shows the default when its value alone would mislead (None: the value).
    """

    name: str
    kind: str
    default: Any
    doc: str
    notes: tuple[tuple[str, str], ...] = ()
    guide: str = ""
    default_words: str | None = None


#: Every setting, in the order the reference lists them: what it does, how it is read and its caveats. The
#: settings reference of the documentation is generated from this table (docs/_ext/polite_reference.py), and
#: tests/test_docs.py checks it against :data:`DEFAULTS` and against how :class:`PoliteConfig` reads each one.
SETTINGS: tuple[Setting, ...] = (
    Setting("POLITE_ENABLED", "bool", True, "Turn everything off without removing the add-on.", notes=(
        ("warning", "With `POLITE_ENABLED = False` nothing of scrapy-polite runs, **the address checks included**: "
                    "the crawl may then reach private and loopback addresses."),)),
    Setting("POLITE_HOST_INTERVAL", "seconds", 1.0,
            "Base interval (seconds) between the end of one response and the start of the next request to one host. "
            "The effective interval of a host is the largest of this, its published `Crawl-delay`, its announced "
            "quota and the overrides (`POLITE_HOST_DELAYS`, a spider's `crawl_delay`, `meta['polite_delay']`).",
            notes=(("note", "The default pace is **one request every 2 seconds per host**, not every second: "
                            "`POLITE_IP_INTERVAL` (2 s) also spaces requests to each IP address, and a host with a "
                            "single address of its own is paced by both. To crawl such a host once a second, set "
                            "`POLITE_IP_INTERVAL = 1.0` (or `0` to pace by host only)."),),
            guide="guides/throttles"),
    Setting("POLITE_IP_INTERVAL", "seconds", 2.0,
            "Minimum interval (seconds) between two requests to one IP address, whatever the host (end of one "
            "response to the start of the next request). Hosts that share an address share its budget. `0` paces "
            "by host only.",
            notes=(("note", "With the defaults (1 s per host, 2 s per address) a host with one address of its own is "
                            "crawled at **one request every 2 seconds**: this setting, not `POLITE_HOST_INTERVAL`, "
                            "sets the pace."),),
            guide="guides/throttles"),
    Setting("POLITE_MAX_BACKOFF", "seconds", 300.0,
            "Cap (seconds) of a computed backoff, `interval × 2^n` with `n` the backoff steps before the throttle.",
            guide="guides/throttles"),
    Setting("POLITE_MAX_WAIT", "seconds", 60.0,
            "Longest time (seconds, > 0) one request waits in line. A host that publishes or is given a delay longer "
            "than this, or is throttling us, is deferred instead: its requests leave the downloader until due.",
            guide="guides/throttles"),
    Setting("POLITE_THROTTLE_STATUSES", "list", [429, 503],
            "HTTP statuses that mean \"slow down\" (a list of whole numbers, not empty). A 403 from a host that "
            "already served a 2xx is a throttle too.",
            guide="guides/throttles"),
    Setting("POLITE_MAX_RETRY_AFTER", "seconds", 3600.0,
            "Cap (seconds) on an honoured `Retry-After` (any number of digits), and on an announced quota's interval "
            "and hold. Larger values are clamped, logged once per host and counted.",
            guide="guides/throttles"),
    Setting("POLITE_MAX_FAILURE_BACKOFF", "seconds", 60.0,
            "Cap (seconds) of the backoff after download failures (timeouts, refused or reset connections): a host "
            "that is down is retried sooner than one that throttles.",
            guide="guides/throttles"),
    Setting("POLITE_THROTTLE_RETRIES", "count", 10,
            "How many times scrapy-polite retries a page whose response was a throttle, besides and before Scrapy's "
            "`RETRY_TIMES` (a whole number >= 0; `0` leaves throttles to Scrapy).",
            guide="guides/throttles"),
    Setting("POLITE_RATELIMIT_HEADERS", "bool", True,
            "Read the quotas hosts announce (`RateLimit-Policy` / `RateLimit`, `RateLimit-Limit/-Remaining/-Reset`, "
            "`X-RateLimit-*`) and pace by them; `False` ignores them.",
            guide="guides/quotas"),
    Setting("POLITE_ADAPTIVE", "bool", False,
            "Adaptive pacing: each host's interval also follows its response times, at least "
            "`POLITE_ADAPTIVE_FACTOR` × its smoothed latency, doubled per 5xx or timeout not yet earned back; never "
            "below the other intervals.",
            notes=(("warning", "With `AUTOTHROTTLE_ENABLED = True` as well the crawl refuses to start (one ERROR line, "
                               "exit status 1) unless `POLITE_ADAPTIVE_WITH_AUTOTHROTTLE = True`."),),
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_FACTOR", "number", 2.0,
            "The adaptive interval is at least this many times the host's smoothed download latency (a finite "
            "number > 0; Heritrix's \"delay factor\"). With `2`, the server spends at most a third of its time on "
            "the crawl.",
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_MAX", "seconds", 60.0,
            "Cap (seconds) of the interval adaptive pacing sets (a larger Crawl-delay, quota or override still wins).",
            guide="guides/adaptive"),
    Setting("POLITE_ADAPTIVE_WITH_AUTOTHROTTLE", "bool", False,
            "With `POLITE_ADAPTIVE` on, the crawl refuses to start while `AUTOTHROTTLE_ENABLED` is on (two pacers, "
            "one unaware of the other) unless this is `True`; then a WARNING says so at start.",
            guide="guides/adaptive"),
    Setting("POLITE_MAX_IDLE_WAIT", "seconds", 300.0,
            "When everything left is deferred beyond this (seconds), the spider closes with reason "
            "`polite_deferred` and the log lists each host and when it is due.",
            notes=(("note", "Requests still deferred at that close are not crawled: without `JOBDIR` they are "
                            "counted in `polite/deferred/not_crawled` and listed; with `JOBDIR` they are saved and "
                            "come back on resume."),),
            guide="guides/throttles"),
    Setting("POLITE_MAX_HELD_IN_MEMORY", "count", 10_000,
            "How many deferred requests are held in memory (a whole number >= 0); the others wait on disk and come "
            "back in due order. Under `JOBDIR` every held request is on disk.",
            guide="guides/throttles"),
    Setting("POLITE_HOST_DELAYS", "dict", {},
            "Per-host interval (seconds), e.g. `{\"api.example.com\": 5}` (a dict or a JSON object). It can only "
            "slow a host down.",
            guide="guides/throttles"),
    Setting("POLITE_STORE", "string", None,
            "The pace table: `None` is `sqlite:///<project>/.scrapy/polite.sqlite3`; `sqlite:///relative/path`, "
            "`sqlite:////absolute/path`, `memory://` (not persisted), or `redis://host:port/db`, `rediss://…`, "
            "`unix:///path/redis.sock?db=0`, or a Redis Cluster, `redis+cluster://host:port[,host:port…]` (shared by "
            "many processes). A Redis URL takes `?layout=table` (the default: the table in one hash slot) or "
            "`?layout=sharded` (one slot per row).",
            notes=(("warning", "A Redis **restarted without persistence** (no `appendonly yes`), or a failover onto an "
                               "empty replica, forgets every delay it held. Each running crawl then writes back what "
                               "it knew (one WARNING, `polite/store/restores`), but what no running crawl knew is "
                               "lost, and so is the event log before that moment (`scrapy polite audit` exits 2). "
                               "Turn on Redis's append-only file to lose nothing."),
                   ("note", "`memory://` keeps the table in the process only: the next run starts with no backoff "
                            "and no Crawl-delay.")),
            guide="guides/many-crawlers", default_words="`None` (`sqlite:///<project>/.scrapy/polite.sqlite3`)"),
    Setting("POLITE_STORE_EXPIRE", "seconds", 30 * 24 * 3600.0,
            "Rows of hosts idle this long (seconds; 30 days by default) are removed when the table is opened (Redis: "
            "each key expires this long after its row's `next_allowed` or last write, whichever is later).",
            guide="guides/operating", default_words="`2592000.0` (30 days)"),
    Setting("POLITE_STORE_PREFIX", "string", "polite:",
            "Key prefix of the table in a shared server (Redis): one table per prefix, so several can share a "
            "server.",
            guide="guides/many-crawlers"),
    Setting("POLITE_STORE_TIMEOUT", "seconds", 60.0,
            "How long (seconds, > 0) a server store may stay unreachable mid-crawl before the spider closes with "
            "reason `polite_store_error` (and `scrapy crawl` exits with status 1). Requests wait meanwhile: none is "
            "sent without a booking.",
            guide="guides/many-crawlers"),
    Setting("POLITE_EVENT_LOG", "bool", True,
            "Keep the event log beside the pace table: every booking, wait, deferral, response, failure, backoff "
            "step, robots.txt delay, refusal and operator action. `scrapy polite audit` and `timeline` read it.",
            guide="guides/operating"),
    Setting("POLITE_EVENT_LOG_SIZE", "count", 100_000,
            "The most events a table's log keeps (a whole number >= 1, about 300 bytes each in SQLite); the oldest "
            "are deleted first.",
            notes=(("note", "An audit that reaches back past the oldest event kept reports the log **truncated** "
                            "(exit status 2): raise this before a long crawl you mean to audit whole, or audit from "
                            "a later moment with `--since`."),),
            guide="guides/operating"),
    Setting("POLITE_SCHEDULER_BASE", "string", "scrapy.core.scheduler.Scheduler",
            "The scheduler `PoliteScheduler` wraps; the add-on fills it in from your `SCHEDULER`.",
            guide="guides/many-crawlers", default_words="your `SCHEDULER` (`scrapy.core.scheduler.Scheduler`)"),
    Setting("POLITE_SHARED_FRONTIER", "bool", True,
            "With scrapy-redis's scheduler, keep deferred and in-flight requests in Redis, leased; `False`: held in "
            "each process, as without scrapy-redis.",
            guide="guides/many-crawlers"),
    Setting("POLITE_FRONTIER_KEY", "string", "%(spider)s:polite",
            "The key prefix of the shared frontier in scrapy-redis's Redis (`%(spider)s`: the spider's name, as in "
            "scrapy-redis's `%(spider)s:requests`).",
            guide="guides/many-crawlers"),
    Setting("POLITE_LEASE_TIME", "seconds", 60.0,
            "Seconds (> 0) a worker's leases last without renewal (each worker renews them every second, or every "
            "third of this if shorter). The requests of a worker that stopped renewing go back to the shared "
            "frontier this long after its last renewal.",
            notes=(("note", "scrapy-redis's `MAX_IDLE_TIME_BEFORE_CLOSE` **may be shorter** than `POLITE_LEASE_TIME`: "
                            "an idle worker does not close while a worker that stopped renewing (killed, crashed, "
                            "frozen) still leases requests, whatever its idle window. It waits until they come back "
                            "(at most `POLITE_LEASE_TIME` after that worker's last renewal), fetches them, then "
                            "closes."),
                   ("warning", "A `POLITE_LEASE_TIME` shorter than the longest pause a live worker can freeze for (a "
                               "long garbage collection, a stopped VM) makes it look dead: its pages are fetched "
                               "twice. A longer one only makes the survivors wait longer for a dead worker's "
                               "pages.")),
            guide="guides/many-crawlers"),
    Setting("POLITE_ALLOW_PRIVATE", "bool", False,
            "Allow non-public addresses (intranet crawls); also lifts the download handler checks.",
            notes=(("note", "Per process: a spider's `custom_settings` can only narrow, never widen, the project's "
                            "address rules (a spider that tries gets a WARNING naming the networks that stay "
                            "refused)."),),
            guide="guides/safety"),
    Setting("POLITE_ALLOWED_NETWORKS", "list", [],
            "CIDR networks of non-public addresses to allow anyway, e.g. `[\"127.0.0.0/8\"]` for local tests "
            "(`-s POLITE_ALLOWED_NETWORKS=127.0.0.0/8,::1/128` on the command line).",
            notes=(("note", "Per process, like `POLITE_ALLOW_PRIVATE`: a spider can only narrow it."),),
            guide="guides/safety"),
    Setting("POLITE_CHECKED_HANDLERS", "list", [],
            "Download handlers (import paths or classes) you accept with the weaker *checked* address rule; any "
            "other handler the add-on does not know refuses to start.",
            guide="guides/safety"),
    Setting("POLITE_DNS_OVERRIDES", "dict", {},
            "Host → list of IP addresses, used instead of DNS (still filtered by the address rules).",
            notes=(("note", "The DNS settings are per process: set them in the project settings, not in a spider's "
                            "`custom_settings`. A *checked* handler resolves names itself and does not see them."),),
            guide="guides/safety"),
    Setting("POLITE_DNS_NAMESERVERS", "list", [],
            "`host[:port]` nameservers (IP addresses); empty: the system's `/etc/resolv.conf`.",
            guide="guides/safety"),
    Setting("POLITE_DNS_TIMEOUT", "seconds", 5.0, "Seconds for one lookup (A and AAAA together).",
            guide="guides/safety"),
    Setting("POLITE_DNS_MIN_TTL", "seconds", 60.0,
            "Shortest time (seconds) an answer is cached, whatever its TTL.", guide="guides/safety"),
    Setting("POLITE_DNS_MAX_TTL", "seconds", 3600.0, "Longest time (seconds) an answer is cached.",
            guide="guides/safety"),
)

#: Every setting with its default (made from :data:`SETTINGS`).
DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}

_PREFIX = "POLITE_"


class SettingsError(ValueError):
    """A ``POLITE_*`` setting has a value the pacer cannot use. The message names the setting and the fix."""


# -- reading one value ------------------------------------------------------------------------------------


def as_settings(settings: Any) -> BaseSettings:
    """``settings`` as a Scrapy ``BaseSettings``: itself, or a plain mapping (what unit tests and tools pass)
    copied into one, so every value is read by Scrapy's own getters."""
    if isinstance(settings, BaseSettings):
        return settings
    return BaseSettings(dict(settings))


def _raw(settings: BaseSettings, name: str) -> Any:
    """The value of ``name``; its default when absent or None (``Settings.get`` treats None as absent too)."""
    return settings.get(name, DEFAULTS.get(name))


def _read(settings: BaseSettings, name: str, getter: Callable[[str, Any], _T], form: str) -> _T:
    """``getter(name, default)``, one of Scrapy's ``getbool``, ``getint``, ``getfloat``, ``getlist`` or
    ``getdict`` of ``settings``, with the default of :data:`DEFAULTS`.

    Raises:
        SettingsError: the getter's ``ValueError`` or ``TypeError`` (``OverflowError`` for an infinite
            whole number), naming the setting, the value and ``form``, the accepted form.
    """
    try:
        return getter(name, DEFAULTS.get(name))
    except (TypeError, ValueError, OverflowError):
        raise SettingsError(f"{name} must be {form}, got {_raw(settings, name)!r}") from None


_BOOLEAN = "a boolean (True/False, 1/0, '1'/'0', 'True'/'False' or 'true'/'false')"


def _bool(settings: BaseSettings, name: str) -> bool:
    """A boolean setting, read by Scrapy's ``getbool``.

    Raises:
        SettingsError: a value ``getbool`` refuses (``'yes'``, ``'on'``, a list …).
    """
    return _read(settings, name, settings.getbool, _BOOLEAN)


def polite_enabled(settings: Any) -> bool:
    """``POLITE_ENABLED`` (default True), read by Scrapy's ``getbool``: the one place it is read (the add-on, the
    middlewares, the extension and :meth:`PoliteConfig.from_settings` ask here).

    Args:
        settings: a Scrapy ``Settings`` or a plain mapping.

    Raises:
        SettingsError: not a boolean; the message names the setting and the values accepted.
    """
    return _bool(as_settings(settings), "POLITE_ENABLED")


def _seconds(settings: BaseSettings, name: str) -> float:
    """A duration setting in seconds, read by Scrapy's ``getfloat``, then finite and ``>= 0``
    (:func:`~scrapy_polite.vocabulary.parse_seconds`; ``getfloat`` takes ``'nan'``, ``'inf'`` and ``-1``).

    Raises:
        SettingsError: not a number, not finite, or negative.
    """
    value = _read(settings, name, settings.getfloat, "a number of seconds")
    if parse_seconds(value) is None:
        raise SettingsError(f"{name} must be a finite number of seconds >= 0, got {_raw(settings, name)!r}")
    return value


def _count(settings: BaseSettings, name: str, *, what: str, minimum: int = 0, fix: str = "") -> int:
    """A whole-number setting ``>= minimum`` (an int, or a string or float of one: ``-s NAME=1000``), read by
    Scrapy's ``getint``; ``what`` says what it counts and ``fix`` what to do instead, for the error message.

    Raises:
        SettingsError: a bool or a fraction (which ``getint`` would truncate), a number below ``minimum``, or
            not a number.
    """
    form = f"a whole number >= {minimum} ({what})"
    value = _read(settings, name, settings.getint, form)
    raw = _raw(settings, name)
    try:
        whole = not isinstance(raw, bool) and float(raw) == value  # getint truncates a fraction
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < minimum:
        raise SettingsError(f"{name} must be {form}, got {raw!r}{fix}")
    return value


def _list_form(what: str, example: Sequence[str]) -> str:
    csv = ",".join(example)
    return (f"{what}: a list such as {list(example)!r}, a comma-separated string such as {csv!r} "
            f"or a JSON list such as {json.dumps(list(example))!r}")


def _list(settings: BaseSettings, name: str, *, what: str, example: Sequence[str]) -> list[Any]:
    """A list setting, read by Scrapy's ``getlist`` (see :func:`parse_list_setting` for the forms)."""
    raw = _raw(settings, name)
    form = _list_form(what, example)
    if isinstance(raw, str) and raw.strip().startswith("["):
        try:
            return list(json.loads(raw))  # valid JSON that starts with "[" is a list; getlist would split it
        except ValueError:
            pass  # not JSON: comma-separated after all, e.g. the nameserver "[::1]:53"
    items = _read(settings, name, settings.getlist, form)
    if raw is not None and not isinstance(raw, (str, list, tuple, set, frozenset)):
        raise SettingsError(f"{name} must be {form}, got {raw!r}")  # getlist takes a dict's keys, 0 as []
    if isinstance(raw, str):
        return [item.strip() for item in items if item.strip()]
    return items


def parse_list_setting(name: str, value: Any, *, what: str, example: Sequence[str]) -> list[Any]:
    """The items of a list setting, in the forms Scrapy users pass, read as Scrapy's ``getlist`` reads them.

    Accepted: a list, tuple or set (its items, unchanged); a JSON list string (``'[]'``,
    ``'["127.0.0.0/8"]'``); any other string is comma-separated, as ``getlist`` reads it, with items
    stripped and empty ones dropped (``''`` is the empty list). A string that starts with ``[`` but is not
    valid JSON is comma-separated too, so ``'[::1]:53'`` is one item; malformed JSON such as
    ``'[127.0.0.0/8]'`` then gives an item the caller's validation refuses, with the accepted forms. None is
    the empty list. The items are not validated here.

    Args:
        name: the setting's name, for the error message.
        value: the raw value.
        what: what the setting holds, e.g. ``"a list of CIDR networks"``.
        example: example items, e.g. ``["127.0.0.0/8", "::1/128"]``, for the error message.

    Returns:
        a new list of the items.

    Raises:
        SettingsError: a value of another type (a number, a dict); the message names the setting, the
            value and the accepted forms.

    >>> parse_list_setting("POLITE_ALLOWED_NETWORKS", "127.0.0.0/8, ::1/128", what="CIDR networks",
    ...                    example=["127.0.0.0/8"])
    ['127.0.0.0/8', '::1/128']
    """
    return _list(BaseSettings({name: value}), name, what=what, example=example)


def _dict_form(what: str, example: Mapping[str, Any]) -> str:
    return f"{what}: a dict such as {dict(example)!r} or a JSON object such as {json.dumps(dict(example))!r}"


def _dict(settings: BaseSettings, name: str, *, what: str, example: Mapping[str, Any]) -> dict[Any, Any]:
    """A dict setting, read by Scrapy's ``getdict`` (see :func:`parse_dict_setting` for the forms)."""
    raw = _raw(settings, name)
    form = _dict_form(what, example)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = settings.getdict(name, DEFAULTS.get(name))
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name} is not valid JSON ({exc}), got {raw!r}; it must be {form}") from None
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be {form}, got {raw!r}") from None
    # getdict also takes a list of pairs, and a JSON list of them: not the forms this setting documents.
    if not isinstance(raw, (str, Mapping)) or (isinstance(raw, str) and not raw.strip().startswith("{")):
        raise SettingsError(f"{name} must be {form}, got {raw!r}")
    return value


def parse_dict_setting(name: str, value: Any, *, what: str, example: Mapping[str, Any]) -> dict[Any, Any]:
    """The entries of a dict setting, in the forms Scrapy users pass, read as Scrapy's ``getdict`` reads them.

    Accepted: a mapping (a dict, or a Scrapy ``BaseSettings``); a JSON object string. None and ``''`` are
    the empty dict. The entries are not validated here.

    Args:
        name: the setting's name, for the error message.
        value: the raw value.
        what: what the setting holds, e.g. ``"a dict of host -> seconds"``.
        example: an example value, for the error message.

    Returns:
        a new dict of the entries.

    Raises:
        SettingsError: malformed JSON, JSON that is not an object, or a value of another type (a list of
            pairs, which ``getdict`` would take, included); the message names the setting, the value and the
            accepted forms.
    """
    return _dict(BaseSettings({name: value}), name, what=what, example=example)


# -- the address and DNS settings -------------------------------------------------------------------------


def normalise_dns_name(host: str) -> str:
    """A host name as the resolver keys it: stripped, lower-cased, without trailing dot or IPv6 brackets.

    >>> normalise_dns_name(" A.Test. ")
    'a.test'
    """
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def _sort_key(address: str) -> tuple[int, Any]:
    ip = ipaddress.ip_address(address)
    return (ip.version, ip)


def parse_dns_overrides(value: Any) -> dict[str, tuple[str, ...]]:
    """``POLITE_DNS_OVERRIDES`` validated: host → its addresses, sorted (IPv4 first) and de-duplicated.

    Args:
        value: a dict (or JSON object string) of host name → addresses; the addresses of one host are a
            list setting (a list, a comma-separated string or a JSON list), so one address may be a plain
            string. Host names are normalised (:func:`normalise_dns_name`).

    Returns:
        a new dict ``{host: (address, ...)}`` with canonical address strings.

    Raises:
        SettingsError: not a dict, malformed JSON, an empty or non-string host, or an address that is not
            an IP literal (``2130706433`` and ``0177.0.0.1`` are names, docs/spec.md §4, so they are refused here).
    """
    return _dns_overrides(BaseSettings({"POLITE_DNS_OVERRIDES": value}))


def _dns_overrides(settings: BaseSettings) -> dict[str, tuple[str, ...]]:
    entries = _dict(settings, "POLITE_DNS_OVERRIDES", what="a dict of host -> list of IP addresses",
                    example={"api.example.test": ["127.0.0.1"]})
    overrides: dict[str, tuple[str, ...]] = {}
    for host, raw_addresses in entries.items():
        name = normalise_dns_name(host) if isinstance(host, str) else ""
        if not name:
            raise SettingsError(f"POLITE_DNS_OVERRIDES has the key {host!r}, which is not a host name; it must "
                                f"map host names to IP addresses, e.g. {{'api.example.test': ['127.0.0.1']}}")
        setting = f"POLITE_DNS_OVERRIDES[{host!r}]"
        addresses = parse_list_setting(setting, raw_addresses, what="a list of IP addresses",
                                       example=["127.0.0.1", "::1"])
        parsed = []
        for address in addresses:
            ip = parse_ip_literal(address) if isinstance(address, str) else None
            if ip is None:
                raise SettingsError(f"{setting} has {address!r}, which is not an IP address; it must be "
                                    f"{_list_form('a list of IP addresses', ['127.0.0.1', '::1'])}")
            parsed.append(str(ip))
        overrides[name] = tuple(sorted(set(parsed), key=_sort_key))
    return overrides


def parse_nameserver(entry: str) -> tuple[str, int]:
    """One ``POLITE_DNS_NAMESERVERS`` entry: ``"127.0.0.1:5353"``, ``"[::1]:53"``, ``"::1"`` or ``"8.8.8.8"``
    → ``(address, port)``; the port defaults to 53.

    Raises:
        SettingsError: not an IP address with an optional port 1-65535 (names the entry and the setting).
    """
    text = str(entry).strip()
    port_text = "53"
    host = text
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                host = ""
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    form = "an IP address with an optional port, e.g. '127.0.0.1:5353', '8.8.8.8' or '[::1]:53'"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise SettingsError(f"POLITE_DNS_NAMESERVERS entry {entry!r} is not an IP address[:port]; "
                            f"each entry must be {form}") from None
    port = int(port_text) if port_text.isascii() and port_text.isdigit() else 0
    if not 0 < port < 65536:
        raise SettingsError(f"POLITE_DNS_NAMESERVERS entry {entry!r} has a bad port (1-65535); "
                            f"each entry must be {form}")
    return host, port


def _address_filter(settings: BaseSettings) -> AddressFilter:
    allow_private = _bool(settings, "POLITE_ALLOW_PRIVATE")
    raw = _raw(settings, "POLITE_ALLOWED_NETWORKS")
    form = _list_form("a list of CIDR networks", ["127.0.0.0/8", "::1/128"])
    networks = _list(settings, "POLITE_ALLOWED_NETWORKS", what="a list of CIDR networks",
                     example=["127.0.0.0/8", "::1/128"])
    try:
        return AddressFilter(allow_private=allow_private, allowed_networks=networks)
    except ValueError as exc:
        raise SettingsError(f"{exc}; POLITE_ALLOWED_NETWORKS is {raw!r} and must be {form}") from None


@dataclass(frozen=True)
class DNSConfig:
    """The validated settings of the per-process resolver (docs/spec.md §4): the address rules and the DNS settings.

    Scrapy builds the resolver from the *process* settings (``TWISTED_DNS_RESOLVER``), so this is read
    without the pacing settings, by :meth:`from_settings`.

    Attributes:
        address_filter: the :class:`~scrapy_polite.addresses.AddressFilter` of ``POLITE_ALLOW_PRIVATE`` and
            ``POLITE_ALLOWED_NETWORKS``.
        overrides: ``POLITE_DNS_OVERRIDES``, normalised host → sorted, de-duplicated addresses (read-only).
        nameservers: ``POLITE_DNS_NAMESERVERS`` as ``(address, port)`` pairs; empty: the system's.
        timeout: ``POLITE_DNS_TIMEOUT``, seconds for one lookup (A and AAAA together), > 0.
        min_ttl, max_ttl: ``POLITE_DNS_MIN_TTL`` / ``POLITE_DNS_MAX_TTL``, seconds; an answer is cached for
            its TTL clamped to this range (``0 <= min_ttl <= max_ttl``).
    """

    address_filter: AddressFilter = field(default_factory=AddressFilter)
    overrides: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    nameservers: tuple[tuple[str, int], ...] = ()
    timeout: float = DEFAULTS["POLITE_DNS_TIMEOUT"]
    min_ttl: float = DEFAULTS["POLITE_DNS_MIN_TTL"]
    max_ttl: float = DEFAULTS["POLITE_DNS_MAX_TTL"]

    @classmethod
    def from_settings(cls, settings: Any) -> DNSConfig:
        """Read and validate the address and DNS settings (a Scrapy ``Settings`` or a plain mapping).

        Raises:
            SettingsError: a bad ``POLITE_ALLOW_PRIVATE``, ``POLITE_ALLOWED_NETWORKS`` entry,
                ``POLITE_DNS_OVERRIDES`` entry or ``POLITE_DNS_NAMESERVERS`` entry; a
                ``POLITE_DNS_TIMEOUT`` <= 0; a negative TTL or ``POLITE_DNS_MIN_TTL > POLITE_DNS_MAX_TTL``.
        """
        settings = as_settings(settings)
        address_filter = _address_filter(settings)
        overrides = _dns_overrides(settings)
        entries = _list(settings, "POLITE_DNS_NAMESERVERS",
                        what="a list of nameserver IP addresses with an optional port",
                        example=["127.0.0.1:5353", "[::1]:53"])
        nameservers = tuple(parse_nameserver(entry) for entry in entries)
        timeout = _seconds(settings, "POLITE_DNS_TIMEOUT")
        if timeout <= 0:
            raise SettingsError(f"POLITE_DNS_TIMEOUT must be > 0 seconds (a lookup needs time to answer), got "
                                f"{_raw(settings, 'POLITE_DNS_TIMEOUT')!r}")
        min_ttl = _seconds(settings, "POLITE_DNS_MIN_TTL")
        max_ttl = _seconds(settings, "POLITE_DNS_MAX_TTL")
        if max_ttl < min_ttl:
            raise SettingsError(f"POLITE_DNS_MAX_TTL ({max_ttl:g} s) must be >= POLITE_DNS_MIN_TTL "
                                f"({min_ttl:g} s): answers are cached for their TTL clamped to "
                                "[POLITE_DNS_MIN_TTL, POLITE_DNS_MAX_TTL]")
        return cls(address_filter=address_filter, overrides=MappingProxyType(overrides),
                   nameservers=nameservers, timeout=timeout, min_ttl=min_ttl, max_ttl=max_ttl)


# -- the whole configuration ------------------------------------------------------------------------------


def _status(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


def _throttle_statuses(settings: BaseSettings) -> frozenset[int]:
    raw = _raw(settings, "POLITE_THROTTLE_STATUSES")
    items = _list(settings, "POLITE_THROTTLE_STATUSES", what="a list of HTTP status codes", example=["429", "503"])
    # A plain string may also separate the codes with spaces ("429 503"), as it always could.
    items = [part for item in items for part in (item.split() if isinstance(item, str) else [item])]
    try:
        statuses = frozenset(_status(s) for s in items)
    except (TypeError, ValueError):
        raise SettingsError(f"POLITE_THROTTLE_STATUSES must be "
                            f"{_list_form('a list of HTTP status codes', ['429', '503'])}, got {raw!r}") from None
    if not statuses:
        raise SettingsError("POLITE_THROTTLE_STATUSES is empty: a throttling host would never be backed off. "
                            "Fix: keep the default [429, 503] or list the statuses that mean 'slow down'")
    if any(not 100 <= s <= 599 for s in statuses):
        raise SettingsError(f"POLITE_THROTTLE_STATUSES has a status outside 100-599: {sorted(statuses)}")
    return statuses


def _host_delays(settings: BaseSettings) -> dict[str, float]:
    raw_delays = _dict(settings, "POLITE_HOST_DELAYS", what="a dict of host -> seconds", example={"api.example.com": 5})
    host_delays: dict[str, float] = {}
    for host, raw in raw_delays.items():
        key = host_key(f"http://{host}/") if "://" not in str(host) else host_key(str(host))
        value = parse_seconds(raw)
        if key is None or value is None:
            raise SettingsError(
                f"POLITE_HOST_DELAYS[{host!r}] must map a host name to seconds >= 0, got {raw!r}")
        host_delays[key] = value
    return host_delays


def _store_uri(settings: BaseSettings) -> str | None:
    raw = _raw(settings, "POLITE_STORE")
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, (str, type(None))):
        raise SettingsError(f"POLITE_STORE must be a store URI such as 'sqlite:///path/to/pace.sqlite3' or "
                            f"'memory://' (or None for the project's .scrapy/polite.sqlite3), got {raw!r}")
    return raw or None


def _store_prefix(settings: BaseSettings) -> str:
    raw = _raw(settings, "POLITE_STORE_PREFIX")
    if not isinstance(raw, str) or not raw or not raw.isprintable() or any(ch.isspace() for ch in raw):
        raise SettingsError(f"POLITE_STORE_PREFIX must be a non-empty string without spaces, the prefix of the pace "
                            f"table's keys in a shared server, such as 'polite:' or 'crawl1:', got {raw!r}")
    return raw


def _adaptive(settings: BaseSettings) -> AdaptivePolicy | None:
    """``POLITE_ADAPTIVE``'s rules, or None when it is off (docs/guides/adaptive.md).

    Raises:
        SettingsError: a ``POLITE_ADAPTIVE_FACTOR`` <= 0 or a bad ``POLITE_ADAPTIVE_MAX``; ``AUTOTHROTTLE_ENABLED``
            with ``POLITE_ADAPTIVE`` while ``POLITE_ADAPTIVE_WITH_AUTOTHROTTLE`` is off.
    """
    on = _bool(settings, "POLITE_ADAPTIVE")
    form = "a finite number > 0 (the interval is at least this many times the host's smoothed latency)"
    factor = _read(settings, "POLITE_ADAPTIVE_FACTOR", settings.getfloat, form)
    if not math.isfinite(factor) or factor <= 0:  # stricter than getfloat
        raise SettingsError(f"POLITE_ADAPTIVE_FACTOR must be {form}, got {_raw(settings, 'POLITE_ADAPTIVE_FACTOR')!r}")
    cap = _seconds(settings, "POLITE_ADAPTIVE_MAX")
    both = _bool(settings, "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE")
    if not on:
        return None
    if _autothrottle(settings) and not both:
        raise SettingsError("POLITE_ADAPTIVE and AUTOTHROTTLE_ENABLED are both on: two pacers, one unaware of the "
                            "other. Turn AutoThrottle off (AUTOTHROTTLE_ENABLED = False): POLITE_ADAPTIVE paces each "
                            "host on its response times already, shared across processes; or set "
                            "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE = True to run both")
    return AdaptivePolicy(factor=factor, cap=cap)


def _autothrottle(settings: BaseSettings) -> bool:
    """Whether Scrapy's ``AUTOTHROTTLE_ENABLED`` is on (False when it is absent or not a boolean: Scrapy's
    AutoThrottle reports its own setting)."""
    try:
        return settings.getbool("AUTOTHROTTLE_ENABLED")
    except (TypeError, ValueError):
        return False


def _frontier_key(settings: BaseSettings) -> str:
    raw = _raw(settings, "POLITE_FRONTIER_KEY")
    try:
        ok = isinstance(raw, str) and bool(raw % {"spider": "s"}) and raw.isprintable() and " " not in raw
    except (KeyError, ValueError, TypeError):
        ok = False
    if not ok:
        raise SettingsError(f"POLITE_FRONTIER_KEY must be a Redis key prefix without spaces, where %(spider)s stands "
                            f"for the spider's name, such as '%(spider)s:polite', got {raw!r}")
    return str(raw)


def _scheduler_base(settings: BaseSettings) -> str | type[Any]:
    raw = _raw(settings, "POLITE_SCHEDULER_BASE")
    if isinstance(raw, type) or (isinstance(raw, str) and raw.strip()):
        return raw
    raise SettingsError(f"POLITE_SCHEDULER_BASE must be a scheduler class or its import path, such as "
                        f"'scrapy.core.scheduler.Scheduler', got {raw!r}")


def checked_handlers(settings: Any) -> tuple[str, ...]:
    """``POLITE_CHECKED_HANDLERS``: the import paths of the download handlers the user accepts with the
    *checked* address rule (docs/spec.md §4.1). Items may be classes (their import path is used).

    Raises:
        SettingsError: not a list, or an item that is neither a class nor a non-empty dotted import path.
    """
    items = _list(as_settings(settings), "POLITE_CHECKED_HANDLERS",
                  what="a list of download handler classes or import paths",
                  example=["myproject.handlers.MyDownloadHandler"])
    paths: list[str] = []
    for item in items:
        if isinstance(item, type):
            paths.append(f"{item.__module__}.{item.__qualname__}")
        elif isinstance(item, str) and "." in item.strip() and " " not in item.strip():
            paths.append(item.strip())
        else:
            raise SettingsError(f"POLITE_CHECKED_HANDLERS: {item!r} is not a download handler class or its import "
                                "path, such as 'myproject.handlers.MyDownloadHandler'")
    return tuple(paths)


@dataclass(frozen=True)
class PoliteConfig:
    """The validated ``POLITE_*`` settings of one crawler.

    Attributes:
        policy: the :class:`~scrapy_polite.policy.PacingPolicy` built from the interval settings
            (``POLITE_HOST_INTERVAL``, ``POLITE_MAX_BACKOFF``, ``POLITE_MAX_WAIT``,
            ``POLITE_MAX_RETRY_AFTER``, ``POLITE_THROTTLE_STATUSES``, ``POLITE_MAX_FAILURE_BACKOFF``,
            ``POLITE_THROTTLE_RETRIES``, ``POLITE_RATELIMIT_HEADERS``, and ``POLITE_ADAPTIVE``,
            ``POLITE_ADAPTIVE_FACTOR``, ``POLITE_ADAPTIVE_MAX`` for its ``adaptive`` rules).
        ip_interval: ``POLITE_IP_INTERVAL``, seconds between two requests to one IP address.
        max_idle_wait: ``POLITE_MAX_IDLE_WAIT``, seconds; when everything left is deferred beyond it the
            spider closes with reason ``polite_deferred``.
        max_held_in_memory: ``POLITE_MAX_HELD_IN_MEMORY``, how many held (deferred) requests are kept in
            memory; the others wait on disk (:mod:`scrapy_polite.held`). An int >= 0.
        store_uri: ``POLITE_STORE`` (None: the project's data dir).
        store_expire: ``POLITE_STORE_EXPIRE``, seconds after which an idle host's row is removed.
        store_prefix: ``POLITE_STORE_PREFIX``, the key prefix of the table in a shared server (Redis).
        event_log: ``POLITE_EVENT_LOG``, keep the event log beside the pace table.
        event_log_size: ``POLITE_EVENT_LOG_SIZE``, the most events the table's log keeps (an int >= 1).
        shared_frontier: ``POLITE_SHARED_FRONTIER``, keep held and in-flight requests in Redis with
            scrapy-redis's scheduler (docs/spec.md §5, "The shared frontier").
        frontier_key: ``POLITE_FRONTIER_KEY``, the shared frontier's key prefix (``%(spider)s``: the name).
        lease_time: ``POLITE_LEASE_TIME``, seconds a worker's leases last without renewal (> 0).
        store_timeout: ``POLITE_STORE_TIMEOUT``, seconds a server store may stay unreachable mid-crawl
            before the spider closes with reason ``polite_store_error`` (> 0).
        host_delays: ``POLITE_HOST_DELAYS`` with normalised host keys, seconds.
        enabled: ``POLITE_ENABLED``.
        checked_handlers: ``POLITE_CHECKED_HANDLERS``, import paths (:func:`checked_handlers`).
        scheduler_base: ``POLITE_SCHEDULER_BASE``, the scheduler class (or its import path) wrapped.
        dns: the address rules and DNS settings (:class:`DNSConfig`), read from this crawler's settings;
            :attr:`address_filter` is ``dns.address_filter``.
    """

    policy: PacingPolicy
    ip_interval: float
    max_idle_wait: float
    store_uri: str | None
    store_expire: float
    host_delays: Mapping[str, float] = field(default_factory=dict)
    enabled: bool = True
    scheduler_base: str | type[Any] = DEFAULTS["POLITE_SCHEDULER_BASE"]
    max_held_in_memory: int = DEFAULTS["POLITE_MAX_HELD_IN_MEMORY"]
    dns: DNSConfig = field(default_factory=DNSConfig)
    store_prefix: str = DEFAULTS["POLITE_STORE_PREFIX"]
    store_timeout: float = DEFAULTS["POLITE_STORE_TIMEOUT"]
    event_log: bool = DEFAULTS["POLITE_EVENT_LOG"]
    event_log_size: int = DEFAULTS["POLITE_EVENT_LOG_SIZE"]
    checked_handlers: tuple[str, ...] = ()
    shared_frontier: bool = DEFAULTS["POLITE_SHARED_FRONTIER"]
    frontier_key: str = DEFAULTS["POLITE_FRONTIER_KEY"]
    lease_time: float = DEFAULTS["POLITE_LEASE_TIME"]

    @property
    def address_filter(self) -> AddressFilter:
        """Which addresses this crawler may contact (``POLITE_ALLOW_PRIVATE``, ``POLITE_ALLOWED_NETWORKS``)."""
        return self.dns.address_filter

    @classmethod
    def from_settings(cls, settings: Any) -> PoliteConfig:
        """Read and validate every ``POLITE_*`` setting (a Scrapy ``Settings`` or a plain mapping).

        Raises:
            SettingsError: a negative, non-finite or non-numeric duration; an empty or non-integer
                ``POLITE_THROTTLE_STATUSES``; a ``POLITE_THROTTLE_RETRIES`` that is not a whole number >= 0;
                a malformed ``POLITE_HOST_DELAYS`` entry; a bad boolean,
                ``POLITE_STORE``, ``POLITE_STORE_PREFIX`` or ``POLITE_SCHEDULER_BASE``; a
                ``POLITE_STORE_TIMEOUT`` <= 0; a ``POLITE_MAX_HELD_IN_MEMORY`` that is not a whole
                number >= 0; any error of :meth:`DNSConfig.from_settings`; ``POLITE_ADAPTIVE`` with
                ``AUTOTHROTTLE_ENABLED`` unless ``POLITE_ADAPTIVE_WITH_AUTOTHROTTLE`` (two pacers, one unaware
                of the other), a ``POLITE_ADAPTIVE_FACTOR`` <= 0.
        """
        settings = as_settings(settings)
        enabled = polite_enabled(settings)
        host_interval = _seconds(settings, "POLITE_HOST_INTERVAL")
        max_backoff = _seconds(settings, "POLITE_MAX_BACKOFF")
        if max_backoff < host_interval:  # found by tests/test_fuzz.py (PacingPolicy's ValueError escaped)
            raise SettingsError(f"POLITE_MAX_BACKOFF ({max_backoff:g} s) must not be below POLITE_HOST_INTERVAL "
                                f"({host_interval:g} s): a backoff shorter than the interval would not slow a "
                                "throttling host down")
        max_wait = _seconds(settings, "POLITE_MAX_WAIT")
        if max_wait <= 0:
            raise SettingsError(f"POLITE_MAX_WAIT must be > 0 seconds (a wait in line of 0 s cannot wait), got "
                                f"{max_wait!r}; use a small value such as 1.0 to defer almost every wait")
        max_retry_after = _seconds(settings, "POLITE_MAX_RETRY_AFTER")
        max_failure_backoff = _seconds(settings, "POLITE_MAX_FAILURE_BACKOFF")
        throttle_retries = _count(settings, "POLITE_THROTTLE_RETRIES",
                                  what="how many times a throttled page is retried, e.g. 10; 0: never")
        ratelimit_headers = _bool(settings, "POLITE_RATELIMIT_HEADERS")
        statuses = _throttle_statuses(settings)
        host_delays = _host_delays(settings)
        store_timeout = _seconds(settings, "POLITE_STORE_TIMEOUT")
        if store_timeout <= 0:
            raise SettingsError(f"POLITE_STORE_TIMEOUT must be > 0 seconds (how long the crawl waits for an "
                                f"unreachable pace table), got {_raw(settings, 'POLITE_STORE_TIMEOUT')!r}")
        lease_time = _seconds(settings, "POLITE_LEASE_TIME")
        if lease_time <= 0:
            raise SettingsError(f"POLITE_LEASE_TIME must be > 0 seconds (how long a worker's leases last without "
                                f"renewal, e.g. 60), got {_raw(settings, 'POLITE_LEASE_TIME')!r}")
        return cls(
            policy=PacingPolicy(host_interval=host_interval, max_backoff=max_backoff, max_wait=max_wait,
                                max_retry_after=max_retry_after, throttle_statuses=statuses,
                                max_failure_backoff=max_failure_backoff, throttle_retries=throttle_retries,
                                ratelimit_headers=ratelimit_headers, adaptive=_adaptive(settings)),
            ip_interval=_seconds(settings, "POLITE_IP_INTERVAL"),
            max_idle_wait=_seconds(settings, "POLITE_MAX_IDLE_WAIT"),
            max_held_in_memory=_count(
                settings, "POLITE_MAX_HELD_IN_MEMORY",
                what="how many deferred requests are held in memory before the others go to disk, e.g. 10000"),
            store_uri=_store_uri(settings),
            store_expire=_seconds(settings, "POLITE_STORE_EXPIRE"),
            host_delays=host_delays,
            enabled=enabled,
            scheduler_base=_scheduler_base(settings),
            dns=DNSConfig.from_settings(settings),
            store_prefix=_store_prefix(settings),
            store_timeout=store_timeout,
            event_log=_bool(settings, "POLITE_EVENT_LOG"),
            event_log_size=_count(settings, "POLITE_EVENT_LOG_SIZE", minimum=1,
                                  what="the most events the event log keeps, e.g. 100000",
                                  fix="; set POLITE_EVENT_LOG = False to keep no log"),
            checked_handlers=checked_handlers(settings),
            shared_frontier=_bool(settings, "POLITE_SHARED_FRONTIER"),
            frontier_key=_frontier_key(settings),
            lease_time=lease_time,
        )


# -- unknown names ----------------------------------------------------------------------------------------


def unknown_settings(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """The ``POLITE_*`` names that are not settings, each with the closest known name (or None).

    A name counts when it starts with ``POLITE_`` in any case (``polite_host_interval`` is a typo too:
    Scrapy setting names are case-sensitive) and is not a key of :data:`DEFAULTS`. The closest name is
    :func:`difflib.get_close_matches` over the part after ``POLITE_`` (cutoff 0.6).

    Args:
        names: setting names, e.g. a Scrapy ``Settings`` (which iterates over its names).

    Returns:
        ``[(name, closest or None), ...]`` in the order first seen, each name once.

    >>> unknown_settings(["POLITE_HOST_INTERVALS", "POLITE_IP_INTERVAL", "LOG_LEVEL"])
    [('POLITE_HOST_INTERVALS', 'POLITE_HOST_INTERVAL')]
    """
    known = {name[len(_PREFIX):]: name for name in DEFAULTS}
    found: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name in seen or name in DEFAULTS:
            continue
        upper = name.upper()
        if not upper.startswith(_PREFIX):
            continue
        seen.add(name)
        close = difflib.get_close_matches(upper[len(_PREFIX):], list(known), n=1)
        found.append((name, known[close[0]] if close else None))
    return found


def warn_unknown_settings(settings: Iterable[str]) -> None:
    """Log one WARNING per unknown ``POLITE_*`` name in ``settings`` (see :func:`unknown_settings`), e.g.
    ``scrapy-polite: unknown setting POLITE_HOST_INTERVALS (did you mean POLITE_HOST_INTERVAL?)``: such a
    setting is silently ignored otherwise.

    Args:
        settings: a Scrapy ``Settings`` or a mapping (its keys are read) or any iterable of names.
    """
    for name, close in unknown_settings(settings):
        if close is not None:
            logger.warning("scrapy-polite: unknown setting %s (did you mean %s?)", name, close)
        else:
            logger.warning("scrapy-polite: unknown setting %s (not a scrapy-polite setting; the settings reference "
                           "lists them)", name)
