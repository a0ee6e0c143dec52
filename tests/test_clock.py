"""The process clock (docs/spec.md §5, §6; issue 16, item 4): a step of the wall clock during a crawl neither
releases a held request early nor stalls one for longer than the step.

* :class:`~scrapy_polite.clock.ProcessClock` on a fake wall clock and a fake monotonic clock: anchored once,
  never backwards, deaf to wall-clock steps;
* the pacer, the memory store and the scheduler on that clock (deterministic, no reactor): a host throttled
  for 30 s, its next request deferred, then the wall clock stepped by +60 s or −60 s ten seconds in: the
  request comes back when it is due by the monotonic clock, not before and not 60 s later. The negative
  control runs the same scenario on the wall clock (the code before this change) and sees the early
  release (+60) and the stall (−60);
* the embedded stores' own default clock ignores a step of ``time.time``;
* due times persisted under ``JOBDIR`` are in the store's clock and converted to the resuming process's;
* one end-to-end crawl (SQLite store) whose ``time.time`` is stepped while a request is held: the server-side
  arrival log shows the Retry-After kept (+60) and no stall (−60); on the wall clock (negative control) the
  held request goes at once after a +60 s step.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
import scrapy
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.internet import defer
from twisted.python.failure import Failure

from scrapy_polite import clock as clock_module
from scrapy_polite.clock import ProcessClock, process_clock
from scrapy_polite.crawl.held import HELD_DIR
from scrapy_polite.crawl.seams import Defer, Go
from scrapy_polite.pacer import Pacer
from scrapy_polite.policy import HostState, host_key
from scrapy_polite.scheduler import PoliteScheduler
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import MemoryStore, SQLiteStore
from scrapy_polite.stores.sqlite import marks as marks_module
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.scheduler_pacer import SchedulerPacer, no_timers
from tests.support.server import Reply, scripted
from tests.test_glue import finish

#: The fake wall clock's start (epoch s, 2033): far from time.time(), so a unit reading the real clock is caught.
T0 = 2_000_000_000.0
#: The wall-clock steps of the issue, seconds.
STEP = 60.0


class FakeTime:
    """A wall clock and a monotonic clock that move only when told: :meth:`advance` moves both (time
    passes), :meth:`step` moves the wall clock only (NTP, a VM resumed, ``date -s``)."""

    def __init__(self) -> None:
        self.wall_t = T0
        self.mono_t = 5_000.0  # seconds since an arbitrary origin (boot)

    def wall(self) -> float:
        return self.wall_t

    def monotonic(self) -> float:
        return self.mono_t

    def advance(self, seconds: float) -> None:
        self.wall_t += seconds
        self.mono_t += seconds

    def step(self, seconds: float) -> None:
        self.wall_t += seconds


class FakeSleep:
    """``sleep(seconds)``: lets that much time pass and returns a fired Deferred."""

    def __init__(self, time_: FakeTime) -> None:
        self.time = time_

    def __call__(self, seconds: float) -> defer.Deferred[None]:
        self.time.advance(seconds)
        return defer.succeed(None)


# ---------------------------------------------------------------------------------------------------
# ProcessClock


def test_the_process_clock_reads_epoch_seconds_and_ignores_wall_clock_steps():
    t = FakeTime()
    clock = ProcessClock(wall=t.wall, monotonic=t.monotonic)
    assert clock() == T0, "anchored on the wall clock at its first read"
    t.advance(2.5)
    assert clock() == T0 + 2.5, "it advances with the monotonic clock"
    t.step(+STEP)
    assert clock() == T0 + 2.5 and t.wall() - clock() == STEP, "a forward step does not move it"
    t.step(-2 * STEP)
    assert clock() == T0 + 2.5 and t.wall() - clock() == -STEP, "nor does a backward one"
    t.advance(1.0)
    assert clock() == T0 + 3.5
    # Negative control: the wall clock itself jumped both ways.
    assert t.wall() == T0 + 3.5 - STEP


def test_the_process_clock_is_anchored_once_at_its_first_read():
    t = FakeTime()
    clock = ProcessClock(wall=t.wall, monotonic=t.monotonic)
    t.advance(10.0)  # not read yet: the anchor is taken at the first read, not at construction
    t.step(+STEP)
    first = clock()
    assert first == T0 + 10.0 + STEP
    t.step(-STEP)
    t.advance(1.0)
    assert clock() == first + 1.0 and clock.anchor == T0 + STEP - 5_000.0


def test_the_process_clock_never_goes_backwards_on_the_real_clocks():
    readings = [process_clock() for _ in range(10_000)]
    assert all(b >= a for a, b in zip(readings, readings[1:]))
    # It reads like epoch seconds (2020..2096), not the monotonic clock's seconds since boot; not compared with
    # time.time(): the wall clock may have stepped since the anchor (CI's fresh machine stepped 11.4 s).
    assert 1.6e9 < process_clock() < 4e9 and abs(process_clock() - time.monotonic()) > 1e9


# ---------------------------------------------------------------------------------------------------
# The pacer, the store and the scheduler on the clock (deterministic)


class Inner:
    """A wrapped scheduler with a list of requests."""

    def __init__(self, requests: list[scrapy.Request]) -> None:
        self.requests = list(requests)

    def open(self, spider: Any) -> None:
        pass

    def close(self, reason: str) -> None:
        pass

    def has_pending_requests(self) -> bool:
        return bool(self.requests)

    def enqueue_request(self, request: scrapy.Request) -> bool:
        self.requests.append(request)
        return True

    def next_request(self) -> scrapy.Request | None:
        return self.requests.pop(0) if self.requests else None

    def __len__(self) -> int:
        return len(self.requests)


def inline(d: Any) -> Any:
    """The result of a coroutine that must complete without the reactor."""
    out: list[Any] = []
    defer.ensureDeferred(d).addBoth(out.append)
    assert out, "the step waited for something: it should have completed at once"
    if isinstance(out[0], Failure):
        out[0].raiseException()
    return out[0]


class ServerClockStore(MemoryStore):
    """A memory store standing in for a server store (Redis): a clock of its own, which the pacer maps
    with :class:`~scrapy_polite.clock.ClockSync`."""

    server_clock = True


def held_release(monkeypatch: pytest.MonkeyPatch, step: float, *, wall_clock: bool,
                 server: bool = False) -> tuple[float, float]:
    """A host throttled for 30 s (``Retry-After: 30``), its next request deferred and held; 10 s later the
    wall clock steps by ``step``; then the scheduler is polled every 0.25 s of real (monotonic) time and
    what it hands out is booked, until the request goes. ``server``: the table has a server's clock, 100 s
    behind this machine's and not stepped (a Redis server elsewhere).

    Returns:
        ``(due, sent)``: monotonic seconds after the deferral at which the request was due (the
        Retry-After), and at which it was sent (booked ``Go``).
    """
    no_timers(monkeypatch)
    t = FakeTime()
    clock = t.wall if wall_clock else ProcessClock(wall=t.wall, monotonic=t.monotonic)
    settings = {"POLITE_HOST_INTERVAL": 1.0, "POLITE_IP_INTERVAL": 0.0, "POLITE_MAX_WAIT": 60.0,
                "POLITE_MAX_HELD_IN_MEMORY": 10, "POLITE_ALLOW_PRIVATE": True}  # (the proxy's address is not asked)
    crawler = get_crawler(ListSpider, settings)
    crawler.spider = ListSpider()
    active: set[scrapy.Request] = set()  # the downloader's requests, for the lifecycle's reconcile
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(active=active), running=False)
    store = (ServerClockStore(clock=lambda: T0 - 100 + t.monotonic() - 5_000.0) if server
             else MemoryStore(clock=clock))
    pacer = Pacer(crawler, PoliteConfig.from_settings(crawler.settings), store.open_async(), clock=clock,
                  sleep=FakeSleep(t))
    proxy = {"proxy": "http://proxy.example:3128"}  # no addresses to resolve
    urls = ["http://a.example/1", "http://a.example/2"]
    scheduler = PoliteScheduler(crawler, Inner([scrapy.Request(u, meta=dict(proxy)) for u in urls]), pacer)
    scheduler.open(crawler.spider)
    host = "a.example"
    r1 = scheduler.next_request()
    assert r1 is not None
    active.add(r1)
    assert isinstance(inline(pacer.booker.before_request(r1, host)), Go)
    r1.meta["polite_host"] = host_key(r1.url)
    t.advance(0.2)
    pacer.recorder.record_response(r1, Response(r1.url, status=429, headers={"Retry-After": "30"}, request=r1))
    inline(finish(pacer, r1))
    active.discard(r1)
    r2 = scheduler.next_request()
    assert r2 is not None
    active.add(r2)
    r2.meta["polite_host"] = host
    outcome = inline(pacer.booker.before_request(r2, host))
    assert isinstance(outcome, Defer) and outcome.reason == "throttled"
    scheduler.hold(r2, host, outcome.due)
    active.discard(r2)
    deferred_at = t.monotonic()
    t.advance(10.0)
    t.step(step)
    while t.monotonic() - deferred_at < 200:
        request = scheduler.next_request()
        if request is not None:
            active.add(request)
            outcome = inline(pacer.booker.before_request(request, host))
            if isinstance(outcome, Go):
                return 30.0, t.monotonic() - deferred_at
            scheduler.hold(request, host, outcome.due)
            active.discard(request)
        t.advance(0.25)
    raise AssertionError("the held request never went")


@pytest.mark.parametrize("step", [+STEP, -STEP], ids=["forward", "backward"])
def test_a_wall_clock_step_neither_releases_a_held_request_early_nor_stalls_it(monkeypatch, step):
    due, sent = held_release(monkeypatch, step, wall_clock=False)
    assert sent >= due, f"released {due - sent:.2f} s early after a {step:+.0f} s step"
    assert sent <= due + 1.0, f"stalled {sent - due:.2f} s after a {step:+.0f} s step"


@pytest.mark.parametrize("step", [+STEP, -STEP], ids=["forward", "backward"])
def test_a_local_step_neither_releases_early_nor_stalls_on_a_server_clock(monkeypatch, step):
    """A server store (Redis): the offset to the server's clock is taken on the process clock, so a local
    step moves neither the offset nor the held request's local due time."""
    due, sent = held_release(monkeypatch, step, wall_clock=False, server=True)
    assert due <= sent <= due + 1.0, f"sent at {sent:.2f} s for a due time of {due} s after a {step:+.0f} s step"


