"""The ``POLITE_*`` settings read once (:mod:`scrapy_polite.settings`): the forms each kind of setting accepts,
a :class:`SettingsError` naming the setting for every invalid value (each with a valid negative control), and
the warning for an unknown ``POLITE_*`` name.

Settings are given both as a Scrapy ``Settings`` (what a crawl has; ``-s NAME=VALUE`` arrives as a string at
``cmdline`` priority) and as a plain dict (what unit tests pass).
"""

from __future__ import annotations

import ipaddress
import logging

import pytest
from scrapy.settings import BaseSettings, Settings

from scrapy_polite.addon import Addon, answering_middlewares
from scrapy_polite.resolver import PublicHostnameResolver, parse_nameserver
from scrapy_polite.settings import (
    DEFAULTS,
    DNSConfig,
    PoliteConfig,
    SettingsError,
    as_settings,
    checked_handlers,
    parse_dict_setting,
    parse_list_setting,
    polite_enabled,
    unknown_settings,
    unknown_settings_error,
)
from scrapy_polite.startup import refuse_to_start


def cmdline(**values: object) -> Settings:
    """Settings as ``scrapy crawl -s NAME=VALUE`` leaves them: each value a string at cmdline priority."""
    settings = Settings()
    for name, value in values.items():
        settings.set(name, value, priority="cmdline")
    return settings


def networks(config: PoliteConfig | DNSConfig) -> list[str]:
    return [str(n) for n in config.address_filter.allowed_networks]


# ---------------------------------------------------------------------------------------------------
# Defaults


@pytest.mark.parametrize("settings", [{}, Settings(), Settings(DEFAULTS)], ids=["dict", "Settings", "defaults"])
def test_defaults(settings):
    config = PoliteConfig.from_settings(settings)
    assert polite_enabled(settings) is True
    assert config.policy.host_interval == 1.0 and config.ip_interval == 2.0
    assert config.policy.throttle_statuses == frozenset({429, 503})
    assert config.store_uri is None and config.host_delays == {}
    assert config.scheduler_base == "scrapy.core.scheduler.Scheduler"
    assert not config.address_filter.allow_private and networks(config) == []
    assert config.dns == DNSConfig(address_filter=config.address_filter)
    assert dict(config.dns.overrides) == {} and config.dns.nameservers == ()
    assert (config.dns.timeout, config.dns.min_ttl, config.dns.max_ttl) == (5.0, 60.0, 3600.0)


def test_address_filter_is_the_dns_configs():
    config = PoliteConfig.from_settings({"POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"]})
    assert config.address_filter is config.dns.address_filter
    assert config.address_filter.allows("127.0.0.1") and not config.address_filter.allows("10.0.0.1")


# ---------------------------------------------------------------------------------------------------
# List settings: a list, a tuple, a comma-separated string, a JSON list (and an empty one)


@pytest.mark.parametrize("value, expected", [
    (["127.0.0.0/8", "::1/128"], ["127.0.0.0/8", "::1/128"]),
    (("127.0.0.0/8",), ["127.0.0.0/8"]),
    ("127.0.0.0/8,::1/128", ["127.0.0.0/8", "::1/128"]),
    (" 127.0.0.0/8 , ::1/128 ,", ["127.0.0.0/8", "::1/128"]),
    ("127.0.0.0/8", ["127.0.0.0/8"]),
    ('["127.0.0.0/8", "::1/128"]', ["127.0.0.0/8", "::1/128"]),
    ("[]", []),
    (" [ ] ", []),
    ("", []),
    ([], []),
], ids=["list", "tuple", "csv", "csv-spaces", "one", "json", "json-empty", "json-empty-spaces", "empty-string",
        "empty-list"])
@pytest.mark.parametrize("make", [dict, cmdline], ids=["dict", "cmdline"])
def test_allowed_networks_forms(make, value, expected):
    settings = make(POLITE_ALLOWED_NETWORKS=value)
    assert networks(PoliteConfig.from_settings(settings)) == expected
    assert networks(DNSConfig.from_settings(settings)) == expected


def test_allowed_networks_empty_json_list_is_no_longer_a_cidr_error():
    """The issue's reproduction: ``-s 'POLITE_ALLOWED_NETWORKS=[]'`` was "'[]' is not a valid CIDR network"."""
    config = PoliteConfig.from_settings(cmdline(POLITE_ALLOWED_NETWORKS="[]"))
    assert networks(config) == [] and not config.address_filter.allows("127.0.0.1")


@pytest.mark.parametrize("value, expected", [
    (["127.0.0.1:5353", "[::1]:53"], (("127.0.0.1", 5353), ("::1", 53))),
    ("127.0.0.1:5353,[::1]:53", (("127.0.0.1", 5353), ("::1", 53))),
    ("[::1]:5300", (("::1", 5300),)),  # starts with "[" but is no JSON: one nameserver
    ("[::1]", (("::1", 53),)),
    ('["8.8.8.8", "[::1]:53"]', (("8.8.8.8", 53), ("::1", 53))),
    ("[]", ()),
    ("", ()),
])
def test_nameservers_forms(value, expected):
    assert DNSConfig.from_settings(cmdline(POLITE_DNS_NAMESERVERS=value)).nameservers == expected


