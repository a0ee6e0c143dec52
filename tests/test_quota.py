"""The quota booking (docs/spec.md §2, "Quota booking"), exactly, on an injected clock.

* what remains is counted from the response to the latest-booked request, less the requests booked after it
  (still in flight when it was answered); a response to an earlier request says nothing newer;
* every booking takes one; the last one holds the host until the reset, so the requests already handed out
  (and every other process's) wait or are deferred; nothing left books nothing before the reset;
* the reset replenishes the quota (less what was booked since the last counted response) and moves on by one
  window; the host's first answer comes before its second booking;
* the reset in every documented form (delta seconds, epoch seconds, epoch milliseconds, IETF ``t``) holds the
  host until exactly that moment;
* a simulated server enforcing a fixed-window quota, booked by several processes at once with random
  latencies (Hypothesis): never a request over the quota, every request sent. Negative control: the same
  simulation without the in-flight count (no serials) is refused.
"""

from __future__ import annotations

import email.utils
import heapq
import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_polite.policy import FIRST_ANSWER_POLL, FIRST_ANSWER_TIMEOUT, HostState, PacingPolicy
from scrapy_polite.policy.ratelimit import QuotaPolicy, RateLimits, ServiceLimit, parse_rate_limits

T0 = 1_800_000_000.0
#: A fast host interval (1 ms): only the quota slows the host down.
POLICY = PacingPolicy(host_interval=0.001, max_backoff=300.0)


def announce(remaining: int, reset: float | None, quota: int = 5, window: float | None = None) -> RateLimits:
    """X-RateLimit-* style: one unnamed policy (the limit) and its service limit."""
    return RateLimits(policies=(QuotaPolicy(quota, window),), limits=(ServiceLimit(remaining, reset),))


def book(state: HostState | None, now: float, policy: PacingPolicy = POLICY) -> tuple[bool, HostState, float]:
    b = policy.book(state, {}, now=now)
    new = b.writes.get("", b.host) if b.booked else b.host
    assert new is not None
    return b.booked, new, b.start


def answered(state: HostState, *, end: float, serial: int | None, limits: RateLimits,
             policy: PacingPolicy = POLICY) -> HostState:
    return policy.after_response(state, status=200, end=end, sent_at=end, serial=serial, ratelimits=limits).state


# --------------------------------------------------------------------------------------------------
# Counting what remains


def test_requests_booked_while_one_is_in_flight_count_against_what_its_response_announces():
    state = None
    ok, state, _ = book(state, T0)  # serial 1, the first request: the host's quota is not known yet
    assert ok and state.booked == 1
    # The first answer comes before a second booking, in any process.
    ok, _, start = book(state, T0 + 0.01)
    assert not ok and start == T0 + 0.01 + FIRST_ANSWER_POLL
    state = answered(state, end=T0 + 0.05, serial=1, limits=announce(4, 10.0))
    assert (state.quota_left, state.quota_reset, state.quota_limit) == (4, T0 + 10.05, 5)
    for serial in (2, 3, 4):  # three more booked, all in flight
        ok, state, _ = book(state, T0 + 0.1 * serial)
        assert ok and state.booked == serial
    assert state.quota_left == 1
    # The response to serial 2 says 3 remain: serials 3 and 4 were booked after it, so 1 is left.
    state = answered(state, end=T0 + 0.5, serial=2, limits=announce(3, 9.55))
    assert state.quota_left == 1
    # Negative control: the response read alone (serial unknown) would leave no more than already counted.
    alone = answered(replace(state, quota_left=5), end=T0 + 0.5, serial=None, limits=announce(3, 9.55))
    assert alone.quota_left == 3  # 3 is what it says; the serial is what subtracts the 2 in flight
    # A response to an earlier request (serial 1 again, late) says nothing newer: not counted, and what it says
    # is not read less the requests booked since (that would hold the host on old news).
    late = answered(state, end=T0 + 0.6, serial=1, limits=announce(1, 9.0))
    assert late.quota_left == 1 and late.ratelimit_until == 0.0
    # ... but a late 0 still holds, as any spent quota does.
    assert answered(state, end=T0 + 0.6, serial=1, limits=announce(0, 9.0)).ratelimit_until == T0 + 9.6


