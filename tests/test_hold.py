"""The in-flight hold of docs/spec.md §3 ("In flight"), exactly, on an injected clock: a booking holds its host's
and address's rows until its outcome releases them, for the request's download timeout plus the row's interval at
most; a record releases only its own hold. Then a Hypothesis state machine of several processes sharing one row:
whatever they book, answer, drop or die, two requests are never in flight on one host at once unless the earlier
one's process died and its bound has passed, and no request starts within one interval of a recorded end.

Every expected value is written out by hand; each rule has a negative control.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from scrapy_polite.policy import HOLD_POLL, HostState, PacingPolicy

T0 = 1_800_000_000.0
POLICY = PacingPolicy()  # host_interval 1 s
A = "192.0.2.1"


def test_a_booking_holds_its_rows_for_the_timeout_plus_the_interval():
    b = POLICY.book(None, {A: None}, now=T0, ip_interval=2.0, hold=(7, 30.0))
    assert b.booked and b.writes[""].held_by == 7 and b.writes[""].held_until == T0 + 31.0
    assert b.writes[A].held_by == 7 and b.writes[A].held_until == T0 + 32.0
    # The interval's booking is unchanged by the hold.
    assert (b.writes[""].next_allowed, b.writes[A].next_allowed) == (T0 + 1.0, T0 + 2.0)
    # Negative control: without a hold, nothing is held.
    plain = POLICY.book(None, {A: None}, now=T0, ip_interval=2.0)
    assert plain.writes[""].held_by == 0 and plain.writes[A].held_until == 0.0


def test_a_held_host_is_not_booked_before_its_release_however_long_the_request_takes():
    held = POLICY.book(None, {}, now=T0, hold=(7, 30.0)).writes[""]
    later = POLICY.book(held, {}, now=T0 + 5.0, hold=(8, 30.0))  # 5 s on: the interval has long passed
    assert not later.booked and later.held and later.start == T0 + 31.0
    assert later.poll == 1.0  # asks again one interval later
    assert later.writes == {}
    # Released by its own record (an answer at T0 + 6): the next booking is due one interval after that end.
    answered = POLICY.after_response(held, status=200, end=T0 + 6.0).state
    released = POLICY.release_hold(answered, 7)
    assert released is not None and released.held_by == 0 and released.held_until == 0.0
    assert not POLICY.book(released, {}, now=T0 + 6.5).booked  # within the interval of the end
    assert POLICY.book(released, {}, now=T0 + 7.0).booked
    # Negative control: an unreleased row stays held until its bound, then frees by itself.
    assert not POLICY.book(answered, {}, now=T0 + 30.9).booked
    assert POLICY.book(answered, {}, now=T0 + 31.0).booked


def test_a_record_releases_only_its_own_hold():
    held = POLICY.book(None, {}, now=T0, hold=(8, 30.0)).writes[""]
    assert POLICY.release_hold(held, 7) is None  # another booking's token: nothing to write
    assert POLICY.release_hold(held, None) is None
    assert POLICY.release_hold(held, 8) is not None
    # An address's finish releases its own hold only, and still keeps the address's interval.
    address = POLICY.book(None, {A: None}, now=T0, ip_interval=2.0, hold=(8, 30.0)).writes[A]
    other = PacingPolicy.finish_address(address, end=T0 + 3.0, ip_interval=2.0, hold=7)
    assert other.held_by == 8 and other.next_allowed == T0 + 5.0
    own = PacingPolicy.finish_address(address, end=T0 + 3.0, ip_interval=2.0, hold=8)
    assert own.held_by == 0 and own.held_until == 0.0 and own.next_allowed == T0 + 5.0


def test_an_end_without_an_answer_releases_with_the_interval_from_the_end():
    held = POLICY.book(None, {}, now=T0, hold=(8, 30.0)).writes[""]
    released = POLICY.release_hold(held, 8, end=T0 + 4.0, interval=1.0)
    assert released is not None and released.next_allowed == T0 + 5.0 and released.updated == T0 + 4.0
    assert released.held_by == 0
    # Negative control: a later moment already booked is never brought forward.
    far = replace(held, next_allowed=T0 + 60.0)
    assert POLICY.release_hold(far, 8, end=T0 + 4.0, interval=1.0).next_allowed == T0 + 60.0  # type: ignore[union-attr]


def test_an_address_held_by_another_request_is_skipped_for_a_free_one():
    a_held = POLICY.book(None, {A: None}, now=T0, ip_interval=2.0, hold=(7, 30.0)).writes[A]
    b = POLICY.book(None, {A: a_held, "192.0.2.2": None}, now=T0 + 3.0, ip_interval=2.0, hold=(8, 30.0))
    assert b.booked and b.address == "192.0.2.2"
    only = POLICY.book(None, {A: a_held}, now=T0 + 3.0, ip_interval=2.0, hold=(8, 30.0))
    assert not only.booked and only.held and only.poll == 2.0 and only.start == T0 + 32.0


def test_the_poll_is_at_least_a_floor_and_at_most_the_wait_cap():
    zero = PacingPolicy(host_interval=0.0)
    held = HostState(next_allowed=T0, held_until=T0 + 10.0, held_by=3)
    assert zero.book(held, {}, now=T0, floor=0.0).poll == HOLD_POLL
    slow = PacingPolicy(max_wait=5.0)
    assert slow.book(replace(held, crawl_delay=30.0), {}, now=T0).poll == 5.0


def test_a_reset_keeps_the_hold_of_a_request_still_in_flight():
    held = POLICY.book(HostState(consec=3), {}, now=T0, hold=(8, 30.0)).writes[""]
    reset = PacingPolicy.reset(held, now=T0 + 1.0)
    assert reset.consec == 0 and (reset.held_by, reset.held_until) == (8, T0 + 31.0)


def test_the_switch_off_is_a_negative_control_only():
    policy = PacingPolicy(ratelimit_headers=False)  # no quota's first answer to wait for: the hold alone
    held = policy.book(None, {}, now=T0, hold=(7, 30.0)).writes[""]
    try:
        PacingPolicy.in_flight_hold = False  # type: ignore[misc]
        assert policy.book(held, {}, now=T0 + 1.0).booked  # the old rule: one interval from the start
        assert policy.book(None, {}, now=T0, hold=(7, 30.0)).writes[""].held_by == 0
    finally:
        PacingPolicy.in_flight_hold = True  # type: ignore[misc]
    assert not policy.book(held, {}, now=T0 + 1.0).booked


class FleetOnOneRow(RuleBasedStateMachine):
    """Processes share one host's row (a store of one row, the injected clock). Each books when it may, its
    request is answered, dropped (an end without an answer) or its process dies (nothing is ever recorded).

    Invariants, checked at every booking: no live request is in flight on the host; a dead process's request
    keeps the host until its bound (download timeout + interval from its booking); and no booking comes within
    one interval of a recorded end."""

    TIMEOUT = 5.0

    @initialize()
    def start(self) -> None:
        self.now = T0
        self.row: HostState | None = None
        self.token = 0
        #: token → (booked at, alive)
        self.flight: dict[int, tuple[float, bool]] = {}
        self.last_end = float("-inf")

    @rule(seconds=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5, 6.0]))
    def advance(self, seconds: float) -> None:
        # A live request lasts at most its download timeout: Scrapy then fails it, and that failure is recorded.
        target = self.now + seconds
        for token, (at, alive) in sorted(self.flight.items(), key=lambda item: item[1][0]):
            if alive and at + self.TIMEOUT <= target:
                self.now = max(self.now, at + self.TIMEOUT)
                self._answer(token, None)
        self.now = target

    @rule()
    def book(self) -> None:
        self.token += 1
        booking = POLICY.book(self.row, {}, now=self.now, hold=(self.token, self.TIMEOUT))
        if not booking.booked:
            assert booking.start > self.now
            if booking.held:  # a hold keeps it out: some request is in flight, or a dead one's bound is ahead
                assert any(alive or at + self.TIMEOUT + 1.0 > self.now for at, alive in self.flight.values())
            return
        for at, alive in self.flight.values():
            assert not alive, "booked while another process's request was in flight"
            assert self.now >= at + self.TIMEOUT + 1.0, "booked before a dead process's bound"
        assert self.now >= self.last_end + 1.0, "booked within one interval of a recorded end"
        self.row = booking.writes[""]
        self.flight = {t: v for t, v in self.flight.items() if v[1]}  # the dead ones' bounds have passed
        self.flight[self.token] = (self.now, True)

    def _live(self) -> list[int]:
        return [t for t, (_, alive) in self.flight.items() if alive]

    @rule(status=st.sampled_from([200, 429, 503, None]), data=st.data())
    def answer(self, status: int | None, data: st.DataObject) -> None:
        live = self._live()
        if not live:
            return
        self._answer(data.draw(st.sampled_from(live)), status)

    def _answer(self, token: int, status: int | None) -> None:
        decision = POLICY.after_response(self.row, status=status, end=self.now, sent_at=self.flight[token][0])
        self.row = POLICY.release_hold(decision.state, token) or decision.state
        del self.flight[token]
        self.last_end = self.now

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        live = self._live()
        if not live:
            return
        token = data.draw(st.sampled_from(live))
        self.row = POLICY.release_hold(self.row, token, end=self.now, interval=1.0) or self.row
        del self.flight[token]
        self.last_end = self.now

    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        live = self._live()
        if not live:
            return
        token = data.draw(st.sampled_from(live))
        self.flight[token] = (self.flight[token][0], False)

    @invariant()
    def at_most_one_live_request(self) -> None:
        if hasattr(self, "flight"):
            assert len(self._live()) <= 1


TestFleetOnOneRow = FleetOnOneRow.TestCase


def test_negative_control_the_machine_finds_the_overlap_without_the_hold():
    try:
        PacingPolicy.in_flight_hold = False  # type: ignore[misc]
        with pytest.raises(AssertionError, match="in flight|bound"):
            run_state_machine_as_test(FleetOnOneRow, settings=settings(
                max_examples=300, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
                phases=[Phase.generate]))
    finally:
        PacingPolicy.in_flight_hold = True  # type: ignore[misc]


def test_the_booking_transaction_reads_and_writes_the_host_and_address_rows_by_their_keys():
    """``booking_update``: the keys read (the host, then each address's ``ip:`` row, in order), the policy given the
    address rows under their addresses, and the writes filed back under the table's keys; ``_hold_of`` the hold
    taken on each, with the interval its release keeps free."""
    from scrapy_polite.crawl.booking import _hold_of, booking_update
    from scrapy_polite.policy import ip_key

    b2 = "192.0.2.2"
    keys, fn = booking_update(POLICY, "example.com", [A, b2], 0.0, 2.0, hold=(7, 30.0))
    assert keys == ["example.com", ip_key(A), ip_key(b2)]
    busy = HostState(next_allowed=T0 + 5.0)  # the first address is booked ahead: the second is free first
    writes, (booking, now) = fn({"example.com": None, ip_key(A): busy, ip_key(b2): None}, T0)
    assert now == T0 and booking.booked and booking.address == b2
    assert sorted(writes) == sorted(["example.com", ip_key(b2)])
    assert writes["example.com"].held_by == 7 and writes[ip_key(b2)].next_allowed == T0 + 2.0
    hold = _hold_of(booking, "example.com", 7, 2.0)
    assert hold is not None and hold.keys == {"example.com": 1.0, ip_key(b2): 2.0}
    # Negative controls: another token holds nothing; by host only, the host's row alone is read and written.
    assert _hold_of(booking, "example.com", 8, 2.0) is None
    keys, fn = booking_update(POLICY, "example.com", [], 0.0, 0.0, hold=(9, 30.0))
    writes, (booking, _) = fn({"example.com": None}, T0)
    assert keys == ["example.com"] and list(writes) == ["example.com"] and booking.address is None


@pytest.mark.parametrize(("value", "expected"), [
    (180.0, 180.0), (0.5, 0.5), (7, 7.0), ("30", 30.0),  # a float as it is; what parse_seconds reads
    (0.0, None), (-1.0, None), (float("nan"), None), (float("inf"), None), ("soon", None), (None, None)])
def test_a_download_timeout_bounds_the_hold_only_when_it_is_seconds_over_zero(value, expected):
    from scrapy_polite.crawl.booking import _timeout

    assert _timeout(value) == expected
