"""The keys of the pace table's rows (docs/spec.md §1, §3): a URL's host key (:func:`host_key`) and an address's
row key (:func:`ip_key`); and a URL's origin (:func:`origin_of`), whose robots.txt publishes its own delay for
the host's row."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Protocol
from urllib.parse import urlsplit

from ..network.addresses import embedded_ipv4
from ..network.hosts import InvalidHost, url_host

__all__ = ["host_key", "ip_key", "origin_key", "origin_of"]

#: The port a scheme's origin has when its URL names none.
_DEFAULT_PORTS = {"http": 80, "https": 443}


class _SplitURL(Protocol):
    @property
    def scheme(self) -> str: ...

    @property
    def netloc(self) -> str: ...


def host_key(url: str) -> str | None:
    """The pacing key of a URL (docs/spec.md §1): its host as the WHATWG URL Standard reads it
    (:func:`scrapy_polite.network.hosts.url_host`: percent-decoded, IDNA-encoded, lower-cased, an IPv4 address in
    any of the Standard's spellings written as a dotted quad), without trailing dots or IPv6 brackets. The
    port is not part of the key.

    Args:
        url: an absolute URL.

    Returns:
        The key (``str``), or None when the URL has no host (``data:``, ``file:``) or the Standard rejects
        its host (:class:`~scrapy_polite.network.hosts.InvalidHost` says why).

    >>> host_key("HTTP://Bücher.Example.:8080/x")
    'xn--bcher-kva.example'
    >>> host_key("http://[2001:DB8::1]/")
    '2001:db8::1'
    >>> host_key("http://0x7f.1/")
    '127.0.0.1'
    """
    try:
        host = url_host(url)
    except InvalidHost:
        return None
    return host.key if host is not None else None


@lru_cache(maxsize=16384)  # called for every booking and release: parse each address once
def ip_key(address: str) -> str:
    """The pace-table key of an address's row: ``ip:`` + the canonical address (host keys never start with
    ``ip:``). An IPv4-mapped, NAT64 or 6to4 address reaches the IPv4 address it embeds and shares its row
    (docs/spec.md §3–4).

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return f"ip:{embedded}"
    return f"ip:{ip}"


def origin_of(url: _SplitURL) -> str:
    """The origin of a URL split by ``urllib.parse`` (``urlsplit``, or Scrapy's ``urlparse_cached``), named by
    :func:`origin_key`: ``scheme://host[:port]``, each of which has a robots.txt of its own (RFC 9309 §2.3), one
    name however the URL spells it (one robots.txt state, one fetch, no user info sent). A host's origins share its
    row (:func:`host_key` has no port).

    >>> from urllib.parse import urlsplit
    >>> origin_of(urlsplit("https://example.com:8443/a?b"))
    'https://example.com:8443'
    >>> origin_of(urlsplit("http://user@Example.com.:80/a"))
    'http://example.com'
    """
    return origin_key(f"{url.scheme}://{url.netloc}")


@lru_cache(maxsize=4096)  # once per request under ROBOTSTXT_OBEY: origins are few
def origin_key(origin: str) -> str:
    """The one name of an origin however a URL spells it (docs/spec.md §2, "A host's origins"; the robots.txt
    middleware's state, the row's delay entries): the scheme lower-cased, the host as :func:`host_key` reads it
    (an IPv6 address in brackets; an ``s3`` bucket as it is, since its robots.txt URL goes to the S3 handler), the
    port unless it is the scheme's default, and no user info (never a password in the table).

    >>> origin_key("HTTPS://user:secret@Example.COM.:443")
    'https://example.com'
    >>> origin_key("http://[2001:DB8::1]:8080")
    'http://[2001:db8::1]:8080'
    """
    parts = urlsplit(origin)
    scheme = parts.scheme.lower()
    hostport = parts.netloc.rpartition("@")[2]  # (a URL with user info has no host key: refused, docs/spec.md §1)
    host = (None if scheme == "s3" else host_key(f"{scheme}://{hostport}")) or (parts.hostname or "")
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # a port that is no number: the origin as it is spelt
        return f"{scheme}://{host}"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"
