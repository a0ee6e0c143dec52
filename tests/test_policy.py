"""Tests of scrapy_polite.policy: the pacing rules of docs/spec.md §1–2.

The first half is the reference gate (docs/spec.md §2, "The gate, in seconds") vector by vector, with its
negative controls, translated from milliseconds with a 1000 ms base to seconds with a 1.0 s base. Every
expected value is written out by hand from the gate or from docs/spec.md §2, never computed with the module under
test. Then one test per **Deviation** of docs/spec.md, the in-flight rule, ``host_key`` and the policy's own validation.
"""

from __future__ import annotations

import calendar
import dataclasses
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_polite import policy as policy_module
from scrapy_polite.policy import NEVER_SEEN, Deferral, HostState, PacingPolicy, host_key, parse_retry_after
from scrapy_polite.stores import SQLiteStore

#: The reference defaults, in seconds: base 1 s, backoff cap 300 s, wait cap 60 s.
BASE = 1.0
MAX_BACKOFF = 300.0
MAX_WAIT = 60.0

#: An arbitrary "now" (Unix epoch seconds); every clock in these tests is injected.
T0 = 1_800_000_000.0

POLICY = PacingPolicy()


def test_defaults_are_the_reference_values():
    assert POLICY.host_interval == BASE
    assert POLICY.max_backoff == MAX_BACKOFF
    assert POLICY.max_wait == MAX_WAIT
    assert POLICY.max_retry_after == 3600.0
    assert POLICY.throttle_statuses == frozenset({429, 503})


# --------------------------------------------------------------------------------------------------
# The gate's pure vectors: pace_delay_after / pace_delay_after2(base, crawl_delay, consec, status,
# retry_after, ok_seen) -> (delay, consec').
# --------------------------------------------------------------------------------------------------

GATE_VECTORS = [
    # id, consec, status, retry_after, crawl_delay, ok_seen, want_delay, want_consec, want_throttle
    pytest.param(0, 200, None, 0.0, False, 1.0, 0, False, id="200 success -> base, consec 0"),
    pytest.param(0, 429, None, 0.0, False, 1.0, 1, True, id="429 consec0 -> base*1, consec 1"),
    pytest.param(1, 429, None, 0.0, False, 2.0, 2, True, id="429 consec1 -> base*2"),
    pytest.param(3, 429, None, 0.0, False, 8.0, 4, True, id="429 consec3 -> base*8"),
    pytest.param(0, 429, 120.0, 0.0, False, 120.0, 1, True, id="429 Retry-After 120 -> 120 s"),
    # SPEC §2 "No dead steps": the delay is the gate's (capped 300 s), and no step is added past the cap.
    pytest.param(20, 429, None, 0.0, False, 300.0, 20, True, id="429 consec20 -> capped 300 s, no step past the cap"),
    pytest.param(0, 503, None, 0.0, False, 1.0, 1, True, id="503 also throttles: consec0 -> base*1"),
    pytest.param(0, 200, None, 5.0, False, 5.0, 0, False, id="crawl_delay 5 s on success"),
    pytest.param(0, 429, None, 5.0, False, 5.0, 1, True, id="crawl_delay 5 s on 429"),
    # R12: a 403 is a throttle only from a host that already served a 2xx.
    pytest.param(0, 403, None, 0.0, False, 1.0, 0, False, id="403 with no prior 2xx -> not throttled, consec stays 0"),
    pytest.param(0, 403, None, 0.0, True, 1.0, 1, True, id="403 after a 2xx -> throttled base*1, consec 1"),
    pytest.param(2, 403, None, 0.0, True, 4.0, 3, True, id="403 after a 2xx, consec2 -> base*4"),
    pytest.param(0, 403, 30.0, 0.0, True, 30.0, 1, True, id="403 after a 2xx honours Retry-After 30"),
    # Regression control: ok_seen does not perturb the rules that already existed.
    pytest.param(1, 429, None, 0.0, True, 2.0, 2, True, id="429 unchanged with ok_seen"),
    pytest.param(1, 429, None, 0.0, False, 2.0, 2, True, id="429 unchanged without ok_seen"),
    # R9 decay: a success takes one halving off the backoff, it does not erase it.
    pytest.param(5, 200, None, 0.0, True, 16.0, 4, False, id="R9 200 after 5 throttles -> consec 4, base*16"),
    pytest.param(1, 200, None, 0.0, False, 1.0, 0, False, id="R9 200 after 1 throttle -> base, consec 0"),
    pytest.param(0, 200, None, 0.0, True, 1.0, 0, False, id="R9 never-throttled host: 200 -> base"),
    pytest.param(3, 200, None, 0.0, True, 4.0, 2, False, id="R9 decay step 3 -> 2"),
    pytest.param(20, 200, None, 0.0, True, 300.0, 19, False, id="R9 decay caps: consec 20 -> 19, still 300 s"),
]