def test_negative_control_on_a_server_clock_a_backward_local_step_stalls_the_wall_clock(monkeypatch):
    """On the wall clock the offset is right after the next read, but the held request's local due time
    was set before the step: a −60 s step holds it 60 s too long (a +60 s step only costs one more read:
    the server's clock books it)."""
    due, sent = held_release(monkeypatch, -STEP, wall_clock=True, server=True)
    assert sent >= due + STEP - 1.0, f"expected a stall by the step (sent at {sent:.2f} s)"
    due, sent = held_release(monkeypatch, +STEP, wall_clock=True, server=True)
    assert due <= sent <= due + 1.0


def test_negative_control_on_the_wall_clock_a_forward_step_releases_early(monkeypatch):
    due, sent = held_release(monkeypatch, +STEP, wall_clock=True)
    assert sent < due - 15, f"the wall clock was expected to release the request early (sent at {sent} s)"


def test_negative_control_on_the_wall_clock_a_backward_step_stalls_by_the_step(monkeypatch):
    due, sent = held_release(monkeypatch, -STEP, wall_clock=True)
    assert sent >= due + STEP - 1.0, f"the wall clock was expected to stall the request by the step (sent at {sent})"


def test_a_wall_clock_step_does_not_bring_a_booking_forward_or_push_it_back():
    """The booking alone (no scheduler): two requests of one host 1 s apart by the monotonic clock, whatever
    the wall clock does in between; on the wall clock (negative control) a +60 step books the second at once."""
    for wall_clock, step, want in [(False, +STEP, 1.0), (False, -STEP, 1.0), (True, +STEP, 0.0),
                                   (True, -STEP, 1.0 + STEP)]:
        t = FakeTime()
        clock = t.wall if wall_clock else ProcessClock(wall=t.wall, monotonic=t.monotonic)
        slept: list[float] = []

        def sleep(seconds: float, t: FakeTime = t, slept: list[float] = slept) -> defer.Deferred[None]:
            slept.append(seconds)
            t.advance(seconds)
            return defer.succeed(None)

        # No quota booking: r1 is never answered here, and a host's second booking waits for its first answer
        # while quotas are read (docs/spec.md §2, "Quota booking"); this test is about the clock alone.
        crawler = get_crawler(ListSpider, {"POLITE_HOST_INTERVAL": 1.0, "POLITE_MAX_WAIT": 120.0,
                                           "POLITE_RATELIMIT_HEADERS": False, "POLITE_ALLOW_PRIVATE": True})
        pacer = Pacer(crawler, PoliteConfig.from_settings(crawler.settings), MemoryStore(clock=clock).open_async(),
                      clock=clock, sleep=sleep)
        r1 = scrapy.Request("http://a.example/1", meta={"proxy": "http://p.example:1", "polite_host": "a.example"})
        r2 = scrapy.Request("http://a.example/2", meta={"proxy": "http://p.example:1", "polite_host": "a.example"})
        start = t.monotonic()
        assert isinstance(inline(pacer.booker.before_request(r1, "a.example")), Go)
        pacer.booker.release(r1, "a.example")
        t.step(step)
        assert isinstance(inline(pacer.booker.before_request(r2, "a.example")), Go)
        assert t.monotonic() - start == pytest.approx(want), (wall_clock, step, slept)


