"""Which addresses may be contacted (docs/spec.md §4): the public-address rule, pure and without I/O.

* :func:`is_public` — the verdict of docs/spec.md §4 for one address (string or :mod:`ipaddress` object);
* :func:`embedded_ipv4` — the IPv4 address inside an IPv4-mapped, NAT64 or 6to4 IPv6 address;
* :func:`parse_ip_literal` — a string that *is* a canonical IP literal, or ``None`` (the other IPv4
  spellings of the URL Standard, ``2130706433``, ``0x7f.1``, ``127.1``, are read by
  :mod:`scrapy_polite.network.hosts`, which turns them into addresses before they reach these rules);
* :class:`AddressFilter` — the rule plus the operator's exceptions (``POLITE_ALLOW_PRIVATE``,
  ``POLITE_ALLOWED_NETWORKS``), applied to a resolver's answer;
* :func:`one_family` — the addresses of one family a host is booked on.

The ranges are written once, as :mod:`ipaddress` networks, in :data:`IPV4_NOT_PUBLIC` and
:data:`IPV6_RULES`. They follow docs/spec.md §4, which takes them from the IANA IPv4 and IPv6
Special-Purpose Address Registries (RFC 6890 and its updates) and the Rust reference (docs/spec.md, "The
references"), with the deviation that 192.0.0.0/24 and 192.88.99.0/24 are refused too. IPv6 is an
allow-list (only global unicast 2000::/3 can be public), so a block IANA reserves later *outside*
2000::/3 is refused without an update, while one reserved later *inside* it is accepted until
:data:`IPV6_RULES` is updated.

Nothing here reads the network, a file or a clock.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

__all__ = [
    "IPAddress",
    "IPV4_NOT_PUBLIC",
    "IPV6_RULES",
    "AddressFilter",
    "embedded_ipv4",
    "is_public",
    "one_family",
    "parse_ip_literal",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_v4 = ipaddress.IPv4Network
_v6 = ipaddress.IPv6Network

#: IPv4 networks whose addresses are not public (docs/spec.md §4; IANA IPv4 Special-Purpose Address Registry,
#: RFC 6890). Every other IPv4 address is public.
IPV4_NOT_PUBLIC: tuple[ipaddress.IPv4Network, ...] = (
    _v4("0.0.0.0/8"),  # "this network" (RFC 791, RFC 1122)
    _v4("10.0.0.0/8"),  # private use (RFC 1918)
    _v4("100.64.0.0/10"),  # shared address space, carrier-grade NAT (RFC 6598)
    _v4("127.0.0.0/8"),  # loopback (RFC 1122)
    _v4("169.254.0.0/16"),  # link local (RFC 3927)
    _v4("172.16.0.0/12"),  # private use (RFC 1918)
    _v4("192.0.0.0/24"),  # IETF protocol assignments (RFC 6890) — Deviation from the reference
    _v4("192.0.2.0/24"),  # documentation TEST-NET-1 (RFC 5737)
    _v4("192.88.99.0/24"),  # deprecated 6to4 relay anycast (RFC 7526) — Deviation from the reference
    _v4("192.168.0.0/16"),  # private use (RFC 1918)
    _v4("198.18.0.0/15"),  # benchmarking (RFC 2544)
    _v4("198.51.100.0/24"),  # documentation TEST-NET-2 (RFC 5737)
    _v4("203.0.113.0/24"),  # documentation TEST-NET-3 (RFC 5737)
    _v4("224.0.0.0/4"),  # multicast (RFC 5771)
    _v4("240.0.0.0/4"),  # reserved (RFC 1112), including limited broadcast 255.255.255.255 (RFC 919)
)

# The three verdicts an IPv6 rule can give.
_REFUSE = "refuse"  # never public
_EMBEDDED = "embedded"  # the verdict of the embedded IPv4 address (see embedded_ipv4)
_PUBLIC = "public"  # public

#: The IPv6 rule of docs/spec.md §4 as one ordered table of ``(network, verdict)``; the **first** network that
#: contains the address decides, and an address that matches none is not public. The order matters:
#: the embedded forms come before everything else because ::ffff:0:0/96 and 64:ff9b::/96 lie outside
#: 2000::/3 and 2002::/16 lies inside it; the refused blocks come before the 2000::/3 that contains them.
#: Sources: IANA IPv6 Special-Purpose Address Registry (RFC 6890) and the Rust reference.
IPV6_RULES: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_v6("::ffff:0:0/96"), _EMBEDDED),  # IPv4-mapped (RFC 4291 §2.5.5.2)
    (_v6("64:ff9b::/96"), _EMBEDDED),  # NAT64 well-known prefix (RFC 6052)
    (_v6("2002::/16"), _EMBEDDED),  # 6to4 (RFC 3056)
    # IPv4-compatible, deprecated (RFC 4291 §2.5.5.1); holds :: and ::1 too. Like Teredo below, already
    # refused by the default and by 2001::/23: named so the table reads as docs/spec.md §4 does.
    (_v6("::/96"), _REFUSE),
    (_v6("2001::/32"), _REFUSE),  # Teredo (RFC 4380)
    (_v6("2001::/23"), _REFUSE),  # IETF protocol assignments: Teredo, benchmarking, ORCHID (RFC 2928)
    (_v6("2001:db8::/32"), _REFUSE),  # documentation (RFC 3849)
    (_v6("3fff::/20"), _REFUSE),  # documentation (RFC 9637)
    (_v6("2000::/3"), _PUBLIC),  # global unicast (RFC 4291); nothing outside it is public
)

_IPV4_MAPPED = IPV6_RULES[0][0]
_NAT64 = IPV6_RULES[1][0]
_SIX_TO_FOUR = IPV6_RULES[2][0]


#: The most address strings an :class:`AddressFilter` keeps the verdict of.
_VERDICTS_MAX = 4096


def _as_address(address: str | IPAddress) -> IPAddress:
    """``address`` as an :mod:`ipaddress` object; ValueError for a string that is no IP literal."""
    if isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return address
    if not isinstance(address, str):
        # ipaddress.ip_address() would take an int (2130706433 → 127.0.0.1): never do that silently.
        raise TypeError(f"expected an IP address string or ipaddress object, got {type(address).__name__}")
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(
            f"{address!r} is not an IP address literal (canonical dotted-quad IPv4 or IPv6 expected)"
        ) from None


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address embedded in ``addr``, for the three forms that carry one to a real IPv4 host.

    * IPv4-mapped ``::ffff:a.b.c.d`` (``::ffff:0:0/96``) → the low 32 bits;
    * NAT64 ``64:ff9b::a.b.c.d`` (``64:ff9b::/96``, RFC 6052) → the low 32 bits;
    * 6to4 ``2002:AABB:CCDD::/48`` (``2002::/16``, RFC 3056) → bits 16–47.

    Any other address, including IPv4-compatible ``::a.b.c.d`` and Teredo (which docs/spec.md §4 refuses
    outright) and any IPv4 address, gives ``None``.

    Args:
        addr: an :class:`ipaddress.IPv6Address` (an IPv4Address is accepted and gives ``None``).

    Returns:
        the embedded :class:`ipaddress.IPv4Address`, or ``None``.
    """
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr in _IPV4_MAPPED or addr in _NAT64:
        return ipaddress.IPv4Address(addr.packed[12:])
    if addr in _SIX_TO_FOUR:
        return ipaddress.IPv4Address(addr.packed[2:6])
    return None