@pytest.mark.parametrize("value, expected", [
    ([429], {429}), ((429, 503.0), {429, 503}), ("429,503", {429, 503}), ("429", {429}),
    ("429 503", {429, 503}), ("[429, 503]", {429, 503}), ('["429"]', {429}),
])
def test_throttle_statuses_forms(value, expected):
    assert PoliteConfig.from_settings(cmdline(POLITE_THROTTLE_STATUSES=value)).policy.throttle_statuses == expected


def test_parse_list_setting_returns_a_copy():
    value = ["a"]
    got = parse_list_setting("POLITE_X", value, what="things", example=["a"])
    assert got == value and got is not value


# ---------------------------------------------------------------------------------------------------
# Dict settings: a dict, a JSON object string


@pytest.mark.parametrize("value", [{"Api.Example.com.": 5}, '{"Api.Example.com.": 5}',
                                   BaseSettings({"api.example.com": 5})], ids=["dict", "json", "BaseSettings"])
def test_host_delays_forms(value):
    settings = Settings()
    settings.set("POLITE_HOST_DELAYS", value, priority="cmdline")
    assert PoliteConfig.from_settings(settings).host_delays == {"api.example.com": 5.0}


@pytest.mark.parametrize("value", [{"A.Test.": ["127.0.0.9", "127.0.0.9", "::1"]},
                                   '{"A.Test.": ["127.0.0.9", "::1"]}',
                                   {"a.test": "::1,127.0.0.9"},
                                   {"[a.test]": '["::1", "127.0.0.9"]'}],
                         ids=["dict", "json", "dict-csv", "dict-json-list"])
def test_dns_overrides_forms(value):
    config = DNSConfig.from_settings(cmdline(POLITE_DNS_OVERRIDES=value))
    assert dict(config.overrides) == {"a.test": ("127.0.0.9", "::1")}  # sorted IPv4 first, de-duplicated


@pytest.mark.parametrize("value", ["", "{}", {}])
def test_empty_dict_settings(value):
    settings = cmdline(POLITE_HOST_DELAYS=value, POLITE_DNS_OVERRIDES=value)
    config = PoliteConfig.from_settings(settings)
    assert config.host_delays == {} and dict(config.dns.overrides) == {}


def test_dns_overrides_are_read_only():
    config = DNSConfig.from_settings({"POLITE_DNS_OVERRIDES": {"a.test": ["127.0.0.1"]}})
    with pytest.raises(TypeError):
        config.overrides["b.test"] = ("127.0.0.2",)  # type: ignore[index]


# ---------------------------------------------------------------------------------------------------
# Booleans: Scrapy's getbool values


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), ("1", True), ("0", False),
    ("True", True), ("true", True), ("False", False), ("false", False),
])
@pytest.mark.parametrize("make", [dict, cmdline], ids=["dict", "cmdline"])
def test_booleans(make, value, expected):
    settings = make(POLITE_ALLOW_PRIVATE=value, POLITE_ENABLED=value)
    config = PoliteConfig.from_settings(settings)
    assert config.address_filter.allow_private is expected and polite_enabled(settings) is expected
    assert Settings({"X": value}).getbool("X") is expected  # the same as Scrapy's own reading


# ---------------------------------------------------------------------------------------------------
# Every invalid value: a SettingsError naming the setting and the value


