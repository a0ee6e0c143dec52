"""Announced quotas (docs/spec.md §2, "Announced quotas"): the parsers of scrapy_polite.policy.ratelimit on real-world
examples and on malformed input, the policy's rules (``after_ratelimit``, the interval, the hold, deferral),
and the quota's columns in the SQLite pace table (an old file migrated, its rows kept).

Expected values are written out by hand from the examples; the epoch-time cases use a fixed "now".
"""

from __future__ import annotations

import email.utils
import sqlite3
from dataclasses import replace

import pytest

from scrapy_polite.policy import HostState, PacingPolicy
from scrapy_polite.policy.ratelimit import QuotaPolicy, RateLimits, ServiceLimit, parse_rate_limits
from scrapy_polite.stores import SCHEMA_VERSION, SQLiteStore
from tests.support.stores import write_version_1_file

#: GitHub's documented example reset (2013-07-01T17:47:53Z) minus 73 s: "now" for the epoch-time examples.
NOW = 1372700873.0 - 73.0
T0 = 1_800_000_000.0
POLICY = PacingPolicy()


def parse(now: float = NOW, date: str | None = None, **fields: str | list[str]) -> RateLimits:
    """``parse(RateLimit_Policy='...')``: keyword names with ``_`` for ``-``; a list is several field lines."""
    return parse_rate_limits({name.replace("_", "-"): value if isinstance(value, list) else [value]
                              for name, value in fields.items()}, now=now, date=date)


# --------------------------------------------------------------------------------------------------
# The IETF fields (draft-ietf-httpapi-ratelimit-headers-08 and later, and the older forms)
# --------------------------------------------------------------------------------------------------


def test_ietf_policy_and_limit_draft_10_example():
    # draft-10 §3 and §4.2: two policies, and one service limit with its reset.
    limits = parse(RateLimit_Policy='"burst";q=100;w=60,"daily";q=1000;w=86400', RateLimit='"default";r=50;t=30')
    assert limits.policies == (QuotaPolicy(100, 60.0, "requests", "burst"), QuotaPolicy(1000, 86400.0, "requests", "daily"))
    assert limits.limits == (ServiceLimit(50, 30.0, "default"),)
    assert limits.malformed == () and bool(limits)


def test_ietf_fields_split_over_several_lines_are_one_list():
    limits = parse(RateLimit_Policy=['"permin";q=50;w=60', '"perhr";q=1000;w=3600'])
    assert [(p.name, p.quota, p.window) for p in limits.policies] == [("permin", 50, 60.0), ("perhr", 1000, 3600.0)]


def test_ietf_partition_keys_units_and_tokens():
    limits = parse(RateLimit_Policy='"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:',
                   RateLimit='"default";r=999;pk=:dHJpYWwxMjEzMjM=:')
    assert limits.policies == (QuotaPolicy(65535, 10.0, "content-bytes", "peruser"),)
    assert limits.limits == (ServiceLimit(999, None, "default"),)  # no reset announced
    # An earlier revision of the draft names the policy with a Token.
    assert parse(RateLimit_Policy="burst;q=100;w=60").policies == (QuotaPolicy(100, 60.0, "requests", "burst"),)


def test_ietf_policy_without_window():
    assert parse(RateLimit_Policy='"default";q=100').policies == (QuotaPolicy(100, None, "requests", "default"),)


def test_draft_07_integer_policies_and_the_dictionary_field():
    # draft-07 §3.5 and §4.
    limits = parse(RateLimit_Policy="10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400",
                   RateLimit="limit=10, remaining=0, reset=10")
    assert [(p.quota, p.window) for p in limits.policies] == [(10, 1.0), (50, 60.0), (1000, 3600.0), (5000, 86400.0),
                                                              (10, None)]
    assert limits.limits == (ServiceLimit(0, 10.0),)


# --------------------------------------------------------------------------------------------------
# The earlier drafts' RateLimit-Limit / -Remaining / -Reset
# --------------------------------------------------------------------------------------------------