@pytest.mark.parametrize(
    "consec, status, retry_after, crawl_delay, ok_seen, want_delay, want_consec, want_throttle", GATE_VECTORS)
def test_gate_vector(consec, status, retry_after, crawl_delay, ok_seen, want_delay, want_consec, want_throttle):
    state = HostState(consec=consec, crawl_delay=crawl_delay, ok_seen=ok_seen)
    decision = POLICY.after_response(state, status=status, end=T0, retry_after=retry_after)
    assert decision.delay == pytest.approx(want_delay)
    assert decision.state.consec == want_consec
    assert decision.throttle is want_throttle
    assert decision.state.next_allowed == pytest.approx(T0 + want_delay)
    assert decision.state.crawl_delay == crawl_delay  # the host's number is never rewritten by a response


def test_unknown_host_200_is_base_and_consec_0():
    decision = POLICY.after_response(None, status=200, end=T0)
    assert decision.delay == BASE
    assert decision.state.consec == 0
    assert decision.state.next_allowed == T0 + BASE


def test_unknown_host_429_steps_to_consec_1():
    decision = POLICY.after_response(None, status=429, end=T0)
    assert (decision.delay, decision.state.consec, decision.counted) == (BASE, 1, True)


def test_403_from_a_never_seen_host_equals_the_ok_seen_false_form():
    # The gate's "legacy 6-arg 403 == ok_seen=0 form": no state at all means "never served us".
    a = POLICY.after_response(None, status=403, end=T0)
    b = POLICY.after_response(HostState(ok_seen=False), status=403, end=T0)
    assert (a.delay, a.state.consec, a.throttle) == (b.delay, b.state.consec, b.throttle) == (BASE, 0, False)
    # ...and that equality is not two defaults agreeing: the ok_seen form differs.
    c = POLICY.after_response(HostState(ok_seen=True), status=403, end=T0)
    assert (c.state.consec, c.throttle) == (1, True)


def test_a_403_that_refuses_its_page_is_no_throttle():
    """``forbidden`` (the page was answered 403 before, the host served a 2xx since): a refusal of the page, which
    takes a step off as a success does, never a throttle's step (docs/spec.md §2). Controls: the same 403 without the
    flag is a throttle; a 429 with the flag is still one (the flag speaks of 403s only)."""
    state = HostState(ok_seen=True, consec=2, next_allowed=T0)
    refused = POLICY.after_response(state, status=403, end=T0, forbidden=True)
    assert (refused.throttle, refused.state.consec) == (False, 1)
    throttled = POLICY.after_response(state, status=403, end=T0)
    assert (throttled.throttle, throttled.state.consec) == (True, 3)
    still = POLICY.after_response(state, status=429, end=T0, forbidden=True)
    assert still.throttle and still.state.consec == 3


def test_download_failure_counts_as_a_throttle_without_retry_after():
    # docs/spec.md §2: a failure that reached the server's side (timeout, refused, reset) is passed as status None.
    decision = POLICY.after_response(HostState(consec=2), status=None, end=T0)
    assert (decision.throttle, decision.state.consec, decision.delay) == (True, 3, 4.0)
    assert decision.state.ok_seen is False


# --------------------------------------------------------------------------------------------------
# Wait clamp: pace_wait_ms(now, next_allowed)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("now, next_allowed, want", [
    pytest.param(1.0, 3.0, 2.0, id="now 1, next 3 -> 2 s"),
    pytest.param(5.0, 3.0, 0.0, id="past -> 0"),
    pytest.param(0.0, 999_999.999, MAX_WAIT, id="huge -> capped 60 s"),
    pytest.param(3.0, 3.0, 0.0, id="exactly due -> 0"),
])
def test_wait_clamp(now, next_allowed, want):
    assert POLICY.wait(HostState(next_allowed=next_allowed), now) == pytest.approx(want)


def test_wait_for_unknown_host_is_zero():
    assert POLICY.wait(None, T0) == 0.0


# --------------------------------------------------------------------------------------------------
# The gate's Retry-After header vectors (the full matrix is in test_retry_after.py)
# --------------------------------------------------------------------------------------------------


