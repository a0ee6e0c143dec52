"""Tests of scrapy_polite.network.addresses: the public-address rule of docs/spec.md §4.

Expected verdicts are written out by hand from docs/spec.md §4, never computed with the module under test.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_polite.network.addresses import (
    IPV4_NOT_PUBLIC,
    AddressFilter,
    embedded_ipv4,
    is_public,
    one_family,
    parse_ip_literal,
)

# --------------------------------------------------------------------------------------------------
# IPv4: every refused range of docs/spec.md §4 at its first and last address, plus the neighbours just outside.
# (range, first, last, just below first or None, its verdict, just above last or None, its verdict)
# --------------------------------------------------------------------------------------------------
IPV4_RANGES = [
    ("0.0.0.0/8", "0.0.0.0", "0.255.255.255", None, None, "1.0.0.0", True),
    ("10.0.0.0/8", "10.0.0.0", "10.255.255.255", "9.255.255.255", True, "11.0.0.0", True),
    ("100.64.0.0/10", "100.64.0.0", "100.127.255.255", "100.63.255.255", True, "100.128.0.0", True),
    ("127.0.0.0/8", "127.0.0.0", "127.255.255.255", "126.255.255.255", True, "128.0.0.0", True),
    ("169.254.0.0/16", "169.254.0.0", "169.254.255.255", "169.253.255.255", True, "169.255.0.0", True),
    ("172.16.0.0/12", "172.16.0.0", "172.31.255.255", "172.15.255.255", True, "172.32.0.0", True),
    ("192.0.0.0/24", "192.0.0.0", "192.0.0.255", "191.255.255.255", True, "192.0.1.0", True),
    ("192.0.2.0/24", "192.0.2.0", "192.0.2.255", "192.0.1.255", True, "192.0.3.0", True),
    ("192.88.99.0/24", "192.88.99.0", "192.88.99.255", "192.88.98.255", True, "192.88.100.0", True),
    ("192.168.0.0/16", "192.168.0.0", "192.168.255.255", "192.167.255.255", True, "192.169.0.0", True),
    ("198.18.0.0/15", "198.18.0.0", "198.19.255.255", "198.17.255.255", True, "198.20.0.0", True),
    ("198.51.100.0/24", "198.51.100.0", "198.51.100.255", "198.51.99.255", True, "198.51.101.0", True),
    ("203.0.113.0/24", "203.0.113.0", "203.0.113.255", "203.0.112.255", True, "203.0.114.0", True),
    # 224/4 is followed directly by 240/4, itself refused.
    ("224.0.0.0/4", "224.0.0.0", "239.255.255.255", "223.255.255.255", True, "240.0.0.0", False),
    # 240/4 is preceded by multicast 224/4 (refused) and ends the address space (255.255.255.255).
    ("240.0.0.0/4", "240.0.0.0", "255.255.255.255", "239.255.255.255", False, None, None),
]


def _boundary_cases(ranges):
    for net, first, last, below, below_ok, above, above_ok in ranges:
        yield pytest.param(first, False, id=f"{net}-first-{first}")
        yield pytest.param(last, False, id=f"{net}-last-{last}")
        if below is not None:
            yield pytest.param(below, below_ok, id=f"{net}-below-{below}")
        if above is not None:
            yield pytest.param(above, above_ok, id=f"{net}-above-{above}")


@pytest.mark.parametrize(("address", "expected"), list(_boundary_cases(IPV4_RANGES)))
def test_ipv4_range_boundaries(address, expected):
    assert is_public(address) is expected


def test_ipv4_table_is_exactly_the_spec_list():
    """Adding or dropping a range from the module's table without updating docs/spec.md §4 fails here."""
    assert {str(n) for n in IPV4_NOT_PUBLIC} == {r[0] for r in IPV4_RANGES}


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.215.14", "100.63.0.1", "172.32.1.1", "223.255.255.255"],
    ids=lambda a: a,
)
def test_plain_public_ipv4_accepted(address):
    assert is_public(address) is True


