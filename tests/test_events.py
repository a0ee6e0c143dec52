"""The event log's seam (scrapy_polite/reports/events.py): what each call records, with the store's time; batching off
the hot path (a timer, a batch size, a bound on pending writes; a failed batch is dropped and counted, never
stops the crawl); ``POLITE_EVENT_LOG`` on by default and off on request; SQLite batches written on a thread of
their own, never on the reactor's; several processes appending to one table lose nothing; the words of
:func:`~scrapy_polite.reports.events.describe`.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer

from scrapy_polite.clock import ClockSync
from scrapy_polite.pacer import find_pacer
from scrapy_polite.reports import events as events_module
from scrapy_polite.reports.events import EventLog, describe
from scrapy_polite.stores import Event, SQLiteStore
from scrapy_polite.stores.base import StoreUnavailable
from tests.support.crawl import ListSpider, polite_settings, run_crawl

ROOT = Path(__file__).resolve().parent.parent
T0 = 2_000_000_000.0


class Timers:
    """A fake ``call_later``: the calls are kept, run with :meth:`fire`."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def __call__(self, seconds, fn):
        entry = [seconds, fn, True]
        self.calls.append(entry)

        class Call:
            def cancel(self):
                if not entry[2]:
                    raise RuntimeError("already called")
                entry[2] = False

        return Call()

    def pending(self) -> list[float]:
        return [c[0] for c in self.calls if c[2]]

    def fire(self) -> None:
        for entry in list(self.calls):
            if entry[2]:
                entry[2] = False
                entry[1]()