def test_gate_parse_retry_after_42():
    assert parse_retry_after("42", now=T0) == 42.0


def test_gate_no_retry_after_is_none():
    assert parse_retry_after(None, now=T0) is None


# --------------------------------------------------------------------------------------------------
# The gate's persisted sequences, replayed against real stores
# --------------------------------------------------------------------------------------------------


def _apply(store, host, status, *, end=T0, retry_after=None, sent_at=None):
    def fn(state, now):
        decision = POLICY.after_response(state, status=status, end=end, retry_after=retry_after, sent_at=sent_at)
        return decision.state, decision

    return store.update(host, fn)


def test_persisted_crawl_delay_round_trip(store):
    store.update("gate.example.test", lambda s, now: (PacingPolicy.with_crawl_delay(s, 7.0, now=T0), None))
    assert store.get("gate.example.test").crawl_delay == 7.0


def test_reset_then_429_persists_consec_1_whatever_the_history(store):
    # The gate's self-isolation: a reset is the precondition, so the 429 lands on exactly 1 on every run.
    host = "gate.example.test"
    store.update(host, lambda s, now: (HostState(consec=7, crawl_delay=2.0, next_allowed=T0 + 500), None))
    store.update(host, lambda s, now: (PacingPolicy.reset(s, now=T0), None))
    _apply(store, host, 429, end=T0 + 1)
    state = store.get(host)
    assert state.consec == 1
    assert state.next_allowed > 0  # next-allowed got stamped
    assert state.next_allowed == pytest.approx(T0 + 1 + 2.0)  # max(base, the kept crawl_delay 2 s)


def test_persisted_2xx_then_403_is_a_throttle(store):
    host = "r12.example.test"
    _apply(store, host, 200, end=T0)
    assert store.get(host).ok_seen is True  # a 2xx sets the persisted ok_seen bit
    decision = _apply(store, host, 403, end=T0 + 2)
    assert decision.throttle is True
    assert store.get(host).consec == 1  # the following 403 IS counted as a throttle


def test_persisted_lone_403_is_not_a_throttle(store):
    # Negative control on a host that never served us.
    host = "r12neg.example.test"
    decision = _apply(store, host, 403, end=T0)
    assert decision.throttle is False
    state = store.get(host)
    assert state.consec == 0
    assert state.ok_seen is False


def test_ok_seen_is_set_only_after_the_decision():
    # The very first 2xx sets ok_seen but is judged without it; its 403 successor then has history.
    first = POLICY.after_response(None, status=200, end=T0)
    assert first.throttle is False and first.state.ok_seen is True
    second = POLICY.after_response(first.state, status=403, end=T0 + 1)
    assert second.throttle is True and second.state.consec == 1
    # A lone 403 never sets ok_seen, so a second 403 is still a refusal, not a throttle.
    lone = POLICY.after_response(None, status=403, end=T0)
    again = POLICY.after_response(lone.state, status=403, end=T0 + 1)
    assert lone.state.ok_seen is False and again.throttle is False and again.state.consec == 0


@pytest.mark.parametrize("status", [199, 300, 301, 304, 404, 500])
def test_ok_seen_is_only_set_by_2xx(status):
    assert POLICY.after_response(None, status=status, end=T0).state.ok_seen is False


@pytest.mark.parametrize("status", [200, 204, 299])
def test_ok_seen_is_set_by_every_2xx(status):
    assert POLICY.after_response(None, status=status, end=T0).state.ok_seen is True


# --------------------------------------------------------------------------------------------------
# Reset
# --------------------------------------------------------------------------------------------------


def test_reset_keeps_crawl_delay_and_forgets_the_rest():
    state = HostState(next_allowed=T0 + 300, consec=5, crawl_delay=12.5, ok_seen=True, throttled_at=T0, updated=T0)
    reset = PacingPolicy.reset(state, now=T0 + 1)
    assert reset.crawl_delay == 12.5
    assert reset.next_allowed == 0.0
    assert reset.consec == 0
    assert reset.ok_seen is False
    # After a reset a 403 is a refusal again (ok_seen forgotten), and the host does not defer.
    assert POLICY.after_response(reset, status=403, end=T0 + 2).throttle is False
    assert (POLICY.defer_verdict(reset, T0 + 1) is not None) is False


def test_reset_of_unknown_host_is_a_blank_row():
    reset = PacingPolicy.reset(None, now=T0)
    assert (reset.next_allowed, reset.consec, reset.crawl_delay, reset.ok_seen) == (0.0, 0, 0.0, False)


