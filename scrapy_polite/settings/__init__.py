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

A ``POLITE_*`` name that is not a setting (a typo such as ``POLITE_HOST_INTERVALS``) stops the crawl before it
starts, and a ``scrapy polite`` verb before it opens the store, with the closest known name
(:func:`check_setting_names`).
"""

from __future__ import annotations

from .config import PoliteConfig, checked_handlers
from .declaration import DEFAULTS, SETTINGS, Setting, unknown_settings, unknown_settings_error
from .dns import DNSConfig, normalise_dns_name, parse_dns_overrides, parse_nameserver
from .reading import (
    SettingsError,
    as_settings,
    check_setting_names,
    parse_dict_setting,
    parse_list_setting,
    polite_enabled,
)

__all__ = [
    "DEFAULTS",
    "DNSConfig",
    "as_settings",
    "check_setting_names",
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
    "unknown_settings_error",
]
