"""Adaptive pacing, the pure rules (docs/spec.md §2, "Adaptive pacing"): :class:`~scrapy_polite.policy.adaptive.AdaptivePolicy`
and its use by :class:`~scrapy_polite.policy.PacingPolicy` (``after_response``, ``book``, ``effective_interval``),
exactly, on an injected clock. Hypothesis for the invariants (never below the floor, never above the cap,
one step at a time), exact values for the formulas, and negative controls (adaptive pacing off; a
Retry-After shorter or longer than the adaptive interval).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_polite.policy import HostState, PacingPolicy
from scrapy_polite.policy.adaptive import GROWTH, MAX_STRAIN_STEPS, SMOOTHING, AdaptivePolicy

T0 = 1_900_000_000.0
#: Seconds: the resolution of a difference of two epoch times as floats (``next_allowed - end``).
EPS = 1e-6

ADAPTIVE = AdaptivePolicy(factor=5.0, cap=30.0)
POLICY = PacingPolicy(host_interval=1.0, max_backoff=300.0, adaptive=ADAPTIVE)
PLAIN = PacingPolicy(host_interval=1.0, max_backoff=300.0)

latencies = st.floats(0, 100, allow_nan=False)
strains = st.integers(0, MAX_STRAIN_STEPS)
floors = st.floats(0, 120, allow_nan=False)
factors = st.floats(0.01, 20, allow_nan=False)
caps = st.floats(0, 120, allow_nan=False)


# --------------------------------------------------------------------------------------------------
# AdaptivePolicy.interval


@given(latency=latencies, strain=strains, floor=floors, factor=factors, cap=caps)
def test_interval_is_never_below_the_floor_nor_above_the_cap(latency, strain, floor, factor, cap):
    interval = AdaptivePolicy(factor=factor, cap=cap).interval(latency, strain, floor)
    assert interval >= floor
    assert interval <= max(cap, floor)
    expected = max(floor, min(cap, max(factor * latency, floor) * GROWTH ** strain))
    assert interval == expected


@given(latency=latencies, strain=strains, floor=floors)
def test_interval_grows_with_latency_and_strain(latency, strain, floor):
    a = ADAPTIVE
    assert a.interval(latency, strain, floor) <= a.interval(latency * 2 + 0.1, strain, floor)
    assert a.interval(latency, strain, floor) <= a.interval(latency, min(strain + 1, MAX_STRAIN_STEPS), floor)


def test_interval_exact_values():
    a = ADAPTIVE
    assert a.interval(0.0, 0, 1.0) == 1.0  # nothing measured: the floor
    assert a.interval(0.05, 0, 1.0) == 1.0  # 5 × 50 ms is below the floor: the floor
    assert a.interval(2.0, 0, 1.0) == 10.0  # 5 × 2 s
    assert a.interval(0.05, 3, 1.0) == 8.0  # three strain steps on the floor
    assert a.interval(2.0, 2, 1.0) == 30.0  # 40 s wanted, the cap
    assert a.interval(2.0, 2, 45.0) == 45.0  # a floor above the cap wins (a Crawl-delay of 45 s)


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_a_factor_that_is_not_positive_and_finite_is_refused(bad):
    with pytest.raises(ValueError, match="factor"):
        AdaptivePolicy(factor=bad)


# --------------------------------------------------------------------------------------------------
# AdaptivePolicy.observe


@given(latency=st.floats(0.001, 100), sample=latencies, strain=strains)
def test_latency_is_smoothed_with_its_weight(latency, sample, strain):
    smoothed, _ = ADAPTIVE.observe(latency, strain, sample=sample, error=False, floor=1.0)
    assert smoothed == latency + SMOOTHING * (sample - latency)
    assert min(latency, sample) <= smoothed + 1e-12 and smoothed <= max(latency, sample) + 1e-12


def test_the_first_sample_is_taken_as_it_is_and_a_missing_sample_changes_nothing():
    assert ADAPTIVE.observe(0.0, 0, sample=0.4, error=False, floor=1.0) == (0.4, 0)
    for missing in (None, -1.0, math.nan, math.inf):
        assert ADAPTIVE.observe(0.4, 2, sample=missing, error=False, floor=1.0) == (0.4, 1)


@given(latency=latencies, strain=strains, floor=st.floats(0, 10), sample=st.one_of(st.none(), latencies))
def test_strain_moves_one_step_at_a_time(latency, strain, floor, sample):
    smoothed, up = ADAPTIVE.observe(latency, strain, sample=sample, error=True, floor=floor)
    at_cap = ADAPTIVE.interval(smoothed, strain, floor) >= max(ADAPTIVE.cap, floor) or strain == MAX_STRAIN_STEPS
    assert up == (strain if at_cap else strain + 1)  # no step past the cap
    _, down = ADAPTIVE.observe(latency, strain, sample=sample, error=False, floor=floor)
    assert down == max(strain - 1, 0)  # negative control: a relax of more than one step fails here


# --------------------------------------------------------------------------------------------------
# In the pacing policy (injected clock)


def run(policy: PacingPolicy, answers, *, state: HostState | None = None, crawl_delay: float = 0.0,
        override: float | None = None):
    """Feed ``answers`` (``(status, latency)``) one after the other, each ending at the moment the host was
    next allowed; return the states and each answer's delay."""
    state = state or HostState(crawl_delay=crawl_delay)
    now = T0
    delays = []
    out = []
    for status, latency in answers:
        now = max(now, state.next_allowed) + latency
        decision = policy.after_response(state, status=status, end=now, latency=latency, override=override)
        state = decision.state
        delays.append(decision.delay)
        out.append(state)
    return out, delays


