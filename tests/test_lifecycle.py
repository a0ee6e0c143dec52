"""The request lifecycle as a state machine (docs/spec.md §5, "The request lifecycle"): a Hypothesis
``RuleBasedStateMachine`` over the real :class:`~scrapy_polite.scheduler.PoliteScheduler` (one request held
in memory per host at most, the rest on disk), :class:`~scrapy_polite.crawl.lifecycle.Lifecycle`,
:class:`~scrapy_polite.crawl.booking.Booker` and :class:`~scrapy_polite.crawl.recording.Recorder`, on the fake clock and
inline memory store of tests/test_glue.py, with a model of Scrapy's downloader (its ``active`` set).

Random steps: new requests of four hosts on shared addresses (some starting in backoff); the engine asking
for requests; each released request then booked (go, wait in line, or deferred back), dropped before
booking (``IgnoreRequest`` from robots.txt, offsite, a project middleware; a response from the cache), or
gone by a path no middleware saw; responses (2xx, 404, 429 + Retry-After, 503) and download failures; time
moving on; the wall clock stepping ± 60 s and − 1 h (the process clock must not follow it); the idle check;
the spider closing (every request then crawled, dropped, in the engine's hands, or reported as not
crawled).

After every step: no host waits with nothing that can wake it; no line or claim is held by a request that
has left the downloader (once reconciled); at most one request per host and per address in flight; per-host
and per-IP spacing of the bookings. At the end, with time moving on, every request ends crawled or dropped:
nothing stays held.
"""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import pytest_twisted
import scrapy
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from scrapy.http import Response
from twisted.internet import defer
from twisted.internet import error as txerror
from twisted.python.failure import Failure

from scrapy_polite import scheduler as scheduler_module
from scrapy_polite.clock import ClockSync, ProcessClock
from scrapy_polite.crawl import booking as booking_module
from scrapy_polite.crawl.booking import Booker
from scrapy_polite.crawl.lifecycle import Lifecycle, Stage
from scrapy_polite.crawl.recording import Recorder
from scrapy_polite.crawl.seams import Defer, Go
from scrapy_polite.policy import HostState, ip_key
from scrapy_polite.reports.counters import Report
from scrapy_polite.scheduler import PoliteScheduler
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import MemoryStore
from tests.support.scheduler_pacer import SchedulerPacer as StandInPacer
from tests.support.scheduler_pacer import Timer
from tests.test_glue import T0, FakeResolution, FakeSleep, FakeStats, finish, inline
from tests.test_held import make_crawler

HOST_INTERVAL, IP_INTERVAL = 1.0, 2.0
HOSTS = ["a.test", "b.test", "c.test", "d.test"]
ADDRESSES = {"a.test": ["192.0.2.1"], "b.test": ["192.0.2.2"], "c.test": ["192.0.2.1", "192.0.2.2"],
             "d.test": ["192.0.2.3"]}
EPS = 1e-6
#: What the machine patches, as imported (restored at every teardown).
ORIGINAL_CALL_LATER = scheduler_module.call_later
ORIGINAL_AWAIT = booking_module.await_deferred


async def await_plain(d: defer.Deferred[Any]) -> Any:
    """Await a Deferred inside a coroutine driven by ``defer.ensureDeferred`` (no asyncio loop)."""
    return await d


def inline_result(d: defer.Deferred[Any]) -> Any:
    """The result of a fired Deferred (its failure raised)."""
    out: list[Any] = []
    d.addBoth(out.append)
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


class SteppedClock:
    """The process clock (:class:`~scrapy_polite.clock.ProcessClock`) on a fake wall clock and a fake
    monotonic clock: :meth:`advance` moves time on (both), :meth:`step` steps only the wall clock (NTP, a VM
    resumed), which is also what ``time.time()`` returns while the machine runs."""

    def __init__(self) -> None:
        self.mono = 0.0
        self.wall_offset = T0
        self.process = ProcessClock(wall=self.wall, monotonic=lambda: self.mono)

    def wall(self) -> float:
        return self.mono + self.wall_offset

    def __call__(self) -> float:
        return self.process()

    def advance(self, seconds: float) -> None:
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.wall_offset += seconds


