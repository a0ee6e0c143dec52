"""Tests of the booking rules of scrapy_polite.policy (docs/spec.md §2-§3), exactly, on an injected clock:
:meth:`PacingPolicy.book` (the reference's ``reserve`` over a host's addresses), :meth:`~PacingPolicy.finish_address`
(the reference's ``finish``), :meth:`~PacingPolicy.robots_delay_update`, :meth:`~PacingPolicy.defer_verdict`
and :func:`ip_key`.

Every expected value is written out by hand from the spec, never computed with the module under test, and
every rule has a negative control: a neighbouring input an over-broad implementation would get wrong. The
last part replays whole timelines with the pure functions and checks the reference's invariants
(``start₂ ≥ end₁ + POLITE_IP_INTERVAL`` on one address, ``start₂ ≥ end₁ + delay`` on one host).
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass, replace

import pytest

from scrapy_polite.policy import Booking, Deferral, HostState, PacingPolicy, ip_key
from scrapy_polite.policy.robots import (
    OPERATOR,
    ORIGINS_KEPT,
    RESTORED,
    entry_name,
    published_delays,
    with_operator_delay,
    with_origin_delay,
)

#: An arbitrary "now" (Unix epoch seconds); every clock here is injected. Multiples of 1/4 s added to it are
#: exact in binary floating point, so the timelines below compare exactly.
T0 = 1_800_000_000.0

POLICY = PacingPolicy()  # host_interval 1 s, max_backoff 300 s, max_wait 60 s

A, B, C = "192.0.2.1", "192.0.2.2", "192.0.2.3"


def row(next_allowed: float, **fields: object) -> HostState:
    """A row whose ``next_allowed`` is given (epoch s); other fields as given."""
    return HostState(next_allowed=next_allowed, **fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# book(): which address, when


def test_book_a_free_host_now_on_the_first_address():
    b = POLICY.book(None, {A: None, B: None}, now=T0, ip_interval=2.0)
    assert b == Booking(booked=True, host=HostState(next_allowed=T0 + 1.0, updated=T0, booked=1), start=T0,
                        host_free=T0, address=A, writes={"": HostState(next_allowed=T0 + 1.0, updated=T0, booked=1),
                                           A: HostState(next_allowed=T0 + 2.0, updated=T0)})
    assert b.interval == 1.0


def test_book_ties_go_to_the_first_address_of_the_mapping():
    # The caller passes the addresses sorted (lowest first); book keeps that order of preference.
    assert POLICY.book(None, {A: None, B: None, C: None}, now=T0, ip_interval=2.0).address == A
    # Negative control: the choice is the mapping's first, not the smallest string nor the last one.
    assert POLICY.book(None, {C: None, A: None, B: None}, now=T0, ip_interval=2.0).address == C
    # Ties among addresses free at the same future moment also go to the first.
    later = POLICY.book(None, {A: row(T0 + 3), B: row(T0 + 3)}, now=T0, ip_interval=2.0)
    assert (later.booked, later.address, later.start) == (False, A, T0 + 3)


def test_book_picks_the_address_free_first():
    addresses = {A: row(T0 + 3), B: row(T0 + 1), C: row(T0 + 2)}
    waiting = POLICY.book(None, addresses, now=T0, ip_interval=2.0)
    assert waiting == Booking(booked=False, host=None, start=T0 + 1, host_free=T0, address=B)
    # A hair before B is free: still nothing booked, nothing written.
    early = POLICY.book(None, addresses, now=T0 + 0.75, ip_interval=2.0)
    assert (early.booked, early.writes, early.address, early.start) == (False, {}, B, T0 + 1)
    # At the moment B is free: booked on B, and A and C are untouched.
    b = POLICY.book(None, addresses, now=T0 + 1, ip_interval=2.0)
    assert (b.booked, b.address, b.start) == (True, B, T0 + 1)
    assert set(b.writes) == {"", B}
    assert b.writes[B] == HostState(next_allowed=T0 + 3, updated=T0 + 1)


def test_book_free_moment_is_max_of_now_host_and_address():
    # The host is the bottleneck: every address is free before it, so all tie at the host's moment and the
    # first wins, even though B has the earlier address time.
    b = POLICY.book(row(T0 + 5), {A: row(T0 + 3), B: None}, now=T0, ip_interval=2.0)
    assert (b.booked, b.start, b.host_free, b.address) == (False, T0 + 5, T0 + 5, A)
    # The addresses are the bottleneck: start is the earliest address moment, later than the host's.
    b = POLICY.book(row(T0 + 2), {A: row(T0 + 4), B: row(T0 + 3)}, now=T0, ip_interval=2.0)
    assert (b.booked, b.start, b.host_free, b.address) == (False, T0 + 3, T0 + 2, B)
    # Both in the past: now.
    b = POLICY.book(row(T0 - 9), {A: row(T0 - 1)}, now=T0, ip_interval=2.0)
    assert (b.booked, b.start, b.host_free) == (True, T0, T0)


def test_book_exactly_at_the_free_moment_books():
    b = POLICY.book(row(T0), {A: row(T0)}, now=T0, ip_interval=2.0)
    assert b.booked and b.start == T0
    # Negative control: a microsecond before it books nothing.
    b = POLICY.book(row(T0), {A: row(T0)}, now=T0 - 1e-6, ip_interval=2.0)
    assert not b.booked and b.writes == {}


def test_book_nothing_when_not_free_returns_start_host_free_and_address():
    host = row(T0 + 1.5, consec=2, ok_seen=True)
    b = POLICY.book(host, {A: row(T0 + 0.5), B: None}, now=T0, ip_interval=2.0)
    assert b == Booking(booked=False, host=host, start=T0 + 1.5, host_free=T0 + 1.5, address=A)
    assert b.host is host  # the row as read, not a booked copy
    # Without addresses: start is the host's moment, no address.
    b = POLICY.book(host, {}, now=T0, ip_interval=2.0)
    assert b == Booking(booked=False, host=host, start=T0 + 1.5, host_free=T0 + 1.5, address=None)


def test_book_host_for_max_of_effective_interval_and_floor():
    # eff = max(host_interval, crawl_delay) = 3 s.
    host = row(T0 - 1, crawl_delay=3.0)
    assert POLICY.book(host, {}, now=T0).writes[""].next_allowed == T0 + 3
    # A floor (override) above eff wins ...
    assert POLICY.book(host, {}, now=T0, floor=5.0).writes[""].next_allowed == T0 + 5
    # ... and a floor below it never shortens it (negative control).
    assert POLICY.book(host, {}, now=T0, floor=0.5).writes[""].next_allowed == T0 + 3
    assert POLICY.book(None, {}, now=T0, floor=0.5).writes[""].next_allowed == T0 + 1


def test_book_keeps_the_rest_of_the_host_row():
    host = HostState(next_allowed=T0 - 10, consec=2, crawl_delay=0.0, ok_seen=True, throttled_at=T0 - 20,
                     updated=T0 - 10)
    b = POLICY.book(host, {}, now=T0)
    assert b.writes == {"": HostState(next_allowed=T0 + 1, consec=2, ok_seen=True, throttled_at=T0 - 20,
                                      updated=T0, booked=1)}  # booked: the serial of the quota booking
    assert b.host == b.writes[""]


def test_book_address_for_ip_interval_not_the_host_interval():
    # Deviation from the Rust reference (docs/spec.md §3): the host is booked for its own eff, the address
    # for POLITE_IP_INTERVAL.
    b = POLICY.book(None, {A: None}, now=T0, ip_interval=2.0)
    assert b.writes[""].next_allowed == T0 + 1 and b.writes[A].next_allowed == T0 + 2
    b = POLICY.book(None, {A: None}, now=T0, ip_interval=0.5)
    assert b.writes[""].next_allowed == T0 + 1 and b.writes[A].next_allowed == T0 + 0.5
    # The address row keeps its other fields.
    b = POLICY.book(None, {A: row(T0 - 3, consec=1)}, now=T0, ip_interval=2.0)
    assert b.writes[A] == HostState(next_allowed=T0 + 2, consec=1, updated=T0)


def test_book_zero_intervals_write_nothing():
    zero = PacingPolicy(host_interval=0.0)
    b = zero.book(None, {A: None}, now=T0, ip_interval=0.0)
    assert (b.booked, b.start, b.address, b.writes, b.host) == (True, T0, A, {}, None)
    # Negative controls: each non-zero interval writes exactly its own row.
    assert set(zero.book(None, {A: None}, now=T0, ip_interval=2.0).writes) == {A}
    assert set(POLICY.book(None, {A: None}, now=T0, ip_interval=0.0).writes) == {""}
    assert zero.book(None, {A: None}, now=T0, floor=0.25, ip_interval=0.0).writes == {
        "": HostState(next_allowed=T0 + 0.25, updated=T0, booked=1)}
    # A published Crawl-delay is an interval too.
    assert zero.book(row(0.0, crawl_delay=4.0), {}, now=T0).writes[""].next_allowed == T0 + 4


def test_book_ip_interval_zero_ignores_address_rows_for_writing_only():
    # The address rows still decide the moment (another process may have booked them) ...
    b = POLICY.book(None, {A: row(T0 + 1)}, now=T0, ip_interval=0.0)
    assert (b.booked, b.start) == (False, T0 + 1)
    # ... but a booking at interval 0 writes no address row.
    b = POLICY.book(None, {A: row(T0)}, now=T0, ip_interval=0.0)
    assert b.booked and set(b.writes) == {""}


# --------------------------------------------------------------------------------------------------
# finish_address(): the reference's finish


def test_finish_address_is_end_plus_ip_interval():
    assert PacingPolicy.finish_address(None, end=T0, ip_interval=2.0) == HostState(next_allowed=T0 + 2, updated=T0)
    # The booking's own hold (start + ip_interval) is pushed to end + ip_interval by a slow response.
    booked = HostState(next_allowed=T0 + 2, updated=T0)
    assert PacingPolicy.finish_address(booked, end=T0 + 5, ip_interval=2.0) == HostState(next_allowed=T0 + 7,
                                                                                          updated=T0 + 5)


def test_finish_address_never_shortens_a_hold():
    held = HostState(next_allowed=T0 + 10, consec=1, updated=T0)
    assert PacingPolicy.finish_address(held, end=T0 + 1, ip_interval=2.0) == replace(held, updated=T0 + 1)
    # Negative control: a hold shorter than end + ip_interval is raised to it.
    short = replace(held, next_allowed=T0 + 2.5)
    assert PacingPolicy.finish_address(short, end=T0 + 1, ip_interval=2.0).next_allowed == T0 + 3
    # ip_interval 0: the address is free at the end at the earliest.
    assert PacingPolicy.finish_address(None, end=T0, ip_interval=0.0).next_allowed == T0


# --------------------------------------------------------------------------------------------------
# robots_delay_update(): a robots.txt delay and its booking


def test_robots_no_delay_on_an_unknown_host_changes_nothing():
    assert POLICY.robots_delay_update(None, None, now=T0) is None
    assert POLICY.robots_delay_update(None, 0, now=T0) is None
    # Negative control: a delay on an unknown host is recorded.
    assert POLICY.robots_delay_update(None, 10, now=T0) == HostState(next_allowed=T0 + 10, crawl_delay=10.0,
                                                                     updated=T0)


def test_robots_same_delay_changes_nothing():
    state = HostState(next_allowed=T0 - 5, crawl_delay=5.0, updated=T0 - 100)
    assert POLICY.robots_delay_update(state, 5, now=T0) is None
    assert POLICY.robots_delay_update(state, 5.0, now=T0) is None
    # Negative control: a different delay is a change.
    assert POLICY.robots_delay_update(state, 6, now=T0) == HostState(next_allowed=T0 + 6, crawl_delay=6.0,
                                                                     updated=T0)


def test_robots_delay_holds_the_host_at_least_delay_after_now():
    state = HostState(next_allowed=T0 - 5, consec=0, ok_seen=True, updated=T0 - 5)
    new = POLICY.robots_delay_update(state, 2, now=T0)
    assert new == HostState(next_allowed=T0 + 2, crawl_delay=2.0, ok_seen=True, updated=T0)
    assert isinstance(new.crawl_delay, float)
    # A longer hold already recorded (a backoff) is kept, and so is the backoff itself.
    throttled = HostState(next_allowed=T0 + 100, consec=3, throttled_at=T0 - 1, updated=T0 - 1)
    assert POLICY.robots_delay_update(throttled, 2, now=T0) == replace(throttled, crawl_delay=2.0, updated=T0)


def test_robots_zero_or_none_clears_a_delay():
    state = HostState(next_allowed=T0 + 1, crawl_delay=5.0, updated=T0 - 4)
    for cleared in (0, 0.0, None):
        assert POLICY.robots_delay_update(state, cleared, now=T0) == HostState(next_allowed=T0 + 1, updated=T0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_robots_delay_refuses_what_is_not_seconds(bad):
    with pytest.raises(ValueError):
        POLICY.robots_delay_update(None, bad, now=T0)
    with pytest.raises(ValueError):
        POLICY.robots_delay_update(HostState(crawl_delay=1.0), bad, now=T0)


def test_robots_delay_of_an_origin_lowers_only_what_that_origin_published():
    """The row keeps each origin's delay and the largest is in force (docs/spec.md §2, "A host's origins"), so the
    origins of one host (other ports, http beside https) never clear each other's. Negative control: without an
    origin, a robots.txt without a delay clears the row's."""
    a, b = "https://h.example ua", "http://h.example:8080 ua"
    one = POLICY.robots_delay_update(None, 3, now=T0, entry=a)
    assert one.crawl_delay == 3.0 and published_delays(one.origin_delays) == {a: 3.0}
    assert POLICY.robots_delay_update(one, None, now=T0 + 1, entry=b) is None  # b had none, and has none
    assert POLICY.robots_delay_update(one, 3, now=T0 + 1, entry=a) is None  # the same again writes nothing
    three = POLICY.robots_delay_update(one, 5, now=T0 + 1, entry=b)
    assert three.crawl_delay == 5.0 and three.next_allowed == T0 + 6
    four = POLICY.robots_delay_update(three, 0, now=T0 + 2, entry=b)
    assert four.crawl_delay == 3.0 and published_delays(four.origin_delays) == {a: 3.0}
    five = POLICY.robots_delay_update(four, 1, now=T0 + 3, entry=a)
    assert five.crawl_delay == 1.0 and five.origin_delays == json.dumps({a: 1.0})
    assert POLICY.robots_delay_update(five, 0, now=T0 + 4, entry=a).crawl_delay == 0.0
    assert POLICY.robots_delay_update(four, None, now=T0 + 4).crawl_delay == 0.0  # the control