# --------------------------------------------------------------------------------------------------
# R13: the deferral predicate. Fixture A is throttled; fixture B is merely polite (Crawl-delay exactly
# max_wait) with the SAME outstanding wait. Preconditions are asserted before the outcome, as the gate does.
# --------------------------------------------------------------------------------------------------

R13_BACKOFF = MAX_BACKOFF  # Retry-After 300 s: the longest backoff, so it cannot elapse mid-test
R13_POLITE_CRAWL_DELAY = MAX_WAIT  # exactly at the cap: sleeping still honours it
R13_LONG_WAIT = MAX_WAIT * 2  # written into next_allowed by hand, independent of the published delay


def _throttled_fixture(now):
    """Fixture A: reset, then a 429 with Retry-After 300 s."""
    state = PacingPolicy.reset(None, now=now)
    return POLICY.after_response(state, status=429, end=now, retry_after=R13_BACKOFF).state


def _polite_fixture(now, crawl_delay=R13_POLITE_CRAWL_DELAY):
    """Fixture B: never throttled, publishing a Crawl-delay, with a long wait manufactured explicitly."""
    state = PacingPolicy.with_crawl_delay(PacingPolicy.reset(None, now=now), crawl_delay, now=now)
    state = POLICY.after_response(state, status=200, end=now).state
    return replace(state, next_allowed=now + R13_LONG_WAIT)


def test_r13_fixtures_reach_their_preconditions():
    throttled, polite = _throttled_fixture(T0), _polite_fixture(T0)
    # Both have a large wait outstanding, and both clamp to the SAME 60 s: indistinguishable by duration.
    assert POLICY.wait(throttled, T0) == MAX_WAIT
    assert POLICY.wait(polite, T0) == MAX_WAIT
    assert throttled.consec == 1
    assert polite.consec == 0  # a published Crawl-delay is not a throttle
    assert polite.crawl_delay == POLICY.max_wait


def test_r13_throttled_host_defers():
    assert (POLICY.defer_verdict(_throttled_fixture(T0), T0) is not None) is True


def test_r13_polite_host_with_the_same_wait_does_not_defer():
    polite = _polite_fixture(T0)
    assert POLICY.wait(polite, T0) == POLICY.wait(_throttled_fixture(T0), T0)  # precondition
    assert (POLICY.defer_verdict(polite, T0) is not None) is False


def test_r13_unknown_host_never_defers():
    assert (POLICY.defer_verdict(None, T0) is not None) is False


def test_r13_throttled_host_whose_backoff_was_served_proceeds():
    served = replace(_throttled_fixture(T0), next_allowed=1.0)  # the gate writes next_allowed = 1 (long past)
    assert (POLICY.defer_verdict(served, T0) is not None) is False
    assert served.consec == 1  # ...and it still carries consec 1: not a no-history pass


def test_r13_backoff_served_exactly_at_next_allowed_proceeds():
    state = _throttled_fixture(T0)
    assert (POLICY.defer_verdict(state, state.next_allowed - 0.001) is not None) is True
    assert (POLICY.defer_verdict(state, state.next_allowed) is not None) is False


def test_r13b_predicate_on_a_persisted_state_equals_the_state_in_hand(tmp_path):
    # One predicate: the answer on a row read back from the table equals the answer on the value in hand,
    # and the first equality is True-vs-True, not False-vs-False.
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    try:
        throttled, polite = _throttled_fixture(T0), _polite_fixture(T0)
        store.update("r13throttled.example.test", lambda s, now: (throttled, None))
        store.update("r13polite.example.test", lambda s, now: (polite, None))
        persisted_throttled = store.get("r13throttled.example.test")
        persisted_polite = store.get("r13polite.example.test")
        assert POLICY.defer_verdict(persisted_throttled, T0) == POLICY.defer_verdict(throttled, T0) is not None
        assert POLICY.defer_verdict(persisted_polite, T0) is POLICY.defer_verdict(polite, T0) is None
        # A missing row (the gate's NULL table) defers nothing.
        assert (POLICY.defer_verdict(store.get("r13unknown.example.test"), T0) is not None) is False
    finally:
        store.close()


# --------------------------------------------------------------------------------------------------
# R14: a published Crawl-delay longer than any in-line wait defers (strictly greater-than)
# --------------------------------------------------------------------------------------------------


