"""The backoff rule of docs/spec.md §2 as amended: "No dead steps, and Retry-After sets the scale".

* A throttle adds a step only while ``eff × 2^consec`` is below ``POLITE_MAX_BACKOFF`` (and the exponent below
  its cap of 10); the first throttle always steps.
* While every throttle of the current run carried a Retry-After, the delay a success leaves is at most the
  largest of them; the run's largest Retry-After is part of the row, and the run ends at ``consec`` 0.

Exact values on an injected clock (every expected number written out by hand from docs/spec.md §2, never
computed with the module under test), each with its negative control, then Hypothesis properties.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scrapy_polite.policy import HostState, PacingPolicy
from scrapy_polite.stores import SQLiteStore

T0 = 1_800_000_000.0
POLICY = PacingPolicy()  # base 1 s, backoff cap 300 s


def replay(policy, events, state=None, *, start=T0, spacing=1000.0):
    """Feed ``events`` (``(status, retry_after)``) one after the other, each sent after the last one ended (no
    request in flight with another); returns ``[(delay, consec, run_retry_after)]`` after each."""
    out = []
    now = start
    for status, retry_after in events:
        decision = policy.after_response(state, status=status, end=now, retry_after=retry_after, sent_at=now - 0.5)
        state = decision.state
        out.append((decision.delay, state.consec, state.run_retry_after))
        now += spacing
    return out, state


# --------------------------------------------------------------------------------------------------
# No dead steps


def test_throttles_without_retry_after_step_up_to_the_cap_and_no_further():
    trace, state = replay(POLICY, [(429, None)] * 14)
    assert [d for d, _, _ in trace] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 300, 300]
    # consec 9 is the step whose backoff is the cap (256 < 300 steps once more, 512 ≥ 300 does not)
    assert [c for _, c, _ in trace] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 9, 9]
    assert state.consec == 9 and next(c for c in range(20) if not POLICY.takes_step(1.0, c)) == 9


def test_recovery_from_the_cap_is_one_step_per_success():
    _, state = replay(POLICY, [(429, None)] * 48)  # the issue's 48 throttles
    trace, state = replay(POLICY, [(200, None)] * 10, state, start=T0 + 10**6)
    assert [d for d, _, _ in trace] == [256, 128, 64, 32, 16, 8, 4, 2, 1, 1]
    assert [c for _, c, _ in trace] == [8, 7, 6, 5, 4, 3, 2, 1, 0, 0]


def test_negative_control_a_step_below_the_cap_is_still_taken():
    """Not over-broad: consec 8 (256 s < 300 s) still steps to 9, and the 9th step changes the next delay."""
    step = POLICY.after_response(HostState(consec=8), status=429, end=T0)
    assert (step.delay, step.state.consec, step.counted) == (256.0, 9, True)
    nxt = POLICY.after_response(step.state, status=429, end=T0 + 1000)
    assert (nxt.delay, nxt.state.consec, nxt.counted) == (300.0, 9, False)


def test_the_exponent_cap_bounds_the_steps_too():
    """A tiny interval: 0.01 × 2^10 = 10.24 s < 300 s, yet step 11 would change nothing (exponent cap 10)."""
    policy = PacingPolicy(host_interval=0.01)
    _, state = replay(policy, [(429, None)] * 20)
    assert state.consec == 10


def test_the_first_throttle_always_steps_even_above_the_cap():
    """A Crawl-delay of 600 s (above the 300 s cap): the first throttle steps (the host is marked as throttling
    us, so its requests are deferred); a second does not; the delay is never below the Crawl-delay."""
    first = POLICY.after_response(HostState(crawl_delay=600.0), status=429, end=T0)
    assert (first.delay, first.state.consec) == (600.0, 1)
    second = POLICY.after_response(first.state, status=429, end=T0 + 1000)
    assert (second.delay, second.state.consec) == (600.0, 1)
    assert POLICY.defer_verdict(first.state, T0 + 1) is not None


def test_a_raised_interval_lowers_the_step_cap():
    """eff 10 s (a Crawl-delay): 10 × 2^4 = 160 < 300 steps, 10 × 2^5 = 320 does not: at most 5 steps."""
    trace, _ = replay(POLICY, [(429, None)] * 8, HostState(crawl_delay=10.0))
    assert [d for d, _, _ in trace] == [10, 20, 40, 80, 160, 300, 300, 300]
    assert [c for _, c, _ in trace] == [1, 2, 3, 4, 5, 5, 5, 5]


def test_failures_keep_their_own_cap():
    """Download failures: cap 60 s, 1 × 2^6 = 64 ≥ 60, so at most 6 steps (docs/spec.md §2)."""
    trace, _ = replay(POLICY, [(None, None)] * 9)
    assert [d for d, _, _ in trace] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert [c for _, c, _ in trace] == [1, 2, 3, 4, 5, 6, 6, 6, 6]


# --------------------------------------------------------------------------------------------------
# Retry-After sets the scale


def test_the_issue_case_three_429s_with_retry_after_3_per_url_sixteen_pages():
    """Each of 16 URLs answers 429 + Retry-After 3 three times, then 200 (one request at a time, as the
    host's pacing sends them): 48 throttles, every one honoured at 3 s; no success leaves more than 3 s."""
    events = [(429, 3.0)] * 48 + [(200, None)] * 16
    trace, state = replay(POLICY, events)
    throttles, successes = trace[:48], trace[48:]
    assert {d for d, _, _ in throttles} == {3.0}
    assert max(c for _, c, _ in throttles) == 9  # no dead steps
    assert [d for d, _, _ in successes] == [3, 3, 3, 3, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert [c for _, c, _ in successes] == [8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert [r for _, _, r in successes] == [3.0] * 8 + [0.0] * 8  # the run ends at consec 0
    assert state == HostState(next_allowed=T0 + 63 * 1000 + 1, consec=0, throttled_at=T0 + 47 * 1000 + 0.0,
                              updated=T0 + 63 * 1000, ok_seen=True)


def test_interleaved_throttles_and_successes_stay_within_the_retry_after():
    events = [(429, 3.0), (429, 3.0), (200, None), (429, 3.0), (200, None), (200, None), (200, None)]
    trace, _ = replay(POLICY, events)
    assert [d for d, _, _ in trace] == [3, 3, 2, 3, 2, 1, 1]
    assert [c for _, c, _ in trace] == [1, 2, 1, 2, 1, 0, 0]


def test_the_largest_retry_after_of_the_run_is_the_cap():
    trace, state = replay(POLICY, [(429, 2.0), (429, 30.0), (429, 5.0), (429, 5.0), (429, 5.0), (429, 5.0)])
    assert [r for _, _, r in trace] == [2.0, 30.0, 30.0, 30.0, 30.0, 30.0]
    after, _ = replay(POLICY, [(200, None)] * 3, state, start=T0 + 10**6)
    assert [d for d, _, _ in after] == [30, 16, 8]  # min(32, 30), then below the cap anyway


def test_negative_control_one_throttle_without_retry_after_ends_the_cap_for_the_run():
    """A run with one throttle that carried no Retry-After: the server did not tell us its window for all of
    it, so a success leaves the computed backoff (the cap does not apply)."""
    events = [(429, 3.0)] * 6 + [(503, None)] + [(429, 3.0)] * 3
    trace, state = replay(POLICY, events)
    assert trace[6] == (64.0, 7, 0.0)  # the computed backoff at step 6, and the run's cap is gone
    assert [r for _, _, r in trace[7:]] == [0.0, 0.0, 0.0]  # later Retry-Afters do not bring it back
    after, _ = replay(POLICY, [(200, None)], state, start=T0 + 10**6)
    assert after == [(256.0, 8, 0.0)]


def test_negative_control_without_retry_after_the_success_delay_is_the_backoff():
    trace, _ = replay(POLICY, [(429, None)] * 4 + [(200, None)])
    assert trace[-1] == (8.0, 3, 0.0)


def test_a_new_run_starts_afresh_after_consec_returns_to_zero():
    trace, state = replay(POLICY, [(429, 3.0), (200, None)])
    assert trace == [(3.0, 1, 3.0), (1.0, 0, 0.0)]
    again, _ = replay(POLICY, [(429, None), (429, None), (429, None), (200, None)], state, start=T0 + 10**6)
    assert again[-1] == (4.0, 2, 0.0)  # not capped at the earlier run's 3 s


def test_the_cap_never_goes_below_the_interval():
    """A Retry-After of 0.5 s against a 5 s Crawl-delay: the delay after a success is still 5 s."""
    trace, _ = replay(POLICY, [(429, 0.5), (429, 0.5), (200, None)], HostState(crawl_delay=5.0))
    assert [d for d, _, _ in trace] == [5, 5, 5]


def test_a_throttle_in_flight_with_another_joins_the_run():
    """Requests in flight together: the second 429 takes no step but its Retry-After counts for the run."""
    first = POLICY.after_response(None, status=429, end=T0 + 1, retry_after=2.0, sent_at=T0)
    second = POLICY.after_response(first.state, status=429, end=T0 + 1.5, retry_after=7.0, sent_at=T0)
    assert (second.state.consec, second.state.run_retry_after) == (1, 7.0)
    third = POLICY.after_response(second.state, status=503, end=T0 + 1.6, sent_at=T0)
    assert (third.state.consec, third.state.run_retry_after) == (1, 0.0)  # one without Retry-After: no cap


def test_a_legacy_row_without_the_field_keeps_the_computed_backoff():
    """A row written before ``run_retry_after`` existed reads 0: the backoff is not capped (as before)."""
    decision = POLICY.after_response(HostState(consec=5), status=200, end=T0)
    assert (decision.delay, decision.state.consec) == (16.0, 4)


def test_reset_forgets_the_run():
    state = POLICY.after_response(None, status=429, end=T0, retry_after=3.0).state
    assert state.run_retry_after == 3.0
    assert PacingPolicy.reset(state, now=T0 + 1).run_retry_after == 0.0


def test_the_run_is_persisted(tmp_path):
    """The run's largest Retry-After round-trips through the SQLite pace table, so another process and the
    next run cap their successes the same way."""
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"), clock=lambda: T0)
    try:
        store.update("h", lambda s, now: (POLICY.after_response(s, status=429, end=now, retry_after=3.0).state, None))
        store.update("h", lambda s, now: (POLICY.after_response(s, status=429, end=now + 10, retry_after=3.0,
                                                                 sent_at=now + 9).state, None))
    finally:
        store.close()
    reopened = SQLiteStore(str(tmp_path / "pace.sqlite3"), clock=lambda: T0)
    try:
        state = reopened.get("h")
        assert state is not None and (state.consec, state.run_retry_after) == (2, 3.0)
        assert POLICY.after_response(state, status=200, end=T0 + 100).delay == 2.0  # min(2, 3)
    finally:
        reopened.close()


# --------------------------------------------------------------------------------------------------
# Properties

statuses = st.sampled_from([429, 503, 200, 204, 404, None])
retry_afters = st.one_of(st.none(), st.floats(0.001, 7200.0))
events = st.lists(st.tuples(statuses, retry_afters), min_size=1, max_size=40)
intervals = st.sampled_from([0.05, 0.3, 1.0, 7.0, 250.0, 600.0])


@given(events=events, crawl_delay=intervals)
def test_consec_never_exceeds_the_step_cap(events, crawl_delay):
    """Whatever happened, a host never holds a step past the cap (the cap for its interval, written by hand:
    the first k with eff × 2^k ≥ 300 s, at least 1, at most 10)."""
    eff = max(1.0, crawl_delay)
    cap = 1
    while cap < 10 and eff * 2.0 ** cap < 300.0:
        cap += 1
    trace, _ = replay(POLICY, [(s, r) for s, r in events], HostState(crawl_delay=crawl_delay))
    assert max(c for _, c, _ in trace) <= cap


@given(retry=st.lists(st.floats(0.001, 3600.0), min_size=1, max_size=30), successes=st.integers(1, 12),
       crawl_delay=intervals)
def test_after_a_retry_after_run_no_success_leaves_more_than_its_largest(retry, successes, crawl_delay):
    events = [(429, r) for r in retry] + [(200, None)] * successes
    trace, _ = replay(POLICY, events, HostState(crawl_delay=crawl_delay))
    eff = max(1.0, crawl_delay)
    for delay, _, _ in trace[len(retry):]:
        assert delay <= max(max(retry), eff) + 1e-6  # epoch seconds near 1.8e9: a float ulp is 2.4e-7
        assert delay >= eff - 1e-6  # never below the interval


@given(retry=st.floats(0.001, 15.9))
def test_negative_control_a_run_with_one_throttle_without_retry_after_is_not_capped(retry):
    """Over-broad check: once a throttle without Retry-After joined the run, a success leaves the backoff."""
    run = [(429, retry)] * 3 + [(429, None)] * 3
    trace, state = replay(POLICY, run + [(200, None)])
    assert trace[-1] == (32.0, 5, 0.0)  # six steps, one earned back: 2^5 s, not min(32, retry)
    assert state.run_retry_after == 0.0