INVALID = [
    ("POLITE_ENABLED", "yes"),
    ("POLITE_ALLOW_PRIVATE", "on"),
    ("POLITE_ALLOW_PRIVATE", [1]),
    ("POLITE_HOST_INTERVAL", -1),
    ("POLITE_HOST_INTERVAL", "fast"),
    ("POLITE_HOST_INTERVAL", False, "got False"),  # getfloat reads it as 0: every host silently unpaced
    ("POLITE_MAX_WAIT", True, "got True"),
    ("POLITE_IP_INTERVAL", float("inf")),
    ("POLITE_MAX_BACKOFF", -0.5),
    ("POLITE_MAX_WAIT", 0, "got 0"),
    ("POLITE_MAX_RETRY_AFTER", "nan"),
    ("POLITE_MAX_IDLE_WAIT", -1),
    ("POLITE_MAX_FAILURE_BACKOFF", -1),
    ("POLITE_ADAPTIVE", "on"),
    ("POLITE_ADAPTIVE_FACTOR", 0, "got 0"),
    ("POLITE_ADAPTIVE_FACTOR", "fast"),
    ("POLITE_ADAPTIVE_MAX", -1),
    ("POLITE_ADAPTIVE_WITH_AUTOTHROTTLE", "yes"),
    ("POLITE_MAX_FAILURE_BACKOFF", "a minute"),
    ("POLITE_THROTTLE_RETRIES", -1),
    ("POLITE_THROTTLE_RETRIES", 2.5),
    ("POLITE_THROTTLE_RETRIES", "often"),
    ("POLITE_THROTTLE_RETRIES", True),
    ("POLITE_RATELIMIT_HEADERS", "yes"),
    ("POLITE_MAX_HELD_IN_MEMORY", -1),
    ("POLITE_MAX_HELD_IN_MEMORY", 2.5),
    ("POLITE_MAX_HELD_IN_MEMORY", "many"),
    ("POLITE_MAX_HELD_IN_MEMORY", True),
    ("POLITE_STORE_EXPIRE", "a month"),
    ("POLITE_STORE", 5),
    ("POLITE_STORE_PREFIX", 5),
    ("POLITE_STORE_PREFIX", "my crawl:"),
    ("POLITE_STORE_TIMEOUT", 0, "got 0"),
    ("POLITE_STORE_TIMEOUT", "a minute"),
    ("POLITE_EVENT_LOG", "yes"),
    ("POLITE_EVENT_LOG_SIZE", 0, "got 0"),
    ("POLITE_EVENT_LOG_SIZE", "lots"),
    ("POLITE_SCHEDULER_BASE", ""),
    ("POLITE_SHARED_FRONTIER", "yes"),
    ("POLITE_FRONTIER_KEY", "with spaces:%(spider)s", "%(spider)s"),
    ("POLITE_FRONTIER_KEY", "%(name)s:polite"),
    ("POLITE_LEASE_TIME", 0, "> 0"),
    ("POLITE_LEASE_TIME", "a minute"),
    ("POLITE_THROTTLE_STATUSES", "[]", "is empty"),
    ("POLITE_THROTTLE_STATUSES", "429,slow"),
    ("POLITE_THROTTLE_STATUSES", "[429.5]"),
    ("POLITE_THROTTLE_STATUSES", [700], "[700]"),
    ("POLITE_THROTTLE_STATUSES", [200, 429], "outside 400-599"),  # trial: every page then backed its host off
    ("POLITE_THROTTLE_STATUSES", "304", "outside 400-599"),
    ("POLITE_THROTTLE_STATUSES", 429),
    ("POLITE_CHECKED_HANDLERS", 1),
    ("POLITE_CHECKED_HANDLERS", '["not a path"]', "'not a path'"),
    ("POLITE_HOST_DELAYS", "{api.example.com: 5}"),
    ("POLITE_HOST_DELAYS", "[5]"),
    ("POLITE_HOST_DELAYS", ["api.example.com"]),
    ("POLITE_HOST_DELAYS", {"api.example.com": -1}, "got -1"),
    ("POLITE_HOST_DELAYS", {"api.example.com": "soon"}, "'soon'"),
    ("POLITE_HOST_DELAYS", {"*.example.com": 5}, "no wildcard"),  # trial: accepted, and never matched
    ("POLITE_THROTTLE_STATUSES", "429,slow", "[429, 503]"),  # the example in the error is the default's form
    ("POLITE_ALLOWED_NETWORKS", "10.0.0.1/8"),
    ("POLITE_ALLOWED_NETWORKS", "127.0.0.0/8,localnet"),
    ("POLITE_ALLOWED_NETWORKS", "[127.0.0.0/8]"),  # JSON without quotes
    ("POLITE_ALLOWED_NETWORKS", "[5]"),
    ("POLITE_ALLOWED_NETWORKS", 5),
    ("POLITE_ALLOWED_NETWORKS", {"127.0.0.0/8": True}),
    ("POLITE_DNS_OVERRIDES", "{not json"),
    ("POLITE_DNS_OVERRIDES", '{"a.test": ["127.0.0.1"]'),
    ("POLITE_DNS_OVERRIDES", "[]"),
    ("POLITE_DNS_OVERRIDES", ["a.test"]),
    ("POLITE_DNS_OVERRIDES", {"a.test": ["2130706433"]}, "'2130706433'"),
    ("POLITE_DNS_OVERRIDES", {"a.test": ["example.com"]}, "'example.com'"),
    ("POLITE_DNS_OVERRIDES", {"a.test": 127}, "got 127"),
    ("POLITE_DNS_OVERRIDES", {"": ["127.0.0.1"]}, "key ''"),
    ("POLITE_DNS_NAMESERVERS", "dns.google"),
    ("POLITE_DNS_NAMESERVERS", "127.0.0.1:0"),
    ("POLITE_DNS_NAMESERVERS", "127.0.0.1:x"),
    ("POLITE_DNS_NAMESERVERS", "[::1]:x"),
    ("POLITE_DNS_NAMESERVERS", "[::1]53"),
    ("POLITE_DNS_NAMESERVERS", "127.0.0.1:70000"),
    ("POLITE_DNS_NAMESERVERS", 53),
    ("POLITE_DNS_TIMEOUT", 0),
    ("POLITE_DNS_TIMEOUT", "slow"),
    ("POLITE_DNS_MIN_TTL", -1),
    ("POLITE_DNS_MAX_TTL", 1, "(1 s)"),  # below the default POLITE_DNS_MIN_TTL (60)
    # Values Scrapy's getters take but the setting does not mean: our checks after the getter refuse them.
    ("POLITE_HOST_INTERVAL", "inf"),  # getfloat: inf
    ("POLITE_EVENT_LOG_SIZE", 2.5),  # getint: 2
    ("POLITE_THROTTLE_RETRIES", "1e309"),  # getint refuses it: a ValueError wrapped
    ("POLITE_HOST_DELAYS", [["api.example.com", 5]], "got [['api.example.com', 5]]"),  # getdict: a dict of pairs
    ("POLITE_DNS_OVERRIDES", '[["a.test", "127.0.0.1"]]'),  # getdict: a JSON list of pairs
    ("POLITE_ALLOWED_NETWORKS", 0, "got 0"),  # getlist: []
    ("POLITE_CHECKED_HANDLERS", {"myproject.handlers.A": 1}),  # getlist: the dict's keys
]