def test_r14_fixture_reaches_its_preconditions():
    slow = _polite_fixture(T0, crawl_delay=MAX_WAIT + 0.001)
    assert slow.crawl_delay == MAX_WAIT + 0.001  # it really published cap + 1 ms
    assert slow.consec == 0  # never throttled: nothing below can pass via the R13 path
    assert POLICY.wait(slow, T0) == MAX_WAIT  # the same clamped wait as the polite host


def test_r14_delay_above_the_cap_defers():
    assert (POLICY.defer_verdict(_polite_fixture(T0, crawl_delay=MAX_WAIT + 0.001), T0) is not None) is True


def test_r14_delay_at_the_cap_does_not_defer():
    assert (POLICY.defer_verdict(_polite_fixture(T0, crawl_delay=MAX_WAIT), T0) is not None) is False


def test_r14_interval_elapsed_proceeds():
    slow = replace(_polite_fixture(T0, crawl_delay=MAX_WAIT + 0.001), next_allowed=1.0)
    assert (POLICY.defer_verdict(slow, T0) is not None) is False
    assert slow.crawl_delay == MAX_WAIT + 0.001  # ...and it still publishes cap + 1 ms


def test_r14_slow_host_defers_until_its_own_interval_has_elapsed():
    # End to end through after_response: the host's own delay sets next_allowed; it defers until then.
    state = PacingPolicy.with_crawl_delay(None, 120.0, now=T0)
    state = POLICY.after_response(state, status=200, end=T0).state
    assert state.next_allowed == T0 + 120.0  # the published 120 s, not truncated to the 60 s wait cap
    assert (POLICY.defer_verdict(state, T0 + 119.9) is not None) is True
    assert (POLICY.defer_verdict(state, T0 + 120.0) is not None) is False


# --------------------------------------------------------------------------------------------------
# docs/spec.md §2 Deviations from the reference
# --------------------------------------------------------------------------------------------------


def test_deviation_retry_after_honoured_beyond_max_backoff():
    # The reference caps an honoured Retry-After at the 300 s backoff cap; we honour it up to max_retry_after.
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=3000.0)
    assert decision.delay == 3000.0
    assert decision.state.next_allowed == T0 + 3000.0
    assert decision.retry_after_clamped is False
    assert decision.state.consec == 1


def test_deviation_retry_after_at_max_retry_after_is_not_clamped():
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=3600.0)
    assert (decision.delay, decision.retry_after_clamped) == (3600.0, False)


def test_deviation_retry_after_above_max_retry_after_is_clamped():
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=7200.0)
    assert decision.delay == 3600.0
    assert decision.retry_after_clamped is True
    small_cap = PacingPolicy(max_retry_after=600.0)
    decision = small_cap.after_response(None, status=503, end=T0, retry_after=601.0)
    assert (decision.delay, decision.retry_after_clamped) == (600.0, True)


def test_deviation_computed_backoff_is_still_capped_at_max_backoff():
    # Only an honoured Retry-After may exceed max_backoff; a computed backoff may not.
    assert POLICY.after_response(HostState(consec=30), status=429, end=T0).delay == MAX_BACKOFF


def test_deviation_retry_after_http_date_relative_to_date_header():
    retry_after = parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now=T0, date="Wed, 21 Oct 2015 07:28:00 GMT")
    assert retry_after == 120.0  # relative to the response's Date, not to the (far later) local clock
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=retry_after)
    assert decision.delay == 120.0


def test_deviation_retry_after_http_date_relative_to_local_clock():
    now = float(calendar.timegm((2015, 10, 21, 7, 29, 0)))
    retry_after = parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now=now)
    assert retry_after == 60.0
    assert POLICY.after_response(None, status=429, end=now, retry_after=retry_after).delay == 60.0


def test_deviation_retry_after_decimal_honoured():
    retry_after = parse_retry_after("1.5", now=T0)
    assert retry_after == 1.5
    decision = POLICY.after_response(None, status=429, end=T0, retry_after=retry_after)
    assert decision.delay == 1.5
    # A decimal below the effective interval is raised to it (delay = max(delay, eff)).
    assert POLICY.after_response(None, status=429, end=T0, retry_after=0.5).delay == BASE


def test_retry_after_zero_is_treated_as_absent():
    # docs/spec.md §2: delay = retry_after if given and > 0, else the computed backoff.
    assert POLICY.after_response(HostState(consec=2), status=429, end=T0, retry_after=0.0).delay == 4.0