def test_kong_rate_limiting_plugin_fields():
    # Kong's rate-limiting plugin (draft fields, with its own X- per-minute fields beside them).
    limits = parse(RateLimit_Limit="6", RateLimit_Remaining="4", RateLimit_Reset="47",
                   X_RateLimit_Limit_Minute="6", X_RateLimit_Remaining_Minute="4")
    assert limits.policies == (QuotaPolicy(6),)
    assert limits.limits == (ServiceLimit(4, 47.0),)


def test_draft_00_limit_with_quota_policies():
    limits = parse(RateLimit_Limit="10, 10;w=1, 50;w=60", RateLimit_Remaining="0", RateLimit_Reset="1")
    assert [(p.quota, p.window) for p in limits.policies] == [(10, None), (10, 1.0), (50, 60.0)]
    assert limits.limits == (ServiceLimit(0, 1.0),)


def test_remaining_without_reset_and_reset_alone():
    assert parse(RateLimit_Remaining="3").limits == (ServiceLimit(3, None),)
    assert parse(RateLimit_Reset="3").limits == ()  # nothing to hold without a remaining count


# --------------------------------------------------------------------------------------------------
# X-RateLimit-*: delta seconds or an epoch time
# --------------------------------------------------------------------------------------------------


def test_github_epoch_reset():
    # GitHub REST API docs: x-ratelimit-reset is the epoch second the window resets.
    limits = parse(x_ratelimit_limit="60", x_ratelimit_remaining="56", x_ratelimit_used="4",
                   x_ratelimit_reset="1372700873", x_ratelimit_resource="core")
    assert limits.policies == (QuotaPolicy(60),)
    assert limits.limits == (ServiceLimit(56, 73.0),)


def test_github_exhausted_reset_in_the_past_is_zero():
    assert parse(now=1372700900.0, x_ratelimit_remaining="0", x_ratelimit_reset="1372700873").limits == (
        ServiceLimit(0, 0.0),)


def test_discord_reset_after_wins_over_the_epoch_reset():
    # Discord developer docs: Reset (epoch, decimals) and Reset-After (seconds).
    limits = parse(now=1470173022.0, X_RateLimit_Limit="5", X_RateLimit_Remaining="0",
                   X_RateLimit_Reset="1470173023.123", X_RateLimit_Reset_After="1.2", X_RateLimit_Bucket="abcd1234")
    assert limits.limits == (ServiceLimit(0, 1.2),)
    alone = parse(now=1470173022.0, X_RateLimit_Remaining="0", X_RateLimit_Reset="1470173023.123")
    assert alone.limits[0].reset == pytest.approx(1.123)


def test_reddit_decimal_remaining_and_delta_reset():
    # Reddit's API: a decimal remaining count and a reset in seconds.
    assert parse(X_Ratelimit_Used="2", X_Ratelimit_Remaining="598.0", X_Ratelimit_Reset="423").limits == (
        ServiceLimit(598, 423.0),)


def test_delta_below_the_epoch_threshold_and_epoch_milliseconds():
    assert parse(X_RateLimit_Remaining="0", X_RateLimit_Reset="999999999").limits[0].reset == 999999999.0
    assert parse(X_RateLimit_Remaining="0", X_RateLimit_Reset="1372700873000").limits[0].reset == 73.0


def test_epoch_reset_against_the_date_header_when_the_clocks_disagree():
    # The server's clock is 100 s behind ours: its epoch reset is measured against its Date.
    server_now = 1372700873 - 10
    date = email.utils.formatdate(server_now, usegmt=True)
    limits = parse(now=server_now + 100.0, date=date, X_RateLimit_Remaining="0", X_RateLimit_Reset="1372700873")
    assert limits.limits[0].reset == 10.0
    # Negative control: a Date within a second of our clock leaves the local clock (finer than Date) in charge.
    limits = parse(now=server_now + 0.6, date=date, X_RateLimit_Remaining="0", X_RateLimit_Reset="1372700873")
    assert limits.limits[0].reset == pytest.approx(9.4)


