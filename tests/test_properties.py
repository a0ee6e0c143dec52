"""Property-based tests (Hypothesis) of the pacing invariants over random event sequences (docs/spec.md §2–3).

Two levels, one set of invariants:

* **the pure rules** of ``scrapy_polite/policy/``: random statuses (2xx, 403, 404, 429, 500, 503, a
  failure) and Retry-After values (none, 0, decimals, huge, ``inf``), random in-flight overlaps (a response
  answers for any earlier booking), clock jumps forward and back, several hosts on shared addresses;
* **the glue** (:class:`~scrapy_polite.crawl.booking.Booker`, :class:`~scrapy_polite.crawl.recording.Recorder`) on the
  fake clock of tests/test_glue.py: one to three processes (each its own lines) sharing one pace table,
  with the same random events.

The invariants: per-host and per-IP spacing, no recorded hold ever shortened, decay one step per success,
concurrent throttles = one step, deferral decided by cause, not duration. The run is bounded and
derandomised (the ``ci`` profile of tests/conftest.py); ``HYPOTHESIS_PROFILE=fuzz`` runs many more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import assume, example, given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import Response

from scrapy_polite.clock import ClockSync
from scrapy_polite.crawl.booking import Booker
from scrapy_polite.crawl.lifecycle import Lifecycle
from scrapy_polite.crawl.recording import Recorder
from scrapy_polite.crawl.seams import Defer, Go
from scrapy_polite.policy import HostState, PacingPolicy, ip_key
from scrapy_polite.reports.counters import Report
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import MemoryStore
from tests.test_glue import T0, FakeClock, FakeResolution, FakeScheduler, FakeSleep, FakeStats, finish, inline

POLICY = PacingPolicy(host_interval=1.0, max_backoff=300.0, max_wait=60.0, max_retry_after=3600.0)
IP_INTERVAL = 2.0

HOSTS = ["a.test", "b.test", "c.test", "d.test"]
#: Several hosts on shared addresses (b and c share A2; a and c share A1; d has its own, IPv4-mapped to A3).
ADDRESSES = {
    "a.test": ["192.0.2.1"],
    "b.test": ["192.0.2.2"],
    "c.test": ["192.0.2.1", "192.0.2.2"],
    "d.test": ["::ffff:192.0.2.3"],
}

statuses = st.sampled_from([200, 200, 204, 301, 403, 404, 429, 429, 500, 503, None])
retry_afters = st.one_of(st.none(), st.just(0.0), st.floats(0, 5000, allow_nan=False),
                         st.integers(0, 10**6).map(float), st.just(math.inf))
#: Clock jumps in seconds: mostly small steps forward, sometimes large jumps either way.
jumps = st.one_of(st.floats(0, 5), st.floats(-120, 600), st.sampled_from([-3600.0, 0.0, 86400.0]))
states = st.builds(
    HostState,
    next_allowed=st.floats(T0 - 1000, T0 + 10_000),
    consec=st.integers(0, 15),
    crawl_delay=st.sampled_from([0.0, 0.5, 5.0, 60.0, 61.0, 600.0]),
    ok_seen=st.booleans(),
    throttled_at=st.one_of(st.just(0.0), st.floats(T0 - 1000, T0 + 1000)),
)


def _status_is_throttle(status: int | None, state: HostState | None) -> bool:
    return status is None or POLICY.is_throttle(status, state)


# --------------------------------------------------------------------------------------------------
# The pure rules, one step at a time


@given(state=st.one_of(st.none(), states), status=statuses, retry_after=retry_afters,
       end=st.floats(T0 - 5000, T0 + 5000), sent_before=st.one_of(st.none(), st.floats(0, 5000)))
@example(state=HostState(next_allowed=T0 + 100, consec=3), status=200, retry_after=None, end=T0, sent_before=None)
@example(state=None, status=429, retry_after=math.inf, end=T0, sent_before=0.0)
def test_no_rule_ever_shortens_a_recorded_hold(state, status, retry_after, end, sent_before):
    sent_at = None if sent_before is None else end - sent_before
    decision = POLICY.after_response(state, status=status, end=end, retry_after=retry_after, sent_at=sent_at)
    old = state.next_allowed if state is not None else 0.0
    assert decision.state.next_allowed >= old
    assert decision.state.next_allowed >= end + POLICY.host_interval  # every response is followed by eff
    assert math.isfinite(decision.state.next_allowed)
    assert decision.state.next_allowed <= max(old, end + max(POLICY.max_retry_after, POLICY.max_backoff, 600.0))
    assert POLICY.finish_address(state, end=end, ip_interval=IP_INTERVAL).next_allowed >= max(old, end + 2.0)
    assert POLICY.reserve(state, start=end, interval=1.0).next_allowed >= old
    for delay in (0.0, 1.0, 90.0):
        updated = POLICY.robots_delay_update(state, delay, now=end)
        if updated is not None:
            assert updated.next_allowed >= old


@given(state=states, status=st.sampled_from([200, 201, 204, 301, 304, 404, 410, 500]),
       end=st.floats(T0, T0 + 5000), stale=st.booleans())
def test_decay_is_one_step_per_success(state, status, end, stale):
    """A response that is no throttle takes exactly one step off (never below 0) — unless it was sent
    before the last throttle was recorded, when it says nothing about the host's mood since (no step)."""
    assume(not POLICY.is_throttle(status, state))
    sent_at = state.throttled_at - 1.0 if stale else state.throttled_at + 0.5
    assume(not stale or state.throttled_at > 0)
    decision = POLICY.after_response(state, status=status, end=end, sent_at=sent_at)
    want = state.consec if stale else max(state.consec - 1, 0)
    assert decision.state.consec == want
    assert not decision.throttle and not decision.counted