def test_each_user_agent_keeps_its_own_entry_and_the_largest_is_in_force():
    """Crawls of different user agents on one table read different groups of one robots.txt: each keeps its own
    entry, so the other's read does not lower it (both share the host's pace: the largest holds)."""
    slow, other = entry_name("http://h.example", "slowbot/1.0"), entry_name("http://h.example", "otherbot/1.0")
    state = POLICY.robots_delay_update(None, 4, now=T0, entry=slow)
    state = POLICY.robots_delay_update(state, 1, now=T0 + 1, entry=other)
    assert state.crawl_delay == 4.0
    # Negative control: the same user agent's read replaces its own entry.
    assert POLICY.robots_delay_update(state, 1, now=T0 + 2, entry=slow).crawl_delay == 1.0


def test_an_operator_s_delay_holds_until_a_robots_txt_changes_and_the_origins_entries_then_count_again():
    """The operator's delay is in force, whatever the origins publish, until a robots.txt of the host publishes
    another delay than its entry held; the origins' entries are kept under it, so that read falls back to the
    largest of them (not to the one origin read). A robots.txt read again unchanged (a fleet's worker started
    later: trial G, where it ended the operator's delay after 4.8 s) leaves it in force. It holds the host from the
    command on, as a robots.txt delay does. Removed (``--clear``), the origins' largest holds at once."""
    a, b = "https://h.example ua", "http://h.example:8080 ua"
    state = POLICY.robots_delay_update(None, 3, now=T0, entry=a)
    by_hand = PacingPolicy.with_crawl_delay(state, 10, now=T0 + 1)
    assert by_hand.crawl_delay == 10.0 and by_hand.next_allowed == T0 + 11
    assert published_delays(by_hand.origin_delays) == {a: 3.0, OPERATOR: 10.0}
    # Read again as recorded (a's 3 s; b's none, where none was): the operator's stays, and nothing is written.
    assert POLICY.robots_delay_update(by_hand, 3, now=T0 + 2, entry=a) is None
    assert POLICY.robots_delay_update(by_hand, 0, now=T0 + 2, entry=b) is None
    # Read for the first time (another origin, another user agent: review): recorded, the operator's stays.
    first = POLICY.robots_delay_update(by_hand, 1, now=T0 + 2, entry=b)
    assert first.crawl_delay == 10.0 and published_delays(first.origin_delays) == {a: 3.0, b: 1.0, OPERATOR: 10.0}
    assert POLICY.robots_delay_update(by_hand, 3, now=T0 + 2, entry="https://h.example otherbot").crawl_delay == 10
    # Negative controls: a read that changes a recorded delay ends it, whichever origin and whichever way.
    again = POLICY.robots_delay_update(first, 2, now=T0 + 3, entry=b)
    assert again.crawl_delay == 3.0 and published_delays(again.origin_delays) == {a: 3.0, b: 2.0}
    cleared = POLICY.robots_delay_update(by_hand, 0, now=T0 + 2, entry=a)
    assert cleared.crawl_delay == 0.0 and published_delays(cleared.origin_delays) == {}
    raised = POLICY.robots_delay_update(by_hand, 20, now=T0 + 2, entry=a)
    assert raised.crawl_delay == 20.0 and published_delays(raised.origin_delays) == {a: 20.0}
    lowered = PacingPolicy.with_crawl_delay(state, 0, now=T0 + 1)
    assert lowered.crawl_delay == 0.0 and lowered.next_allowed == state.next_allowed  # never earlier
    assert POLICY.robots_delay_update(lowered, 0, now=T0 + 2, entry=b) is None
    assert POLICY.robots_delay_update(lowered, 4, now=T0 + 2, entry=a).crawl_delay == 4.0
    # Set before any crawl read the host: the first read records its entry, the operator's stays (review).
    early = PacingPolicy.with_crawl_delay(None, 5, now=T0)
    assert POLICY.robots_delay_update(early, 0.3, now=T0 + 1, entry=a).crawl_delay == 5.0
    removed = PacingPolicy.with_crawl_delay(by_hand, None, now=T0 + 2)
    assert removed.crawl_delay == 3.0 and published_delays(removed.origin_delays) == {a: 3.0}
    assert removed.next_allowed == by_hand.next_allowed  # (the hold stays: reset forgets it)
    assert PacingPolicy.with_crawl_delay(None, None, now=T0).crawl_delay == 0.0  # the control: nothing published
    # The reset keeps the host's own numbers, its origins' delays among them.
    assert PacingPolicy.reset(by_hand, now=T0 + 5).origin_delays == by_hand.origin_delays