def test_the_interval_rises_with_a_slowing_server_and_falls_back_as_it_recovers():
    """50 ms → 2 s → 50 ms: the delay after each answer (the interval from its end) rises to factor × the
    smoothed latency, then falls back to the floor, never below it."""
    answers = [(200, 0.05)] * 5 + [(200, 2.0)] * 8 + [(200, 0.05)] * 20
    states, delays = run(POLICY, answers)
    assert delays[:5] == pytest.approx([1.0] * 5, abs=EPS)  # 5 × 50 ms < the 1 s floor
    slow = delays[5:13]
    assert slow == sorted(slow) and slow[-1] > 9.0  # rising towards 5 × 2 s
    fast = delays[13:]
    assert all(b <= a + EPS for a, b in zip(fast, fast[1:]))
    assert fast[-1] == pytest.approx(1.0, abs=EPS)  # back to the floor
    assert min(delays) >= 1.0 - EPS
    for state, delay in zip(states, delays):
        # exactly the rule (no strain: all 200), to the epoch clock's float resolution
        assert delay == pytest.approx(max(1.0, min(30.0, 5.0 * state.latency)), abs=EPS)
    # Negative control: without POLITE_ADAPTIVE the same answers are paced at the floor alone.
    plain_states, plain = run(PLAIN, answers)
    assert plain == pytest.approx([1.0] * len(answers), abs=EPS) and all(s.latency == 0 for s in plain_states)


def test_5xx_and_failures_add_steps_and_each_other_answer_takes_one_off():
    answers = [(200, 0.05), (500, 0.05), (502, 0.05), (None, 0.05), (200, 0.05), (404, 0.05), (200, 0.05)]
    states, delays = run(POLICY, answers)
    assert [s.strain for s in states] == [0, 1, 2, 3, 2, 1, 0]
    kept = [d for d, (status, _) in zip(delays, answers) if status is not None]
    assert kept == pytest.approx([1.0, 2.0, 4.0, 4.0, 2.0, 1.0], abs=EPS)
    # The failure is also a throttle (docs/spec.md §2): its delay is the backoff on the adaptive interval.
    assert delays[3] >= 8.0


@given(latency=st.floats(0, 50), crawl_delay=st.sampled_from([0.0, 0.5, 3.0, 45.0]),
       override=st.one_of(st.none(), st.floats(0, 40)), quota=st.sampled_from([0.0, 2.0, 50.0]),
       status=st.sampled_from([200, 404, 500, 504]))
def test_never_below_the_floor_never_above_the_cap(latency, crawl_delay, override, quota, status):
    state = HostState(crawl_delay=crawl_delay, ratelimit_interval=quota, latency=latency, strain=2)
    floor = max(1.0, crawl_delay, quota, override or 0.0)
    decision = POLICY.after_response(state, status=status, end=T0, latency=latency, override=override)
    eff = POLICY.effective_interval(decision.state, override)
    assert floor <= eff <= max(30.0, floor)
    assert decision.delay >= floor - EPS
    booking = POLICY.book(decision.state, {}, now=decision.state.next_allowed, floor=override or 0.0)
    assert booking.booked and booking.interval == eff >= floor
    assert booking.host is not None and booking.host.next_allowed == booking.start + eff


def test_retry_after_longer_than_the_adaptive_interval_wins_and_a_shorter_one_does_not_shorten_it():
    slow = HostState(latency=2.0)  # adaptive interval 10 s
    longer = POLICY.after_response(slow, status=429, end=T0, retry_after=20.0, latency=2.0)
    assert longer.delay == 20.0
    shorter = POLICY.after_response(slow, status=429, end=T0, retry_after=3.0, latency=2.0)
    assert shorter.delay == 10.0  # the adaptive interval is a floor for the Retry-After too
    # Negative control: without adaptive pacing the same Retry-After is honoured as it is.
    assert PLAIN.after_response(slow, status=429, end=T0, retry_after=3.0).delay == 3.0


def test_the_booking_uses_the_shared_row_and_says_the_interval_it_applied():
    """A second process reading the row books at the raised interval at once (the row carries the latency)."""
    row = HostState(latency=1.0, next_allowed=T0)
    booking = POLICY.book(row, {}, now=T0)
    assert booking.booked and booking.interval == 5.0 and booking.writes[""].next_allowed == T0 + 5.0
    assert PLAIN.book(row, {}, now=T0).interval == 1.0  # negative control: off, the latency is not read


def test_reset_forgets_latency_and_strain():
    state = PacingPolicy.reset(HostState(latency=3.0, strain=4, crawl_delay=2.0), now=T0)
    assert (state.latency, state.strain, state.crawl_delay) == (0.0, 0, 2.0)