class Writer:
    """Records the batches; ``fail`` makes them fail; ``hold`` leaves their Deferreds unfired."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self.fail = False
        self.error: Exception = StoreUnavailable("redis://x: connection refused")  # transient: written again
        self.hold = False
        self.pending: list[defer.Deferred] = []

    def append_events(self, events):
        self.batches.append(list(events))
        if self.fail:
            return defer.fail(self.error)
        if self.hold:
            d = defer.Deferred()
            self.pending.append(d)
            return d
        return defer.succeed(None)


def make(writer=None, *, offset: float = 0.0, **kwargs):
    clock = ClockSync(lambda: T0 + 100, server_clock=True)
    clock.offset = offset
    timers = Timers()
    stats: dict[str, float] = {}

    def inc(key, count):
        stats[key] = stats.get(key, 0) + count

    log = EventLog(writer if writer is not None else Writer(), clock, call_later=timers, inc=inc, source="m:1",
                   **kwargs)
    return log, timers, stats


# --------------------------------------------------------------------------------------------------
# What each call records


def test_each_call_records_one_event_with_the_store_time():
    writer = Writer()
    log, timers, _ = make(writer, offset=2.5)  # this process's clock is 2.5 s ahead of the store's
    log.booking("a.example", "http://a.example/", at=T0, due=T0 + 1, address="192.0.2.1")
    log.wait("a.example", "http://a.example/x", 0.75)
    log.deferral("a.example", "http://a.example/y", "throttled", T0 + 110)  # due on this process's clock
    log.deferral("a.example", None, "line", None)
    log.robots_delay("a.example", 3.0)
    log.refusal("b.example", "http://b.example/", "non_public")
    assert writer.batches == []  # nothing written until the batch is due
    log.flush()
    (batch,) = writer.batches
    store_now = T0 + 100 - 2.5
    assert [e.seq for e in batch] == list(range(7))  # numbered in the order recorded (Event.seq)
    batch = [e._replace(seq=None) for e in batch]
    assert batch == [
        Event(T0, "opened", "", source="m:1"),  # the log's first event is its opening
        Event(T0, "booking", "a.example", "http://a.example/", delay=1.0, due=T0 + 1, address="192.0.2.1",
              source="m:1"),
        Event(store_now, "wait", "a.example", "http://a.example/x", delay=0.75, due=store_now + 0.75, source="m:1"),
        Event(store_now, "deferral", "a.example", "http://a.example/y", delay=pytest.approx(10.0),
              due=T0 + 107.5, reason="throttled", source="m:1"),
        Event(store_now, "deferral", "a.example", None, reason="line", source="m:1"),
        Event(store_now, "robots_delay", "a.example", delay=3.0, due=store_now + 3.0, source="m:1"),
        Event(store_now, "refusal", "b.example", "http://b.example/", reason="non_public", source="m:1"),
    ]


def test_a_counted_throttle_is_a_response_and_a_backoff_step():
    writer = Writer()
    log, _, _ = make(writer)
    common = dict(at=T0 + 1, retry_after=5.0, delay=5.0, due=T0 + 6, steps=2, started=T0)
    log.response("a.example", "http://a.example/", status=429, failure=None, throttle=True, counted=True, **common)
    log.response("a.example", "http://a.example/2", status=429, failure=None, throttle=True, counted=False, **common)
    log.response("a.example", "http://a.example/3", status=200, failure=None, throttle=False, counted=False,
                 **{**common, "retry_after": None, "steps": 1})
    log.response("a.example", "http://a.example/4", status=None, failure="TimeoutError", throttle=True, counted=True,
                 **{**common, "retry_after": None})
    log.flush()
    kinds = [(e.kind, e.status, e.reason) for e in writer.batches[0][1:]]  # (after the log's opening)
    assert kinds == [("response", 429, "throttle"), ("backoff", 429, "429"),
                     ("response", 429, "throttle_counted_before"),  # no second step for the same moment
                     ("response", 200, None),
                     ("failure", None, "TimeoutError"), ("backoff", None, "TimeoutError")]
    backoff = writer.batches[0][2]
    assert (backoff.delay, backoff.due, backoff.steps, backoff.retry_after, backoff.started) == (5.0, T0 + 6, 2, 5.0, T0)


def test_off_records_nothing():
    log = EventLog.off()
    log.booking("a.example", "u", at=T0, due=T0, address=None)
    log.wait("a.example", "u", 1.0)
    log.refusal("a.example", "u", "non_public")
    assert log._buffer == [] and log.enabled is False
    assert log.flush().called


# --------------------------------------------------------------------------------------------------
# Batching


def test_a_batch_is_written_one_interval_after_its_first_event():
    writer = Writer()
    log, timers, _ = make(writer, flush_interval=1.0)
    log.wait("a.example", None, 0.1)
    assert timers.pending() == [0.0]  # the log's opening and its first event: written at once
    timers.fire()
    log.wait("a.example", None, 0.2)
    log.wait("a.example", None, 0.3)
    assert timers.pending() == [1.0]  # one timer for the batch, not one per event
    timers.fire()
    assert [len(b) for b in writer.batches] == [2, 2]
    log.wait("a.example", None, 0.4)
    assert timers.pending() == [1.0]  # the next batch has its own timer
    timers.fire()
    assert [len(b) for b in writer.batches] == [2, 2, 1]


def test_a_full_batch_is_written_at_once():
    writer = Writer()
    log, timers, _ = make(writer, batch_size=3)
    log.wait("a.example", None, 0.1)
    timers.fire()  # (the log's opening and its first event, written at once)
    writer.batches.clear()
    for _ in range(3):
        log.wait("a.example", None, 0.1)
    assert timers.pending() == [0.0]  # the interval's timer replaced by an immediate one
    timers.fire()
    assert [len(b) for b in writer.batches] == [3]


def two_failed_batches(writer: Writer, error: Exception, caplog: Any) -> tuple[EventLog, Timers, dict[str, float]]:
    """A log whose first two batches (the opening and a wait, then a wait) fail with ``error``, logged at WARNING."""
    writer.fail, writer.error = True, error
    log, timers, stats = make(writer)
    with caplog.at_level(logging.WARNING, logger="scrapy_polite.reports.events"):
        for _ in range(2):
            log.wait("a.example", None, 0.1)
            d = log.flush()
            assert d.called and d.result is None  # never fails: the crawl is not affected
    return log, timers, stats


def test_a_failed_batch_is_written_again_with_the_next_in_order(caplog):
    """Trial: Redis restarted within seconds, the batches written meanwhile were dropped, and the holes made the whole
    crawl's log impossible to audit. A failed batch is kept and written again before the next one, nothing counted as
    dropped; a retry is scheduled without a new event."""
    writer = Writer()
    log, timers, stats = two_failed_batches(writer, StoreUnavailable("redis://x: connection refused"), caplog)
    assert stats == {} and not [r for r in caplog.records if "event log" in r.getMessage()]
    timers.fire()  # fails again: kept, and written again later without a new event, the wait doubling
    assert timers.pending() == [4.0] and len(writer.batches) == 3  # (three failures: 1, 2, then 4 s)
    log.wait("a.example", None, 0.1)  # (review) a new event does not make the kept ones be written at once
    assert timers.pending() == [4.0] and len(writer.batches) == 3
    writer.fail = False
    timers.fire()
    assert [e.seq for e in writer.batches[-1]] == [0, 1, 2, 3]  # the log's opening and the waits, in order
    assert [e.kind for e in writer.batches[-1]] == ["opened", "wait", "wait", "wait"]
    log.flush()
    assert len(writer.batches) == 4  # nothing kept twice


def test_failed_batches_are_dropped_counted_and_warned_once_past_the_bound_or_at_close(caplog, monkeypatch):
    monkeypatch.setattr(events_module, "KEPT_MAX", 3)
    writer = Writer()
    writer.fail = True
    log, _, stats = make(writer)
    with caplog.at_level(logging.WARNING, logger="scrapy_polite.reports.events"):
        log.wait("a.example", None, 0.1)
        log.flush()  # 2 kept (the opening and the wait)
        assert stats == {}
        log.wait("a.example", None, 0.1)
        log.wait("a.example", None, 0.1)
        log.flush()  # 4 in the batch, over the bound of 3: dropped
        assert stats == {"events/dropped": 4}
        log.wait("a.example", None, 0.1)
        log.close()  # the wait and the closing mark: not kept after the close
    assert stats == {"events/dropped": 6}
    assert len([r for r in caplog.records if "event log" in r.getMessage()]) == 1


def test_events_kept_for_a_retry_do_not_fill_the_next_batch():
    """(review) With 1,000 events kept, each new event made the whole buffer be written at once: a write of every
    kept event per event logged. Only new events count toward a batch; the kept ones wait for their timer."""
    writer = Writer()
    writer.fail = True
    log, timers, _ = make(writer, batch_size=3)
    for _ in range(2):
        log.wait("a.example", None, 0.1)
    log.flush()  # the opening and the two waits: kept
    timers.calls.clear()
    log.wait("a.example", None, 0.1)
    assert timers.pending() == [] and len(writer.batches) == 1  # no write at once: one new event of 3
    log.wait("a.example", None, 0.1)
    log.wait("a.example", None, 0.1)
    assert timers.pending() == [0.0]  # three new events: a batch


def test_a_batch_failing_for_another_cause_is_dropped_counted_and_warned_once(caplog):
    """(review) Only a store unreachable or busy for now is worth a retry: a batch the store refuses for another
    cause (a value it cannot write, a file gone) would fail every later one with it."""
    writer = Writer()
    log, timers, stats = two_failed_batches(writer, RuntimeError("disk full"), caplog)
    assert stats == {"events/dropped": 3}  # (the log's opening, and the two)
    assert len([r for r in caplog.records if "event log" in r.getMessage()]) == 1
    writer.fail = False
    log.wait("a.example", None, 0.1)
    log.flush()
    assert stats == {"events/dropped": 3} and [e.kind for e in writer.batches[-1]] == ["wait"]  # control


def test_pending_writes_are_bounded():
    writer = Writer()
    writer.hold = True
    log, _, stats = make(writer, max_pending=2)
    for _ in range(3):
        log.wait("a.example", None, 0.1)
        log.flush()
    assert len(writer.batches) == 2 and stats == {}  # the third batch waits in the buffer
    writer.pending[0].callback(None)
    log.wait("a.example", None, 0.1)
    log.flush()
    assert len(writer.batches) == 3  # room again once a write completed
    assert [e.seq for e in writer.batches[-1]] == [3, 4]  # the one that waited, then the new one


def test_close_cancels_the_timer_and_writes_what_is_left():
    writer = Writer()
    log, timers, _ = make(writer)
    log.wait("a.example", None, 0.1)
    log.close()
    assert timers.pending() == [] and [[e.kind for e in b] for b in writer.batches] == [["opened", "wait", "closed"]]
    log.wait("a.example", None, 0.1)  # after close: kept until the next flush, no timer
    assert timers.pending() == []
    log.close()  # closed once
    assert [e.kind for e in writer.batches[-1]] == ["wait"]


def test_a_log_that_recorded_nothing_opens_and_closes_nothing():
    writer = Writer()
    log, _, _ = make(writer)
    log.close()
    assert writer.batches == []


# --------------------------------------------------------------------------------------------------
# In a crawl


@pytest_twisted.ensureDeferred
async def test_a_crawl_records_events_by_default_and_none_when_off(arrival_server):
    srv = arrival_server("127.0.0.2")
    srv.site(2)
    on = await run_crawl(ListSpider, polite_settings(POLITE_HOST_INTERVAL=0.05, POLITE_IP_INTERVAL=0),
                         urls=[srv.url("/")], follow=True)
    store = find_pacer(on).store.store
    events = store.events()
    assert {e.kind for e in events} >= {"booking", "response"}
    assert len([e for e in events if e.kind == "booking"]) == on.stats.get_value("polite/requests") == 3
    off = await run_crawl(ListSpider, polite_settings(POLITE_HOST_INTERVAL=0.05, POLITE_IP_INTERVAL=0,
                                                      POLITE_EVENT_LOG=False), urls=[srv.url("/")], follow=True)
    assert off.stats.get_value("polite/requests") == 3 and find_pacer(off).store.store.events() == []


@pytest_twisted.ensureDeferred
async def test_sqlite_batches_are_written_inline_on_the_reactor_thread(arrival_server, tmp_path, monkeypatch):
    """In a crawl the batches go through the no-wait connection on the reactor's thread (never through a
    thread that would hold the write lock the pace table's calls need: docs/spec.md §6), and the last one
    is written at the close. Negative control: no batch on any other thread."""
    srv = arrival_server("127.0.0.2")
    srv.site(3)
    threads: list[str] = []
    original = SQLiteStore.append_events

    def spy(self, events):
        threads.append(threading.current_thread().name)
        return original(self, events)

    monkeypatch.setattr(SQLiteStore, "append_events", spy)
    path = tmp_path / "pace.sqlite3"
    crawler = await run_crawl(ListSpider, polite_settings(POLITE_HOST_INTERVAL=0.05, POLITE_IP_INTERVAL=0,
                                                          POLITE_STORE=f"sqlite:///{path}"),
                              urls=[srv.url("/")], follow=True)
    assert threads and set(threads) == {threading.main_thread().name}, threads
    store = SQLiteStore(str(path))
    try:
        bookings = [e for e in store.events() if e.kind == "booking"]
        assert len(bookings) == crawler.stats.get_value("polite/requests") == 4  # the last batch written at close
    finally:
        store.close()


@pytest.mark.parametrize("size, expect", [(5, 5), ("5", 5)])
def test_the_cap_is_the_setting(size, expect):
    from scrapy_polite.settings import PoliteConfig

    config = PoliteConfig.from_settings({"POLITE_EVENT_LOG_SIZE": size})
    assert config.event_log_size == expect and config.event_log is True
    assert PoliteConfig.from_settings({}).event_log_size == 100_000


@pytest.mark.parametrize("bad", [0, -1, 2.5, "many", True])
def test_a_bad_cap_is_a_settings_error(bad):
    from scrapy_polite.settings import PoliteConfig, SettingsError

    with pytest.raises(SettingsError, match="POLITE_EVENT_LOG_SIZE"):
        PoliteConfig.from_settings({"POLITE_EVENT_LOG_SIZE": bad})


# --------------------------------------------------------------------------------------------------
# Several processes, one table

WORKER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from scrapy_polite.stores import Event, SQLiteStore

    path, go, name = sys.argv[1], sys.argv[2], sys.argv[3]
    store = SQLiteStore(path)
    while not os.path.exists(go):
        time.sleep(0.001)
    for batch in range(20):
        store.append_events([Event(time.time(), "wait", "a.example", steps=batch * 10 + i, source=name)
                             for i in range(10)])
    store.close()
""")