# ---------------------------------------------------------------------------------------------------
# The embedded stores' default clock


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_the_embedded_stores_now_ignores_a_step_of_time_time(monkeypatch, tmp_path, backend):
    store = MemoryStore() if backend == "memory" else SQLiteStore(str(tmp_path / "pace.sqlite3"))
    wall_store = MemoryStore(clock=lambda: time.time())  # negative control: the wall clock, read at each call
    try:
        real = time.time
        before, wall_before = store.now(), wall_store.now()
        for step in (+STEP, -STEP):
            monkeypatch.setattr(time, "time", lambda step=step: real() + step)
            now, wall_now = store.now(), wall_store.now()
            assert before <= now < before + 5.0, f"the store's now moved by the {step:+.0f} s step"
            assert abs((wall_now - wall_before) - step) < 5.0, "the negative control follows the step"
            before = now
            monkeypatch.setattr(time, "time", real)
        update_now = store.update("a.example", lambda state, now: (None, now))
        assert update_now >= before, "the now of a transaction never goes backwards"
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------------
# Due times persisted under JOBDIR: the store's clock


def test_held_due_times_are_persisted_in_the_stores_clock_and_converted_on_resume(monkeypatch, tmp_path):
    """A process 100 s ahead of the server holds a request due at local T0 + 30 (server T0 - 70): JOBDIR
    records the server's time; a resuming process 5 s *behind* the server holds it until its own T0 - 75."""
    no_timers(monkeypatch)
    crawler = get_crawler(ListSpider, {"JOBDIR": str(tmp_path)})
    crawler.spider = ListSpider()
    first = PoliteScheduler(crawler, Inner([]), SchedulerPacer(T0, offset=100.0))  # type: ignore[arg-type]
    first.open(crawler.spider)
    first.hold(scrapy.Request("http://a.example/1", callback=crawler.spider.parse), "a.example", T0 + 30)
    (directory,) = os.listdir(tmp_path / HELD_DIR)
    with open(tmp_path / HELD_DIR / directory / "host.json", encoding="utf-8") as f:
        assert json.load(f)["due"] == T0 - 70, "persisted in the store's clock"
    again = get_crawler(ListSpider, {"JOBDIR": str(tmp_path)})
    again.spider = ListSpider()
    pacer = SchedulerPacer(T0 - 200, offset=-5.0)
    second = PoliteScheduler(again, Inner([]), pacer)  # type: ignore[arg-type]
    second.open(again.spider)
    assert second.earliest_due() == T0 - 75, "converted to the resuming process's clock"
    pacer.now = T0 - 75.5
    assert second.next_request() is None
    pacer.now = T0 - 75
    request = second.next_request()
    assert request is not None and request.url == "http://a.example/1"
    second.close("finished")