def test_origin_delays_keep_the_largest_of_a_bounded_number_of_entries_and_read_a_bad_value_as_none():
    text = ""
    for port in range(ORIGINS_KEPT + 10):
        text, in_force = with_origin_delay(text, f"http://h.example:{port} ua", 1.0 + port)
    delays = published_delays(text)
    assert len(delays) == ORIGINS_KEPT and in_force == ORIGINS_KEPT + 10.0
    assert min(delays.values()) == 11.0  # the smallest were dropped, never the largest
    by_hand, _ = with_operator_delay(text, 0.5)  # the operator's is kept, however small (it is the one in force)
    assert published_delays(by_hand)[OPERATOR] == 0.5 and len(published_delays(by_hand)) == ORIGINS_KEPT
    for bad in ("{", "[1, 2]", "[" * 100_000, '{"a": "x", "b": -1, "c": NaN, "d": true, "e": Infinity, "f": [1], '
                '"g": 0, "h": 1' + "0" * 400 + "}"):
        assert published_delays(bad) == {}
        assert with_origin_delay(bad, "https://h ua", 2.0) == (json.dumps({"https://h ua": 2.0}), 2.0)


def test_entries_another_writer_left_behind_are_dropped():
    """A row whose ``crawl_delay`` its entries did not make was written by a writer that set the delay without them
    (an earlier version's process or ``crawl-delay``): its entries are stale, so a robots.txt without a delay does
    not bring back the 5 s the site withdrew. Negative control: a row whose entries agree keeps them."""
    stale = HostState(crawl_delay=0.0, origin_delays=json.dumps({"https://h.example ua": 5.0}), updated=T0)
    new = POLICY.robots_delay_update(stale, 0, now=T0 + 1, entry="http://h.example:8080 ua")
    assert new is not None and new.crawl_delay == 0.0 and new.origin_delays == ""
    agreed = replace(stale, crawl_delay=5.0)
    assert POLICY.robots_delay_update(agreed, 0, now=T0 + 1, entry="http://h.example:8080 ua") is None
    assert POLICY.robots_delay_update(agreed, 1, now=T0 + 1, entry="http://h.example:8080 ua").crawl_delay == 5.0