DNS_SETTINGS = {"POLITE_ALLOW_PRIVATE", "POLITE_ALLOWED_NETWORKS"} | {n for n in DEFAULTS if n.startswith("POLITE_DNS")}


def _shown(case: tuple) -> str:
    """What the message must quote: the third element of a case, else the value's repr."""
    return case[2] if len(case) > 2 else repr(case[1])


@pytest.mark.parametrize("name, value, shown", [(c[0], c[1], _shown(c)) for c in INVALID],
                         ids=[f"{c[0]}={c[1]!r}" for c in INVALID])
@pytest.mark.parametrize("make", [dict, cmdline], ids=["dict", "cmdline"])
def test_invalid_value_names_the_setting(make, name, value, shown):
    with pytest.raises(SettingsError, match=name) as exc:
        PoliteConfig.from_settings(make(**{name: value}))
    assert shown in str(exc.value)
    if name in DNS_SETTINGS:  # the per-process resolver reads them alone, and refuses them the same way
        with pytest.raises(SettingsError, match=name):
            DNSConfig.from_settings(make(**{name: value}))
        with pytest.raises(SettingsError, match=name):
            PublicHostnameResolver.from_settings(make(**{name: value}), reactor=None)


VALID = {
    "POLITE_ENABLED": "false", "POLITE_ALLOW_PRIVATE": "1", "POLITE_HOST_INTERVAL": "0",
    "POLITE_IP_INTERVAL": 0.5, "POLITE_MAX_BACKOFF": "10", "POLITE_MAX_WAIT": 0.1,
    "POLITE_MAX_RETRY_AFTER": 0, "POLITE_MAX_IDLE_WAIT": 1, "POLITE_MAX_HELD_IN_MEMORY": "0",
    "POLITE_STORE_EXPIRE": "60", "POLITE_MAX_FAILURE_BACKOFF": "5", "POLITE_THROTTLE_RETRIES": "3",
    "POLITE_RATELIMIT_HEADERS": "false", "POLITE_ADAPTIVE": "true", "POLITE_ADAPTIVE_FACTOR": "3",
    "POLITE_ADAPTIVE_MAX": "30", "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE": "false",
    "POLITE_STORE": "memory://", "POLITE_STORE_PREFIX": "crawl1:", "POLITE_STORE_TIMEOUT": "5",
    "POLITE_EVENT_LOG": "false", "POLITE_EVENT_LOG_SIZE": "10",
    "POLITE_SCHEDULER_BASE": "scrapy.core.scheduler.Scheduler",
    "POLITE_SHARED_FRONTIER": "false", "POLITE_FRONTIER_KEY": "%(spider)s:held", "POLITE_LEASE_TIME": "2",
    "POLITE_THROTTLE_STATUSES": "429", "POLITE_HOST_DELAYS": '{"api.example.com": 0}',
    "POLITE_ALLOWED_NETWORKS": '["10.0.0.0/8"]', "POLITE_DNS_OVERRIDES": '{"a.test": "127.0.0.1"}',
    "POLITE_DNS_NAMESERVERS": "127.0.0.1:5353", "POLITE_DNS_TIMEOUT": "0.1", "POLITE_DNS_MIN_TTL": 0,
    "POLITE_DNS_MAX_TTL": "60", "POLITE_CHECKED_HANDLERS": "myproject.handlers.A, myproject.handlers.B",
}


def test_valid_values_are_the_negative_control():
    """Every setting of the table above, with a valid value of the same shape: no error, and each is read."""
    assert set(VALID) == set(DEFAULTS) == {case[0] for case in INVALID}
    for make in (dict, cmdline):
        settings = make(**VALID)
        config = PoliteConfig.from_settings(settings)
        assert polite_enabled(settings) is False and config.address_filter.allow_private is True
        assert config.policy.host_interval == 0 and config.policy.max_wait == 0.1
        assert config.policy.throttle_statuses == {429} and config.host_delays == {"api.example.com": 0.0}
        assert config.store_uri == "memory://" and config.store_expire == 60
        assert config.store_prefix == "crawl1:" and config.store_timeout == 5.0
        assert config.event_log is False and config.event_log_size == 10
        assert config.max_held_in_memory == 0
        assert (config.shared_frontier, config.frontier_key, config.lease_time) == (False, "%(spider)s:held", 2.0)
        assert config.policy.max_failure_backoff == 5.0 and config.policy.throttle_retries == 3
        assert config.policy.ratelimit_headers is False
        assert config.policy.adaptive is not None
        assert (config.policy.adaptive.factor, config.policy.adaptive.cap) == (3.0, 30.0)
        assert checked_handlers(settings) == ("myproject.handlers.A", "myproject.handlers.B")
        assert config.dns.address_filter.allowed_networks == (ipaddress.ip_network("10.0.0.0/8"),)
        assert dict(config.dns.overrides) == {"a.test": ("127.0.0.1",)}
        assert config.dns.nameservers == (("127.0.0.1", 5353),)
        assert (config.dns.timeout, config.dns.min_ttl, config.dns.max_ttl) == (0.1, 0.0, 60.0)