@given(state=st.one_of(st.none(), states), sent=st.floats(T0 - 1000, T0 + 1000),
       responses=st.lists(st.tuples(st.sampled_from([429, 503, 429, 200, 404, None]), retry_afters,
                                    st.one_of(st.floats(0.001, 600), st.floats(-600, 0))),
                          min_size=1, max_size=8),
       later_jump=st.floats(-600, 600))
@example(state=None, sent=T0, responses=[(429, None, 1.0), (429, None, 2.0)], later_jump=0.0)
@example(state=HostState(consec=2, ok_seen=True), sent=T0, responses=[(None, None, 1.0), (503, 10.0, 1.5)],
         later_jump=0.0)
@example(state=None, sent=T0, responses=[(429, None, -30.0), (429, None, 1.0)], later_jump=0.0)  # clock went back
def test_concurrent_throttles_take_one_step(state, sent, responses, later_jump):
    """Requests in flight together, all sent at ``sent`` after the last recorded throttle, answer for one
    moment of the host's mood: however many throttles come back, in whatever order, with whatever successes
    among them, the backoff takes at most one step — exactly one when a status throttle is among them. Also
    when the clock jumped back while they were in flight (a response "ends" before its request was sent)."""
    assume(state is None or state.throttled_at < sent)
    current = state
    for status, retry_after, after in responses:
        current = POLICY.after_response(current, status=status, end=sent + after + later_jump,
                                        retry_after=retry_after, sent_at=sent).state
    start = state.consec if state is not None else 0
    throttles = [s for s, _, _ in responses if s is None or s in POLICY.throttle_statuses]
    status_throttles = [s for s in throttles if s is not None]
    if not throttles:  # only successes: they decay, one step each
        successes = len(responses)
        assert current is not None and current.consec == max(start - successes, 0)
        return
    assert current is not None
    first_throttle = next(i for i, (s, _, _) in enumerate(responses) if s is None or s in POLICY.throttle_statuses)
    decayed = max(start - first_throttle, 0)  # successes before the first throttle decay as usual
    # No dead steps (docs/spec.md §2): at the cap (eff × 2^consec ≥ 300 s, or the exponent's 10) no step is added.
    eff = max(1.0, state.crawl_delay if state is not None else 0.0)
    steps = 1 if decayed == 0 or (decayed < 10 and eff * 2.0 ** decayed < 300.0) else 0
    if status_throttles and responses[first_throttle][0] is not None:
        assert current.consec == decayed + steps, (start, responses, current)
    else:
        assert decayed <= current.consec <= decayed + steps, (start, responses, current)