# --------------------------------------------------------------------------------------------------
# IPv6 ranges, same shape. Verdicts follow docs/spec.md §4: public only inside 2000::/3 minus 2001::/23,
# 2001:db8::/32, 3fff::/20; embedded forms judged by their IPv4; ::/96 and Teredo refused.
# --------------------------------------------------------------------------------------------------
IPV6_RANGES = [
    # global unicast: 2000:: is public; its last address lies past 3fff::/20 (3fff:0000-3fff:0fff).
    ("2000::/3", None, "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None, None, None, None),
    ("2001::/23", "2001::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
     "2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True, "2001:200::", True),
    # Teredo: above it is 2001:1::, still inside 2001::/23.
    ("2001::/32", "2001::", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff",
     "2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True, "2001:1::", False),
    ("2001:db8::/32", "2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
     "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", True, "2001:db9::", True),
    ("3fff::/20", "3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
     "3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True, "3fff:1000::", True),
    # 6to4 embedding 0.0.0.0 and 255.255.255.255: both refused; neighbours are plain global unicast.
    ("2002::/16", "2002::", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
     "2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True, "2003::", True),
    # IPv4-mapped embedding 0.0.0.0 / 255.255.255.255; neighbours lie outside 2000::/3.
    ("::ffff:0:0/96", "::ffff:0.0.0.0", "::ffff:255.255.255.255",
     "::fffe:ffff:ffff", False, "::1:0:0:0", False),
    # NAT64 embedding 0.0.0.0 / 255.255.255.255; neighbours lie outside 2000::/3.
    ("64:ff9b::/96", "64:ff9b::", "64:ff9b::ffff:ffff",
     "64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", False, "64:ff9b::1:0:0", False),
    # IPv4-compatible (includes :: and ::1); above it is ::1:0:0, outside 2000::/3.
    ("::/96", "::", "::ffff:ffff", None, None, "::1:0:0", False),
]


@pytest.mark.parametrize(("address", "expected"), list(_boundary_cases(IPV6_RANGES[1:])))
def test_ipv6_range_boundaries(address, expected):
    assert is_public(address) is expected


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("2000::", True, id="2000::/3-first"),
        pytest.param("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True, id="2000::/3-last"),
        pytest.param("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", False, id="2000::/3-below"),
        pytest.param("4000::", False, id="2000::/3-above"),
    ],
)
def test_ipv6_global_unicast_boundaries(address, expected):
    assert is_public(address) is expected


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("::127.0.0.1", id="ipv4-compatible-loopback"),
        pytest.param("64:ff9b::10.0.0.1", id="nat64-private"),
        pytest.param("2002:0a00:0001::1", id="6to4-private"),
    ],
)
def test_reference_counterexamples_refused(address):
    """The three addresses the reference's earlier IPv6 branch accepted (docs/spec.md, "The references")."""
    assert is_public(address) is False


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("::ffff:8.8.8.8", id="mapped"),
        pytest.param("64:ff9b::808:808", id="nat64"),
        pytest.param("2002:0808:0808::1", id="6to4"),
    ],
)
def test_embedded_public_ipv4_accepted(address):
    assert is_public(address) is True


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("::ffff:127.0.0.1", id="mapped-loopback"),
        pytest.param("::ffff:192.168.1.1", id="mapped-private"),
        pytest.param("::ffff:192.88.99.1", id="mapped-6to4-relay"),
        pytest.param("64:ff9b::a9fe:a9fe", id="nat64-link-local-metadata"),
        pytest.param("64:ff9b::100.64.0.1", id="nat64-shared"),
        pytest.param("2002:7f00:1::", id="6to4-loopback"),
        pytest.param("2002:a9fe:a9fe::1", id="6to4-link-local"),
        pytest.param("2002:c000:0201::1", id="6to4-documentation"),
    ],
)
def test_embedded_non_public_ipv4_refused(address):
    assert is_public(address) is False


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("2001:0:4136:e378:8000:63bf:3fff:fdd2", id="teredo-example"),
        pytest.param("2001::808:808", id="teredo-low-bits-public-ipv4"),
        pytest.param("::8.8.8.8", id="ipv4-compatible-public-ipv4"),
        pytest.param("::", id="unspecified"),
        pytest.param("::1", id="loopback"),
        pytest.param("64:ff9b:1::808:808", id="nat64-local-use-prefix"),
    ],
)
def test_refused_outright_even_with_public_ipv4_inside(address):
    assert is_public(address) is False


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("fe80::1", id="link-local"),
        pytest.param("fc00::1", id="unique-local"),
        pytest.param("fd12:3456::1", id="unique-local-fd"),
        pytest.param("ff02::1", id="multicast"),
        pytest.param("fec0::1", id="site-local"),
        pytest.param("100::1", id="discard-only"),
        pytest.param("fe80::1%eth0", id="zone-link-local"),
        pytest.param("2606:4700::1111%eth0", id="zone-on-global"),
    ],
)
def test_ipv6_special_refused(address):
    assert is_public(address) is False