@pytest.mark.parametrize("operator_side", ["current", "known"])
def test_a_restored_row_keeps_each_entry_s_larger_delay_and_stays_current(operator_side):
    """A row written back into a table that came back empty: each entry's larger delay, the larger delay in force;
    should an operator's delay on one side not make it (a review's sequence: https publishes 10 s, the operator
    sets 5 s, one process knew the row before the command), the larger holds until the next read, which falls
    back to the origins' largest (10 s), not to nothing."""
    https, http = "https://h ua", "http://h ua"
    published = POLICY.robots_delay_update(None, 10, now=T0, entry=https)
    by_hand = PacingPolicy.with_crawl_delay(published, 5, now=T0 + 1)
    current, known = (by_hand, published) if operator_side == "current" else (published, by_hand)
    merged = POLICY.restore(current, known)
    assert merged.crawl_delay == 10.0
    after = POLICY.robots_delay_update(merged, 0, now=T0 + 2, entry=http)
    assert (after or merged).crawl_delay == 10.0
    # A restored delay the entries do not make is no operator's: the next read, even unchanged, ends it (review).
    older = HostState(crawl_delay=5.0)  # an earlier version's row: a delay without entries
    restored = POLICY.restore(POLICY.robots_delay_update(None, 2, now=T0, entry=https), older)
    assert restored.crawl_delay == 5.0 and published_delays(restored.origin_delays) == {https: 2.0, RESTORED: 5.0}
    assert POLICY.robots_delay_update(restored, 2, now=T0 + 1, entry=https).crawl_delay == 2.0
    rows = (HostState(crawl_delay=3.0, origin_delays=json.dumps({http: 1.0, https: 3.0})),
            HostState(crawl_delay=4.0, origin_delays=json.dumps({http: 4.0, "http://h:81 ua": 2.0})))
    merged = POLICY.restore(*rows)
    assert merged.crawl_delay == 4.0
    assert published_delays(merged.origin_delays) == {http: 4.0, https: 3.0, "http://h:81 ua": 2.0}


