"""The address and DNS settings of the per-process resolver (docs/spec.md §4): :class:`DNSConfig`."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scrapy.settings import BaseSettings

from ..network.addresses import AddressFilter, parse_ip_literal
from .declaration import DEFAULTS
from .reading import (
    SettingsError,
    _bool,
    _dict,
    _list,
    _list_form,
    _raw,
    _seconds,
    as_settings,
    parse_list_setting,
)

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
        address_filter: the :class:`~scrapy_polite.network.addresses.AddressFilter` of ``POLITE_ALLOW_PRIVATE`` and
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