@pytest.mark.parametrize(
    "address",
    ["2606:4700::1111", "2a00:1450:4001:81a::200e", "2001:4860:4860::8888", "2001:200::1"],
    ids=lambda a: a,
)
def test_plain_public_ipv6_accepted(address):
    assert is_public(address) is True


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param(ipaddress.IPv4Address("8.8.8.8"), True, id="v4-public"),
        pytest.param(ipaddress.IPv4Address("127.0.0.1"), False, id="v4-loopback"),
        pytest.param(ipaddress.IPv6Address("2606:4700::1111"), True, id="v6-public"),
        pytest.param(ipaddress.IPv6Address("::ffff:10.0.0.1"), False, id="v6-mapped-private"),
    ],
)
def test_is_public_accepts_address_objects(address, expected):
    assert is_public(address) is expected


@pytest.mark.parametrize(
    "text",
    ["0177.0.0.1", "0x7f.1", "2130706433", "127.1", "[::1]", "example.com", "", " 8.8.8.8", "1.2.3.4:80"],
    ids=repr,
)
def test_is_public_rejects_non_literals(text):
    with pytest.raises(ValueError, match="not an IP address literal") as info:
        is_public(text)
    assert repr(text) in str(info.value)


def test_is_public_rejects_int():
    with pytest.raises(TypeError):
        is_public(2130706433)


# --------------------------------------------------------------------------------------------------
# embedded_ipv4
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("::ffff:8.8.8.8", "8.8.8.8", id="mapped"),
        pytest.param("64:ff9b::10.0.0.1", "10.0.0.1", id="nat64"),
        pytest.param("2002:0a00:0001::1", "10.0.0.1", id="6to4"),
        pytest.param("2002:0808:0808:1234:5678::ffff", "8.8.8.8", id="6to4-low-bits-ignored"),
        pytest.param("::127.0.0.1", None, id="ipv4-compatible"),
        pytest.param("2001:0:4136:e378:8000:63bf:3fff:fdd2", None, id="teredo"),
        pytest.param("2606:4700::1111", None, id="plain-global"),
        pytest.param("64:ff9b:1::a00:1", None, id="nat64-local-use"),
    ],
)
def test_embedded_ipv4(address, expected):
    result = embedded_ipv4(ipaddress.IPv6Address(address))
    assert result == (None if expected is None else ipaddress.IPv4Address(expected))


def test_embedded_ipv4_of_ipv4_is_none():
    assert embedded_ipv4(ipaddress.IPv4Address("8.8.8.8")) is None


# --------------------------------------------------------------------------------------------------
# parse_ip_literal
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "127.0.0.01", "127.0.1",
        "[127.0.0.1]", "[::1", "::1]", "example.com", "localhost", "", "[]",
    ],
    ids=repr,
)
def test_parse_ip_literal_refuses(text):
    assert parse_ip_literal(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("127.0.0.1", ipaddress.IPv4Address("127.0.0.1"), id="dotted-quad"),
        pytest.param("8.8.8.8", ipaddress.IPv4Address("8.8.8.8"), id="public-dotted-quad"),
        pytest.param("[::1]", ipaddress.IPv6Address("::1"), id="bracketed-v6"),
        pytest.param("::1", ipaddress.IPv6Address("::1"), id="bare-v6"),
        pytest.param("[2606:4700::1111]", ipaddress.IPv6Address("2606:4700::1111"), id="bracketed-global"),
        pytest.param("[::ffff:127.0.0.1]", ipaddress.IPv6Address("::ffff:7f00:1"), id="bracketed-mapped"),
    ],
)
def test_parse_ip_literal_accepts(text, expected):
    assert parse_ip_literal(text) == expected


def test_parse_ip_literal_keeps_zone_and_is_public_refuses_it():
    addr = parse_ip_literal("[fe80::1%eth0]")
    assert isinstance(addr, ipaddress.IPv6Address)
    assert addr.scope_id == "eth0"
    assert is_public(addr) is False