# --------------------------------------------------------------------------------------------------
# defer_verdict(): leave the downloader, with reason and due time


def test_verdict_no_state_is_never_deferred():
    assert POLICY.defer_verdict(None, T0) is None
    assert POLICY.defer_verdict(None, T0, override=1000.0) is None
    # Negative control: a row saying the same thing defers.
    assert POLICY.defer_verdict(row(T0 + 5, consec=1), T0) == Deferral(reason="throttled", due=T0 + 5)


def test_verdict_due_host_is_never_deferred():
    for state in (row(T0, consec=3), row(T0 - 1, crawl_delay=600.0), row(T0, consec=1, crawl_delay=600.0)):
        assert POLICY.defer_verdict(state, T0) is None
    # Negative control: a microsecond later than now defers.
    assert POLICY.defer_verdict(row(T0 + 1e-6, consec=3), T0) == Deferral("throttled", T0 + 1e-6)


def test_verdict_throttled_host_defers_until_next_allowed():
    assert POLICY.defer_verdict(row(T0 + 0.5, consec=1), T0) == Deferral(reason="throttled", due=T0 + 0.5)
    # Takes precedence over a long published delay (the host refused us).
    assert POLICY.defer_verdict(row(T0 + 200, consec=2, crawl_delay=120.0), T0) == Deferral("throttled", T0 + 200)
    assert POLICY.defer_verdict(row(T0 + 200, consec=1), T0, override=120.0) == Deferral("throttled", T0 + 200)