# ---------------------------------------------------------------------------------------------------
# End to end: a real crawl whose wall clock steps while a request is held


async def crawl_with_a_step(arrival_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, address: str,
                            step: float, retry_after: int) -> tuple[float, Any]:
    """Three pages of one host, the first request answered 429 with ``Retry-After``; 1 s after that 429 was
    served (the host's requests are held by then), the crawl process's ``time.time`` steps by ``step`` (the
    server's log reads a clock no step moves: tests.support.server.clock). Returns the gap between the 429's end and the next arrival
    (the first held request released), by the server's log, and the crawler."""
    real = time.time
    srv = arrival_server(address)
    stepper = threading.Timer(1.0, lambda: monkeypatch.setattr(time, "time", lambda: real() + step))

    def throttle_then_step(info: Any, count: int) -> Reply:
        stepper.start()
        return Reply.throttle(429, str(retry_after))

    srv.route("/*", scripted(throttle_then_step))
    settings = polite_settings(POLITE_IP_INTERVAL=0, POLITE_STORE=f"sqlite:///{tmp_path}/pace.sqlite3")
    try:
        crawler = await run_crawl(ListSpider, settings, urls=[srv.url(f"/p/{i}") for i in range(3)], timeout=50)
    finally:
        stepper.cancel()
        stepper.join()
        monkeypatch.setattr(time, "time", real)
    hits = sorted((a for a in srv.arrivals() if a.path != "/robots.txt"), key=lambda a: a.start)
    assert [a.status for a in hits] == [429, 200, 200, 200], hits
    assert sorted(a.path for a in hits) == sorted(["/p/0", "/p/1", "/p/2", hits[0].path]), hits
    return hits[1].start - hits[0].end, crawler