def test_taking_the_last_one_holds_the_host_until_the_reset_for_everyone():
    state = HostState(quota_left=1, quota_reset=T0 + 4, quota_limit=5, quota_serial=7, booked=7, updated=T0)
    ok, state, _ = book(state, T0 + 1)
    assert ok and state.quota_left == 0
    assert state.ratelimit_until == T0 + 4 and state.next_allowed == T0 + 4
    # Requests already handed out (any process) meet the hold: not booked, deferred for the quota.
    for now in (T0 + 1, T0 + 2.5, T0 + 3.999):
        ok, held, start = book(state, now)
        assert not ok and start == T0 + 4
        verdict = POLICY.defer_verdict(held, now)
        assert verdict is not None and verdict.reason == "ratelimit" and verdict.due == T0 + 4
    # Nothing left but no hold recorded (e.g. the last one counted by a response): still not booked.
    spent = replace(state, next_allowed=0.0, ratelimit_until=0.0)
    assert book(spent, T0 + 2)[0] is False
    # Negative control: one left books.
    assert book(replace(spent, quota_left=1), T0 + 2)[0] is True


def test_a_response_whose_in_flight_count_spends_the_quota_holds_the_host():
    state = HostState(quota_left=3, quota_reset=T0 + 4, quota_limit=5, quota_serial=1, booked=4, updated=T0)
    # Serial 2 answered "2 remain"; serials 3 and 4 were booked after it: nothing is left.
    held = answered(state, end=T0 + 1, serial=2, limits=announce(2, 3.0))
    assert held.quota_left == 0 and held.ratelimit_until == T0 + 4 and held.next_allowed == T0 + 4
    # Negative control: the same response to the latest booking leaves 2 and holds nothing.
    free = answered(state, end=T0 + 1, serial=4, limits=announce(2, 3.0))
    assert free.quota_left == 2 and free.ratelimit_until == 0.0


def test_the_reset_replenishes_the_quota_less_what_was_booked_since_and_moves_on_one_window():
    state = HostState(quota_left=0, quota_reset=T0 + 4, quota_limit=5, quota_window=4.0, quota_serial=10,
                      booked=11, ratelimit_until=T0 + 4, next_allowed=T0 + 4, updated=T0)
    assert book(state, T0 + 3.9)[0] is False
    ok, new, _ = book(state, T0 + 4.0)
    # 5, less serial 11 (booked after the last counted response: it may be in the new window), less this one.
    assert ok and new.quota_left == 3 and new.quota_reset == T0 + 8.0 and new.quota_serial == 11
    # Several windows later: the next reset is the first one after now.
    ok, later, _ = book(state, T0 + 13.0)
    assert ok and later.quota_reset == T0 + 16.0
    # Without a known window the next reset is not known; without a known quota the quota is unknown.
    no_window = book(replace(state, quota_window=0.0), T0 + 4.0)[1]
    assert (no_window.quota_left, no_window.quota_reset) == (3, 0.0)
    unknown = book(replace(state, quota_limit=0), T0 + 4.0)[1]
    assert unknown.quota_left == -1


def test_spent_with_its_reset_unknown_waits_for_an_answer_not_for_ever():
    """A refill without a window, then spent: the reset is not known (docs/spec.md §2, "Quota booking")."""
    state = HostState(quota_left=0, quota_reset=0.0, quota_limit=5, quota_serial=3, booked=8, updated=T0)
    # Requests booked since the last counted answer (4 to 8) are unanswered: one of them may say more.
    ok, _, start = book(state, T0)
    assert not ok and start == T0 + FIRST_ANSWER_POLL  # tries again, no hold recorded
    # A request booked since answers without a quota: the quota is unknown, the host books again.
    plain = POLICY.after_response(state, status=200, end=T0 + 1, serial=5).state
    assert plain.quota_left == -1 and book(plain, plain.next_allowed)[0]
    # Nothing answers at all: held FIRST_ANSWER_TIMEOUT after the row's last write at most (not max_wait).
    assert book(state, T0 + FIRST_ANSWER_TIMEOUT - 0.01)[0] is False and book(state, T0 + FIRST_ANSWER_TIMEOUT)[0]
    # Nothing unanswered: nothing can say more, the booking goes at once (the quota is unknown).
    assert book(replace(state, quota_serial=8), T0)[0] is True
    # Negative control: an answer to a request booked before the last counted one changes nothing.
    assert POLICY.after_response(state, status=200, end=T0 + 1, serial=2).state.quota_left == 0