def test_verdict_long_crawl_delay_defers_strictly_above_max_wait():
    assert POLICY.defer_verdict(row(T0 + 90, crawl_delay=90.0), T0) == Deferral(reason="crawl_delay", due=T0 + 90)
    assert POLICY.defer_verdict(row(T0 + 60, crawl_delay=60.000001), T0) == Deferral("crawl_delay", T0 + 60)
    # Negative control: equal to max_wait (60 s) waits in line.
    assert POLICY.defer_verdict(row(T0 + 60, crawl_delay=60.0), T0) is None


def test_verdict_override_counts_as_a_published_delay():
    state = row(T0 + 61)
    assert POLICY.defer_verdict(state, T0, override=61.0) == Deferral("crawl_delay", T0 + 61)
    assert POLICY.defer_verdict(state, T0, override=60.0) is None
    assert POLICY.defer_verdict(state, T0, override=None) is None
    assert POLICY.defer_verdict(state, T0, override=0.0) is None


def test_verdict_a_polite_host_with_the_same_wait_is_not_deferred():
    # The discriminator is why we wait, never how long.
    assert POLICY.defer_verdict(row(T0 + 30, consec=1), T0) == Deferral("throttled", T0 + 30)
    assert POLICY.defer_verdict(row(T0 + 30, consec=0), T0) is None
    # Even a wait longer than max_wait, booked by another process, is waited out in line.
    assert POLICY.defer_verdict(row(T0 + 100, consec=0, crawl_delay=2.0), T0) is None


# --------------------------------------------------------------------------------------------------
# ip_key(): one row per reachable IPv4 address, canonical IPv6