class SchedulerPacer(StandInPacer):
    """The units the scheduler takes from the pacer, the machine's own: its lifecycle, its booker, its clock."""

    def __init__(self, machine: LifecycleMachine) -> None:
        super().__init__(0.0, max_held_in_memory=1)  # its clock is the machine's; an embedded store's, the same
        self.m = machine
        self.lifecycle = machine.lifecycle
        self.booker = machine.booker

    def clock(self) -> float:
        return self.m.clock()

    def reconcile(self) -> int:
        ended = self.m.lifecycle.reconcile(self.m.active)
        self.m.vanished.clear()
        return ended


class Inner:
    """The wrapped scheduler: a FIFO of the spider's new requests."""

    def __init__(self) -> None:
        self.queue: list[scrapy.Request] = []

    def has_pending_requests(self) -> bool:
        return bool(self.queue)

    def enqueue_request(self, request: scrapy.Request) -> bool:
        self.queue.append(request)
        return True

    def next_request(self) -> scrapy.Request | None:
        return self.queue.pop(0) if self.queue else None

    def __len__(self) -> int:
        return len(self.queue)


class LifecycleMachine(RuleBasedStateMachine):
    """See the module docstring."""

    @initialize(backoffs=st.lists(st.sampled_from([0.0, 2.0, 5.0, 30.0]), min_size=len(HOSTS),
                                  max_size=len(HOSTS)))
    def setup(self, backoffs: list[float] | None = None) -> None:
        """``backoffs``: per host, seconds of backoff left from an earlier run (0: none), so that its
        requests are held from the start."""
        self._patched = True
        scheduler_module.call_later = lambda delay, fn, *a: Timer(delay)  # the test is the engine's poll
        # A booking that waits for a line resumes when the line frees, on plain Deferreds (no event loop).
        booking_module.await_deferred = await_plain
        self.clock = SteppedClock()
        self._time = mock.patch("time.time", self.clock.wall)  # a component reading the wall clock sees steps
        self._time.start()
        self.closed = False
        config = PoliteConfig.from_settings({"POLITE_HOST_INTERVAL": HOST_INTERVAL, "POLITE_IP_INTERVAL": IP_INTERVAL,
                                             "POLITE_MAX_WAIT": 60.0, "POLITE_MAX_RETRY_AFTER": 30.0})
        self.store = MemoryStore(clock=self.clock)
        now = self.clock()
        for host, seconds in zip(HOSTS, backoffs or [0.0] * len(HOSTS)):
            if seconds:
                state = HostState(next_allowed=now + seconds, consec=1, throttled_at=now, updated=now)
                self.store.update(host, lambda _old, _now, state=state: (state, None))
        astore: Any = self.store.open_async()
        self.lifecycle = Lifecycle()
        report = Report(FakeStats())
        sync = ClockSync(self.clock)
        self.resolution = FakeResolution(ADDRESSES)
        self.booker = Booker(config, astore, self.lifecycle, self.resolution, report, sync,  # type: ignore[arg-type]
                             FakeSleep(self.clock), lambda exc: None)
        self.recorder = Recorder(config, astore, self.lifecycle, report, sync, self.booker.override,
                                 lambda exc: None, "test-agent")
        self.crawler = make_crawler()
        self.pacer = SchedulerPacer(self)
        self.scheduler = PoliteScheduler(self.crawler, Inner(), self.pacer)  # type: ignore[arg-type]
        self.scheduler.open(self.crawler.spider)
        self.booker.scheduler = self.scheduler
        self.lifecycle.wake = self.scheduler.wake
        self.active: set[scrapy.Request] = set()  # Scrapy's Downloader.active
        self.vanished: set[scrapy.Request] = set()  # left the downloader by a path no middleware saw
        self.released: list[scrapy.Request] = []  # handed out, not yet through the middleware
        self.in_flight: list[scrapy.Request] = []
        self.booked_requests: list[scrapy.Request] = []
        self.waiting: list[scrapy.Request] = []  # booking in progress (waiting for an address's line)
        self.bookings: dict[str, list[float]] = {}  # host or ip: key → booking times
        self.created = 0
        self.ended = 0  # crawled (a final response or failure) or dropped

    def teardown(self) -> None:
        if hasattr(self, "_patched"):  # restored to the originals, whatever ran before
            scheduler_module.call_later = ORIGINAL_CALL_LATER
            booking_module.await_deferred = ORIGINAL_AWAIT
        if hasattr(self, "_time"):
            self._time.stop()
        if hasattr(self, "scheduler") and not self.closed:
            self.scheduler.close("finished")

    # -- the spider and the engine -------------------------------------------------------------------

    @precondition(lambda self: not self.closed)
    @rule(host=st.sampled_from(HOSTS), n=st.integers(1, 4))
    def new_request(self, host: str, n: int = 1) -> None:
        """The spider yields ``n`` requests of ``host``."""
        spider = self.crawler.spider
        for _ in range(n):
            self.created += 1
            self.scheduler.enqueue_request(scrapy.Request(f"http://{host}/{self.created}", callback=spider.parse,
                                                          errback=spider.on_error, dont_filter=True))

    @precondition(lambda self: not self.closed)
    @rule(n=st.integers(1, 4))
    def engine_asks(self, n: int = 1) -> None:
        """The engine asks for up to ``n`` requests (until the downloader is full or none is given)."""
        for _ in range(n):
            request = self.scheduler.next_request()
            if request is None:
                return
            self.active.add(request)
            self.released.append(request)

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0, 31.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: not self.closed)
    @rule(seconds=st.sampled_from([-60.0, 60.0, -3600.0]))
    def wall_clock_steps(self, seconds: float) -> None:
        """The wall clock steps (NTP, a VM resumed): nothing held may go early, nothing may stall."""
        self.clock.step(seconds)

    @precondition(lambda self: not self.closed)  # Scrapy closes a scheduler once
    @rule()
    def close(self) -> None:
        """The spider closes: every request ends crawled, dropped, or reported as not crawled."""
        held = self.scheduler.held_count()
        in_progress = len(self.active)  # released, waiting or in flight: the engine's at close
        self.scheduler.close("finished")
        self.closed = True
        reported = self.crawler.stats.get_value("polite/deferred/not_crawled") or 0
        assert reported == held, (reported, held)
        assert self.ended + held + in_progress + len(self.inner_pending()) == self.created, (
            self.ended, held, in_progress, self.created)

    def inner_pending(self) -> list[scrapy.Request]:
        return self.scheduler.inner.queue

    @precondition(lambda self: not self.closed)
    @rule()
    def reconcile_timer(self) -> None:
        """The extension's timer (once a second): the lifecycle reconciles with the downloader."""
        self.pacer.reconcile()

    @rule()
    def idle_check(self) -> None:
        """The extension's spider_idle: reconcile, then wake every parked host nothing holds back."""
        if self.active:
            return  # the engine is not idle while the downloader has requests
        self.pacer.reconcile()
        self.scheduler.unpark()
        earliest = self.scheduler.earliest_due()
        assert earliest is None or earliest != math.inf, (
            f"idle with every held host parked on nothing: {self.scheduler.describe()}")

    # -- the downloader middlewares ------------------------------------------------------------------

    @precondition(lambda self: self.released and not self.closed)
    @rule(i=st.integers(0, 20), fate=st.sampled_from(["book", "book", "book", "drop", "answer", "vanish"]))
    def through_the_middlewares(self, i: int, fate: str) -> None:
        request = self.released.pop(i % len(self.released))
        host = request.url.split("/")[2]
        if fate == "vanish":  # e.g. a middleware returned another request in its place: no hook ran
            self.active.discard(request)
            self.vanished.add(request)
            self.ended += 1
            return
        if fate in ("drop", "answer"):  # IgnoreRequest / a response before booking: the middleware drops it
            self.booker.end(request, dropped=True)
            self.active.discard(request)
            self.ended += 1
            return
        for key in ("polite_host", "polite_sent_at", "polite_ip", "_polite_pinned"):
            request.meta.pop(key, None)
        request.meta["polite_host"] = host
        d = defer.ensureDeferred(self.booker.before_request(request, host))
        if not d.called:  # waiting in line for an address (the first one waits; later ones defer)
            self.waiting.append(request)
            d.addCallback(self._booked, request, host)
            return
        self._booked(inline_result(d), request, host)

    def _booked(self, outcome: Go | Defer, request: scrapy.Request, host: str) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        if isinstance(outcome, Defer):
            self.scheduler.hold(request, host, outcome.due)
            self.active.discard(request)
            return
        assert isinstance(outcome, Go)
        request.meta["polite_sent_at"] = outcome.sent_at
        if outcome.address is not None:
            self.resolution.pin(request, host, outcome.address)
        now = self.clock.mono  # spacing is judged on time as it passed, whatever the wall clock did
        self.booked_requests.append(request)
        self.bookings.setdefault(host, []).append(now)
        if outcome.address is not None:
            self.bookings.setdefault(ip_key(outcome.address), []).append(now)
        self.in_flight.append(request)

    @precondition(lambda self: self.in_flight and not self.closed)
    @rule(i=st.integers(0, 20), status=st.sampled_from([200, 200, 200, 404, 429, 503, "failure"]),
          retry_after=st.sampled_from([None, "0", "1", "3"]))
    def download_ends(self, i: int, status: Any, retry_after: str | None) -> None:
        request = self.in_flight.pop(i % len(self.in_flight))
        if status == "failure":
            self.recorder.record_failure(request, txerror.ConnectionRefusedError())
        else:
            headers = {"Retry-After": retry_after} if retry_after is not None and status in (429, 503) else {}
            self.recorder.record_response(request, Response(request.url, status=status, headers=headers,
                                                            request=request))
        decision = inline(finish(self, request))
        self.active.discard(request)
        if decision is not None and decision.throttle and status != "failure":
            # the middleware's throttle retry: the same request is held until its host is due
            self.scheduler.hold(request, request.meta["polite_host"], decision.state.next_allowed)
            return
        self.ended += 1

    # -- the invariants ------------------------------------------------------------------------------

    @invariant()
    def nothing_waits_on_nothing(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for host, count, due in self.scheduler.held_hosts():
            if due == math.inf:
                assert self.lifecycle.parkable(host), (
                    f"{host} ({count} held) is parked until its line frees, but nothing holds it back")

    @invariant()
    def no_line_is_held_by_a_request_that_left(self) -> None:
        if not hasattr(self, "lifecycle"):
            return
        for key, request in self.lifecycle.holders():
            assert request in self.active or request in self.vanished, (
                f"{key} is held by {request} ({self.lifecycle.stage(request)}), which left the downloader")
            assert self.lifecycle.stage(request) not in (Stage.FINISHED, Stage.DROPPED, Stage.HELD)

    @invariant()
    def one_in_flight_per_host_and_address(self) -> None:
        if not hasattr(self, "in_flight"):
            return
        hosts = [r.meta["polite_host"] for r in self.in_flight]
        assert len(hosts) == len(set(hosts)), hosts
        addresses = [r.meta["polite_ip"] for r in self.in_flight if r.meta.get("polite_ip")]
        assert len(addresses) == len(set(addresses)), addresses

    @invariant()
    def bookings_are_spaced(self) -> None:
        if not hasattr(self, "bookings"):
            return
        for key, times in self.bookings.items():
            spacing = IP_INTERVAL if key.startswith("ip:") else HOST_INTERVAL
            for before, after in zip(times, times[1:]):
                assert after - before >= spacing - EPS, (key, times)


LifecycleMachine.TestCase.settings = hsettings(max_examples=40, stateful_step_count=50, deadline=None)
TestLifecycle = LifecycleMachine.TestCase


def test_everything_ends_crawled_or_dropped_once_time_moves_on():
    """A deterministic run of the machine's moves to its end: every request is eventually released and
    crawled; nothing stays held (the negative control of the idle assertion: a host parked forever)."""
    m = LifecycleMachine()
    m.setup([3.0, 3.0, 0.0, 5.0])
    try:
        for host in HOSTS * 3:
            m.new_request(host)
        fates = ["book", "drop", "answer", "vanish"]
        most_held = 0
        for step in range(400):
            m.engine_asks(4)
            most_held = max(most_held, m.scheduler.held_count())
            while m.released:
                m.through_the_middlewares(0, fates[step % len(fates)] if step > 20 else "book")
            if m.in_flight:
                m.download_ends(0, 200, None)
            m.time_passes(0.25)
            m.idle_check()
            m.nothing_waits_on_nothing()
            m.no_line_is_held_by_a_request_that_left()
            m.bookings_are_spaced()
        assert most_held >= 6, "too few requests were held: the run proves nothing"
        assert m.scheduler.held_count() == 0 and not m.released and not m.in_flight and not m.waiting
        assert m.ended == m.created == 12
    finally:
        m.teardown()


def test_a_host_whose_released_requests_are_dropped_one_by_one_is_never_parked_on_nothing():
    """The crawl of the issue in miniature: a.test starts in backoff with five requests, all held; once due,
    each released request is dropped before booking (robots.txt) or booked. The host is never parked with
    nothing to wake it, and every request ends without the idle check's help; one that leaves by a path no
    middleware saw is reclaimed at the extension's next reconcile (once a second).

    Fails when a released request does not claim its host, or a drop does not end the claim: the host is
    parked "until its line frees" after the first drop (``nothing_waits_on_nothing``)."""
    m = LifecycleMachine()
    m.setup([3.0, 0.0, 0.0, 0.0])
    try:
        m.new_request("a.test", 5)
        m.engine_asks(4)
        m.engine_asks(4)
        while m.released:
            m.through_the_middlewares(0, "book")  # every one deferred: the host backs off
        assert m.scheduler.held_count() == 5
        m.time_passes(3.0)
        fates = iter(["book", "drop", "vanish", "book", "answer", "drop"])
        for _ in range(20):
            m.engine_asks(4)
            assert len(m.released) <= 1, "a host's held requests are released one at a time"
            if m.released:
                m.through_the_middlewares(0, next(fates))
            m.nothing_waits_on_nothing()
            m.no_line_is_held_by_a_request_that_left()
            if m.in_flight:
                m.download_ends(0, 200, None)
            m.time_passes(1.0)
            m.reconcile_timer()
        assert m.scheduler.held_count() == 0 and m.ended == 5
        # /1 claimed the host as it was handed out: /2 to /5 were held behind it then, and it behind them when the
        # booking deferred it (backoff), so the fates fell on 2, 3, 4, 5, 1.
        assert [r.url for r in m.booked_requests] == ["http://a.test/2", "http://a.test/5"]
    finally:
        m.teardown()


def test_a_wall_clock_step_neither_releases_a_held_host_early_nor_stalls_it():
    """a.test starts 5 s in backoff with two requests, both held. The wall clock steps +60 s one second in
    (nothing may go before 5 s of time as it passed), or −60 s (nothing may stall past 5 s). Judged on the
    monotonic clock; fails when the pacing reads the wall clock."""
    for step in (60.0, -60.0):
        m = LifecycleMachine()
        m.setup([5.0, 0.0, 0.0, 0.0])
        try:
            m.new_request("a.test", 2)
            m.engine_asks(4)
            while m.released:
                m.through_the_middlewares(0, "book")
            assert m.scheduler.held_count() == 2 and not m.bookings
            m.time_passes(1.0)
            m.wall_clock_steps(step)
            while not m.bookings.get("a.test") and m.clock.mono < 20:
                m.time_passes(0.1)
                m.engine_asks(4)
                while m.released:
                    m.through_the_middlewares(0, "book")
            first = m.bookings["a.test"][0]
            assert 5.0 - 1e-6 <= first <= 5.2, (step, first)
        finally:
            m.teardown()


# ---------------------------------------------------------------------------------------------------
# The owner's bookkeeping (each found by a review, each failing on the code before its fix)


def test_reconcile_releases_the_reclaimed_requests_pin():
    """A request reclaimed by reconcile gives up its resolver pin too (the booking's release is called), or
    the resolver would answer only that address for its host for the rest of the crawl."""
    from tests.test_glue import book, glue, request

    g = glue(addresses={"a.example": ["192.0.2.1"]})
    ra = request("http://a.example/1")
    book(g, ra)
    assert g.resolution.pins[("a.example", "192.0.2.1")] == 1
    assert g.lines.reconcile({ra}, g.booker.release) == 0  # negative control: still in the downloader
    assert g.resolution.pins[("a.example", "192.0.2.1")] == 1
    assert g.lines.reconcile(set(), g.booker.release) == 1
    assert not g.lines.busy("a.example") and not g.lines.busy("ip:192.0.2.1")
    assert g.resolution.pins[("a.example", "192.0.2.1")] == 0


def test_lines_do_not_outlive_their_use():
    """A wait on several lines leaves its fired Deferred in the others' lists: those lines are still
    forgotten once free (the owner keeps only the lines in use)."""
    lc = Lifecycle()
    lc.wake = lambda host: None
    kept = []
    for i in range(100):
        r1, r2, waiter = (scrapy.Request(f"http://h{i}.example/1"), scrapy.Request(f"http://h{i}.example/2"),
                          scrapy.Request("http://x.example/"))
        k1, k2 = f"ip:192.0.{i}.1", f"ip:192.0.{i}.2"
        assert lc.take(k1, r1) and lc.take(k2, r2)
        d = lc.wait_for([k1, k2])  # every address busy: wait for either
        lc.free(r1, f"h{i}.example", k1)
        assert d.called and lc.take(k1, waiter)
        assert lc.lines_kept() == 2  # negative control: lines in use are kept
        lc.free(waiter, "x.example", k1)
        lc.free(r2, f"h{i}.example", k2)
        kept.append((r1, r2, waiter))
    assert not lc.holders() and lc.lines_kept() == 0


def test_the_reclaimed_stat_counts_requests():
    counted: list[float] = []
    lc = Lifecycle(inc=lambda key, count: counted.append(count))
    requests = [scrapy.Request(f"http://h{i}.example/") for i in range(3)]
    for i, r in enumerate(requests):
        lc.release(r, f"h{i}.example")
    assert lc.reconcile(set(requests[:1])) == 2
    assert sum(counted) == 2


def test_a_claim_is_ended_whatever_host_the_request_arrives_for():
    """The claim is the host the request was released for: it ends even when the request arrives for
    another key (a middleware that changed its URL in place)."""
    lc = Lifecycle()
    woken: list[str] = []
    lc.wake = woken.append
    r = scrapy.Request("http://a.example/")
    lc.release(r, "a.example")
    lc.arrive(r, "b.example")
    assert not lc.blocked("a.example") and woken == ["a.example"]


def test_a_claim_handed_to_the_hosts_line_wakes_the_host_only_when_the_line_frees():
    """A released request that arrives and takes its host's line (``take_line``) keeps the host blocked from its
    claim to its line: nothing is woken then (the wake would find the host blocked and cost the engine a turn),
    and the line's end wakes it. Negative controls: arriving without the line (a burst) wakes the host at once;
    a claim that ends while another request holds the line wakes nothing until that line frees."""
    lc = Lifecycle()
    woken: list[str] = []
    lc.wake = woken.append
    r1, r2, r3 = (scrapy.Request(f"http://a.example/{i}") for i in range(3))
    lc.release(r1, "a.example")
    assert lc.arrive(r1, "a.example", take_line=True) is True
    assert lc.blocked("a.example") and lc.holds("a.example", r1) and woken == []
    lc.release(r2, "a.example")  # another pass of the scheduler's (a fresh request) while r1 is in flight
    assert lc.arrive(r2, "a.example", take_line=True) is False  # the line is r1's: r2 waits for it
    assert woken == []
    lc.end(r1)
    assert woken == ["a.example"]
    lc.release(r3, "a.example")
    assert lc.arrive(r3, "a.example") is False  # no line asked for: the claim's end wakes the host
    assert woken == ["a.example", "a.example"] and not lc.blocked("a.example")


@pytest_twisted.ensureDeferred
async def test_the_pacers_reconcile_releases_the_reclaimed_requests_pin_and_hold():
    """The same through :meth:`Pacer.reconcile <scrapy_polite.pacer.Pacer.reconcile>`, the one the scheduler and
    the extension call: it must hand the booking's release to the lifecycle, or a reclaimed request keeps its pin
    (the resolver answers only that address for its host) and its in-flight hold in the table (docs/spec.md §3)."""
    from types import SimpleNamespace

    from scrapy.utils.test import get_crawler

    from scrapy_polite.pacer import Pacer
    from scrapy_polite.settings import PoliteConfig
    from scrapy_polite.stores import MemoryStore
    from tests.test_glue import FakeResolution, request

    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://", "POLITE_ALLOWED_NETWORKS": ["192.0.2.0/24"]})
    store = MemoryStore()
    pacer = Pacer(crawler, PoliteConfig.from_settings(crawler.settings), store.open_async())
    try:
        pacer.booker.resolution = resolution = FakeResolution({"a.example": ["192.0.2.1"]})
        active: set[Any] = set()
        crawler.engine = SimpleNamespace(downloader=SimpleNamespace(active=active))
        ra = request("http://a.example/1")
        active.add(ra)
        go = await pacer.booker.before_request(ra, "a.example")
        resolution.pin(ra, "a.example", go.address)  # what the middleware does with a Go
        assert resolution.pins[("a.example", "192.0.2.1")] == 1 and store.get("a.example").held_by != 0
        assert pacer.reconcile() == 0  # negative control: still in the downloader
        active.clear()  # it left by a path no middleware saw
        assert pacer.reconcile() == 1
        assert resolution.pins[("a.example", "192.0.2.1")] == 0
        assert store.get("a.example").held_by == 0 and store.get("ip:192.0.2.1").held_by == 0
    finally:
        pacer.close()


# -- every move is checked (docs/spec.md §5, "Every move is checked") --------------------------------------------


def test_a_legal_life_counts_nothing_and_a_new_pass_after_its_end_is_legal():
    counted: list[tuple[str, float]] = []
    lc = Lifecycle(inc=lambda key, n: counted.append((key, n)))
    r = scrapy.Request("http://a.example/")
    lc.held(r, "a.example")
    lc.release(r, "a.example")
    lc.arrive(r, "a.example")
    lc.booked(r)
    lc.sent(r)
    lc.end(r)
    lc.held(r, "a.example")  # a throttle retry: the same request held again after its end
    lc.release(r, "a.example")
    lc.arrive(r, "a.example")
    lc.sent(r)
    assert lc.stage(r) == Stage.IN_FLIGHT and counted == []


def test_an_illegal_move_raises_in_tests_and_is_counted_and_logged_once_at_warning_in_a_crawl(monkeypatch, caplog):
    from scrapy_polite.crawl import lifecycle as lifecycle_module
    from scrapy_polite.crawl.lifecycle import IllegalMove

    counted: list[tuple[str, float]] = []
    lc = Lifecycle(inc=lambda key, n: counted.append((key, n)))
    r1, r2 = scrapy.Request("http://a.example/1"), scrapy.Request("http://a.example/2")
    lc.held(r1, "a.example")
    try:
        lc.booked(r1)  # booked straight from held: it never arrived
    except IllegalMove:
        pass
    else:
        raise AssertionError("the tests run strict: an illegal move raises")
    assert counted == [("lifecycle/illegal", 1)]
    monkeypatch.setattr(lifecycle_module, "STRICT", False)  # as in a crawl
    caplog.set_level("DEBUG", logger="scrapy_polite.crawl.lifecycle")
    lc.held(r2, "a.example")
    lc.booked(r2)
    r3 = scrapy.Request("http://a.example/3")
    lc.held(r3, "a.example")
    lc.booked(r3)  # the same kind again: DEBUG
    assert lc.stage(r2) == Stage.BOOKED  # made all the same
    assert counted == [("lifecycle/illegal", 1)] * 3
    levels = [rec.levelname for rec in caplog.records if "does not allow" in rec.getMessage()]
    assert levels == ["WARNING", "DEBUG", "DEBUG"]  # the strict one was the first of its kind


def test_a_request_given_to_the_scheduler_again_while_in_the_downloader_ends_and_frees_its_host():
    """The same object enqueued again (a middleware after ours returned it, a spider yielded it twice) while it
    holds its host's line: it left by a path no middleware of ours saw, so it is dropped at once (its line freed,
    its host woken) and begins a new pass. Negative control: a new request is not touched."""
    from scrapy.utils.test import get_crawler

    from scrapy_polite.pacer import Pacer

    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://"})
    pacer = Pacer(crawler, PoliteConfig.from_settings(crawler.settings), MemoryStore().open_async())
    try:
        scheduler = PoliteScheduler(crawler, Inner(), pacer)  # type: ignore[arg-type]
        lc = pacer.lifecycle
        r, other = scrapy.Request("http://a.example/1"), scrapy.Request("http://b.example/1")
        lc.release(r, "a.example")
        lc.arrive(r, "a.example")
        assert lc.take("a.example", r) and lc.blocked("a.example")
        assert scheduler.enqueue_request(r) and scheduler.enqueue_request(other)
        assert lc.stage(r) == Stage.DROPPED and not lc.blocked("a.example")
        assert lc.stage(other) is None
        lc.release(r, "a.example")  # a new pass: legal (the tests run strict)
        lc.arrive(r, "a.example")
    finally:
        pacer.close()
