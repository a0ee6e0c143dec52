"""Which host a URL names, as the WHATWG URL Standard reads it (docs/spec.md §1, §4): pure, no I/O.

The URL Standard (https://url.spec.whatwg.org/, "host parsing") is what browsers and curl follow, and the
parser here is `Ada <https://github.com/ada-url/ada>`_ (the ``ada-url`` package), a conforming
implementation, rather than hand-written code. For the special schemes (``http``, ``https``, ``ws``,
``wss``, ``ftp``) it percent-decodes the host, then:

* a host whose last label is a number (``2130706433``, ``0x7f.1``, ``127.1``, ``0300.0250.0.1``, ``0``)
  is an **IPv4 address**, read by the Standard's IPv4 parser (decimal, ``0x`` hex and ``0`` octal parts,
  the last part filling the remaining bytes), or the URL is rejected (``1.2.3.4.5``, ``256.0.0.1``);
* ``[...]`` is an IPv6 address (no zone ids: ``[fe80::1%25eth0]`` is rejected);
* anything else is a domain, mapped and IDNA-encoded by UTS #46 (``Bücher.example`` →
  ``xn--bcher-kva.example``), or rejected (a forbidden code point, a label IDNA refuses).

Such an address is an address, never a name: it goes straight to the address rules
(:mod:`scrapy_polite.network.addresses`) and no DNS query is ever sent for it.

* :func:`url_host` — the :class:`Host` of a URL, ``None`` when it has none; :class:`InvalidHost` when the
  Standard rejects it;
* :func:`name_host` — the same for a bare host name (what a resolver is asked for).

Results are cached by the URL's ``scheme://authority`` (hosts are few, URLs many): the rest of a URL never
changes its host.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from ada_url import HostType, parse_url

from .addresses import IPAddress, parse_ip_literal

__all__ = ["Host", "InvalidHost", "NO_HOST", "NO_NETWORK_SCHEMES", "name_host", "url_host"]

#: URL schemes that make no network request: such URLs have no host (docs/spec.md §1).
NO_NETWORK_SCHEMES = frozenset({"data", "file", "about"})

# A URL whose host the authority alone decides: ``scheme://authority`` with a non-empty authority free of
# whitespace, controls and backslashes (which the Standard strips, skips or reads as "/"), followed by the
# path, query, fragment or the end. Any other URL is parsed whole.
_SIMPLE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#\\\x00-\x20\x7f]+)(?=[/?#]|\Z)")

#: The Standard's forbidden host code points, and "%" (after decoding; docs/spec.md §1).
_FORBIDDEN = frozenset("\x00\t\n\r #/:<>?@[\\]^|%")
_CACHE_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class Host:
    """A URL's host as the URL Standard reads it.

    Attributes:
        key: the pacing key (docs/spec.md §1): an IPv4 address in dotted-quad form, an IPv6 address in
            :mod:`ipaddress`'s canonical form (no brackets), or the ASCII (IDNA) domain, lower-cased,
            without its trailing dot (a domain with an empty label, ``a..b`` or ``b..``, is refused).
        ip: the address when the host is one (IPv4 or IPv6), else ``None`` (a name to resolve).
    """

    key: str
    ip: IPAddress | None = None


#: The reason of an :class:`InvalidHost` for a URL with an empty host (``http://``, ``http://:80/``).
NO_HOST = "it has no host"


class InvalidHost(ValueError):
    """The URL Standard rejects the URL's host (or the authority around it), or other URL parsers would
    read another host from it.

    Attributes:
        url: the URL or host name given.
        reason: why, in words ("its host '1.2.3.4.5' ends in a number, so ...").
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url!r}: {reason}")

    @property
    def missing(self) -> bool:
        """Whether the URL has no host at all (rather than one the Standard rejects)."""
        return self.reason == NO_HOST


def _is_number(label: str) -> bool:
    """The Standard's "ends in a number" test for one label: all digits, or ``0x``/``0X`` and hex digits."""
    if label.isascii() and label.isdigit():
        return True
    return len(label) >= 2 and label[0] == "0" and label[1] in "xX" and all(
        c in "0123456789abcdefABCDEF" for c in label[2:])