@pytest.mark.parametrize("address", [
    "192.0.2.1",
    "::ffff:192.0.2.1", "::ffff:c000:201", "::FFFF:192.0.2.1",  # IPv4-mapped
    "64:ff9b::192.0.2.1", "64:ff9b::c000:201",                  # NAT64 (RFC 6052 well-known prefix)
    "2002:c000:201::1", "2002:c000:0201:abcd::5",               # 6to4 (RFC 3056)
])
def test_ip_key_embedded_ipv4_shares_the_ipv4_row(address):
    assert ip_key(address) == "ip:192.0.2.1"


@pytest.mark.parametrize("address, key", [
    ("::192.0.2.1", "ip:::c000:201"),                    # IPv4-compatible: deprecated, not a path to IPv4
    ("64:ff9b:1::c000:201", "ip:64:ff9b:1::c000:201"),   # local-use NAT64 prefix: not the well-known /96
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "ip:2001:0:4136:e378:8000:63bf:3fff:fdd2"),  # Teredo
    ("2002:c000:202::1", "ip:192.0.2.2"),                # 6to4 of another IPv4 address: that one's row
])
def test_ip_key_other_ipv6_forms_do_not_share_it(address, key):
    assert ip_key(address) == key


def test_ip_key_is_canonical_ipv6():
    for spelling in ("2001:DB8:0:0::1", "2001:0db8::0001", "2001:db8:0:0:0:0:0:1"):
        assert ip_key(spelling) == "ip:2001:db8::1"
    assert ip_key("2001:db8::2") != ip_key("2001:db8::1")


@pytest.mark.parametrize("bad", ["a.example", "", "ip:192.0.2.1", "300.1.1.1", "192.0.2.1:80",
                                 "010.0.0.1"])
def test_ip_key_refuses_what_is_not_an_address(bad):
    with pytest.raises(ValueError):
        ip_key(bad)


# --------------------------------------------------------------------------------------------------
# Timelines: the reference's invariants, replayed with the pure functions


@dataclass
class Sent:
    """One simulated request: its host, the address key it was booked on, start and end (epoch s) and the
    delay the policy chose after its response (s)."""

    host: str
    key: str | None
    start: float
    end: float
    delay: float = 0.0


def simulate(policy: PacingPolicy, hosts: dict[str, list[str]], requests: list[tuple[str, float, int]], *,
             ip_interval: float, finish: bool = True) -> list[Sent]:
    """Replay ``requests`` (host, duration s, status), in order of arrival, on one process at ``T0``.

    As the pacer does: at most one request per host and one per address key in flight (the lines); a
    request is booked with :meth:`PacingPolicy.book` over the addresses of its host not in flight; at its
    end the host's row gets :meth:`~PacingPolicy.after_response` and (``finish``) the address's row
    :meth:`~PacingPolicy.finish_address`. Time jumps from event to event (ends and booked moments).
    """
    table: dict[str, HostState] = {}
    pending = list(requests)
    flying: list[tuple[Sent, int]] = []
    done: list[Sent] = []
    now = T0
    for _ in range(10_000):
        if not pending and not flying:
            return done
        wakes: list[float] = []
        for req in list(pending):
            host, duration, status = req
            busy_keys = {s.key for s, _ in flying}
            if any(s.host == host for s, _ in flying):
                continue
            free = [a for a in hosts[host] if ip_key(a) not in busy_keys]
            if hosts[host] and not free:
                continue
            booking = policy.book(table.get(host), {a: table.get(ip_key(a)) for a in free}, now=now,
                                  ip_interval=ip_interval)
            if not booking.booked:
                wakes.append(booking.start)
                continue
            for name, state in booking.writes.items():
                table[host if name == "" else ip_key(name)] = state
            key = ip_key(booking.address) if booking.address is not None else None
            flying.append((Sent(host, key, now, now + duration), status))
            pending.remove(req)
        now = min([s.end for s, _ in flying] + wakes)
        for sent, status in [f for f in flying if f[0].end == now]:
            flying.remove((sent, status))
            decision = policy.after_response(table.get(sent.host), status=status, end=now, sent_at=sent.start)
            table[sent.host] = decision.state
            sent.delay = decision.delay
            if finish and sent.key is not None:
                table[sent.key] = policy.finish_address(table.get(sent.key), end=now, ip_interval=ip_interval)
            done.append(sent)
    raise AssertionError("the simulation did not finish")