@pytest_twisted.ensureDeferred
async def test_e2e_a_forward_step_does_not_release_a_held_request_early(arrival_server, monkeypatch, tmp_path):
    gap, crawler = await crawl_with_a_step(arrival_server, monkeypatch, tmp_path, "127.0.7.1", +STEP, 10)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert gap >= 10.0 - 0.02, f"the held request went {10.0 - gap:.2f} s early after a +60 s step"
    assert gap < 10.0 + 10.0


@pytest_twisted.ensureDeferred
async def test_e2e_a_backward_step_does_not_stall_a_held_request(arrival_server, monkeypatch, tmp_path):
    gap, crawler = await crawl_with_a_step(arrival_server, monkeypatch, tmp_path, "127.0.7.2", -STEP, 3)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert gap >= 3.0 - 0.02
    assert gap < 3.0 + 10.0, f"the held request stalled {gap - 3.0:.1f} s after a -60 s step"


@pytest_twisted.ensureDeferred
async def test_e2e_negative_control_on_the_wall_clock_a_forward_step_releases_early(arrival_server, monkeypatch,
                                                                                    tmp_path):
    """The same crawl with the process clock swapped back to the wall clock (``time.time()`` read at each
    call, as before): after the +60 s step (1 s after the 429) the held request goes at the engine's next
    poll (every 5 s), not 10 s after the 429."""
    monkeypatch.setattr(clock_module.ProcessClock, "__call__", lambda self: time.time())
    gap, _ = await crawl_with_a_step(arrival_server, monkeypatch, tmp_path, "127.0.7.3", +STEP, 10)
    assert gap < 8.0, f"the wall clock was expected to release the held request early (gap {gap:.2f} s)"


# ---------------------------------------------------------------------------------------------------
# One clock per SQLite file (docs/spec.md §6): processes anchored before and after a step agree


@pytest.fixture(autouse=True)
def _one_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every opener of this module's tables is on one boot, with no time namespace, whatever the system says."""
    monkeypatch.setattr(marks_module, "_boot_id", lambda: "test-boot")
    monkeypatch.setattr(marks_module, "_clock_key", lambda: "test-boot")


def _opener(path: str, t: FakeTime, *, mark: bool = True) -> SQLiteStore:
    """The table as a process anchored on ``t`` now opens it (a crawl leaves a mark; a command does not)."""
    clock = ProcessClock(wall=t.wall, monotonic=t.monotonic)
    assert clock() == t.wall()  # anchored now
    return SQLiteStore(path, clock=clock, mark=mark)


def _book(store: SQLiteStore, host: str, interval: float) -> None:
    store.update(host, lambda state, now: (HostState(next_allowed=now + interval, updated=now), None))


@pytest.mark.parametrize("step", [+STEP, -STEP], ids=["forward", "backward"])
@pytest.mark.parametrize("shared", [True, False], ids=["one-clock", "negative-control-own-clocks"])
def test_processes_anchored_before_and_after_a_step_read_one_table_clock(monkeypatch, tmp_path, step, shared):
    """A crawl books a host for 10 s; 2 s later the wall clock steps and a second crawl opens the file: it
    reads the table's time as the first does, so the host is 8 s off for both. With a clock each (a system
    that does not say which boot this is: the code before this change), the second reads the row ``step``
    seconds off: after a forward step it books at once (50 s early), after a backward one it waits 68 s."""
    if not shared:
        monkeypatch.setattr(marks_module, "_boot_id", lambda: "")
        monkeypatch.setattr(marks_module, "_clock_key", lambda: "")
    path = str(tmp_path / "pace.sqlite3")
    t = FakeTime()
    first = _opener(path, t)
    try:
        _book(first, "a.example", 10.0)
        t.advance(2.0)
        t.step(step)
        second = _opener(path, t)
        try:
            assert first.clock_offset == 0.0
            assert second.clock_offset == pytest.approx(step if shared else 0.0)
            snapshot = second.read(["a.example"])
            wait = snapshot.states["a.example"].next_allowed - snapshot.now
            assert wait == pytest.approx(8.0 if shared else 8.0 - step)
            assert abs(snapshot.now - first.now()) == pytest.approx(0.0 if shared else abs(step), abs=1e-6)
        finally:
            second.close()
    finally:
        first.close()