# --------------------------------------------------------------------------------------------------
# AddressFilter
# --------------------------------------------------------------------------------------------------
def test_default_filter_is_public_only():
    f = AddressFilter()
    assert f.allows("8.8.8.8") is True
    assert f.allows("127.0.0.5") is False
    assert f.allows("::1") is False


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("127.0.0.5", True, id="inside-allowed"),
        pytest.param("127.255.255.255", True, id="last-of-allowed"),
        pytest.param("::ffff:127.0.0.5", True, id="mapped-into-allowed"),
        pytest.param("10.0.0.1", False, id="other-private"),
        pytest.param("::1", False, id="v6-loopback-not-in-v4-net"),
        pytest.param("::127.0.0.5", False, id="ipv4-compatible-not-embedded"),
        pytest.param("8.8.8.8", True, id="public-still-allowed"),
    ],
)
def test_allowed_networks(address, expected):
    f = AddressFilter(allowed_networks=["127.0.0.0/8"])
    assert f.allows(address) is expected


@pytest.mark.parametrize(
    "address",
    ["10.0.0.1", "127.0.0.1", "::1", "fe80::1%eth0", "169.254.169.254", "8.8.8.8", "2606:4700::1111"],
    ids=lambda a: a,
)
def test_allow_private_admits_all(address):
    assert AddressFilter(allow_private=True).allows(address) is True


def test_allowed_networks_v6():
    f = AddressFilter(allowed_networks=["fd00::/8"])
    assert f.allows("fd00::1") is True
    assert f.allows("fc00::1") is False


@pytest.mark.parametrize(
    "entry",
    ["10.0.0.0/33", "not-a-net", "10.0.0.1/8", "", "fd00::/129", "127.0.0.0/8 ", "0177.0.0.0/8"],
    ids=repr,
)
def test_bad_cidr_raises_naming_it(entry):
    with pytest.raises(ValueError) as info:
        AddressFilter(allowed_networks=["192.168.0.0/16", entry])
    message = str(info.value)
    assert repr(entry) in message
    assert "POLITE_ALLOWED_NETWORKS" in message


def test_non_string_cidr_entry_raises_value_error():
    with pytest.raises(ValueError, match="POLITE_ALLOWED_NETWORKS"):
        AddressFilter(allowed_networks=[167772160])


def test_allowed_networks_comma_separated_string():
    f = AddressFilter(allowed_networks="127.0.0.0/8, 10.0.0.0/8")
    assert [str(n) for n in f.allowed_networks] == ["127.0.0.0/8", "10.0.0.0/8"]
    assert f.allows("10.1.2.3") is True
    assert f.allows("192.168.0.1") is False


def test_split_preserves_order_and_canonicalises():
    f = AddressFilter(allowed_networks=["10.0.0.0/8"])
    kept, dropped = f.split(
        ["127.0.0.1", "8.8.8.8", "2606:4700:0:0::1111", "10.0.0.2", "::1", ipaddress.IPv4Address("1.1.1.1"),
         "192.168.0.1"]
    )
    assert kept == ["8.8.8.8", "2606:4700::1111", "10.0.0.2", "1.1.1.1"]
    assert dropped == ["127.0.0.1", "::1", "192.168.0.1"]


def test_split_empty():
    assert AddressFilter().split([]) == ([], [])


def test_split_rejects_non_literal():
    with pytest.raises(ValueError, match="2130706433"):
        AddressFilter().split(["8.8.8.8", "2130706433"])


# --------------------------------------------------------------------------------------------------
# The verdict cache (an address string's canonical form and verdict are computed once)


def test_a_cached_verdict_is_the_verdict_computed_fresh():
    import scrapy_polite.network.addresses as addresses_module

    rules = AddressFilter(allowed_networks=["127.0.0.0/8"])
    cases = ["8.8.8.8", "10.0.0.1", "127.0.0.5", "::ffff:10.0.0.1", "::ffff:8.8.8.8", "2001:db8::1",
             "169.254.169.254", "0:0:0:0:0:ffff:7f00:1", "64:ff9b::a00:1", "2002:0a00:0001::1"]
    for text in cases:
        first = rules.allows(text)
        assert rules.allows(text) is first  # from the cache
        assert rules.allows(ipaddress.ip_address(text)) is first  # the same as for the ipaddress object
        assert AddressFilter(allowed_networks=["127.0.0.0/8"]).allows(text) is first  # and fresh
        assert rules.split([text]) == AddressFilter(allowed_networks=["127.0.0.0/8"]).split([text])
    # the negative controls: a non-public address is never admitted by the cache, a public one never refused
    assert rules.allows("10.0.0.1") is False and rules.allows("8.8.8.8") is True
    # an error is never cached: a bad string raises every time
    for _ in range(2):
        with pytest.raises(ValueError):
            rules.allows("not-an-address")
    # bounded: once full, the cache starts over, and verdicts stay right
    for i in range(addresses_module._VERDICTS_MAX + 10):
        rules.allows(f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}")
    assert len(rules._verdicts) <= addresses_module._VERDICTS_MAX
    assert rules.allows("10.0.0.1") is False and rules.allows("127.0.0.5") is True