def test_error_message_gives_the_accepted_forms():
    with pytest.raises(SettingsError) as exc:
        PoliteConfig.from_settings({"POLITE_ALLOWED_NETWORKS": "[127.0.0.0/8]"})
    message = str(exc.value)
    assert "'[127.0.0.0/8]'" in message  # the value
    assert "comma-separated" in message and "JSON list" in message and '["127.0.0.0/8"' in message  # the forms


def test_malformed_json_overrides_say_json():
    with pytest.raises(SettingsError, match=r"POLITE_DNS_OVERRIDES is not valid JSON .*'\{not json'") as exc:
        DNSConfig.from_settings(cmdline(POLITE_DNS_OVERRIDES="{not json"))
    assert "JSON object" in str(exc.value)
    # negative control: the same override as valid JSON
    assert dict(DNSConfig.from_settings(cmdline(POLITE_DNS_OVERRIDES='{"x.test": ["127.0.0.1"]}')).overrides) == {
        "x.test": ("127.0.0.1",)}


def test_max_ttl_may_equal_min_ttl_but_not_be_below():
    assert DNSConfig.from_settings({"POLITE_DNS_MIN_TTL": 5, "POLITE_DNS_MAX_TTL": 5}).max_ttl == 5
    with pytest.raises(SettingsError, match="POLITE_DNS_MAX_TTL .* must be >= POLITE_DNS_MIN_TTL"):
        DNSConfig.from_settings({"POLITE_DNS_MIN_TTL": 5, "POLITE_DNS_MAX_TTL": 4.9})


def test_dict_and_list_helpers_refuse_other_types():
    with pytest.raises(SettingsError, match="POLITE_X must be things"):
        parse_list_setting("POLITE_X", 3, what="things", example=["a"])
    with pytest.raises(SettingsError, match="POLITE_Y must be pairs"):
        parse_dict_setting("POLITE_Y", ["a"], what="pairs", example={"a": 1})
    assert parse_dict_setting("POLITE_Y", '{"a": 1}', what="pairs", example={"a": 1}) == {"a": 1}


@pytest.mark.parametrize("entry", ["dns.google", "127.0.0.1:0", "127.0.0.1:70000", "[::1]:x", "127.0.0.1:",
                                   "127.0.0.1:\u00b2"])
def test_parse_nameserver_raises_settings_error(entry):
    with pytest.raises(SettingsError, match="POLITE_DNS_NAMESERVERS entry"):
        parse_nameserver(entry)


def test_resolver_constructor_refuses_with_settings_error():
    with pytest.raises(SettingsError, match=r"POLITE_DNS_OVERRIDES\['x.test'\]"):
        PublicHostnameResolver(None, overrides={"x.test": ["0177.0.0.1"]})
    with pytest.raises(SettingsError, match="POLITE_DNS_TIMEOUT"):
        PublicHostnameResolver(None, timeout=0)
    resolver = PublicHostnameResolver(None, overrides={"X.test.": "127.0.0.1"}, timeout=1)  # negative control
    assert resolver.overrides == {"x.test": ("127.0.0.1",)}