def test_every_reset_from_the_epoch_threshold_on_is_an_epoch_time():
    """GitLab and Twitch send ``RateLimit-Reset`` as an epoch second, against the drafts (gitlab-org/gitlab#199738):
    read as delta seconds it held the host for POLITE_MAX_RETRY_AFTER (an hour) instead of the 73 s asked. The
    same rule for ``t`` and the draft -07 ``reset``; below the threshold each stays delta seconds (the control)."""
    gitlab = parse(RateLimit_Limit="600", RateLimit_Remaining="0", RateLimit_Reset="1372700873")
    assert gitlab.limits == (ServiceLimit(0, 73.0),) and not gitlab.malformed
    assert parse(RateLimit='"default";r=0;t=1372700873').limits[0].reset == 73.0
    assert parse(RateLimit="limit=100, remaining=0, reset=1372700873").limits[0].reset == 73.0
    assert parse(RateLimit_Remaining="0", RateLimit_Reset="999999999").limits[0].reset == 999999999.0
    assert parse(RateLimit='"default";r=0;t=30').limits[0].reset == 30.0
    end = NOW
    gitlab_429 = POLICY.after_response(None, status=429, end=end, retry_after=60.0, ratelimits=gitlab)
    assert gitlab_429.state.next_allowed - end == pytest.approx(74.0, abs=1.0)  # the reset (+ its 1 s), not an hour


def test_x_fields_sent_twice_are_two_limits_each_with_its_own_reset():
    """A gateway and the origin both send ``X-RateLimit-*`` (go-chi/httprate#30): the lines were joined by a comma
    and ignored as malformed, so a spent quota was not held. Each remaining count goes with its own reset: the
    gateway's spent 10 per minute holds the host a minute, not until the origin's hourly reset. One line each is
    the control; counts that do not pair up give the fewest remaining and the latest reset."""
    twice = parse(X_RateLimit_Limit=["60", "60"], X_RateLimit_Remaining=["0", "0"], X_RateLimit_Reset=["30", "30"])
    assert twice.limits == (ServiceLimit(0, 30.0), ServiceLimit(0, 30.0)) and not twice.malformed
    two = parse(X_RateLimit_Limit=["10", "5000"], X_RateLimit_Remaining=["0", "4999"],
                X_RateLimit_Reset=["60", str(int(NOW) + 3600)])
    assert two.limits == (ServiceLimit(0, 60.0), ServiceLimit(4999, 3600.0))
    held = POLICY.after_response(None, status=200, end=NOW, ratelimits=two)
    assert held.state.ratelimit_until - NOW == pytest.approx(61.0)  # the gateway's minute (and its 1 s resolution)
    assert parse(X_RateLimit_Remaining="5, 0", X_RateLimit_Reset="10, 30").limits == (
        ServiceLimit(5, 10.0), ServiceLimit(0, 30.0))
    assert parse(X_RateLimit_Remaining=["0", "3"], X_RateLimit_Reset="30").limits == (ServiceLimit(0, 30.0),)
    assert parse(X_RateLimit_Remaining="0", X_RateLimit_Reset_After=["1.5", "2.25"]).limits[0].reset == 2.25
    assert parse(X_RateLimit_Remaining="0", X_RateLimit_Reset="30").limits == (ServiceLimit(0, 30.0),)
    assert parse(X_RateLimit_Remaining="0, x").malformed == ("x-ratelimit-remaining",)
    assert parse(X_RateLimit_Remaining="1,000", X_RateLimit_Reset="30").malformed == ("x-ratelimit-remaining",)