def test_a_refill_that_leaves_nothing_holds_one_window_at_most():
    """As many requests unanswered at the reset as the quota (in flight, or never answered): the window after the
    reset may be theirs, so the host is held until the next reset, and not one window longer: they were booked
    before the reset (issue 30 finding 4: the row recorded no hold, so the refill was computed again from it at
    every try, and the host was held window after window, for ever)."""
    state = HostState(quota_left=0, quota_reset=T0 + 4, quota_limit=5, quota_window=4.0, quota_serial=10, booked=15,
                      ratelimit_until=T0 + 4, next_allowed=T0 + 4, updated=T0)
    ok, held, start = book(state, T0 + 4.0)
    assert not ok and start == T0 + 8.0
    verdict = POLICY.defer_verdict(held, T0 + 4.0)
    assert verdict is not None and verdict.reason == "ratelimit" and verdict.due == T0 + 8.0
    ok, new, _ = book(state, T0 + 8.0)  # the same row (a hold is never written): due, and booked
    assert ok and new.quota_left == 4 and new.quota_reset == T0 + 12.0
    # Negative control: fewer unanswered than the quota leave some at the reset.
    assert book(replace(state, quota_serial=11), T0 + 4.0)[0]  # 5, less 4 unanswered: one left, booked


def test_an_answer_without_a_quota_before_the_reset_is_not_counted_again_at_it():
    """An answer without rate-limit fields (or a failure) before the recorded reset: its request was counted in
    the window before it, not subtracted from the next (docs/spec.md §2, "Quota booking")."""
    state = HostState(quota_left=2, quota_reset=T0 + 4, quota_limit=5, quota_window=4.0, quota_serial=10, booked=13,
                      updated=T0)
    before = POLICY.after_response(state, status=200, end=T0 + 1, serial=13).state
    assert before.quota_serial == 13 and before.quota_left == 2
    assert book(before, T0 + 4.0)[1].quota_left == 4  # 5, less this booking
    # Negative controls: answered after the reset, it may have reached the server in the new window ...
    after = POLICY.after_response(state, status=200, end=T0 + 4.5, serial=13).state
    assert after.quota_serial == 10 and book(after, T0 + 4.6)[1].quota_left == 1  # 5 - 3 - this one
    # ... and an answer to a request booked before the last counted one says nothing.
    assert POLICY.after_response(state, status=200, end=T0 + 1, serial=9).state.quota_serial == 10


def test_the_first_answer_waits_at_most_its_timeout():
    state = HostState(booked=1, updated=T0, next_allowed=T0)
    assert book(state, T0 + FIRST_ANSWER_TIMEOUT - 0.01)[0] is False
    assert book(state, T0 + FIRST_ANSWER_TIMEOUT)[0] is True  # the first request never answered: the next goes
    short = PacingPolicy(host_interval=0.001, max_wait=2.0)  # and never longer than max_wait
    assert book(state, T0 + 1.99, short)[0] is False and book(state, T0 + 2.0, short)[0] is True
    # Rows that never counted a booking (written before the quota booking, or with the headers off) do not wait.
    assert book(HostState(updated=T0), T0 + 1)[0] is True
    off = PacingPolicy(host_interval=0.0, ratelimit_headers=False)
    assert book(state, T0 + 1, off)[0] is True


def test_with_the_headers_off_nothing_is_counted():
    off = PacingPolicy(host_interval=0.0, ratelimit_headers=False)
    state = HostState(quota_left=0, quota_reset=T0 + 4, quota_limit=5, quota_serial=1, booked=1, updated=T0)
    ok, new, _ = book(state, T0 + 1, off)
    assert ok and new.booked == 1 and new.quota_left == 0


def test_a_clamped_reset_is_not_refilled():
    policy = PacingPolicy(host_interval=0.0, max_retry_after=60.0)
    state = answered(HostState(booked=1), end=T0, serial=1, limits=announce(0, 7200.0), policy=policy)
    assert state.quota_reset == T0 + 60.0 and state.quota_limit == 0 and state.next_allowed == T0 + 60
    assert book(state, T0 + 60.0, policy)[1].quota_left == -1  # unknown after it: no burst of 5