# --------------------------------------------------------------------------------------------------
# docs/spec.md §2: requests in flight together answer for one moment of the host's mood
# --------------------------------------------------------------------------------------------------


def test_eight_concurrent_429s_are_one_step():
    sent = T0
    state, decisions = None, []
    for i in range(8):
        decision = POLICY.after_response(state, status=429, end=sent + 0.1 + i * 0.01, sent_at=sent)
        if state is not None:
            assert decision.state.next_allowed >= state.next_allowed  # never shortened
        state = decision.state
        decisions.append(decision)
    assert state.consec == 1  # not 8: no 2**8 backoff
    assert [d.counted for d in decisions] == [True] + [False] * 7
    assert all(d.throttle for d in decisions)


def test_eight_concurrent_429s_with_retry_after_are_one_step():
    state = None
    for i in range(8):
        state = POLICY.after_response(state, status=429, end=T0 + 0.1 + i * 0.01, sent_at=T0,
                                      retry_after=120.0).state
    assert state.consec == 1
    assert state.next_allowed >= T0 + 0.1 + 120.0


def test_success_sent_before_a_recorded_throttle_takes_no_step_off():
    # A fresh Retry-After 120 s backoff; a 200 to a request sent before it must not cancel it.
    throttled = POLICY.after_response(HostState(ok_seen=True), status=429, end=T0, sent_at=T0 - 0.5,
                                      retry_after=120.0).state
    assert throttled.consec == 1
    late = POLICY.after_response(throttled, status=200, end=T0 + 0.3, sent_at=T0 - 0.2)
    assert late.state.consec == 1  # unchanged
    assert late.state.next_allowed >= throttled.next_allowed  # not shortened
    assert late.state.next_allowed >= T0 + 120.0
    assert (POLICY.defer_verdict(late.state, T0 + 1) is not None) is True


def test_success_sent_before_a_recorded_throttle_keeps_a_deep_streak():
    throttled = POLICY.after_response(HostState(consec=2), status=429, end=T0, sent_at=T0 - 0.5).state
    assert (throttled.consec, throttled.next_allowed) == (3, T0 + 4.0)
    late = POLICY.after_response(throttled, status=200, end=T0 + 0.1, sent_at=T0 - 0.1)
    assert late.state.consec == 3
    assert late.state.next_allowed >= throttled.next_allowed


def test_negative_control_success_sent_after_the_throttle_takes_a_step_off():
    throttled = POLICY.after_response(None, status=429, end=T0, sent_at=T0 - 0.5, retry_after=120.0).state
    fresh = POLICY.after_response(throttled, status=200, end=T0 + 121.0, sent_at=T0 + 120.5)
    assert fresh.state.consec == 0
    assert fresh.state.next_allowed == T0 + 121.0 + BASE


def test_negative_control_429_sent_after_the_recorded_throttle_takes_a_step():
    first = POLICY.after_response(None, status=429, end=T0, sent_at=T0 - 0.5)
    second = POLICY.after_response(first.state, status=429, end=T0 + 2.0, sent_at=T0 + 1.0)
    assert second.state.consec == 2
    assert second.counted is True
    assert second.delay == 2.0  # base * 2**1


def test_without_sent_at_a_response_is_judged_against_the_current_state():
    first = POLICY.after_response(None, status=429, end=T0)
    second = POLICY.after_response(first.state, status=429, end=T0 + 0.1)
    assert second.state.consec == 2 and second.counted is True


def test_stale_throttle_after_the_step_was_earned_back_takes_no_new_step():
    # Two requests sent together at T0-1; the first answers 429 (one step, consec 1). A request sent
    # after it answers 200 and earns the step back (consec 0). The second request of the first pair then
    # answers 429: it speaks for the moment that was already counted, so it must take no new step --
    # and the Decision must agree with the state about whether a step was taken.
    first = POLICY.after_response(None, status=429, end=T0, sent_at=T0 - 1)
    earned = POLICY.after_response(first.state, status=200, end=T0 + 2, sent_at=T0 + 1)
    assert earned.state.consec == 0  # precondition
    stale = POLICY.after_response(earned.state, status=429, end=T0 + 3, sent_at=T0 - 1)
    assert stale.counted is False
    assert stale.state.consec == 0, "a stale 429 re-took the step that the in-flight group already took"