def test_a_dual_stack_host_is_booked_on_the_family_this_machine_routes():
    """IPv4 when one of its IPv4 addresses is routed, else IPv6 when one of those is, else all (docs/spec.md §3):
    a machine routed only over IPv6 books the IPv6 addresses (review), one with no route at all lets both fail."""
    both = ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
    assert one_family(both, lambda a: True) == ["192.0.2.1", "192.0.2.2"]
    assert one_family(both, lambda a: ":" in a) == ["2001:db8::1"]
    assert one_family(both, lambda a: a == "192.0.2.2") == ["192.0.2.1", "192.0.2.2"]
    assert one_family(both, lambda a: False) == both
    assert one_family(["2001:db8::1"], lambda a: False) == ["2001:db8::1"]  # one family: nothing to choose


@pytest.mark.parametrize(("network", "wide"), [
    ("0.0.0.0/0", True), ("10.0.0.0/7", True), ("128.0.0.0/1", True), ("::/0", True), ("2000::/3", True),
    ("2002::/15", True),  # 6to4 (private IPv4 inside) and public 2003::/16
    # (review) embedded forms take the verdicts of the IPv4 network they embed
    ("::ffff:0:0/96", True), ("64:ff9b::/96", True), ("2002::/16", True), ("2002:800::/21", True), ("::/8", True),
    ("224.0.0.0/3", False),  # two non-public blocks side by side
    # controls: only non-public addresses, or only public ones (which need no entry, and admit nothing more)
    ("127.0.0.0/8", False), ("169.254.169.254/32", False), ("10.0.0.0/8", False), ("8.8.8.0/24", False),
    ("::1/128", False), ("fc00::/7", False), ("fe80::/10", False), ("2001:db8::/32", False),
    ("::ffff:10.0.0.0/104", False), ("2002:a00::/24", False), ("2600::/16", False),
])
def test_a_network_that_holds_public_addresses_too_is_wide(network, wide):
    """``AddressFilter.wide_networks``: an allowed network spanning public and non-public addresses (trial: a user
    gave ``0.0.0.0/0``, admitting every private address, the cloud metadata service included) is named, for the
    start-up WARNING; one inside the non-public blocks, or wholly public, is not."""
    rules = AddressFilter(allowed_networks=["127.0.0.0/8", network])
    assert rules.wide_networks == ([network] if wide else [])


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32)).map(lambda t: ipaddress.IPv4Network(t, strict=False)),
    st.tuples(st.sampled_from([0, 0xFFFF << 32, 0x64FF9B << 96, 0x2002 << 112, 0x2001 << 112, 0x2600 << 112]),
              st.integers(0, 2**128 - 1), st.integers(0, 128)).map(
        lambda t: ipaddress.IPv6Network((t[0] | (t[1] >> t[2] if t[2] < 128 else 0), t[2]), strict=False)),
))
def test_a_wide_network_is_one_whose_addresses_is_public_judges_both_ways(net):
    """``wide_networks`` agrees with :func:`is_public` on the addresses themselves: a network with fewer than 512
    addresses is judged on every one of them; a larger one on its ends, its middle and the special addresses it holds
    (the sampled verdicts can only find fewer kinds than there are, so: both sampled → wide)."""
    if net.num_addresses < 512:
        found = {is_public(address) for address in net}
        assert bool(AddressFilter(allowed_networks=[str(net)]).wide_networks) is (len(found) == 2)
        return
    specials = ["169.254.169.254", "8.8.8.8", "10.0.0.1", "::ffff:169.254.169.254", "::ffff:8.8.8.8",
                "64:ff9b::808:808", "2002:808:808::1", "2002:a00:1::1", "2001:db8::1", "2600::1", "::1"]
    sampled = [net.network_address, net.broadcast_address, net.network_address + net.num_addresses // 2]
    sampled += [ip for a in specials if (ip := ipaddress.ip_address(a)).version == net.version and ip in net]
    if len({is_public(address) for address in sampled}) == 2:
        assert AddressFilter(allowed_networks=[str(net)]).wide_networks == [str(net)]