def test_the_binding_limit_is_the_one_with_the_least_left():
    limits = RateLimits(policies=(QuotaPolicy(100, 60.0, name="burst"), QuotaPolicy(1000, 86400.0, name="day")),
                        limits=(ServiceLimit(50, 30.0, "burst"), ServiceLimit(3, 500.0, "day")))
    state = answered(HostState(booked=1), end=T0, serial=1, limits=limits)
    assert (state.quota_left, state.quota_reset, state.quota_limit, state.quota_window) == (3, T0 + 500, 1000,
                                                                                         86400.0)
    # A limit in other units than requests is not a count of requests (its 0 still holds the host).
    bytes_ = RateLimits(policies=(QuotaPolicy(10, 60.0, unit="content-bytes"),), limits=(ServiceLimit(0, 30.0),))
    spent = answered(HostState(booked=1), end=T0, serial=1, limits=bytes_)
    assert spent.quota_left == -1 and spent.ratelimit_until == T0 + 30


def test_reset_forgets_what_is_left_and_keeps_the_serials():
    state = HostState(quota_left=0, quota_reset=T0 + 4, quota_limit=5, quota_window=4.0, quota_serial=9, booked=12,
                      ratelimit_until=T0 + 4, next_allowed=T0 + 4)
    new = POLICY.reset(state, now=T0)
    assert (new.quota_left, new.quota_reset, new.ratelimit_until, new.next_allowed) == (-1, 0.0, 0.0, 0.0)
    assert (new.quota_limit, new.quota_window, new.quota_serial, new.booked) == (5, 4.0, 9, 12)


# --------------------------------------------------------------------------------------------------
# The reset in every documented form: the host is held until exactly that moment


NOW = 1_800_000_100.0
DATE = email.utils.formatdate(NOW, usegmt=True)