def test_the_first_crawl_to_open_a_file_nobody_has_open_sets_its_clock(tmp_path):
    """The anchor is kept while an opener of this boot runs; the next crawl to open the file when none runs
    writes its own (the table stays near the wall clock), the anchor of another boot goes, and a command
    (no mark) reads the clock of the crawl it finds."""
    path = str(tmp_path / "pace.sqlite3")
    t = FakeTime()
    _opener(path, t).close()
    db = sqlite3.connect(path)
    with db:
        db.execute("INSERT INTO clocks (boot, anchor) VALUES ('another-boot', 1.0)")
    db.close()
    t.step(STEP)
    crawl = _opener(path, t)  # nobody has the file open: its clock is this process's
    try:
        assert crawl.clock_offset == 0.0
        t.step(STEP)
        command = _opener(path, t, mark=False)
        try:
            assert command.clock_offset == pytest.approx(STEP) and command.now() == pytest.approx(crawl.now())
        finally:
            command.close()
        db = sqlite3.connect(path)
        try:
            boots = [boot for boot, in db.execute("SELECT boot FROM clocks")]
        finally:
            db.close()
        assert boots == ["test-boot"]
    finally:
        crawl.close()


@pytest_twisted.ensureDeferred
async def test_the_pacer_turns_a_shared_table_clock_into_its_own(tmp_path):
    """The second crawl's pacer maps the table's due times to its own clock by the fixed offset: the host
    booked for 10 s by the first crawl is due 8 s later by the second's clock, not 8 s + the step."""
    path = str(tmp_path / "pace.sqlite3")
    t = FakeTime()
    first = _opener(path, t)
    _book(first, "a.example", 10.0)
    t.advance(2.0)
    t.step(STEP)
    clock = ProcessClock(wall=t.wall, monotonic=t.monotonic)
    second = SQLiteStore(path, clock=clock, mark=True)
    crawler = get_crawler(ListSpider, {"POLITE_STORE": f"sqlite:///{path}"})
    pacer = Pacer(crawler, PoliteConfig.from_settings(crawler.settings), second.open_async(), clock=clock)
    try:
        assert pacer.sync.offset == pytest.approx(STEP) and not pacer.sync.server_clock
        due = await deferred_from_coro(pacer.booker.due("a.example"))
        assert due - clock() == pytest.approx(8.0)
    finally:
        pacer.close()
        first.close()


def test_a_crawl_that_finds_a_crash_mark_keeps_the_clock_of_the_crashed_crawl(tmp_path):
    """The crawl that crashed wrote its rows on the file's clock: the next one (a supervisor's restart after a
    step) reads them on it too, and only the crawl after a clean close sets the clock again."""
    path = str(tmp_path / "pace.sqlite3")
    t = FakeTime()
    crashed = _opener(path, t)
    _book(crashed, "a.example", 600.0)  # a long backoff, before the crash window (9 s before its last beat)
    crashed.close()
    db = sqlite3.connect(path)
    with db:  # the mark a killed process leaves: its pid runs no process
        db.execute("INSERT INTO openers (token, pid, machine, boot, started, opened, beat) VALUES "
                   "('gone', 999999999, ?, 'test-boot', 1, ?, ?)", (socket.gethostname(), T0, T0 + 9.0))
    db.close()
    t.advance(10.0)
    t.step(STEP)
    restarted = _opener(path, t)
    try:
        assert restarted.recovery is not None and restarted.clock_offset == pytest.approx(STEP)
        snapshot = restarted.read(["a.example"])
        assert snapshot.states["a.example"].next_allowed - snapshot.now == pytest.approx(590.0)
    finally:
        restarted.close()
    assert _opener(path, t).clock_offset == 0.0  # every opener closed cleanly: this crawl's clock