def ip_violations(timeline: list[Sent], ip_interval: float) -> list[tuple[Sent, Sent]]:
    """Pairs of consecutive requests on one address key with ``start₂ < end₁ + ip_interval``."""
    by_key: dict[str, list[Sent]] = defaultdict(list)
    for s in timeline:
        if s.key is not None:
            by_key[s.key].append(s)
    bad = []
    for sents in by_key.values():
        sents.sort(key=lambda s: s.start)
        bad += [(a, b) for a, b in zip(sents, sents[1:]) if b.start < a.end + ip_interval]
    return bad


def host_violations(timeline: list[Sent]) -> list[tuple[Sent, Sent]]:
    """Pairs of consecutive requests to one host with ``start₂ < end₁ + delay₁``."""
    by_host: dict[str, list[Sent]] = defaultdict(list)
    for s in timeline:
        by_host[s.host].append(s)
    bad = []
    for sents in by_host.values():
        sents.sort(key=lambda s: s.start)
        bad += [(a, b) for a, b in zip(sents, sents[1:]) if b.start < a.end + a.delay]
    return bad


#: Hosts sharing addresses; "e" reaches 192.0.2.1 through its IPv4-mapped form, so it shares A's budget.
HOSTS = {
    "a": [A], "b": [A, B], "c": [B], "d": [A, B, C], "e": ["::ffff:192.0.2.1"], "f": ["2001:db8::1"],
}


def workload(seed: int, n: int = 120) -> list[tuple[str, float, int]]:
    rng = random.Random(seed)
    return [(rng.choice(sorted(HOSTS)), rng.choice([0.0, 0.25, 0.5, 1.0, 2.5, 3.0]),
             rng.choice([200] * 8 + [429, 503]))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ip_interval", [2.0, 0.5])
def test_timeline_one_address_start2_after_end1_plus_ip_interval(seed, ip_interval):
    timeline = simulate(POLICY, HOSTS, workload(seed), ip_interval=ip_interval)
    assert len(timeline) == 120
    assert ip_violations(timeline, ip_interval) == []
    assert host_violations(timeline) == []
    # The mapped address shares the IPv4 row: requests of "a" and "e" are on one key.
    assert {s.key for s in timeline if s.host in ("a", "e")} == {"ip:192.0.2.1"}


@pytest.mark.parametrize("seed", range(3))
def test_timeline_without_finish_breaks_the_ip_invariant(seed):
    # Negative control: booking alone holds an address for ip_interval from the *start*; a response slower
    # than that lets the next request in too soon. The finish step is what keeps the invariant.
    timeline = simulate(POLICY, HOSTS, workload(seed), ip_interval=2.0, finish=False)
    assert ip_violations(timeline, 2.0) != []


def test_timeline_checks_can_fail():
    # The checkers themselves find a made-up violation.
    a1 = Sent("a", "ip:192.0.2.1", T0, T0 + 1, delay=1.0)
    a2 = Sent("a", "ip:192.0.2.1", T0 + 2.5, T0 + 3)
    assert ip_violations([a1, a2], 2.0) == [(a1, a2)]
    assert ip_violations([a1, a2], 1.5) == []
    assert host_violations([a1, replace(a2, start=T0 + 1.75)]) == [(a1, replace(a2, start=T0 + 1.75))]
    assert host_violations([a1, a2]) == []


def test_timeline_one_address_serialises_hosts_exactly():
    # Three hosts on one address, 1 s responses: each starts ip_interval (2 s) after the previous ended.
    hosts = {"a": [A], "b": [A], "c": [A]}
    timeline = simulate(POLICY, hosts, [("a", 1.0, 200), ("b", 1.0, 200), ("c", 1.0, 200)], ip_interval=2.0)
    assert [(s.host, s.start - T0, s.end - T0) for s in timeline] == [("a", 0, 1), ("b", 3, 4), ("c", 6, 7)]
    # Negative control: on three addresses they all go at once.
    hosts = {"a": [A], "b": [B], "c": [C]}
    timeline = simulate(POLICY, hosts, [("a", 1.0, 200), ("b", 1.0, 200), ("c", 1.0, 200)], ip_interval=2.0)
    assert [s.start - T0 for s in timeline] == [0, 0, 0]


def test_timeline_a_host_with_two_addresses_uses_the_free_one():
    # "b" has A and B; A is busy with "a", so "b" goes at once on B.
    hosts = {"a": [A], "b": [A, B]}
    timeline = simulate(POLICY, hosts, [("a", 3.0, 200), ("b", 0.5, 200)], ip_interval=2.0)
    assert [(s.host, s.key, s.start - T0) for s in timeline] == [("b", "ip:192.0.2.2", 0), ("a", "ip:192.0.2.1", 0)]