@pytest.mark.parametrize("fields", [
    pytest.param({"RateLimit-Policy": ['"default";q=5;w=4'], "RateLimit": ['"default";r=0;t=3']}, id="IETF t"),
    pytest.param({"RateLimit-Limit": ["5"], "RateLimit-Remaining": ["0"], "RateLimit-Reset": ["3"]},
                 id="draft delta seconds"),
    pytest.param({"X-RateLimit-Limit": ["5"], "X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": ["3"]},
                 id="X- delta seconds"),
    pytest.param({"X-RateLimit-Limit": ["5"], "X-RateLimit-Remaining": ["0"], "X-RateLimit-Reset": [str(NOW + 3)]},
                 id="X- epoch seconds"),
    pytest.param({"X-RateLimit-Limit": ["5"], "X-RateLimit-Remaining": ["0"],
                  "X-RateLimit-Reset": [str(int((NOW + 3) * 1000))]}, id="X- epoch milliseconds"),
])
def test_every_reset_form_holds_the_host_until_its_reset(fields):
    """``end + reset + resolution``: 1 s for whole seconds, 0.001 s for epoch milliseconds."""
    limits = parse_rate_limits({**fields, "Date": [DATE]}, now=NOW, date=DATE)
    end = T0  # the store's clock: the reset is a duration from the response
    state = answered(HostState(booked=1), end=end, serial=1, limits=limits)
    assert state.quota_left == 0 and state.quota_limit == 5
    # Until the end of the second (or millisecond) the reset is stated to: a server may have truncated it.
    by = end + 3.0 + limits.limits[0].resolution
    assert state.quota_reset == pytest.approx(by, abs=1e-6)
    assert state.ratelimit_until == state.next_allowed == state.quota_reset
    assert book(state, by - 0.001)[0] is False and book(state, by)[0] is True
    # Negative control: one remaining books at once, and holds after it.
    one = answered(HostState(booked=1), end=end, serial=1,
                   limits=replace(limits, limits=tuple(replace(lim, remaining=1) for lim in limits.limits)))
    ok, after, _ = book(one, end + 1.0)  # after the w / q of the IETF form (0.8 s)
    assert ok and after.next_allowed == pytest.approx(by, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# A simulated server enforcing a fixed-window quota, booked by several processes at once


@dataclass
class Server:
    """``quota`` requests per fixed window of ``window`` s (aligned on multiples of it); announces the quota in
    X-RateLimit-* style (remaining, reset rounded up to ``resolution`` seconds)."""

    quota: int
    window: float
    resolution: float
    refused: int = 0
    _start: float = -1.0
    _used: int = 0

    def arrive(self, at: float) -> RateLimits:
        start = math.floor(at / self.window + 1e-9) * self.window  # a reset met to the float's last bit is met
        if start != self._start:
            self._start, self._used = start, 0
        self._used += 1
        if self._used > self.quota:
            self.refused += 1
        reset = start + self.window - at
        reset = math.ceil(reset / self.resolution - 1e-9) * self.resolution
        return announce(max(self.quota - self._used, 0), reset, quota=self.quota)


def simulate(processes: int, pages: int, quota: int, window: float, uplink: float, downlinks: list[float],
             resolution: float, *, serials: bool = True, start: float = 0.0) -> tuple[Server, float]:
    """``processes`` crawlers, one request in flight each, book ``pages`` requests on one shared row. Requests
    reach the server ``uplink`` s after their booking (in booking order); responses take ``downlinks[i]``.
    ``serials=False``: each response is read as the answer to the latest booking (no in-flight count).
    The crawl starts at ``start`` s (its phase in the server's windows). Returns the server and the makespan (first arrival to last arrival, seconds)."""
    server = Server(quota, window, resolution)
    row: HostState | None = None
    now = 0.0
    events: list[tuple[float, int, str, int]] = [(start, p, "try", 0) for p in range(processes)]
    heapq.heapify(events)
    sent, done, first, last = 0, 0, None, 0.0
    answers: dict[int, tuple[float, RateLimits, int]] = {}
    n = 0
    while events:
        n += 1
        assert n < 100_000, "the simulation did not finish"
        now, proc, kind, ident = heapq.heappop(events)
        if kind == "try":
            if sent >= pages:
                continue
            b = POLICY.book(row, {}, now=now)
            if not b.booked:
                heapq.heappush(events, (max(b.start, now + 1e-3), proc, "try", 0))
                continue
            row = b.writes.get("", row)
            assert row is not None
            sent += 1
            arrival = now + uplink
            first = arrival if first is None else first
            last = max(last, arrival)
            limits = server.arrive(arrival)
            end = arrival + downlinks[sent % len(downlinks)]
            answers[sent] = (now, limits, row.booked)
            heapq.heappush(events, (end, proc, "answer", sent))
        else:
            sent_at, limits, serial = answers.pop(ident)
            # Without the in-flight count, every response reads as the answer to the latest booking.
            latest = row.booked if row is not None else serial
            row = POLICY.after_response(row, status=200, end=now, sent_at=sent_at,
                                        serial=serial if serials else latest, ratelimits=limits).state
            done += 1
            heapq.heappush(events, (now, proc, "try", 0))
    assert done == pages
    return server, last - (first or 0.0)


@given(processes=st.integers(1, 8), quota=st.integers(1, 6), window=st.sampled_from([1.0, 2.0, 4.0]),
       uplink=st.floats(0.0, 0.3), downlinks=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=8),
       resolution=st.sampled_from([0.001, 1.0]), offset=st.floats(0.0, 4.0))
def test_a_fixed_window_quota_is_never_exceeded_by_any_number_of_processes(processes, quota, window, uplink,
                                                                          downlinks, resolution, offset):
    server, makespan = simulate(processes, 24, quota, window, uplink, downlinks, resolution, start=offset)
    assert server.refused == 0
    # Never slower than one window per quota's worth of pages, plus the first partial window and a round trip
    # per window (the first answer of each).
    windows = math.ceil(24 / quota)
    assert makespan <= windows * window + windows * (uplink + max(downlinks)) + window


def test_negative_control_without_the_in_flight_count_the_quota_is_exceeded():
    refused = [simulate(8, 24, 5, 4.0, 0.05, [0.3, 0.1, 0.4], 0.001, serials=False)[0].refused,
               simulate(8, 24, 5, 4.0, 0.05, [0.3, 0.1, 0.4], 0.001, serials=True)[0].refused]
    assert refused[0] > 0 and refused[1] == 0, refused