def _why(authority: str) -> str:
    """Words for why the Standard rejects a URL with this authority (best effort: the parser says only
    "invalid")."""
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        inner, _, _rest = host[1:].partition("]")
        if "%" in inner:
            return (f"its host {host!r} is an IPv6 address with a zone id, which a URL cannot carry "
                    "(the URL Standard has no zone ids)")
        return f"its host {host!r} is not a valid IPv6 address"
    name, colon, port = host.partition(":")
    if colon and port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return f"its port {port!r} is not a number from 0 to 65535"
    if not name:
        return NO_HOST
    labels = name.split(".")
    if labels and labels[-1] == "" and len(labels) > 1:
        labels = labels[:-1]
    if labels and _is_number(labels[-1]):
        return (f"its host {name!r} ends in a number, so the URL Standard reads it as an IPv4 address, and it "
                "is not a valid one (at most 4 parts, each 0-255, the last filling the remaining bytes)")
    bad = sorted({c for c in name if c in _FORBIDDEN and c != "%"})
    if bad:
        return f"its host {name!r} contains {''.join(bad)!r}, which the URL Standard forbids in a host"
    return f"its host {name!r} is not a valid domain name (percent-encoding or IDNA)"


def _from_parsed(hostname: str, host_type: HostType) -> Host | str:
    """The :class:`Host` of the parser's answer, or why it is refused."""
    if host_type == HostType.IPV4:
        return Host(hostname, ipaddress.IPv4Address(hostname))
    if host_type == HostType.IPV6:
        ip = ipaddress.IPv6Address(hostname.strip("[]"))
        return Host(str(ip), ip)
    key = hostname.lower()
    if key.endswith("."):  # the root's dot: "example.com." and "example.com" are one name
        key = key[:-1]
    if not key:
        return f"its host {hostname!r} is only dots"
    if "" in key.split("."):
        # No DNS name has an empty label; and stripping it would change the host ("0.." is a name to the
        # Standard, "0" an address). Found by tests/test_fuzz.py.
        return f"its host {hostname!r} has an empty label, which no DNS name has"
    return Host(key)


#: The schemes whose requests carry a ``Host`` header built from the URL's authority.
_HOST_HEADER_SCHEMES = frozenset({"http", "https", "ws", "wss"})
#: Why an HTTP URL with user info is refused (docs/spec.md §1).
USER_INFO = ("it carries user info (name:password@ before the host), which would be sent in its Host header "
             "(Scrapy's own HTTP handler fails such a URL: invalid hostname); give credentials with Scrapy's "
             "HttpAuthMiddleware (http_user, http_pass) instead")


def _parse(url: str, authority: str) -> Host | str | None:
    """The host of ``url``, None without one, or the reason (a ``str``) it is refused: the Standard rejects it, or
    an HTTP URL carries user info (:data:`USER_INFO`)."""
    if "@" in authority and url.partition(":")[0].strip().lower() in _HOST_HEADER_SCHEMES:
        return USER_INFO
    try:
        parts = parse_url(url, attributes=("hostname", "host_type"))
    except ValueError:
        return _why(authority)
    hostname = str(parts["hostname"])
    if not hostname:
        return None
    return _from_parsed(hostname, HostType(parts["host_type"]))


@lru_cache(maxsize=_CACHE_SIZE)
def _parse_prefix(prefix: str) -> Host | str | None:
    """:func:`_parse` of a ``scheme://authority`` prefix, cached."""
    return _parse(prefix, prefix.partition("://")[2])


def _authority_of(url: str) -> str:
    """The authority of a URL, for the words of a refusal only."""
    _, sep, rest = url.partition("://")
    if not sep:
        return ""
    return re.split(r"[/?#\\]", rest, maxsplit=1)[0]