@given(state=states, now=st.floats(T0 - 1000, T0 + 1000), wait=st.floats(1e-6, 1e7),
       other_wait=st.floats(1e-6, 1e7), override=st.one_of(st.none(), st.sampled_from([0.0, 5.0, 60.0, 61.0, 900.0])))
@example(state=HostState(), now=T0, wait=1e6, other_wait=1e-3, override=None)
@example(state=HostState(consec=1), now=T0, wait=1e-3, other_wait=1e6, override=None)
def test_deferral_is_decided_by_cause_not_duration(state, now, wait, other_wait, override):
    """The verdict of a host that is not yet due depends on why it waits (a throttle, a long published delay
    or override, a spent quota), never on how long: the same row with any other wait gets the same verdict."""
    a = POLICY.defer_verdict(replace(state, next_allowed=now + wait), now, override=override)
    b = POLICY.defer_verdict(replace(state, next_allowed=now + other_wait), now, override=override)
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert a.reason == b.reason
        assert a.due == now + wait and b.due == now + other_wait
    cause = state.consec > 0 or max(state.crawl_delay, override or 0.0) > POLICY.max_wait
    assert (a is not None) == cause
    if a is not None:
        assert a.reason == ("throttled" if state.consec > 0 else "crawl_delay")
    # A host that is due is never deferred, whatever its history.
    assert POLICY.defer_verdict(replace(state, next_allowed=now), now, override=override) is None


# --------------------------------------------------------------------------------------------------
# The pure rules over a whole timeline: several hosts on shared addresses


@dataclass
class Flight:
    host: str
    address: str | None
    start: float
    eff: float


events = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(HOSTS)),
    st.tuples(st.just("respond"), st.integers(0, 7), statuses, retry_afters),
    st.tuples(st.just("jump"), jumps),
), min_size=1, max_size=60)


@given(events=events)
@example(events=[("send", "a.test"), ("respond", 0, 200, None), ("jump", -3600.0), ("send", "a.test")])
@example(events=[("send", "a.test"), ("send", "c.test"), ("respond", 1, 429, 5.0), ("send", "b.test"),
                 ("jump", 3.0), ("send", "c.test")])
def test_a_timeline_keeps_per_host_and_per_ip_spacing(events):
    """Book, respond and jump the clock at random, as the glue does (one request in flight per host and per
    address in this process, booked only over free addresses): every booking of a host starts at least
    ``eff`` after the host's previous one and ``delay`` after its previous response; every booking of an
    address at least ``POLITE_IP_INTERVAL`` after the previous booking and the previous response on it,
    across all the hosts that share it; no write ever lowers a row."""
    rows: dict[str, HostState] = {}
    now = T0
    flights: list[Flight] = []
    last_start: dict[str, float] = {}
    last_free: dict[str, float] = {}  # host or ip key → earliest next start its last response allowed
    for event in events:
        if event[0] == "jump":
            now += event[1]
            continue
        if event[0] == "send":
            host = event[1]
            if any(f.host == host for f in flights):
                continue  # its line is taken
            busy = {ip_key(f.address) for f in flights if f.address is not None}
            free = [a for a in ADDRESSES[host] if ip_key(a) not in busy]
            if not free:
                continue  # every address has a request in flight: it waits for one
            booking = POLICY.book(rows.get(host), {a: rows.get(ip_key(a)) for a in free}, now=now,
                                  ip_interval=IP_INTERVAL)
            if not booking.booked:
                assert booking.start > now
                continue
            for key, state in booking.writes.items():
                row = host if key == "" else ip_key(key)
                assert state.next_allowed >= rows.get(row, HostState()).next_allowed
                rows[row] = state
            assert booking.address is not None
            eff = POLICY.effective_interval(rows.get(host))
            for key in (host, ip_key(booking.address)):
                interval = eff if key == host else IP_INTERVAL
                if key in last_start:
                    assert now >= last_start[key] + interval - 1e-9, (key, now, last_start[key])
                if key in last_free:
                    assert now >= last_free[key] - 1e-9, (key, now, last_free[key])
                last_start[key] = now
            flights.append(Flight(host, booking.address, now, eff))
        else:
            if not flights:
                continue
            _, index, status, retry_after = event
            flight = flights.pop(index % len(flights))
            end = now
            old = rows.get(flight.host)
            decision = POLICY.after_response(old, status=status, end=end, retry_after=retry_after,
                                             sent_at=flight.start)
            assert decision.state.next_allowed >= (old.next_allowed if old else 0.0)
            rows[flight.host] = decision.state
            last_free[flight.host] = max(last_free.get(flight.host, 0.0), end + decision.delay)
            if flight.address is not None:
                key = ip_key(flight.address)
                before = rows.get(key)
                rows[key] = POLICY.finish_address(before, end=end, ip_interval=IP_INTERVAL)
                assert rows[key].next_allowed >= (before.next_allowed if before else 0.0)
                last_free[key] = max(last_free.get(key, 0.0), end + IP_INTERVAL)