def test_processes_appending_to_one_table_lose_nothing(tmp_path):
    path = str(tmp_path / "pace.sqlite3")
    SQLiteStore(path).close()
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    go = tmp_path / "go"
    workers = [subprocess.Popen([sys.executable, str(script), path, str(go), f"p{n}"]) for n in range(4)]
    go.write_text("go")
    assert [w.wait(timeout=60) for w in workers] == [0, 0, 0, 0]
    store = SQLiteStore(path)
    try:
        events = store.events(limit=10_000)
    finally:
        store.close()
    assert len(events) == 800
    for n in range(4):
        mine = [e.steps for e in events if e.source == f"p{n}"]
        assert sorted(mine) == list(range(200))


# --------------------------------------------------------------------------------------------------
# The words


def test_describe_each_kind():
    e = Event
    assert describe(e(T0, "booking", "h", address="192.0.2.1", delay=1.0)) == "booked on 192.0.2.1, next allowed in 1.0 s"
    assert describe(e(T0, "booking", "h", reason="burst")) == "booked (burst)"
    assert describe(e(T0, "booking", "h", delay=-0.0001)) == "booked, next allowed now"  # never "in -0.0 s"
    assert describe(e(T0, "wait", "h", delay=0.75)) == "waits 0.8 s in line"
    assert describe(e(T0, "deferral", "h", reason="line")) == "deferred (line busy) until its line frees"
    assert describe(e(T0, "deferral", "h", reason="crawl_delay", delay=70.0, due=T0 + 70)).startswith(
        "deferred (Crawl-delay) for 70.0 s, until ")
    assert describe(e(T0, "deferral", "h", reason="throttled")) == "deferred (throttled)"
    assert describe(e(T0, "deferral", "h", reason="ratelimit")) == "deferred (rate limit)"
    assert describe(e(T0, "response", "h", status=200, delay=1.0)) == "200: delay chosen 1.0 s"
    assert describe(e(T0, "response", "h", status=503, delay=4.0, retry_after=4.0, reason="throttle", steps=2)) == (
        "503, Retry-After 4 s: delay chosen 4.0 s, a throttle, backoff steps 2")
    assert describe(e(T0, "failure", "h", reason="TimeoutError", delay=2.0, steps=1)) == (
        "TimeoutError (download failure): delay chosen 2.0 s, backoff steps 1")
    assert describe(e(T0, "backoff", "h", reason="429", delay=8.0, steps=3, due=T0 + 8)).startswith(
        "backoff step 3 (429): 8.0 s, until ")
    assert describe(e(T0, "robots_delay", "h", delay=3.0)) == "robots.txt delay 3 s adopted"
    assert describe(e(T0, "robots_delay", "h", delay=0.0)) == "robots.txt publishes no delay"
    assert describe(e(T0, "refusal", "h", reason="non_public")) == "refused (non-public)"
    assert describe(e(T0, "operator", "h", reason="reset")) == "operator: reset"