class _Process:
    """What Scrapy passes to ``TWISTED_DNS_RESOLVER``'s ``from_crawler``: an object with ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings


def test_resolver_from_crawler_reads_command_line_strings():
    settings = cmdline(POLITE_ALLOWED_NETWORKS="127.0.0.9/32,::1/128", POLITE_DNS_NAMESERVERS="[::1]:5300",
                       POLITE_DNS_OVERRIDES='{"A.test": "127.0.0.9"}', POLITE_ALLOW_PRIVATE="0",
                       POLITE_DNS_TIMEOUT="0.5", POLITE_DNS_MIN_TTL="0", POLITE_DNS_MAX_TTL="10")
    resolver = PublicHostnameResolver.from_crawler(_Process(settings), None)
    assert resolver.nameservers == [("::1", 5300)]
    assert resolver.overrides == {"a.test": ("127.0.0.9",)}
    assert (resolver.timeout, resolver.min_ttl, resolver.max_ttl) == (0.5, 0.0, 10.0)
    assert resolver.filter.allows("127.0.0.9") and resolver.filter.allows("::1")
    assert not resolver.filter.allows("127.0.0.1") and not resolver.filter.allow_private


def test_resolver_from_config():
    config = DNSConfig.from_settings({"POLITE_DNS_NAMESERVERS": ["127.0.0.1:5353"], "POLITE_DNS_TIMEOUT": 2})
    resolver = PublicHostnameResolver.from_config(config, None)
    assert resolver.nameservers == [("127.0.0.1", 5353)] and resolver.timeout == 2.0
    assert resolver.filter is config.address_filter


# ---------------------------------------------------------------------------------------------------
# Unknown POLITE_* names


def test_unknown_settings_suggests_the_closest_name():
    names = ["POLITE_HOST_INTERVALS", "POLITE_HOST_INTERVAL", "LOG_LEVEL", "POLITE_DNS_NAMESERVER",
             "polite_ip_interval", "POLITE_HOST_INTERVALS", "POLITE_ZZZ"]
    assert unknown_settings(names) == [
        ("POLITE_HOST_INTERVALS", "POLITE_HOST_INTERVAL"),
        ("POLITE_DNS_NAMESERVER", "POLITE_DNS_NAMESERVERS"),
        ("polite_ip_interval", "POLITE_IP_INTERVAL"),
        ("POLITE_ZZZ", None),
    ]


def test_known_names_are_not_unknown():
    assert unknown_settings(DEFAULTS) == []
    assert unknown_settings(Settings({**DEFAULTS, "DOWNLOAD_DELAY": 1, "ROBOTSTXT_OBEY": True})) == []


def test_unknown_settings_are_one_error_naming_each():
    settings = Settings({"POLITE_HOST_INTERVALS": 5, "POLITE_HOST_INTERVAL": 5, "POLITE_ZZZ": 1})
    assert unknown_settings_error(settings) == (
        "POLITE_HOST_INTERVALS is not a scrapy-polite setting (did you mean POLITE_HOST_INTERVAL?); POLITE_ZZZ is not "
        "a scrapy-polite setting. Fix: correct them or remove them (the settings reference lists the settings)")


def test_known_names_are_no_error():
    assert unknown_settings_error({"POLITE_HOST_INTERVAL": 5, "POLITE_DNS_TIMEOUT": 1, "LOG_LEVEL": "INFO"}) is None


def test_the_addon_refuses_to_start_with_a_typo(caplog):
    """Trial: a typo was a WARNING, and the crawl ran at the default pace (``POLITE_HOST_INTERVL = 2``). It is
    one ERROR line naming the setting, where it was set and the close name; the control: the right name starts."""
    settings = Settings()
    settings.set("POLITE_HOST_INTERVL", 10, priority="spider")
    with caplog.at_level(logging.WARNING, logger="scrapy_polite"), pytest.raises(SettingsError):
        Addon().update_settings(settings)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["scrapy-polite cannot start the crawl: POLITE_HOST_INTERVL is not a scrapy-polite setting (did "
                      "you mean POLITE_HOST_INTERVAL?). Fix: correct it or remove it (the settings reference lists the "
                      "settings) (POLITE_HOST_INTERVL is set in the spider's custom_settings)"], errors
    correct = Settings()
    correct.set("POLITE_HOST_INTERVAL", 10, priority="spider")
    Addon().update_settings(correct)


def test_a_typo_is_no_error_when_the_addon_is_off():
    settings = Settings({"POLITE_ENABLED": False, "POLITE_HOST_INTERVL": 10})
    Addon().update_settings(settings)


@pytest.mark.parametrize("make", [dict, cmdline], ids=["dict", "cmdline"])
def test_adaptive_with_autothrottle_is_refused_unless_allowed(make, caplog):
    """POLITE_ADAPTIVE and AutoThrottle are two pacers, one unaware of the other: refused, naming the fix (its own,
    not the generic "give POLITE_ADAPTIVE a value"), unless POLITE_ADAPTIVE_WITH_AUTOTHROTTLE says both (docs/spec.md
    §2, "Adaptive pacing")."""
    with pytest.raises(SettingsError, match="AUTOTHROTTLE_ENABLED = False") as exc:
        PoliteConfig.from_settings(make(POLITE_ADAPTIVE="True", AUTOTHROTTLE_ENABLED="True"))
    assert "POLITE_ADAPTIVE_WITH_AUTOTHROTTLE" in str(exc.value)
    with caplog.at_level(logging.ERROR):
        refuse_to_start(exc.value)
    line, = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.count("Fix:") == 1 and "Fix: turn AutoThrottle off" in line and "a value" not in line, line
    allowed = PoliteConfig.from_settings(make(POLITE_ADAPTIVE="True", AUTOTHROTTLE_ENABLED="True",
                                              POLITE_ADAPTIVE_WITH_AUTOTHROTTLE="True"))
    assert allowed.policy.adaptive is not None
    # Negative controls: either alone is fine.
    assert PoliteConfig.from_settings(make(AUTOTHROTTLE_ENABLED="True")).policy.adaptive is None
    assert PoliteConfig.from_settings(make(POLITE_ADAPTIVE="True",
                                           AUTOTHROTTLE_ENABLED="False")).policy.adaptive is not None


# ---------------------------------------------------------------------------------------------------
# Through Scrapy's getters; POLITE_ENABLED in one place


class RecordingSettings(Settings):
    """A Scrapy ``Settings`` that notes which getter read which setting."""

    def __init__(self, values: dict) -> None:
        self.read: dict[str, set[str]] = {}
        super().__init__(values)

    def _note(self, getter: str, name: str) -> None:
        self.read.setdefault(name, set()).add(getter)

    def getbool(self, name, default=False):
        self._note("getbool", name)
        return super().getbool(name, default)

    def getint(self, name, default=0):
        self._note("getint", name)
        return super().getint(name, default)

    def getfloat(self, name, default=0.0):
        self._note("getfloat", name)
        return super().getfloat(name, default)

    def getlist(self, name, default=None):
        self._note("getlist", name)
        return super().getlist(name, default)

    def getdict(self, name, default=None):
        self._note("getdict", name)
        return super().getdict(name, default)


#: The settings that are strings or classes, for which Scrapy has no getter but ``get``.
NO_GETTER = {"POLITE_STORE", "POLITE_STORE_PREFIX", "POLITE_SCHEDULER_BASE", "POLITE_FRONTIER_KEY"}


def test_every_setting_is_read_through_a_scrapy_getter():
    """Each typed setting goes through the getter of its type (the VALID values, so every branch reads; the
    networks comma-separated, as the JSON list form is read before getlist, below)."""
    settings = RecordingSettings({**VALID, "POLITE_ALLOWED_NETWORKS": "10.0.0.0/8"})
    PoliteConfig.from_settings(settings)
    expected = {name: {"getbool"} for name, default in DEFAULTS.items() if isinstance(default, bool)}
    expected |= {name: {"getfloat"} for name, default in DEFAULTS.items() if isinstance(default, float)}
    expected |= {name: {"getint"} for name, default in DEFAULTS.items()
                 if isinstance(default, int) and not isinstance(default, bool)}
    expected |= {name: {"getlist"} for name, default in DEFAULTS.items() if isinstance(default, list)}
    expected |= {name: {"getdict"} for name, default in DEFAULTS.items() if isinstance(default, dict)}
    polite = {name: getters for name, getters in settings.read.items() if name.startswith("POLITE_")}
    assert polite == expected
    assert set(DEFAULTS) - set(polite) == NO_GETTER  # the negative control: only the string settings use get()
    # a JSON list is the one form getlist cannot read: it is parsed before (and getlist is not asked)
    json_list = RecordingSettings({"POLITE_ALLOWED_NETWORKS": '["127.0.0.0/8"]'})
    assert networks(DNSConfig.from_settings(json_list)) == ["127.0.0.0/8"]
    assert "POLITE_ALLOWED_NETWORKS" not in json_list.read


def test_a_getter_error_is_a_settings_error_naming_the_setting():
    """Scrapy's own ValueError (getbool's message names no setting) becomes ours, naming setting and value."""
    with pytest.raises(ValueError, match="Supported values for boolean settings") as scrapy_error:
        Settings({"POLITE_EVENT_LOG": "yes"}).getbool("POLITE_EVENT_LOG")
    assert "POLITE_EVENT_LOG" not in str(scrapy_error.value)
    with pytest.raises(SettingsError, match=r"POLITE_EVENT_LOG must be a boolean .* got 'yes'"):
        PoliteConfig.from_settings(Settings({"POLITE_EVENT_LOG": "yes"}))
    with pytest.raises(SettingsError, match=r"POLITE_DNS_TIMEOUT must be a number of seconds, got \[5\]"):
        DNSConfig.from_settings(Settings({"POLITE_DNS_TIMEOUT": [5]}))  # getfloat's TypeError


def test_as_settings_wraps_a_mapping_once():
    settings = Settings({"POLITE_HOST_INTERVAL": 3})
    assert as_settings(settings) is settings
    wrapped = as_settings({"POLITE_HOST_INTERVAL": "3"})
    assert isinstance(wrapped, BaseSettings) and wrapped.getfloat("POLITE_HOST_INTERVAL") == 3.0


@pytest.mark.parametrize("make", [dict, cmdline], ids=["dict", "cmdline"])
def test_polite_enabled(make):
    assert polite_enabled(make()) is True  # the default
    assert polite_enabled(make(POLITE_ENABLED="0")) is False
    assert polite_enabled(make(POLITE_ENABLED="True")) is True
    with pytest.raises(SettingsError, match="POLITE_ENABLED must be a boolean .*got 'yes'"):
        polite_enabled(make(POLITE_ENABLED="yes"))


def test_a_disabled_addon_installs_nothing_and_an_invalid_enabled_is_refused():
    """The add-on asks :func:`polite_enabled` in both its hooks."""
    off = Settings()
    off.set("POLITE_ENABLED", "false", priority="cmdline")
    Addon.update_pre_crawler_settings(off)
    Addon().update_settings(off)
    assert "scrapy_polite.middleware.PoliteDownloaderMiddleware" not in off.getdict("DOWNLOADER_MIDDLEWARES")
    assert off.get("TWISTED_DNS_RESOLVER") != "scrapy_polite.resolver.PublicHostnameResolver"
    bad = Settings()
    bad.set("POLITE_ENABLED", "yes", priority="cmdline")
    Addon.update_pre_crawler_settings(bad)  # no error here: update_settings reports it, once
    with pytest.raises(SettingsError, match="POLITE_ENABLED"):
        Addon().update_settings(bad)
    on = Settings()  # the negative control: enabled, the components are installed
    Addon.update_pre_crawler_settings(on)
    Addon().update_settings(on)
    assert "scrapy_polite.middleware.PoliteDownloaderMiddleware" in on.getdict("DOWNLOADER_MIDDLEWARES")


class _Answers:
    def process_request(self, request):
        return None


class _OnlyResponses:
    def process_response(self, request, response):
        return response


@pytest.mark.parametrize(("settings", "found"), [
    ({}, []),  # Scrapy's own never answer (the HTTP cache is off)
    ({"HTTPCACHE_ENABLED": True}, ["scrapy.downloadermiddlewares.httpcache.HttpCacheMiddleware"]),
    ({"DOWNLOADER_MIDDLEWARES": {_Answers: 500}}, [f"{__name__}._Answers"]),
    ({"DOWNLOADER_MIDDLEWARES": {_Answers: None}}, []),  # disabled
    ({"DOWNLOADER_MIDDLEWARES": {_OnlyResponses: 500}}, []),  # no process_request: answers nothing
    ({"DOWNLOADER_MIDDLEWARES": {"scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware": 100}}, []),  # the add-on's
])
def test_the_middlewares_that_may_answer_a_request_before_the_pacing_one(settings, found):
    """While one is found, the scheduler holds no new request for its host's line as it hands it out (docs/spec.md
    §5): such a page is never held back."""
    assert answering_middlewares(Settings(settings)) == found



def _cache_crawler(tmp_path, **settings):
    """A crawler whose downloader has Scrapy's real ``HttpCacheMiddleware`` (filesystem storage in ``tmp_path``, open),
    holding a fresh entry for ``http://a.example/fresh``."""
    from types import SimpleNamespace

    from scrapy import Request, Spider
    from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(Spider, {"HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": str(tmp_path), **settings})
    crawler.spider = Spider.from_crawler(crawler, "cached")
    cache = HttpCacheMiddleware.from_crawler(crawler)
    cache.storage.open_spider(crawler.spider)
    fresh = Request("http://a.example/fresh")
    cache.storage.store_response(crawler.spider, fresh, HtmlResponse(fresh.url, body=b"x", request=fresh))
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(middleware=SimpleNamespace(middlewares=[cache])))
    return crawler, cache