# --------------------------------------------------------------------------------------------------
# The glue on a fake clock: processes sharing one pace table


class _Process:
    """The units of one crawl process (its own lines), on the shared store and clock."""

    def __init__(self, store: MemoryStore, clock: FakeClock) -> None:
        config = PoliteConfig.from_settings({"POLITE_HOST_INTERVAL": 1.0, "POLITE_IP_INTERVAL": IP_INTERVAL,
                                             "POLITE_MAX_WAIT": 60.0})
        self.lines = Lifecycle()
        self.stats = FakeStats()
        report = Report(self.stats)
        sync = ClockSync(clock, server_clock=False)
        self.errors: list[Any] = []
        self.resolution = FakeResolution({h: sorted(a) for h, a in ADDRESSES.items()})
        self.booker = Booker(config, store.open_async(), self.lines, self.resolution, report,  # type: ignore[arg-type]
                             sync, FakeSleep(clock), self.errors.append)
        self.recorder = Recorder(config, store.open_async(), self.lines, report, sync, self.booker.override,
                                 self.errors.append, "test-agent")
        self.booker.scheduler = FakeScheduler(True)


glue_events = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(0, 2), st.sampled_from(HOSTS)),
    st.tuples(st.just("respond"), st.integers(0, 7), statuses, retry_afters),
    st.tuples(st.just("jump"), jumps),
), min_size=1, max_size=40)


@given(events=glue_events, processes=st.integers(1, 3))
@example(events=[("send", 0, "a.test"), ("send", 1, "a.test"), ("respond", 0, 429, None),
                 ("respond", 0, 429, None), ("jump", 400.0), ("send", 0, "a.test")], processes=2)
