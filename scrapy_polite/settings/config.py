"""One crawler's validated ``POLITE_*`` settings: :class:`PoliteConfig` (the pacing policy, the stores, the
frontier, the scheduler and the handlers; the resolver's part is :class:`~scrapy_polite.settings.dns.DNSConfig`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.core.scheduler import BaseScheduler
from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.misc import load_object
from scrapy.utils.python import global_object_name

from ..network.addresses import AddressFilter
from ..policy import PacingPolicy, host_key
from ..policy.adaptive import AdaptivePolicy
from ..vocabulary import parse_seconds
from .declaration import DEFAULTS
from .dns import DNSConfig
from .reading import (
    SettingsError,
    _bool,
    _count,
    _dict,
    _list,
    _list_form,
    _raw,
    _read,
    _seconds,
    as_settings,
    polite_enabled,
)

# -- the whole configuration ------------------------------------------------------------------------------


def _status(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


def _throttle_statuses(settings: BaseSettings) -> frozenset[int]:
    raw = _raw(settings, "POLITE_THROTTLE_STATUSES")
    items = _list(settings, "POLITE_THROTTLE_STATUSES", what="a list of HTTP status codes", example=[429, 503])
    # A plain string may also separate the codes with spaces ("429 503"), as it always could.
    items = [part for item in items for part in (item.split() if isinstance(item, str) else [item])]
    try:
        statuses = frozenset(_status(s) for s in items)
    except (TypeError, ValueError):
        raise SettingsError(f"POLITE_THROTTLE_STATUSES must be "
                            f"{_list_form('a list of HTTP status codes', [429, 503])}, got {raw!r}") from None
    if not statuses:
        raise SettingsError("POLITE_THROTTLE_STATUSES is empty: a throttling host would never be backed off. "
                            "Fix: keep the default [429, 503] or list the statuses that mean 'slow down'")
    if any(not 400 <= s <= 599 for s in statuses):  # trial: 200 was taken, and every page backed its host off
        raise SettingsError(f"POLITE_THROTTLE_STATUSES has a status outside 400-599 (a throttle is a refusal, 4xx or "
                            f"5xx): {sorted(statuses)}")
    return statuses


def _host_delays(settings: BaseSettings) -> dict[str, float]:
    raw_delays = _dict(settings, "POLITE_HOST_DELAYS", what="a dict of host -> seconds", example={"api.example.com": 5})
    host_delays: dict[str, float] = {}
    for host, raw in raw_delays.items():
        key = host_key(f"http://{host}/") if "://" not in str(host) else host_key(str(host))
        value = parse_seconds(raw)
        if key is None or value is None or "*" in key:  # "*" is a valid host character, but never a real host's
            raise SettingsError(
                f"POLITE_HOST_DELAYS[{host!r}] must map a host name (no wildcard: each host is its own key) to "
                f"seconds >= 0, got {raw!r}")
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
                            "other. Fix: turn AutoThrottle off (AUTOTHROTTLE_ENABLED = False): POLITE_ADAPTIVE paces "
                            "each host on its response times already, shared across processes; or set "
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


def scheduler_base_class(base: str | type[Any], settings: BaseSettings | None = None) -> type[Any]:
    """The scheduler class ``POLITE_SCHEDULER_BASE`` names (:attr:`PoliteConfig.scheduler_base`), loaded and checked
    as Scrapy checks its ``SCHEDULER``: by a crawl before it starts (trial: a bad one failed inside the engine, with
    two tracebacks and no ERROR line; one that was not a scheduler failed each request and the crawl exited 0); the
    ``scrapy polite`` commands never load it. The message names the setting the user wrote, read in ``settings``:
    ``SCHEDULER``, which the add-on moved (trial: it said POLITE_SCHEDULER_BASE "is set by an add-on"), or
    ``POLITE_SCHEDULER_BASE``.

    Raises:
        SettingsError: the path cannot be loaded, or its class lacks Scrapy's scheduler interface
            (``has_pending_requests``, ``enqueue_request``, ``next_request``: Scrapy's ``BaseScheduler``).
    """
    priority = settings.getpriority("POLITE_SCHEDULER_BASE") if settings is not None else None
    moved = priority is not None and priority <= SETTINGS_PRIORITIES["addon"]
    setting = "SCHEDULER" if moved else "POLITE_SCHEDULER_BASE"
    path = base if isinstance(base, str) else global_object_name(base)
    named = f"{setting} {path!r} (the scheduler scrapy-polite wraps" + (
        ", moved to POLITE_SCHEDULER_BASE)" if moved else ")")
    loaded: type[Any]
    if isinstance(base, type):
        loaded = base
    else:
        try:
            loaded = load_object(base)
        except (ImportError, NameError, AttributeError, ValueError) as exc:
            raise SettingsError(f"{named} cannot be loaded: {exc}. Fix: name an importable scheduler class, such as "
                                "'scrapy.core.scheduler.Scheduler'", setting=setting) from None
    if not isinstance(loaded, type) or not issubclass(loaded, BaseScheduler):
        raise SettingsError(f"{named} is not a scheduler: it lacks Scrapy's scheduler interface "
                            "(has_pending_requests, enqueue_request, next_request). Fix: name a scheduler class, "
                            "such as 'scrapy.core.scheduler.Scheduler'", setting=setting)
    return loaded


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


def _positive_seconds(settings: BaseSettings, name: str, why: str) -> float:
    """A duration setting that must be > 0 seconds (``why``: what it is, for the message)."""
    value = _seconds(settings, name)
    if value <= 0:
        raise SettingsError(f"{name} must be > 0 seconds ({why}), got {_raw(settings, name)!r}")
    return value


def _policy(settings: BaseSettings) -> PacingPolicy:
    """The :class:`~scrapy_polite.policy.PacingPolicy` of the interval, backoff, throttle and adaptive settings.

    Raises:
        SettingsError: a bad value of one of them; ``POLITE_MAX_BACKOFF`` below ``POLITE_HOST_INTERVAL``;
            ``POLITE_MAX_WAIT`` <= 0.
    """
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
    throttle_retries = _count(settings, "POLITE_THROTTLE_RETRIES",
                              what="how many times a throttled page is retried, e.g. 10; 0: never")
    return PacingPolicy(host_interval=host_interval, max_backoff=max_backoff, max_wait=max_wait,
                        max_retry_after=_seconds(settings, "POLITE_MAX_RETRY_AFTER"),
                        throttle_statuses=_throttle_statuses(settings),
                        max_failure_backoff=_seconds(settings, "POLITE_MAX_FAILURE_BACKOFF"),
                        throttle_retries=throttle_retries,
                        ratelimit_headers=_bool(settings, "POLITE_RATELIMIT_HEADERS"), adaptive=_adaptive(settings))


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
            memory; the others wait on disk (:mod:`scrapy_polite.crawl.held`). An int >= 0.
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
    scheduler_base: str | type[Any] = DEFAULTS["POLITE_SCHEDULER_BASE"]
    max_held_in_memory: int = DEFAULTS["POLITE_MAX_HELD_IN_MEMORY"]
    dns: DNSConfig = field(default_factory=DNSConfig)
    store_prefix: str = DEFAULTS["POLITE_STORE_PREFIX"]
    store_timeout: float = DEFAULTS["POLITE_STORE_TIMEOUT"]
    event_log: bool = DEFAULTS["POLITE_EVENT_LOG"]
    event_log_size: int = DEFAULTS["POLITE_EVENT_LOG_SIZE"]
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
        polite_enabled(settings)  # these two are checked here, and read where they are used (the add-on,
        checked_handlers(settings)  # the handlers' modes)
        policy = _policy(settings)
        host_delays = _host_delays(settings)
        store_timeout = _positive_seconds(settings, "POLITE_STORE_TIMEOUT",
                                          "how long the crawl waits for an unreachable pace table")
        lease_time = _positive_seconds(settings, "POLITE_LEASE_TIME",
                                       "how long a worker's leases last without renewal, e.g. 60")
        return cls(
            policy=policy,
            ip_interval=_seconds(settings, "POLITE_IP_INTERVAL"),
            max_idle_wait=_seconds(settings, "POLITE_MAX_IDLE_WAIT"),
            max_held_in_memory=_count(
                settings, "POLITE_MAX_HELD_IN_MEMORY",
                what="how many deferred requests are held in memory before the others go to disk, e.g. 10000"),
            store_uri=_store_uri(settings),
            store_expire=_seconds(settings, "POLITE_STORE_EXPIRE"),
            host_delays=host_delays,
            scheduler_base=_scheduler_base(settings),
            dns=DNSConfig.from_settings(settings),
            store_prefix=_store_prefix(settings),
            store_timeout=store_timeout,
            event_log=_bool(settings, "POLITE_EVENT_LOG"),
            event_log_size=_count(settings, "POLITE_EVENT_LOG_SIZE", minimum=1,
                                  what="the most events the event log keeps, e.g. 100000",
                                  fix="; set POLITE_EVENT_LOG = False to keep no log"),
            shared_frontier=_bool(settings, "POLITE_SHARED_FRONTIER"),
            frontier_key=_frontier_key(settings),
            lease_time=lease_time,
        )