@pytest.mark.parametrize(("settings", "url", "meta", "answers"), [
    ({}, "/fresh", {}, True),  # a fresh entry: the cache answers it
    ({}, "/missing", {}, False),  # control: a miss goes to the network
    ({}, "/fresh", {"dont_cache": True}, False),  # the cache does not look
    ({"HTTPCACHE_IGNORE_MISSING": True}, "/missing", {}, True),  # a miss the cache drops
    ({"HTTPCACHE_IGNORE_MISSING": True}, "/fresh", {}, True),
    ({"HTTPCACHE_POLICY": "scrapy.extensions.httpcache.RFC2616Policy"}, "/fresh", {}, False),  # stale: revalidated
    ({"HTTPCACHE_POLICY": "scrapy.extensions.httpcache.RFC2616Policy", "HTTPCACHE_IGNORE_MISSING": True},
     "/fresh", {}, False),  # stale, though the cache drops misses (review: it went unheld)
])
def test_the_scheduler_asks_the_http_cache_whether_it_answers(tmp_path, settings, url, meta, answers):
    """``cache_answers`` decides as ``HttpCacheMiddleware.process_request`` does (docs/spec.md §5): the scheduler holds
    for its host's line only a request the cache lets through to the network."""
    from scrapy import Request

    from scrapy_polite.addon import cache_answers

    crawler, _ = _cache_crawler(tmp_path, **settings)
    answer = cache_answers(crawler)
    assert answer is not None
    assert answer(Request(f"http://a.example{url}", meta=meta)) is answers


@pytest.mark.parametrize("ignore_missing", [False, True])
def test_an_http_cache_entry_that_cannot_be_read_is_a_miss(tmp_path, ignore_missing):
    from scrapy import Request

    from scrapy_polite.addon import cache_answers

    crawler, cache = _cache_crawler(tmp_path, HTTPCACHE_IGNORE_MISSING=ignore_missing)

    def broken(spider, request):
        raise OSError("unreadable")

    cache.storage.retrieve_response = broken
    answer = cache_answers(crawler)
    assert answer is not None and answer(Request("http://a.example/fresh")) is ignore_missing


def test_no_cache_question_without_the_cache_alone(tmp_path):
    """Another middleware that may answer first (the scheduler cannot ask it), or no engine yet: no question."""
    from scrapy_polite.addon import cache_answers

    crawler, _ = _cache_crawler(tmp_path, DOWNLOADER_MIDDLEWARES={_Answers: 500})
    assert cache_answers(crawler) is None
    crawler, _ = _cache_crawler(tmp_path)
    crawler.engine = None
    assert cache_answers(crawler) is None