def url_host(url: str) -> Host | None:
    """The host of ``url`` as the WHATWG URL Standard reads it (docs/spec.md §1).

    Args:
        url: an absolute URL.

    Returns:
        its :class:`Host`, or ``None`` when the URL names no host to contact: a ``data:``, ``file:`` or
        ``about:`` URL, or a URL of another scheme without a host (``mailto:x``).

    Raises:
        InvalidHost: the Standard rejects the URL's host, port or credentials (``http://1.2.3.4.5/``,
            ``http://[fe80::1%25eth0]/``, ``http://a b/``, ``http://x:99999/``), it is no URL at all, Python's
            ``urlsplit`` reads another host from it (``http:///x``), or an HTTP URL carries user info
            (``http://name:password@host/``: it would be sent in the Host header).

    >>> url_host("http://0x7f.1/x")
    Host(key='127.0.0.1', ip=IPv4Address('127.0.0.1'))
    >>> url_host("HTTP://Bücher.Example.:8080/").key
    'xn--bcher-kva.example'
    """
    match = _SIMPLE.match(url)
    if match is not None:
        scheme = match.group(1).lower()
        if scheme in NO_NETWORK_SCHEMES:
            return None
        result = _parse_prefix(match.group(0))
    else:
        scheme = url.partition(":")[0].strip().lower()
        if scheme in NO_NETWORK_SCHEMES:
            return None
        result = _parse(url, _authority_of(url))
        if not isinstance(result, str):
            result = _agreed(url, result)
    if isinstance(result, str):
        raise InvalidHost(url, result)
    if scheme == "s3" and result is not None:
        return _s3_host(url)
    return result


def _s3_host(url: str) -> Host:
    """The host an ``s3://BUCKET/KEY`` URL is downloaded from: Scrapy's S3 handler fetches
    ``https://BUCKET.s3.amazonaws.com/KEY`` (the bucket as ``urlsplit`` reads it; ``s3.amazonaws.com`` whatever
    the credentials), so that host is booked, resolved and pinned (docs/spec.md §1), never the bucket's name.

    Raises:
        InvalidHost: the bucket makes no host name.
    """
    try:
        bucket = urlsplit(url).hostname
    except ValueError:
        bucket = None
    if not bucket:
        raise InvalidHost(url, NO_HOST)
    try:
        host = url_host(f"https://{bucket}.s3.amazonaws.com/")
    except InvalidHost as exc:
        raise InvalidHost(url, f"its bucket makes no host name: {exc.reason}") from None
    if host is None:  # pragma: no cover - an https URL always has a host or is refused
        raise InvalidHost(url, NO_HOST)
    return host


def _agreed(url: str, host: Host | None) -> Host | str | None:
    """``host``, or a reason to refuse ``url`` when Python's ``urlsplit`` (and so Twisted, which builds the
    Host header from the same split) names another host than the Standard does: ``http:///x`` is host ``x``
    to the Standard and has no host to ``urlsplit``. Only URLs off the simple ``scheme://authority`` form
    get here."""
    try:
        other = urlsplit(url).hostname
    except ValueError:
        other = None
    try:
        theirs = name_host(other).key if other else None
    except InvalidHost:
        theirs = None
    ours = host.key if host is not None else None
    if theirs == ours:
        return host
    return (f"the URL Standard reads its host as {ours!r}, Python's and Twisted's URL parsers as {theirs!r}; "
            "refused rather than connect to one host under the other's name")


@lru_cache(maxsize=_CACHE_SIZE)
def _name(name: str) -> Host | str:
    text = name.strip()
    if text.startswith("[") or ":" in text:  # an IPv6 literal (a zone id is kept: never public)
        ip = parse_ip_literal(text)
        if isinstance(ip, ipaddress.IPv6Address):
            return Host(str(ip), ip)
        return f"{name!r} is not a host name or an IP address"
    if not text or any(c in "/?#@\\" or c <= " " or c == "\x7f" for c in text):
        return f"{name!r} is not a host name or an IP address"
    result = _parse(f"http://{text}/", text)
    if result is None:
        return f"{name!r} is not a host name or an IP address"
    return result


def name_host(name: str) -> Host:
    """The host a bare host name denotes, read as the host of ``http://NAME/`` by the URL Standard
    (docs/spec.md §4): ``0x7f.1`` is the address 127.0.0.1, ``Bücher.example`` the domain
    ``xn--bcher-kva.example``. An IPv6 address may come with or without brackets; a zone id is kept (so the
    address rules refuse it).

    Raises:
        InvalidHost: the Standard rejects it as a host (``1.2.3.4.5``, ``a b``, ``x/y``).
        TypeError: ``name`` is not a ``str``.
    """
    if not isinstance(name, str):
        raise TypeError(f"expected a host name string, got {type(name).__name__}")
    result = _name(name)
    if isinstance(result, str):
        raise InvalidHost(name, result)
    return result