# --------------------------------------------------------------------------------------------------
# Malformed fields: ignored (the drafts: "Malformed RateLimit header fields MUST be ignored") and named
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, value", [
    ("RateLimit-Policy", '"burst";q=abc;w=60'),
    ("RateLimit-Policy", '"burst";w=60'),
    ("RateLimit-Policy", '"burst";q=-1;w=60'),
    ("RateLimit-Policy", '"burst";q=10;w=0'),
    ("RateLimit-Policy", '"burst";q=1.5;w=60'),
    ("RateLimit-Policy", '("a" "b");q=1'),
    ("RateLimit-Policy", '"burst";q=10;qu=5'),
    ("RateLimit-Policy", ""),
    ("RateLimit-Policy", '"burst";q=100;w=60,'),
    ("RateLimit-Policy", "?1;q=5"),
    ("RateLimit", '"default";t=5'),
    ("RateLimit", '"default";r=1.5'),
    ("RateLimit", "r=0;t=5"),
    ("RateLimit", "remaining=0"),
    ("RateLimit", "limit=abc"),
    ("RateLimit", "12"),
    ("RateLimit-Limit", "unlimited"),
    ("RateLimit-Limit", "10;w=-1"),
    ("RateLimit-Remaining", "-1"),
    ("RateLimit-Remaining", "1, 2"),
    ("RateLimit-Reset", "soon"),
    ("X-RateLimit-Limit", "lots"),
    ("X-RateLimit-Remaining", "-1"),
    ("X-RateLimit-Remaining", "1e3"),
    ("X-RateLimit-Reset", "tomorrow"),
    ("X-RateLimit-Reset", "9" * 400),
    ("X-RateLimit-Reset-After", "-2"),
    ("RateLimit-Policy", b'"caf\xe9";q=1'),
    ("X-RateLimit-Reset", b"\xff"),
])
def test_a_malformed_field_is_ignored_and_named(name, value):
    limits = parse_rate_limits({name: [value], "RateLimit-Policy" if name != "RateLimit-Policy" else "X-RateLimit-Limit":
                                ['"ok";q=10;w=5' if name != "RateLimit-Policy" else "7"]}, now=NOW)
    assert limits.malformed == (name.lower(),)
    # The well-formed field beside it is still read.
    assert limits.policies and limits.policies[-1].quota in (10, 7)


def test_no_field_at_all_is_empty():
    limits = parse_rate_limits({"Content-Type": ["text/html"]}, now=NOW)
    assert limits == RateLimits() and not limits


# --------------------------------------------------------------------------------------------------
# The policy: q per w → interval ≥ w / q; remaining 0 → held until the reset; both capped; only slower
# --------------------------------------------------------------------------------------------------


def limits_of(*policies: QuotaPolicy, limits: tuple[ServiceLimit, ...] = ()) -> RateLimits:
    return RateLimits(policies=policies, limits=limits)


def test_the_interval_is_the_largest_w_over_q_of_the_policies():
    decision = POLICY.after_ratelimit(None, limits_of(QuotaPolicy(100, 60.0), QuotaPolicy(1000, 86400.0)), end=T0)
    assert decision.interval == 86.4 and decision.state.ratelimit_interval == 86.4 and decision.changed
    assert decision.hold is None and decision.state.next_allowed == 0.0


@pytest.mark.parametrize("policy", [
    QuotaPolicy(100, None), QuotaPolicy(0, 60.0), QuotaPolicy(100, 60.0, "content-bytes"),
    QuotaPolicy(5, 10.0, "concurrent-requests"),
])
def test_policies_that_give_no_interval(policy):
    decision = POLICY.after_ratelimit(None, limits_of(policy), end=T0)
    assert decision.interval is None and decision.state.ratelimit_interval == 0.0 and not decision.changed


def test_a_spent_quota_holds_the_host_until_its_reset():
    state = HostState(next_allowed=T0 + 1, updated=T0 - 1)
    decision = POLICY.after_ratelimit(state, limits_of(limits=(ServiceLimit(0, 12.0), ServiceLimit(0, 3.0),
                                                               ServiceLimit(5, 60.0))), end=T0)
    assert decision.hold == 12.0
    assert decision.state.next_allowed == T0 + 12.0 and decision.state.ratelimit_until == T0 + 12.0
    # Negative controls: quota left, or an exact reset of 0 (the quota is replenished at once), hold nothing.
    for limit in (ServiceLimit(1, 12.0), ServiceLimit(0, 0.0)):
        new = POLICY.after_ratelimit(state, limits_of(limits=(limit,)), end=T0).state
        assert (new.next_allowed, new.ratelimit_until) == (state.next_allowed, state.ratelimit_until)


