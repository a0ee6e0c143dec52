"""The ``POLITE_*`` settings: defaults (SPEC §2, §4, §6), reading and validation.

Every duration is in seconds (Scrapy's convention, as ``DOWNLOAD_DELAY``). Settings are read once, when the
crawler builds the components, and a bad value stops the crawl at start with an error that names the
setting — never a silently unpaced crawl.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .policy import PacingPolicy, host_key

__all__ = ["DEFAULTS", "PoliteConfig", "SettingsError"]

#: Every setting with its default. README.md documents each one.
DEFAULTS: dict[str, Any] = {
    "POLITE_ENABLED": True,
    "POLITE_HOST_INTERVAL": 1.0,
    "POLITE_IP_INTERVAL": 2.0,
    "POLITE_MAX_BACKOFF": 300.0,
    "POLITE_MAX_WAIT": 60.0,
    "POLITE_THROTTLE_STATUSES": [429, 503],
    "POLITE_MAX_RETRY_AFTER": 3600.0,
    "POLITE_MAX_IDLE_WAIT": 300.0,
    "POLITE_STORE": None,  # None: sqlite in the project's data dir (.scrapy/polite.sqlite3)
    "POLITE_STORE_EXPIRE": 30 * 24 * 3600.0,
    "POLITE_HOST_DELAYS": {},
    "POLITE_SCHEDULER_BASE": "scrapy.core.scheduler.Scheduler",
    "POLITE_ALLOW_PRIVATE": False,
    "POLITE_ALLOWED_NETWORKS": [],
    "POLITE_DNS_OVERRIDES": {},
    "POLITE_DNS_NAMESERVERS": [],
    "POLITE_DNS_TIMEOUT": 5.0,
    "POLITE_DNS_MIN_TTL": 60.0,
    "POLITE_DNS_MAX_TTL": 3600.0,
}


class SettingsError(ValueError):
    """A ``POLITE_*`` setting has a value the pacer cannot use. The message names the setting and the fix."""


def _seconds(settings: Any, name: str, *, minimum: float = 0.0) -> float:
    raw = settings.get(name, DEFAULTS[name])
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise SettingsError(f"{name} must be a finite number of seconds >= {minimum:g}, got {raw!r}")
    return value


def _status(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


@dataclass(frozen=True)
class PoliteConfig:
    """The validated ``POLITE_*`` settings of one crawler.

    Attributes:
        policy: the :class:`~scrapy_polite.policy.PacingPolicy` built from the interval settings.
        ip_interval: ``POLITE_IP_INTERVAL``, seconds between two requests to one IP address.
        max_idle_wait: ``POLITE_MAX_IDLE_WAIT``, seconds; when everything left is deferred beyond it the
            spider closes with reason ``polite_deferred``.
        store_uri: ``POLITE_STORE`` (None: the project's data dir).
        store_expire: ``POLITE_STORE_EXPIRE``, seconds after which an idle host's row is removed.
        host_delays: ``POLITE_HOST_DELAYS`` with normalised host keys, seconds.
    """

    policy: PacingPolicy
    ip_interval: float
    max_idle_wait: float
    store_uri: str | None
    store_expire: float
    host_delays: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Any) -> PoliteConfig:
        """Read and validate the settings (a Scrapy ``Settings`` or a plain mapping).

        Raises:
            SettingsError: a negative, non-finite or non-numeric duration; an empty or non-integer
                ``POLITE_THROTTLE_STATUSES``; a malformed ``POLITE_HOST_DELAYS`` entry.
        """
        host_interval = _seconds(settings, "POLITE_HOST_INTERVAL")
        max_backoff = _seconds(settings, "POLITE_MAX_BACKOFF")
        max_wait = _seconds(settings, "POLITE_MAX_WAIT")
        if max_wait <= 0:
            raise SettingsError(f"POLITE_MAX_WAIT must be > 0 seconds (a wait in line of 0 s cannot wait), got "
                                f"{max_wait!r}; use a small value such as 1.0 to defer almost every wait")
        max_retry_after = _seconds(settings, "POLITE_MAX_RETRY_AFTER")
        raw_statuses = settings.get("POLITE_THROTTLE_STATUSES", DEFAULTS["POLITE_THROTTLE_STATUSES"])
        if isinstance(raw_statuses, str):
            raw_statuses = [s for s in raw_statuses.replace(",", " ").split() if s]
        try:
            statuses = frozenset(_status(s) for s in raw_statuses)
        except (TypeError, ValueError):
            raise SettingsError(
                f"POLITE_THROTTLE_STATUSES must be a list of HTTP status codes, got {raw_statuses!r}") from None
        if not statuses:
            raise SettingsError("POLITE_THROTTLE_STATUSES is empty: a throttling host would never be backed off. "
                                "Fix: keep the default [429, 503] or list the statuses that mean 'slow down'")
        if any(not 100 <= s <= 599 for s in statuses):
            raise SettingsError(f"POLITE_THROTTLE_STATUSES has a status outside 100-599: {sorted(statuses)}")
        raw_delays = settings.get("POLITE_HOST_DELAYS", None) or {}
        if isinstance(raw_delays, str):
            import json

            try:
                raw_delays = json.loads(raw_delays)
            except ValueError:
                raise SettingsError(f"POLITE_HOST_DELAYS must be a dict of host -> seconds, got {raw_delays!r}") from None
        if not isinstance(raw_delays, Mapping):
            raise SettingsError(f"POLITE_HOST_DELAYS must be a dict of host -> seconds, got {raw_delays!r}")
        host_delays: dict[str, float] = {}
        for host, raw in raw_delays.items():
            key = host_key(f"http://{host}/") if "://" not in str(host) else host_key(str(host))
            try:
                value = float(raw)
            except (TypeError, ValueError):
                value = float("nan")
            if key is None or not math.isfinite(value) or value < 0:
                raise SettingsError(
                    f"POLITE_HOST_DELAYS[{host!r}] must map a host name to seconds >= 0, got {raw!r}")
            host_delays[key] = value
        store_uri = settings.get("POLITE_STORE", None) or None
        return cls(
            policy=PacingPolicy(host_interval=host_interval, max_backoff=max_backoff, max_wait=max_wait,
                                max_retry_after=max_retry_after, throttle_statuses=statuses),
            ip_interval=_seconds(settings, "POLITE_IP_INTERVAL"),
            max_idle_wait=_seconds(settings, "POLITE_MAX_IDLE_WAIT"),
            store_uri=store_uri,
            store_expire=_seconds(settings, "POLITE_STORE_EXPIRE"),
            host_delays=host_delays,
        )