def test_the_glue_keeps_the_invariants_across_processes(events, processes):
    """Random sends, responses and clock jumps through the real Booker and Recorder of up to three processes
    sharing one MemoryStore: the rows never go down, every Go starts no earlier than the host's and the
    address's rows allowed, a Defer names the row's cause (never a duration), and requests of one host in
    flight together take at most one backoff step."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    procs = [_Process(store, clock) for _ in range(processes)]
    flights: list[tuple[_Process, Request, str, float, int]] = []
    counter = 0
    for event in events:
        rows_before = dict(store.items())
        if event[0] == "jump":
            clock.advance(event[1])
            continue
        if event[0] == "send":
            proc = procs[event[1] % processes]
            host = event[2]
            busy = {ip_key(f[1].meta["polite_ip"]) for f in flights if f[0] is proc and f[1].meta.get("polite_ip")}
            if all(ip_key(a) in busy for a in ADDRESSES[host]):
                continue  # it would wait for an address's line: not an inline step
            counter += 1
            req = Request(f"http://{host}/{counter}", meta={"polite_host": host})
            row = store.get(host)
            verdict = POLICY.defer_verdict(row, clock())
            before = clock()
            outcome = inline(proc.booker.before_request(req, host))
            if isinstance(outcome, Defer):
                if outcome.reason == "throttled":
                    assert row is not None and row.consec > 0 and row.next_allowed > before
                elif outcome.reason == "crawl_delay":
                    assert row is not None and row.crawl_delay > POLICY.max_wait
                else:
                    assert outcome.reason in ("line", "ip_line"), outcome
                continue
            assert isinstance(outcome, Go)
            assert verdict is None, f"a request of a host that should defer ({verdict}) went"
            host_row = rows_before.get(host)
            if host_row is not None:
                assert outcome.sent_at >= host_row.next_allowed - 1e-9
            if outcome.address is not None:
                ip_row = rows_before.get(ip_key(outcome.address))
                if ip_row is not None:
                    assert outcome.sent_at >= ip_row.next_allowed - 1e-9
                req.meta["polite_ip"] = outcome.address
                proc.resolution.pin(req, host, outcome.address)
            req.meta["polite_sent_at"] = outcome.sent_at
            consec = host_row.consec if host_row is not None else 0
            flights.append((proc, req, host, outcome.sent_at, consec))
        else:
            if not flights:
                continue
            _, index, status, retry_after = event
            proc, req, host, sent_at, consec_at_send = flights.pop(index % len(flights))
            headers = {"Retry-After": _header(retry_after)} if retry_after is not None else {}
            if status is None:
                from twisted.internet.error import ConnectionRefusedError

                d = proc.recorder.record_failure(req, ConnectionRefusedError())
            else:
                d = proc.recorder.record_response(req, Response(req.url, status=status, headers=headers,
                                                                request=req))
            assert d is None or d.called
            inline(finish(proc, req))
            row = store.get(host)
            assert row is not None
            # A response answers for the moment its request was sent: one step above the backoff of that
            # moment at most, however many requests of the host were in flight with it.
            current = rows_before.get(host)
            assert row.consec <= max(current.consec if current else 0, consec_at_send + 1), (row, consec_at_send)
        for key, old in rows_before.items():
            new = store.get(key)
            assert new is not None and new.next_allowed >= old.next_allowed, (key, old, new)
    for proc in procs:
        assert proc.errors == []


def _header(retry_after: float) -> str:
    if math.isinf(retry_after):
        return "9" * 400
    return f"{retry_after:.3f}" if retry_after != int(retry_after) else str(int(retry_after))


# --------------------------------------------------------------------------------------------------
# The crashers these properties found, as regular tests


def test_a_throttle_recorded_at_the_moment_of_a_booking_answers_for_that_request_too():
    """Found by the glue property (two processes, a fake clock): a request booked at the very moment a throttle
    was recorded was in flight with it (a request booked after a throttle waits at least eff), so its own
    throttle takes no second step."""
    first = POLICY.after_response(None, status=429, end=T0 + 2, sent_at=T0).state
    assert (first.consec, first.throttled_at) == (1, T0 + 2)
    tie = POLICY.after_response(first, status=429, end=T0 + 2, sent_at=T0 + 2)
    assert tie.state.consec == 1 and not tie.counted
    # Negative control: a request booked after the throttle's hold is a new moment, and steps.
    later = POLICY.after_response(first, status=429, end=T0 + 5, sent_at=first.next_allowed)
    assert later.state.consec == 2 and later.counted


def test_a_clock_jumping_back_in_flight_does_not_compound_concurrent_throttles():
    """Found by the pure property: two requests sent at T0, the clock stepped back 30 s before the first
    429 came in. Its step's moment is T0 (its request's), not T0 - 30, so the second 429 is the same moment."""
    first = POLICY.after_response(None, status=429, end=T0 - 30, sent_at=T0).state
    assert first.consec == 1 and first.throttled_at == T0
    second = POLICY.after_response(first, status=429, end=T0 + 1, sent_at=T0)
    assert second.state.consec == 1 and not second.counted
    # Negative control: without the jump the moment is the response's end, as before.
    plain = POLICY.after_response(None, status=429, end=T0 + 3, sent_at=T0).state
    assert plain.throttled_at == T0 + 3