def test_a_spent_quota_whose_reset_is_not_said_is_held_a_window_or_max_wait():
    """docs/spec.md §2, "Announced quotas": every spent quota has a due moment, none waits for an answer."""
    state = HostState(next_allowed=T0 + 1, updated=T0 - 1)
    windowed = POLICY.after_ratelimit(state, limits_of(QuotaPolicy(5, 4.0), limits=(ServiceLimit(0, None),)), end=T0)
    assert windowed.hold == 4.0 and windowed.state.quota_reset == T0 + 4.0 and windowed.state.quota_limit == 5
    bare = POLICY.after_ratelimit(state, limits_of(QuotaPolicy(5), limits=(ServiceLimit(0, None),)), end=T0)
    assert bare.hold == POLICY.max_wait and bare.state.ratelimit_until == T0 + POLICY.max_wait
    assert bare.state.quota_limit == 0  # a guess, not a reset: nothing is refilled there
    # Negative control: with units left, an unsaid reset holds nothing and is not known.
    left = POLICY.after_ratelimit(state, limits_of(QuotaPolicy(5, 4.0), limits=(ServiceLimit(2, None),)), end=T0)
    assert left.hold is None and left.state.quota_reset == 0.0 and left.state.next_allowed == T0 + 1


@pytest.mark.parametrize("fields, resolution", [
    pytest.param({"RateLimit-Policy": ['"d";q=5'], "RateLimit": ['"d";r=0;t=3']}, 1.0, id="IETF t"),
    pytest.param({"RateLimit-Remaining": ["0"], "RateLimit-Reset": ["3"]}, 1.0, id="RateLimit-Reset"),
    pytest.param({"RateLimit": ["limit=5, remaining=0, reset=3"]}, 1.0, id="draft -07 dictionary"),
    pytest.param({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": ["3"]}, 1.0, id="X- whole seconds"),
    pytest.param({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": ["3.000"]}, 0.001, id="X- three decimals"),
    pytest.param({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset-After": ["3.0"]}, 0.1, id="Reset-After"),
    pytest.param({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": [str(int(T0) + 3)]}, 1.0,
                 id="X- epoch seconds"),
    pytest.param({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": [str((int(T0) + 3) * 1000)]}, 0.001,
                 id="X- epoch milliseconds"),
])
def test_every_reset_is_read_with_its_resolution(fields, resolution):
    limit = parse_rate_limits(fields, now=float(int(T0))).limits[0]
    assert limit.reset == pytest.approx(3.0) and limit.resolution == pytest.approx(resolution)


def test_a_whole_second_reset_is_held_to_the_end_of_its_second():
    """A server that truncates 3.9 s to ``t=3`` is replenished up to 1 s after ``end + 3``: the hold ends at
    ``end + 4`` (docs/spec.md §2, "The reset's resolution"), and no later than its window unless ``t`` says more."""
    whole = parse_rate_limits({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": ["3"]}, now=T0)
    assert POLICY.after_ratelimit(None, whole, end=T0).state.next_allowed == T0 + 4.0
    exact = parse_rate_limits({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": ["3.000"]}, now=T0)
    assert POLICY.after_ratelimit(None, exact, end=T0).state.next_allowed == pytest.approx(T0 + 3.001)
    # t = 0 (less than a second left, truncated) still holds that second; a reset in the past is 0 s away.
    zero = parse_rate_limits({"RateLimit-Policy": ['"d";q=5'], "RateLimit": ['"d";r=0;t=0']}, now=T0)
    assert POLICY.after_ratelimit(None, zero, end=T0).hold == 1.0
    past = parse_rate_limits({"X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": [str(int(T0) - 60)]}, now=T0)
    assert POLICY.after_ratelimit(None, past, end=T0).hold == 1.0
    # The window bounds it: 5 per 4 s is replenished within 4 s (t = 4 holds 4 s, not 5) ...
    windowed = parse_rate_limits({"RateLimit-Policy": ['"d";q=5;w=4'], "RateLimit": ['"d";r=0;t=4']}, now=T0)
    assert POLICY.after_ratelimit(None, windowed, end=T0).hold == 4.0
    # ... unless the reset says more (a server may hold a client past its window).
    longer = parse_rate_limits({"RateLimit-Policy": ['"d";q=5;w=4'], "RateLimit": ['"d";r=0;t=30']}, now=T0)
    assert POLICY.after_ratelimit(None, longer, end=T0).hold == 30.0


def test_the_same_reset_said_again_keeps_its_earliest_bound():
    """Each response of one window bounds its reset (``end + t + 1`` when ``t`` is whole seconds); the bounds of
    one reset lie within 2 s of each other, and the earliest holds (docs/spec.md §2, "The reset's resolution")."""
    def say(state: HostState | None, end: float, remaining: int, t: int) -> HostState:
        fields = {"RateLimit-Policy": ['"d";q=5'], "RateLimit": [f'"d";r={remaining};t={t}']}
        serial = (state.booked if state is not None else 0) + 1
        return POLICY.after_ratelimit(replace(state or HostState(), booked=serial), parse_rate_limits(fields, now=end),
                                      end=end, serial=serial).state
    state = say(None, T0 + 0.2, 3, 3)            # the window ends at T0 + 3.5: bound T0 + 4.2
    state = say(state, T0 + 1.4, 2, 3)           # bound T0 + 5.4: the same reset, the earlier bound kept
    assert state.quota_reset == pytest.approx(T0 + 4.2)
    state = say(state, T0 + 3.2, 0, 1)           # spent: held until the earliest bound, not T0 + 5.2
    assert state.quota_reset == pytest.approx(T0 + 4.2) and state.next_allowed == pytest.approx(T0 + 4.2)
    # Negative controls: the next window (the quota went up, or its bound lies a window later) is its own.
    after = say(state, T0 + 4.3, 4, 4)
    assert after.quota_reset == pytest.approx(T0 + 9.3)
    far = say(say(None, T0, 3, 3), T0 + 0.5, 2, 10)
    assert far.quota_reset == pytest.approx(T0 + 11.5)


def test_a_hold_never_shortens_a_recorded_one():
    state = HostState(next_allowed=T0 + 100, ratelimit_until=T0 + 100, updated=T0)
    new = POLICY.after_ratelimit(state, limits_of(limits=(ServiceLimit(0, 5.0),)), end=T0).state
    assert new.next_allowed == T0 + 100 and new.ratelimit_until == T0 + 100


def test_interval_and_hold_are_capped_like_retry_after():
    policy = PacingPolicy(max_retry_after=60.0)
    decision = policy.after_ratelimit(None, limits_of(QuotaPolicy(1, 86400.0), limits=(ServiceLimit(0, 7200.0),)),
                                      end=T0)
    assert decision.clamped and decision.interval == 60.0 and decision.hold == 60.0
    assert decision.state.next_allowed == T0 + 60.0
    assert not POLICY.after_ratelimit(None, limits_of(QuotaPolicy(1, 59.0)), end=T0).clamped


def test_the_latest_announcement_replaces_the_recorded_interval():
    state = POLICY.after_ratelimit(None, limits_of(QuotaPolicy(10, 6.0)), end=T0).state
    assert state.ratelimit_interval == 0.6
    again = POLICY.after_ratelimit(state, limits_of(QuotaPolicy(10, 6.0)), end=T0 + 1)
    assert not again.changed and again.state == state  # the same announcement writes nothing new
    raised = POLICY.after_ratelimit(state, limits_of(QuotaPolicy(20, 6.0)), end=T0 + 2)
    assert raised.changed and raised.state.ratelimit_interval == 0.3
    silent = POLICY.after_ratelimit(raised.state, limits_of(limits=(ServiceLimit(3, 1.0),)), end=T0 + 3)
    assert silent.state.ratelimit_interval == 0.3  # a response without a policy leaves it


def test_a_quota_only_ever_slows_the_host_down():
    fast = HostState(ratelimit_interval=0.3)
    assert POLICY.effective_interval(fast) == 1.0  # below the 1 s host interval: the interval wins
    assert POLICY.effective_interval(HostState(ratelimit_interval=5.0)) == 5.0
    assert POLICY.effective_interval(HostState(ratelimit_interval=5.0, crawl_delay=7.0)) == 7.0
    assert POLICY.effective_interval(HostState(ratelimit_interval=5.0), override=6.0) == 6.0


def test_the_response_that_announces_a_quota_is_already_paced_by_it():
    limits = limits_of(QuotaPolicy(1, 5.0))
    decision = POLICY.after_response(None, status=200, end=T0, ratelimits=limits)
    assert decision.delay == 5.0 and decision.state.ratelimit_interval == 5.0
    assert decision.ratelimit is not None and decision.ratelimit.interval == 5.0
    # The booking uses it too: the next request books the host for 5 s.
    booking = POLICY.book(decision.state, {}, now=T0 + 5)
    assert booking.booked and booking.writes[""].next_allowed == T0 + 10.0


def test_a_429_with_a_spent_quota_waits_for_the_longer_of_both():
    limits = limits_of(limits=(ServiceLimit(0, 12.0),))
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=3.0, ratelimits=limits)
    assert decision.throttle and decision.delay == 12.0 and decision.state.consec == 1
    shorter = POLICY.after_response(None, status=429, end=T0, retry_after=30.0, ratelimits=limits)
    assert shorter.delay == 30.0


def test_a_spent_quota_defers_the_host_with_its_own_reason():
    held = POLICY.after_response(None, status=200, end=T0, ratelimits=limits_of(limits=(ServiceLimit(0, 2.0),)))
    verdict = POLICY.defer_verdict(held.state, T0 + 0.5)
    assert verdict is not None and verdict.reason == "ratelimit" and verdict.due == T0 + 2.0
    assert POLICY.defer_verdict(held.state, T0 + 2.0) is None  # reset reached
    # A throttle takes precedence; a merely polite host with the same wait does not defer.
    assert POLICY.defer_verdict(HostState(next_allowed=T0 + 2, consec=1, ratelimit_until=T0 + 2), T0).reason == \
        "throttled"
    assert POLICY.defer_verdict(HostState(next_allowed=T0 + 2), T0) is None


def test_a_quota_slower_than_max_wait_defers_like_a_long_crawl_delay():
    slow = HostState(next_allowed=T0 + 90, ratelimit_interval=90.0)
    assert POLICY.defer_verdict(slow, T0).reason == "ratelimit"
    assert POLICY.defer_verdict(HostState(next_allowed=T0 + 90, ratelimit_interval=90.0, crawl_delay=120.0),
                                T0).reason == "crawl_delay"
    assert POLICY.defer_verdict(HostState(next_allowed=T0 + 30, ratelimit_interval=30.0), T0) is None


def test_with_the_headers_off_nothing_announced_counts():
    off = PacingPolicy(ratelimit_headers=False)
    limits = limits_of(QuotaPolicy(1, 5.0), limits=(ServiceLimit(0, 12.0),))
    decision = off.after_response(None, status=200, end=T0, ratelimits=limits)
    assert decision.delay == 1.0 and decision.ratelimit is None and decision.state.ratelimit_interval == 0.0
    recorded = HostState(next_allowed=T0 + 12, ratelimit_interval=90.0, ratelimit_until=T0 + 12)
    assert off.effective_interval(recorded) == 1.0
    assert off.defer_verdict(recorded, T0) is None  # the hold's next_allowed still makes it wait in line
    assert POLICY.defer_verdict(recorded, T0).reason == "ratelimit"


def test_reset_keeps_the_announced_interval_and_forgets_the_hold():
    state = HostState(next_allowed=T0 + 50, consec=2, crawl_delay=3.0, ratelimit_interval=0.6,
                      ratelimit_until=T0 + 50, updated=T0)
    reset = PacingPolicy.reset(state, now=T0 + 1)
    assert (reset.crawl_delay, reset.ratelimit_interval, reset.ratelimit_until, reset.next_allowed) == (
        3.0, 0.6, 0.0, 0.0)


# --------------------------------------------------------------------------------------------------
# The pace table: the quota's columns, and an old file migrated with its rows
# --------------------------------------------------------------------------------------------------


def test_sqlite_migrates_a_version_1_file_keeping_its_rows_with_no_quota(tmp_path):
    path = tmp_path / "pace.sqlite3"
    row = write_version_1_file(path)  # the hosts table without the quota's columns
    store = SQLiteStore(str(path))
    try:
        old = store.get("a.example")
        assert old == row
        assert (old.ratelimit_interval, old.ratelimit_until) == (0.0, 0.0)
        quota = HostState(ratelimit_interval=0.6, ratelimit_until=T0 + 12, updated=T0)
        store.update("b.example", lambda state, now: (quota, None))
        assert store.get("b.example") == quota
        assert dict(store.items()) == {"a.example": old, "b.example": quota}
    finally:
        store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = [row[1] for row in db.execute("PRAGMA table_info(hosts)")]
        assert {"ratelimit_interval", "ratelimit_until"} <= set(columns)
    finally:
        db.close()
    reopened = SQLiteStore(str(path))  # migrated once: opening again changes nothing
    try:
        assert reopened.get("b.example") == quota
    finally:
        reopened.close()


V2_FILE = """
    CREATE TABLE hosts (host TEXT PRIMARY KEY, next_allowed REAL NOT NULL, consec INTEGER NOT NULL,
        crawl_delay REAL NOT NULL, ok_seen INTEGER NOT NULL, throttled_at REAL NOT NULL,
        updated REAL NOT NULL) WITHOUT ROWID;
    CREATE INDEX hosts_updated ON hosts (updated);
    CREATE TABLE events (id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, host TEXT NOT NULL,
        url TEXT, status INTEGER, delay REAL, due REAL, reason TEXT, retry_after REAL, steps INTEGER,
        address TEXT, started REAL, source TEXT NOT NULL);
    INSERT INTO hosts (host, next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated)
        VALUES ('a.example', 1800000005.5, 3, 2.5, 1, 1800000001.0, 1800000002.0);
    INSERT INTO events (at, kind, host, source) VALUES (1800000002.0, 'booking', 'a.example', 'here');
    PRAGMA user_version = 2;
"""


def test_sqlite_migrates_a_version_2_file_keeping_its_rows_and_events(tmp_path):
    path = tmp_path / "pace.sqlite3"
    db = sqlite3.connect(path)  # what version 2 wrote: the hosts table and the event log, no quota columns
    db.executescript(V2_FILE)
    db.close()
    store = SQLiteStore(str(path))
    try:
        assert store.get("a.example") == HostState(next_allowed=1800000005.5, consec=3, crawl_delay=2.5, ok_seen=True,
                                                   throttled_at=1800000001.0, updated=1800000002.0)
        assert [e.kind for e in store.events()] == ["booking"]
    finally:
        store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


def test_sqlite_migration_keeps_quota_columns_a_file_already_has(tmp_path):
    # A file whose numbering differed (its version 2 already had the quota's columns): the step that adds them
    # keeps them instead of failing to open the table.
    path = tmp_path / "pace.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V2_FILE.replace("updated REAL NOT NULL) WITHOUT ROWID",
                                     "updated REAL NOT NULL, ratelimit_interval REAL NOT NULL DEFAULT 0, "
                                     "ratelimit_until REAL NOT NULL DEFAULT 0) WITHOUT ROWID"))
    db.execute("UPDATE hosts SET ratelimit_interval = 0.6")
    db.commit()
    db.close()
    store = SQLiteStore(str(path))
    try:
        assert store.get("a.example").ratelimit_interval == 0.6
    finally:
        store.close()