# --------------------------------------------------------------------------------------------------
# docs/spec.md §1: host keys
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, want", [
    pytest.param("http://WWW.Example.COM/path", "www.example.com", id="lower-case"),
    pytest.param("http://Bücher.example/", "xn--bcher-kva.example", id="IDNA"),
    pytest.param("HTTP://Bücher.Example.:8080/x", "xn--bcher-kva.example", id="IDNA, dot and port together"),
    pytest.param("http://xn--bcher-kva.example/", "xn--bcher-kva.example", id="already punycode"),
    pytest.param("http://example.com./", "example.com", id="trailing dot"),
    pytest.param("http://[2001:DB8::1]/", "2001:db8::1", id="IPv6 brackets removed, lower-cased"),
    pytest.param("http://[2001:db8::1]:8443/", "2001:db8::1", id="IPv6 with port"),
    pytest.param("http://192.0.2.7:8080/", "192.0.2.7", id="IPv4 with port"),
    pytest.param("https://user:pw@example.com:444/", None, id="userinfo: refused (docs/spec.md §1)"),
])
def test_host_key(url, want):
    assert host_key(url) == want


def test_host_key_ignores_the_port():
    assert host_key("http://example.com:8080/a") == host_key("http://example.com:9090/b") == "example.com"
    assert host_key("https://example.com/") == host_key("http://example.com/")


@pytest.mark.parametrize("url", [
    "data:text/plain,hello",
    "file:///etc/passwd",
    "about:blank",
    "http:///no-host",
    "http://",
    "http://[::1/",  # unterminated IPv6 literal
    "not a url",
    "http://:80/",
])
def test_host_key_none_for_urls_without_a_host(url):
    assert host_key(url) is None


# --------------------------------------------------------------------------------------------------
# The policy's own configuration
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["host_interval", "max_backoff", "max_wait", "max_retry_after"])
@pytest.mark.parametrize("value", [-1.0, -0.001, float("nan"), float("inf")])
def test_policy_rejects_negative_or_non_finite_intervals(name, value):
    with pytest.raises(ValueError, match=name):
        PacingPolicy(**{name: value})


def test_policy_accepts_zero_intervals():
    PacingPolicy(host_interval=0.0, max_wait=0.0)


def test_policy_rejects_max_backoff_below_host_interval():
    # The PacingPolicy docstring promises this ValueError.
    with pytest.raises(ValueError):
        PacingPolicy(host_interval=10.0, max_backoff=5.0)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_with_crawl_delay_rejects_negative_or_non_finite(value):
    with pytest.raises(ValueError):
        PacingPolicy.with_crawl_delay(None, value, now=T0)


def test_custom_throttle_statuses():
    policy = PacingPolicy(throttle_statuses=[429, 503, 509])
    assert policy.after_response(None, status=509, end=T0).throttle is True
    assert PacingPolicy(throttle_statuses=[429]).after_response(None, status=503, end=T0).throttle is False