def _ipv6_verdict(addr: ipaddress.IPv6Address) -> str:
    for network, verdict in IPV6_RULES:
        if addr in network:
            return verdict
    return _REFUSE


def _holds_both(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """Whether ``net`` holds public and non-public addresses (:attr:`AddressFilter.wide_networks`)."""
    return len(_verdicts(net)) == 2


def _verdicts(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> set[bool]:
    """The :func:`is_public` verdicts of the addresses in ``net``, by the rule tables (no address is enumerated): a
    network that only partly overlaps a block is split in two; one inside an embedded block (IPv4-mapped, NAT64,
    6to4) takes the verdicts of the IPv4 network it embeds (review: ``::ffff:0:0/96`` holds 169.254.169.254)."""
    if isinstance(net, ipaddress.IPv4Network):
        if any(net.subnet_of(block) for block in IPV4_NOT_PUBLIC):
            return {False}
        if not any(net.overlaps(block) for block in IPV4_NOT_PUBLIC):
            return {True}
        low, high = net.subnets()
        return _verdicts(low) | _verdicts(high)
    for block, verdict in IPV6_RULES:  # the first block that meets the network decides, as for an address
        if net.subnet_of(block):
            if verdict != _EMBEDDED:
                return {verdict == _PUBLIC}
            bits = int(net.network_address)
            if block == _SIX_TO_FOUR:  # the IPv4 address is bits 16–47
                return _verdicts(ipaddress.IPv4Network(((bits >> 80) & 0xFFFFFFFF, min(net.prefixlen, 48) - 16)))
            return _verdicts(ipaddress.IPv4Network((bits & 0xFFFFFFFF, net.prefixlen - 96)))
        if net.overlaps(block):
            halves = list(net.subnets())
            return _verdicts(halves[0]) | _verdicts(halves[1])
    return {False}


def is_public(address: str | IPAddress) -> bool:
    """Whether ``address`` may be contacted without an explicit exception (docs/spec.md §4).

    IPv4 is public unless it lies in one of :data:`IPV4_NOT_PUBLIC`. IPv6 is public only inside 2000::/3
    minus 2001::/23, 2001:db8::/32 and 3fff::/20; IPv4-mapped (``::ffff:0:0/96``), NAT64
    (``64:ff9b::/96``) and 6to4 (``2002::/16``) addresses take the verdict of the IPv4 address they embed;
    IPv4-compatible (``::a.b.c.d``) and Teredo (``2001::/32``) addresses are refused. An IPv6 address
    with a zone id (``fe80::1%eth0``) names an interface-local destination and is never public. Ranges
    from the IANA special-purpose registries (RFC 6890); see :data:`IPV6_RULES`.

    Args:
        address: an IP literal string as :func:`ipaddress.ip_address` reads it (no brackets, no port;
            non-standard IPv4 spellings such as ``0177.0.0.1`` are not literals) or an
            :class:`ipaddress.IPv4Address` / :class:`ipaddress.IPv6Address`.

    Returns:
        ``True`` when the address is public.

    Raises:
        ValueError: ``address`` is a string that is not an IP literal.
        TypeError: ``address`` is neither a string nor an ipaddress object (an ``int`` is refused rather
            than read as an address).
    """
    addr = _as_address(address)
    if isinstance(addr, ipaddress.IPv4Address):
        return not any(addr in network for network in IPV4_NOT_PUBLIC)
    if addr.scope_id:
        return False
    verdict = _ipv6_verdict(addr)
    if verdict == _EMBEDDED:
        inner = embedded_ipv4(addr)
        return inner is not None and is_public(inner)
    return verdict == _PUBLIC


def parse_ip_literal(text: str) -> IPAddress | None:
    """The address a URL host string denotes when it is an IP literal, else ``None`` (a name to resolve).

    Accepted: a canonical dotted-quad IPv4 (four decimal octets 0–255, no leading zeros), or an IPv6
    literal, with or without the URL brackets (``[::1]``; brackets must hold IPv6). A zone id
    (``fe80::1%eth0``) is kept on the result, which :func:`is_public` then refuses.

    Other IPv4 spellings — a bare integer ``2130706433``, hex ``0x7f.1``, octal ``0177.0.0.1``, shortened
    ``127.1`` — give ``None`` here: this reads canonical literals only (settings, resolver answers). A URL's
    or a resolver's host is first read by the WHATWG URL Standard (:func:`scrapy_polite.network.hosts.name_host`,
    docs/spec.md §4), which reads those spellings as the addresses they are (as browsers, curl and C
    resolvers do), so they reach the address rules as addresses and never DNS.

    Args:
        text: a host as it appears in a URL (no port).

    Returns:
        an :class:`ipaddress.IPv4Address` / :class:`ipaddress.IPv6Address`, or ``None``.

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a host string, got {type(text).__name__}")
    bracketed = text.startswith("[") and text.endswith("]")
    if bracketed:
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if bracketed and not isinstance(addr, ipaddress.IPv6Address):
        return None
    return addr


class AddressFilter:
    """The public-address rule plus the operator's exceptions, for a resolver's answers (docs/spec.md §4).

    An address is allowed when it is public (:func:`is_public`), or ``allow_private`` is set
    (``POLITE_ALLOW_PRIVATE``), or it lies in one of ``allowed_networks`` (``POLITE_ALLOWED_NETWORKS``).
    An IPv4-mapped, NAT64 or 6to4 address is also allowed when its embedded IPv4 lies in an allowed
    network, consistently with :func:`is_public`, which judges such addresses by their embedded IPv4.

    Args:
        allow_private: allow every address (value of ``POLITE_ALLOW_PRIVATE``).
        allowed_networks: CIDR strings (``"127.0.0.0/8"``, ``"fd00::/8"``; a bare address is a /32 or
            /128). A single string is read as a comma-separated list, as Scrapy's ``getlist`` does.

    Raises:
        ValueError: an entry of ``allowed_networks`` is not a valid CIDR network (host bits set, as in
            ``10.0.0.1/8``, count as invalid); the message names the entry and ``POLITE_ALLOWED_NETWORKS``.
    """

    __slots__ = ("_allow_private", "_networks", "_verdicts")

    def __init__(self, allow_private: bool = False, allowed_networks: Iterable[str] = ()) -> None:
        if isinstance(allowed_networks, str):
            allowed_networks = [part.strip() for part in allowed_networks.split(",") if part.strip()]
        networks = []
        for entry in allowed_networks:
            try:
                if not isinstance(entry, str):
                    raise TypeError
                networks.append(ipaddress.ip_network(entry, strict=True))
            except (ValueError, TypeError):
                raise ValueError(
                    f"POLITE_ALLOWED_NETWORKS: {entry!r} is not a valid CIDR network "
                    f"(expected e.g. '127.0.0.0/8' or 'fd00::/8', with no host bits set)"
                ) from None
        self._allow_private = bool(allow_private)
        self._networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(networks)
        #: address string → (its canonical text, allowed): the rules never change after construction, so a
        #: string's verdict is computed once (at most :data:`_VERDICTS_MAX` kept; cleared when full).
        self._verdicts: dict[str, tuple[str, bool]] = {}

    @property
    def allow_private(self) -> bool:
        """Whether every address is allowed."""
        return self._allow_private

    @property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """The validated allowed networks, in the order given."""
        return self._networks

    @property
    def wide_networks(self) -> list[str]:
        """The allowed networks that hold public addresses as well as non-public ones (``0.0.0.0/0``, ``10.0.0.0/7``,
        ``::/0``): public addresses need no exception, so such a network was likely meant as a list of targets, and it
        admits every non-public address it holds, the cloud metadata address 169.254.169.254 included (trial:
        ``0.0.0.0/0`` was accepted without a word). Judged on the blocks of :data:`IPV4_NOT_PUBLIC` and
        :data:`IPV6_RULES`."""
        return [str(net) for net in self._networks if _holds_both(net)]

    def __repr__(self) -> str:
        nets = [str(n) for n in self._networks]
        return f"AddressFilter(allow_private={self._allow_private!r}, allowed_networks={nets!r})"

    def _in_allowed_network(self, addr: IPAddress) -> bool:
        candidates = [addr]
        inner = embedded_ipv4(addr) if isinstance(addr, ipaddress.IPv6Address) else None
        if inner is not None:
            candidates.append(inner)
        return any(a in network for a in candidates for network in self._networks)

    def allows(self, address: str | IPAddress) -> bool:
        """Whether ``address`` may be contacted.

        Raises:
            ValueError: ``address`` is a string that is not an IP literal (see :func:`is_public`).
            TypeError: ``address`` is neither a string nor an ipaddress object.
        """
        if type(address) is str:
            return self._verdict(address)[1]
        addr = _as_address(address)
        return self._allow_private or is_public(addr) or self._in_allowed_network(addr)

    def _verdict(self, address: str) -> tuple[str, bool]:
        """``(canonical text, allowed)`` of an address string, from the cache or computed (and kept).

        Raises:
            ValueError: ``address`` is not an IP literal (never cached).
        """
        verdict = self._verdicts.get(address)
        if verdict is None:
            addr = _as_address(address)
            verdict = (str(addr), self._allow_private or is_public(addr) or self._in_allowed_network(addr))
            if len(self._verdicts) >= _VERDICTS_MAX:
                self._verdicts.clear()
            self._verdicts[address] = verdict
        return verdict

    def split(self, addresses: Iterable[str | IPAddress]) -> tuple[list[str], list[str]]:
        """Partition ``addresses`` into ``(kept, dropped)``, each in the order given.

        Addresses are returned in the canonical text form of :mod:`ipaddress` (``str(address)``).

        Raises:
            ValueError: an entry is a string that is not an IP literal.
            TypeError: an entry is neither a string nor an ipaddress object.
        """
        kept: list[str] = []
        dropped: list[str] = []
        for address in addresses:
            if type(address) is str:
                text, allowed = self._verdict(address)
            else:
                addr = _as_address(address)
                text, allowed = str(addr), self.allows(addr)
            (kept if allowed else dropped).append(text)
        return kept, dropped


def one_family(addresses: Iterable[str], routed: Callable[[str], bool] = lambda _address: True) -> list[str]:
    """The addresses a host is booked and connected on (docs/spec.md §3): its IPv4 ones when this machine has a route
    to one of them (``routed``), else its IPv6 ones when it has a route to one of those, else all of them.

    A dual-stack host's IPv4 and IPv6 addresses are, as a rule, one server: booking on both would pace it at twice
    the per-address interval, and a machine without IPv6 (or IPv4) connectivity cannot reach half of them (Twisted's
    ``HostnameEndpoint`` falls back to the other family; a connection pinned to the booked address cannot).

    >>> one_family(["192.0.2.1", "2001:db8::1"])
    ['192.0.2.1']
    >>> one_family(["192.0.2.1", "2001:db8::1"], routed=lambda address: ":" in address)
    ['2001:db8::1']
    >>> one_family(["2001:db8::1"])
    ['2001:db8::1']
    """
    listed = list(addresses)
    v4 = [a for a in listed if ":" not in a]
    v6 = [a for a in listed if ":" in a]
    if not v4 or not v6:
        return listed
    for family in (v4, v6):
        if any(routed(a) for a in family):
            return family
    return listed