@pytest.mark.parametrize("name", ["max_failure_backoff"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_policy_rejects_a_bad_failure_cap(name, value):
    with pytest.raises(ValueError, match=name):
        PacingPolicy(**{name: value})


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_policy_rejects_a_bad_throttle_retry_budget(value):
    with pytest.raises(ValueError, match="throttle_retries"):
        PacingPolicy(throttle_retries=value)


# --------------------------------------------------------------------------------------------------
# Download failures have their own cap, POLITE_MAX_FAILURE_BACKOFF (docs/spec.md §2)
# --------------------------------------------------------------------------------------------------


def _failures(policy: PacingPolicy, state: HostState | None, n: int) -> tuple[HostState, list[float], list[int]]:
    delays, steps = [], []
    for i in range(n):
        decision = policy.after_response(state, status=None, end=T0 + 1000 * i)
        state = decision.state
        delays.append(decision.delay)
        steps.append(state.consec)
    return state, delays, steps


def test_failures_back_off_up_to_their_own_cap_and_stop_stepping_there():
    # Base 1 s, failure cap 60 s: 1, 2, 4 … 32, then 60 (64 capped) with no further step.
    state, delays, steps = _failures(POLICY, None, 9)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert steps == [1, 2, 3, 4, 5, 6, 6, 6, 6]
    # So the decay after the host is back never waits longer than the failure cap: 2^5 = 32 s.
    after = POLICY.after_response(state, status=200, end=T0 + 10_000)
    assert after.state.consec == 5 and after.delay == 32.0


def test_negative_control_throttles_climb_to_the_throttle_cap():
    state = None
    for i in range(9):
        state = POLICY.after_response(state, status=429, end=T0 + 1000 * i).state
    assert state.consec == 9
    after = POLICY.after_response(state, status=200, end=T0 + 10_000)
    assert after.state.consec == 8 and after.delay == 256.0  # a throttling host earns its steps back slowly


def test_a_failure_after_throttles_is_capped_and_takes_no_step():
    throttled = HostState(consec=9, updated=T0)
    decision = POLICY.after_response(throttled, status=None, end=T0 + 1)
    assert decision.delay == 60.0 and decision.state.consec == 9
    assert decision.throttle is True and decision.counted is False


def test_the_first_failure_always_steps_even_below_a_tiny_cap():
    policy = PacingPolicy(max_failure_backoff=0.0)
    state, delays, steps = _failures(policy, None, 3)
    assert delays == [1.0, 1.0, 1.0]  # never below the interval
    assert steps == [1, 1, 1]  # the host did fail: deferred while it is held, but it never climbs


def test_the_failure_cap_leaves_throttles_alone():
    policy = PacingPolicy(max_failure_backoff=2.0)
    state = HostState(consec=5, updated=T0)
    assert policy.after_response(state, status=429, end=T0 + 1).delay == 32.0
    assert policy.after_response(state, status=None, end=T0 + 1).delay == 2.0


# --------------------------------------------------------------------------------------------------
# The package's throttle retries (docs/spec.md §2, "A throttle is not a failure")
# --------------------------------------------------------------------------------------------------


def test_a_throttled_page_is_retried_while_its_budget_lasts():
    policy = PacingPolicy(throttle_retries=2)
    assert [policy.retry_throttled(throttle=True, retries=n) for n in range(4)] == [True, True, False, False]
    assert policy.retry_throttled(throttle=False, retries=0) is False  # only throttles are the package's


def test_a_budget_of_zero_never_retries_and_the_default_is_ten():
    assert PacingPolicy(throttle_retries=0).retry_throttled(throttle=True, retries=0) is False
    assert POLICY.throttle_retries == 10
    assert POLICY.retry_throttled(throttle=True, retries=9) is True
    assert POLICY.retry_throttled(throttle=True, retries=10) is False


# -- the module's fast copy of a row ------------------------------------------------------------------------

_FIELD_VALUES = {f.name: (st.booleans() if f.type == "bool" else st.integers(-1, 10**6) if f.type == "int"
                          else st.text() if f.type == "str" else st.floats(0, 1e10, allow_nan=False))
                 for f in dataclasses.fields(HostState)}


@given(st.fixed_dictionaries({}, optional=_FIELD_VALUES), st.fixed_dictionaries({}, optional=_FIELD_VALUES))
def test_the_policys_row_copy_is_dataclasses_replace(base, changes):
    state = HostState(**base)
    copied = policy_module.replace(state, **changes)
    assert copied == dataclasses.replace(state, **changes)
    assert type(copied) is HostState and copied is not state
    assert state == HostState(**base)  # the original row is untouched (it is shared: NEVER_SEEN)
    assert hash(copied) == hash(dataclasses.replace(state, **changes))


def test_the_policys_row_copy_refuses_an_unknown_field_and_leaves_other_types_to_dataclasses():
    with pytest.raises(TypeError, match="nxt_allowed"):
        policy_module.replace(NEVER_SEEN, nxt_allowed=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        NEVER_SEEN.next_allowed = 5.0  # type: ignore[misc]  # the shared empty row stays immutable
    assert NEVER_SEEN == HostState()
    # Negative control: another dataclass goes through dataclasses.replace, __post_init__ included.
    assert policy_module.replace(Deferral(reason="throttled", due=1.0), due=2.0) == Deferral(reason="throttled", due=2.0)
    with pytest.raises(ValueError, match="host_interval"):
        policy_module.replace(PacingPolicy(), host_interval=-1.0)


@given(st.fixed_dictionaries(_FIELD_VALUES), st.fixed_dictionaries({}, optional=_FIELD_VALUES))
def test_a_row_built_from_its_fields_is_the_dataclass_built_by_init(whole, later):
    built = policy_module.state_from_fields(whole, later)
    assert built == HostState(**{**whole, **later})  # a later part wins
    assert hash(built) == hash(HostState(**{**whole, **later}))
    assert type(built) is HostState
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.next_allowed = 5.0  # type: ignore[misc]  # still frozen
    # Negative control: the parts' order matters (an implementation that let the first part win would pass
    # the equality above only when the parts agree).
    if later and any(whole[k] != v for k, v in later.items()):
        assert policy_module.state_from_fields(later, whole) != built
