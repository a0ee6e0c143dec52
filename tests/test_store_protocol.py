"""The store protocol (docs/spec.md §6, scrapy_polite.stores.base.PaceStore), one shared suite run over every
backend of :data:`tests.support.stores.BACKENDS` (memory, SQLite, Redis, a Redis Cluster).

What every backend must do: rows read and written whole (no lossy column); ``update`` / ``update_many``
apply ``fn(states, now)`` atomically with **the store's now**, write only keys they read, and change
nothing when ``fn`` raises; ``delete``, ``items`` sorted by key, ``expire``; a plausible ``now()``; and
the backend's own async table (:class:`~scrapy_polite.stores.AsyncStore`: Deferreds; fired at once when inline).
Then what only persistent backends have (reopen), a stepped store's updates waiting between their steps
on the reactor (not on a thread), and SQLite's contended path of its table.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import fields, replace
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from scrapy_polite.clock import process_clock
from scrapy_polite.policy import HostState
from scrapy_polite.stores import (
    Again,
    AsyncMemoryStore,
    AsyncSQLiteStore,
    AsyncStore,
    CallThreads,
    MemoryStore,
    Snapshot,
    SQLiteStore,
    SteppedStore,
    StoreClosed,
    StoreError,
    ThreadedStore,
    has_ability,
    open_async,
)
from tests.support.stores import (  # noqa: F401  (fixtures)
    T0,
    StoreUnderTest,
    any_store,
    clocked_store,
    persistent_store,
    set_up_under_way,
)

#: Every field away from its default, with awkward floats, to catch a lossy column.
FULL = HostState(next_allowed=T0 + 0.123456789, consec=7, crawl_delay=2.5, ok_seen=True,
                 throttled_at=T0 - 1e-6, updated=T0 + 1 / 3, ratelimit_interval=0.6 + 1e-9,
                 ratelimit_until=T0 + 12.000001, quota_left=3, quota_reset=T0 + 4.000001, quota_limit=5,
                 quota_window=4.5, quota_serial=41, booked=2**40 + 3, latency=0.05 + 1e-9, strain=3,
                 run_retry_after=3.000000001, held_until=T0 + 181.5000001, held_by=2**61 + 12345,
                 origin_delays='{"http://b\\u00fccher.example:8080 bot/1 (+\\"x\\")": 2.5, '
                               '"https://\u00e9t\u00e9.example ": 1e-07, "operator": 2.5}')
OTHER = HostState(next_allowed=T0 + 5, consec=1, updated=T0)


class Boom(Exception):
    """Raised by an update function."""


def put(store, key, state):
    store.update(key, lambda old, now: (state, None))


def rows(store):
    return list(store.items())


# --------------------------------------------------------------------------------------------------
# get / read


def test_full_sets_every_field_of_the_row():
    # A field added to HostState must be added to FULL, or no backend is checked for storing it.
    unset = [f.name for f in fields(HostState) if getattr(FULL, f.name) == f.default]
    assert unset == [], f"FULL leaves {unset} at their defaults: give them awkward values"


def test_get_missing_is_none_and_a_written_row_is_read_back_whole(any_store):
    store = any_store.store
    assert store.get("a.example") is None
    put(store, "a.example", FULL)
    assert store.get("a.example") == FULL
    assert store.get("b.example") is None  # negative control: keys are independent
    assert type(store.get("a.example").ok_seen) is bool
    assert type(store.get("a.example").consec) is int


def test_read_returns_every_key_asked_in_order_with_the_store_now(any_store):
    store = any_store.store
    put(store, "a.example", FULL)
    put(store, "ip:192.0.2.1", OTHER)
    before = store.now()
    snap = store.read(["ip:192.0.2.1", "missing.example", "a.example"])
    after = store.now()
    assert isinstance(snap, Snapshot)
    assert list(snap.states) == ["ip:192.0.2.1", "missing.example", "a.example"]
    assert snap.states == {"ip:192.0.2.1": OTHER, "missing.example": None, "a.example": FULL}
    assert before <= snap.now <= after
    one = store.read(["a.example"])
    assert one.states == {"a.example": FULL} and before <= one.now


def test_read_now_is_the_injected_clock(clocked_store):
    store, clock = clocked_store.store, clocked_store.clock
    assert store.read(["a.example"]).now == T0
    assert store.read(["a.example", "b.example"]).now == T0
    clock.advance(2.5)
    assert store.read(["a.example"]).now == T0 + 2.5  # negative control: not a constant
    assert store.read(["a.example", "b.example"]).now == T0 + 2.5
    assert store.now() == T0 + 2.5


# --------------------------------------------------------------------------------------------------
# update


def test_update_passes_the_current_state_and_returns_the_result(any_store):
    store = any_store.store
    seen = []

    def bump(old, now):
        seen.append(old)
        return (replace(old, consec=old.consec + 1) if old else FULL), len(seen)

    assert store.update("a.example", bump) == 1
    assert store.update("a.example", bump) == 2
    assert seen == [None, FULL]
    assert store.get("a.example") == replace(FULL, consec=8)


def test_update_returning_none_writes_nothing(any_store):
    store = any_store.store
    assert store.update("a.example", lambda old, now: (None, "kept")) == "kept"
    assert store.get("a.example") is None and rows(store) == []  # no row created
    put(store, "a.example", FULL)
    assert store.update("a.example", lambda old, now: (None, 1)) == 1
    assert store.get("a.example") == FULL  # an existing row untouched


def test_update_fn_receives_the_store_now(any_store):
    store = any_store.store
    seen = []
    before = store.now()
    store.update("a.example", lambda old, now: (None, seen.append(now)))
    store.update_many(["a.example", "b.example"], lambda states, now: ({}, seen.append(now)))
    after = store.now()
    assert len(seen) == 2 and all(before <= n <= after for n in seen)


def test_update_fn_receives_the_injected_clock(clocked_store):
    store, clock = clocked_store.store, clocked_store.clock
    seen = []
    store.update("a.example", lambda old, now: (replace(FULL, updated=now), seen.append(now)))
    clock.advance(0.75)
    store.update_many(["a.example", "ip:192.0.2.1"], lambda states, now: ({}, seen.append(now)))
    clock.advance(-0.25)  # the store takes its clock as it is, even when it steps back
    store.update("a.example", lambda old, now: (None, seen.append(now)))
    assert seen == [T0, T0 + 0.75, T0 + 0.5]
    assert store.get("a.example").updated == T0
    assert abs(seen[0] - time.time()) > 3600  # negative control: not the real clock


def test_update_that_raises_changes_nothing(any_store):
    store = any_store.store
    put(store, "a.example", FULL)

    def fail(old, now):
        raise Boom("no")

    with pytest.raises(Boom):
        store.update("a.example", fail)
    with pytest.raises(Boom):
        store.update("new.example", fail)
    assert rows(store) == [("a.example", FULL)]
    # The store is usable afterwards (no transaction left open).
    put(store, "a.example", OTHER)
    assert store.get("a.example") == OTHER


# --------------------------------------------------------------------------------------------------
# update_many


def test_update_many_passes_every_key_in_order_and_writes_what_fn_returns(any_store):
    store = any_store.store
    put(store, "a.example", FULL)
    put(store, "ip:192.0.2.2", OTHER)
    seen = []

    def fn(states, now):
        seen.append(dict(states))
        return {"ip:192.0.2.1": OTHER, "a.example": replace(FULL, consec=0)}, "result"

    keys = ["a.example", "ip:192.0.2.1", "ip:192.0.2.2"]
    assert store.update_many(keys, fn) == "result"
    assert [list(s) for s in seen] == [keys]
    assert seen[0] == {"a.example": FULL, "ip:192.0.2.1": None, "ip:192.0.2.2": OTHER}
    assert rows(store) == [("a.example", replace(FULL, consec=0)), ("ip:192.0.2.1", OTHER),
                           ("ip:192.0.2.2", OTHER)]  # a key read but not returned is untouched


def test_update_many_with_no_writes_changes_nothing(any_store):
    store = any_store.store
    put(store, "a.example", FULL)
    assert store.update_many(["a.example", "b.example"], lambda states, now: ({}, 3)) == 3
    assert rows(store) == [("a.example", FULL)]


@pytest.mark.parametrize("order", ["stray_last", "stray_first"])
def test_update_many_refuses_to_write_a_key_it_did_not_read(any_store, order):
    store = any_store.store
    put(store, "a.example", FULL)
    writes = [("a.example", OTHER), ("b.example", OTHER)]
    if order == "stray_first":
        writes.reverse()
    with pytest.raises(ValueError, match="did not read"):
        store.update_many(["a.example"], lambda states, now: (dict(writes), None))
    assert rows(store) == [("a.example", FULL)]  # nothing written, not even the key it read
    # Negative control: the same write of the keys it read goes through.
    store.update_many(["a.example", "b.example"], lambda states, now: (dict(writes), None))
    assert rows(store) == [("a.example", OTHER), ("b.example", OTHER)]


def test_update_many_pairs_each_key_with_its_own_row_however_the_keys_are_given(any_store):
    """``keys`` read once (an iterator) or as a tuple: each key is given its own row, and the writes of the keys read
    go through. Negative control: the same call with a list. An update function that returns no mapping of writes
    (None) fails with TypeError and writes nothing, on every store alike."""
    store = any_store.store
    put(store, "a.example", FULL)
    put(store, "b.example", OTHER)
    for given in (["a.example", "b.example"], ("a.example", "b.example"), iter(["a.example", "b.example"])):
        seen = store.update_many(given, lambda states, now: ({"b.example": states["a.example"]}, dict(states)))
        assert seen == {"a.example": FULL, "b.example": OTHER}, given
        assert rows(store) == [("a.example", FULL), ("b.example", FULL)], given
        put(store, "b.example", OTHER)
    with pytest.raises(TypeError):
        store.update_many(["a.example"], lambda states, now: (None, "ok"))
    assert rows(store) == [("a.example", FULL), ("b.example", OTHER)]


def test_update_many_that_raises_changes_nothing(any_store):
    store = any_store.store
    put(store, "a.example", FULL)

    def fail(states, now):
        raise Boom("no")

    with pytest.raises(Boom):
        store.update_many(["a.example", "ip:192.0.2.1"], fail)
    assert rows(store) == [("a.example", FULL)]
    store.update_many(["a.example"], lambda states, now: ({"a.example": OTHER}, None))
    assert store.get("a.example") == OTHER


def test_updates_are_not_lost_across_two_stores_on_the_same_rows(persistent_store):
    # Two store objects (two connections, two processes' view) interleaving read-modify-writes.
    first, second = persistent_store.store, persistent_store.open()
    bump = lambda old, now: (replace(old or HostState(), consec=(old.consec if old else 0) + 1), None)  # noqa: E731
    for _ in range(10):
        first.update("a.example", bump)
        second.update("a.example", bump)
    assert first.get("a.example").consec == 20 and second.get("a.example").consec == 20


# --------------------------------------------------------------------------------------------------
# delete / items / expire / now


def test_delete(any_store):
    store = any_store.store
    put(store, "a.example", FULL)
    put(store, "b.example", OTHER)
    assert store.delete("a.example") is True
    assert store.delete("a.example") is False  # negative control: no row, no deletion
    assert store.delete("never.example") is False
    assert rows(store) == [("b.example", OTHER)]


def test_items_sorted_by_key(any_store):
    store = any_store.store
    assert rows(store) == []
    keys = ["xn--bcher-kva.example", "ip:2001:db8::1", "b.example", "ip:192.0.2.1", "a.example", "192.0.2.9"]
    for i, key in enumerate(keys):
        put(store, key, replace(OTHER, consec=i))
    assert [k for k, _ in rows(store)] == sorted(keys)
    assert dict(rows(store)) == {key: replace(OTHER, consec=i) for i, key in enumerate(keys)}


def test_expire_removes_rows_idle_and_due_before_the_moment(any_store):
    store = any_store.store
    put(store, "stale.example", HostState(next_allowed=T0 - 5, updated=T0 - 10))
    put(store, "recent.example", HostState(next_allowed=T0 - 5, updated=T0))          # updated at the moment
    put(store, "held.example", HostState(next_allowed=T0 + 5, updated=T0 - 10))       # still held
    put(store, "due-now.example", HostState(next_allowed=T0, updated=T0 - 10))        # due at the moment
    put(store, "ip:192.0.2.1", HostState(next_allowed=T0 - 1, updated=T0 - 1))
    assert store.expire(T0) == 2
    assert [k for k, _ in rows(store)] == ["due-now.example", "held.example", "recent.example"]
    assert store.expire(T0) == 0  # negative control: nothing left to expire at that moment
    assert store.expire(T0 + 6) == 3


def test_now_is_close_to_the_real_clock_and_does_not_go_back(any_store):
    """A store's own clock reads Unix epoch seconds and never goes back: the embedded backends read the process
    clock (anchored on the wall clock, so a step of the wall clock during the run, as NTP makes on a fresh
    machine, does not move it: docs/spec.md §5), a Redis backend its server's clock (the wall clock here)."""
    store = any_store.open_on_own_clock()
    reads = [store.now() for _ in range(50)]
    assert all(b >= a - 0.001 for a, b in zip(reads, reads[1:]))
    real = process_clock() if any_store.backend.injectable_clock else time.time()
    assert abs(reads[0] - real) < 5.0
    assert abs(reads[0] - time.monotonic()) > 3600  # negative control: not seconds since boot


# --------------------------------------------------------------------------------------------------
# Persistent backends


def test_reopen_sees_what_was_written(persistent_store):
    put(persistent_store.store, "a.example", FULL)
    put(persistent_store.store, "ip:192.0.2.1", OTHER)
    persistent_store.store.delete("ip:192.0.2.1")
    put(persistent_store.store, "ip:192.0.2.2", OTHER)
    store = persistent_store.reopen()
    assert rows(store) == [("a.example", FULL), ("ip:192.0.2.2", OTHER)]
    # Negative control: another location has none of it.
    elsewhere = persistent_store.open(location=persistent_store.location + "-other")
    assert rows(elsewhere) == []


# --------------------------------------------------------------------------------------------------
# Each backend's own async table (AsyncStore)


def wrap(handle: StoreUnderTest) -> AsyncStore:
    store = handle.store
    # A server store on one thread, as before its own table: the suite's calls of one turn complete in call
    # order (a crawl's two threads overlap calls, each caller waiting for its own).
    astore = store.open_async(threads=1) if has_ability(store, CallThreads) else store.open_async()
    handle.adopt(astore)
    return astore


@pytest_twisted.ensureDeferred
async def test_async_store_returns_deferreds_of_the_results(any_store):
    astore = wrap(any_store)
    assert astore.uri == any_store.store.uri
    calls = [
        astore.update("a.example", lambda old, now: (FULL, "one")),
        astore.update_many(["a.example", "ip:192.0.2.1"],
                           lambda states, now: ({"ip:192.0.2.1": OTHER}, sorted(k for k, v in states.items() if v))),
        astore.get("a.example"),
        astore.read(["a.example", "ip:192.0.2.1", "nope"]),
    ]
    assert all(isinstance(d, defer.Deferred) for d in calls)
    if any_store.backend.grouped:
        assert not any(d.called for d in calls)  # one group, committed on the next reactor turn
    elif any_store.backend.inline_async:
        assert all(d.called for d in calls)  # inline: fired before the reactor turns
    one, many, got, snap = [await d for d in calls]
    if any_store.backend.grouped:
        assert astore.transactions == 1  # the four calls of the turn: one transaction
    assert (one, many, got) == ("one", ["a.example"], FULL)
    assert snap.states == {"a.example": FULL, "ip:192.0.2.1": OTHER, "nope": None}


@pytest_twisted.ensureDeferred
async def test_async_store_fn_receives_the_injected_clock(clocked_store):
    astore = wrap(clocked_store)
    clocked_store.clock.advance(1.25)
    seen = []
    await astore.update("a.example", lambda old, now: (None, seen.append(now)))
    await astore.update_many(["a.example"], lambda states, now: ({}, seen.append(now)))
    snap = await astore.read(["a.example"])
    assert seen == [T0 + 1.25, T0 + 1.25] and snap.now == T0 + 1.25


@pytest_twisted.ensureDeferred
async def test_async_store_failures_are_failed_deferreds_and_change_nothing(any_store):
    astore = wrap(any_store)
    await astore.update("a.example", lambda old, now: (FULL, None))

    def fail(old, now):
        raise Boom("no")

    with pytest.raises(Boom):
        await astore.update("a.example", fail)
    with pytest.raises(ValueError, match="did not read"):
        await astore.update_many(["a.example"], lambda states, now: ({"b.example": OTHER}, None))
    assert (await astore.read(["a.example", "b.example"])).states == {"a.example": FULL, "b.example": None}
    # Negative control: the adapter still works after the failures.
    assert await astore.update("a.example", lambda old, now: (OTHER, 7)) == 7
    assert await astore.get("a.example") == OTHER


def test_async_store_over_memory_is_inline():
    store = MemoryStore(clock=lambda: T0)
    astore = store.open_async()
    d = astore.update("a.example", lambda old, now: (FULL, now))
    assert d.called and d.result == T0  # no thread, no reactor turn
    assert store.get("a.example") == FULL
    astore.close()


def test_each_backend_opens_its_own_async_table_and_none_is_chosen_by_type(tmp_path):
    """Each backend hands out the async table it implements (``open_async``): memory's inline one, SQLite's
    group commit, a subclass's its base's. Nothing chooses a table by a backend's type: a backend of no known
    type gets the generic threaded table only by asking for it (``ThreadedStore(store)``); without an
    ``open_async`` it has none (negative control: ``open_async`` refuses it, naming the opt-in)."""
    class MyMemory(MemoryStore):
        pass

    sqlite = SQLiteStore(str(tmp_path / "pace.sqlite3"), clock=lambda: T0).open_async()
    memory, mine = MemoryStore().open_async(), MyMemory().open_async()
    other = SteppedMemory([])
    threaded = ThreadedStore(other)
    try:
        assert type(sqlite) is AsyncSQLiteStore and type(memory) is AsyncMemoryStore
        assert type(mine) is AsyncMemoryStore and mine.store.__class__ is MyMemory
        assert threaded.store is other
        with pytest.raises(StoreError, match="open_async"):
            open_async(other)  # type: ignore[arg-type]
    finally:
        for a in (sqlite, memory, mine, threaded):
            a.close()


# --------------------------------------------------------------------------------------------------
# A stepped store (Redis): the waits between an update's steps are on the reactor, not on a thread


class SteppedMemory:
    """A store of rows in memory (a MemoryStore within) whose updates run as steps, as a server store's: each
    update asks to wait ``delays`` (seconds) in turn, then applies. Records the thread of every step."""

    uri = "stepped-memory://"

    def __init__(self, delays):
        self.rows = MemoryStore(clock=lambda: T0)
        self.delays = list(delays)
        self.step_threads = []

    def get(self, key):
        return self.rows.get(key)

    def update(self, key, fn):
        return self.rows.update(key, fn)

    def close(self):
        self.rows.close()

    def update_steps(self, key, fn):
        store, waits = self, list(self.delays)

        class Steps:
            def step(self):
                store.step_threads.append(threading.current_thread().name)
                if waits:
                    return Again(waits.pop(0))
                return store.update(key, fn)

        return Steps()

    def update_many_steps(self, keys, fn):
        raise NotImplementedError


@pytest_twisted.ensureDeferred
async def test_a_stepped_update_waits_between_its_steps_on_the_reactor_not_on_a_thread():
    from twisted.internet import reactor

    store = SteppedMemory([0.0, 0.05])
    astore = ThreadedStore(store, threads=1)
    try:
        assert isinstance(store, SteppedStore)
        assert await astore.update("a.example", lambda old, now: (FULL, "done")) == "done"
        assert len(store.step_threads) == 3 and all("scrapy-polite-store" in t for t in store.step_threads)
        # An update waiting 30 s for its next step holds no thread: with one thread, another call completes.
        store.delays = [30.0]
        waiting = astore.update("b.example", lambda old, now: (OTHER, "late"))
        for _ in range(200):
            if len(store.step_threads) == 4:
                break
            await deferLater(reactor, 0.01, lambda: None)
        started = time.monotonic()
        assert await astore.get("a.example") == FULL
        assert time.monotonic() - started < 5.0 and not waiting.called
        timers = [c for c in reactor.getDelayedCalls() if c.getTime() > reactor.seconds() + 20]
        assert len(timers) == 1  # the update's next step, on the reactor's clock
    finally:
        await astore.close_async()
    # Closing stops the wait: its timer is cancelled and the update fails as closed (nothing left running).
    assert not timers[0].active()
    with pytest.raises(StoreError, match="closed"):
        await waiting
    assert store.get("b.example") is None


# --------------------------------------------------------------------------------------------------
# SQLite only: the adapter's contended path


@pytest_twisted.ensureDeferred
async def test_async_sqlite_waits_on_its_thread_when_another_writer_holds_the_lock(tmp_path):
    from twisted.internet import reactor  # installed by pytest-twisted (--reactor=asyncio)

    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        first = astore.update("a.example", lambda old, now: (FULL, "first"))
        second = astore.get("a.example")  # queued behind it: calls complete in call order
        assert not first.called and not second.called  # the inline try found the lock and handed over
        reactor.callLater(0.05, other.execute, "COMMIT")
        assert await first == "first"
        assert await second == FULL
        # Uncontended again: inline.
        third = astore.get("a.example")
        assert third.called and third.result == FULL
    finally:
        if other.in_transaction:  # never leave the store's thread waiting for the lock
            other.execute("ROLLBACK")
        other.close()
        astore.close()


# --------------------------------------------------------------------------------------------------
# The event log (append_events / events), on every backend


def ev(at, kind="booking", host="a.example", **fields):
    from scrapy_polite.stores import Event

    return Event(at, kind, host, **fields)


def test_events_round_trip_whole_in_order(any_store):
    from scrapy_polite.stores import Event

    store = any_store.store
    assert store.events() == []
    full = Event(T0 + 1 / 3, "response", "xn--bcher-kva.example", url="http://bücher.example/ä?q=1", status=429,
                 delay=3.000001, due=T0 + 3.123456789, reason="throttle", retry_after=3.0, steps=2,
                 address="2001:db8::1", started=T0 - 1e-6, source="machine:123")
    sparse = Event(T0 + 0.5, "wait", "b.example", delay=0.25)
    store.append_events([full, sparse])
    assert store.events() == [full, sparse]
    got = store.events()[0]
    assert type(got.status) is int and type(got.steps) is int and type(got.at) is float
    assert store.events()[1].url is None and store.events()[1].status is None  # absent fields stay None


def test_events_are_ordered_by_time_then_by_appending(any_store):
    store = any_store.store
    late, early, tie1, tie2 = ev(T0 + 5, reason="late"), ev(T0 + 1, reason="early"), ev(T0 + 3, reason="t1"), \
        ev(T0 + 3, reason="t2")
    store.append_events([late, tie1])
    store.append_events([early, tie2])  # another process's batch, appended later with older events
    assert [e.reason for e in store.events()] == ["early", "t1", "t2", "late"]
    assert [e.reason for e in store.events(limit=2)] == ["early", "t2"]  # the last appended, sorted by time


def test_events_filter_by_since_host_and_keep_the_latest_limit(any_store):
    store = any_store.store
    batch = [ev(T0 + i, host="a.example" if i % 2 else "b.example", steps=i) for i in range(10)]
    store.append_events(batch)
    assert [e.steps for e in store.events(since=T0 + 6)] == [6, 7, 8, 9]  # since is inclusive
    assert [e.steps for e in store.events(host="a.example")] == [1, 3, 5, 7, 9]
    assert [e.steps for e in store.events(host="a.example", since=T0 + 4)] == [5, 7, 9]
    assert [e.steps for e in store.events(limit=3)] == [7, 8, 9]  # the latest, oldest first
    assert [e.steps for e in store.events(host="b.example", limit=2)] == [6, 8]
    assert store.events(limit=0) == []
    assert store.events(host="c.example") == [] and store.events(since=T0 + 100) == []  # negative controls


def test_event_log_is_capped_by_deleting_the_oldest(any_store):
    store = any_store.open(events_max=5)
    store.append_events([ev(T0 + i, steps=i) for i in range(3)])
    store.append_events([ev(T0 + i, steps=i) for i in range(3, 8)])
    assert [e.steps for e in store.events()] == [3, 4, 5, 6, 7]
    store.append_events([ev(T0 + 8, steps=8)])
    assert [e.steps for e in store.events()] == [4, 5, 6, 7, 8]
    # Negative control: the default cap keeps all of them.
    roomy = any_store.open(location=any_store.location + "-roomy")
    roomy.append_events([ev(T0 + i, steps=i) for i in range(9)])
    assert len(roomy.events()) == 9


def test_event_log_is_shared_by_two_stores_on_the_same_table(persistent_store):
    first, second = persistent_store.store, persistent_store.open()
    for i in range(5):
        first.append_events([ev(T0 + 2 * i, source="p1")])
        second.append_events([ev(T0 + 2 * i + 1, source="p2")])
    assert [e.source for e in first.events()] == ["p1", "p2"] * 5
    assert first.events() == second.events()
    store = persistent_store.reopen()
    assert len(store.events()) == 10
    elsewhere = persistent_store.open(location=persistent_store.location + "-other")
    assert elsewhere.events() == []  # negative control: another table has its own log


def test_event_log_does_not_touch_the_rows(any_store):
    store = any_store.store
    put(store, "a.example", FULL)
    store.append_events([ev(T0, host="a.example"), ev(T0, host="events")])
    assert rows(store) == [("a.example", FULL)]  # no row named after an event or a host called "events"
    assert store.expire(T0 + 10**9) == 1 and rows(store) == []
    assert len(store.events()) == 2


@pytest_twisted.ensureDeferred
async def test_async_store_appends_events(any_store):
    astore = wrap(any_store)
    d = astore.append_events([ev(T0, steps=1), ev(T0 + 1, steps=2)])
    assert isinstance(d, defer.Deferred)
    assert await d is None
    await astore.update("a.example", lambda old, now: (FULL, None))  # the pace table still works beside it
    assert [e.steps for e in any_store.store.events()] == [1, 2]


@pytest_twisted.ensureDeferred
async def test_close_async_never_blocks_the_reactor_while_a_queued_call_waits(tmp_path):
    """A call on the store's thread that waits (here for another writer's lock; with Redis, a socket timeout
    in an outage) keeps the crawl's close off the reactor: the reactor runs meanwhile, and the close completes
    once the call is done. Negative control: the blocking ``close()`` holds the caller for that long."""
    import threading

    from twisted.internet import reactor, task

    path = str(tmp_path / "pace.sqlite3")
    for closing in ("async", "blocking"):
        astore = SQLiteStore(path, clock=lambda: T0).open_async()
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        queued = astore.update("a.example", lambda old, now: (FULL, "queued"))
        assert not queued.called  # on the store's thread, waiting for the lock
        ticks: list[float] = []  # a reactor timer every 20 ms: how many ran while the close waited
        loop = task.LoopingCall(_tick, ticks)
        loop.start(0.02)
        if closing == "async":
            reactor.callLater(0.5, other.execute, "COMMIT")  # runs only if the reactor is not blocked
            started = time.monotonic()
            await astore.close_async()
            ended = time.monotonic()
            loop.stop()
            assert await queued == "queued"
            assert ended - started >= 0.4
            # a count, not the longest gap (which a loaded machine stretches): about 25 unloaded
            assert len([t for t in ticks if started < t < ended]) >= 5, ticks
        else:
            threading.Timer(0.5, other.execute, ("COMMIT",)).start()
            started = time.monotonic()
            astore.close()
            ended = time.monotonic()
            loop.stop()
            assert ended - started >= 0.4  # the caller was held until the call was done
            assert [t for t in ticks if started < t < ended] == []  # and the reactor with it: no timer ran
        other.close()
    assert SQLiteStore(path).get("a.example") == FULL
    # Once closed, a late call fails cleanly (nothing restarts a thread).
    with pytest.raises(Exception, match="closed"):
        await astore.update("a.example", lambda old, now: (FULL, None))


@pytest_twisted.ensureDeferred
async def test_a_call_after_the_close_fails_as_closed_and_writes_nothing(any_store):
    """From the close on (the same reactor turn, while the close runs on another thread), every call fails
    with StoreClosed at once and never reaches the backend: nothing is written, no update function runs.
    Negative control: the same calls before the close are written."""
    astore = wrap(any_store)
    assert await astore.update("a.example", lambda old, now: (OTHER, "before")) == "before"  # the control
    ran: list[str] = []

    def late(old, now):
        ran.append("late")
        return FULL, None

    closing = astore.close_async()
    calls = [astore.update("a.example", late), astore.update_many(["a.example"], lambda s, now: ({}, ran.append("x"))),
             astore.get("a.example"), astore.read(["a.example"]), astore.append_events([ev(T0, steps=9)])]
    await closing
    calls += [astore.update("a.example", late), astore.append_events([ev(T0, steps=9)])]
    for d in calls:
        with pytest.raises(StoreClosed, match="is closed"):
            await d
    assert ran == [] and astore.closed
    if any_store.backend.persistent:  # what the table holds, read through a new connection
        other = any_store.open()
        assert other.get("a.example") == OTHER and other.events() == []
    else:
        assert any_store.store.get("a.example") == OTHER and any_store.store.events() == []
    astore.close()  # idempotent


def test_sqlite_close_waits_for_a_call_in_progress_on_another_thread_and_later_calls_fail_as_closed(tmp_path):
    """The close of a SQLite connection and a call on another thread never overlap: the close waits for the
    call (it commits whole), and a call after the close raises StoreClosed and writes nothing. Negative
    control: a call before the close is written."""
    import threading

    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, clock=lambda: T0)
    inside, release = threading.Event(), threading.Event()

    def slow(old, now):
        inside.set()
        assert release.wait(10)
        return FULL, "committed"

    results: list[str] = []
    writer = threading.Thread(target=lambda: results.append(store.update("a.example", slow)))
    writer.start()
    assert inside.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # held until the call in progress is done
    release.set()
    writer.join(10)
    closer.join(10)
    assert results == ["committed"] and not closer.is_alive()
    with pytest.raises(StoreClosed):
        store.update("a.example", lambda old, now: (OTHER, None))
    with pytest.raises(StoreClosed):
        store.append_events([ev(T0)])
    reopened = SQLiteStore(path)
    try:
        assert reopened.get("a.example") == FULL and reopened.events() == []
    finally:
        reopened.close()


def _tick(ticks: list[float]) -> None:
    ticks.append(time.monotonic())


@pytest_twisted.ensureDeferred
async def test_after_a_busy_call_the_held_calls_complete_in_order_and_run_inline_again(tmp_path):
    """The call that met another writer's lock goes to the store's thread; the calls made meanwhile wait
    on the reactor's side, complete in call order after it, and run inline (on the reactor's thread), not
    each through the thread. Negative control: the first one did run on the thread."""
    import threading

    from twisted.internet import reactor

    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async()
    other = sqlite3.connect(path, isolation_level=None)
    ran_on: dict[str, int] = {}
    done: list[str] = []

    def write(name):
        def fn(old, now):
            ran_on[name] = threading.get_ident()
            return FULL, name
        return fn

    try:
        other.execute("BEGIN IMMEDIATE")
        calls = [astore.update("a.example", write("first")), astore.get("a.example")]
        await deferLater(reactor, 0.01)  # their group met the lock: on the thread
        calls.append(astore.update("a.example", write("third")))  # a later turn: held behind it
        for name, d in zip(["first", "second", "third"], calls):
            d.addCallback(lambda result, name=name: done.append(name) or result)
        assert not any(d.called for d in calls)
        reactor.callLater(0.05, other.execute, "COMMIT")
        assert [await d for d in calls] == ["first", FULL, "third"]
        assert done == ["first", "second", "third"]
        assert ran_on["first"] != threading.get_ident()  # the busy one: on the store's thread
        assert ran_on["third"] == threading.get_ident()  # held, then inline again
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
        astore.close()


# --------------------------------------------------------------------------------------------------
# SQLite only: group commit (docs/spec.md §6, "Group commit")


@pytest_twisted.ensureDeferred
async def test_group_commit_one_callers_exception_loses_none_of_the_others_updates(tmp_path):
    """The calls of one reactor turn are one transaction; a caller whose function raises (or whose
    ``update_many`` writes a key it did not read) gets its own exception and writes nothing, the others'
    updates commit, each caller gets its own result, in call order, and each reads the writes of the calls
    before it. Negative control: the failed callers' rows are untouched."""
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async()
    order: list[str] = []

    def bump(name):
        def fn(old, now):
            return replace(old or HostState(), consec=(old.consec if old else 0) + 1), name
        return fn

    def fail(old, now):
        raise Boom("no")

    try:
        calls = [astore.update("a.example", bump("one")),
                 astore.update("b.example", fail),
                 astore.update("a.example", bump("three")),
                 astore.update_many(["a.example"], lambda states, now: ({"b.example": OTHER}, "stray")),
                 astore.update_many(["a.example", "c.example"],
                                    lambda states, now: ({"c.example": replace(OTHER, consec=states["a.example"].consec)},
                                                         "five")),
                 astore.get("a.example")]
        outcomes: list[Any] = []
        for i, d in enumerate(calls):
            d.addBoth(lambda result, i=i: order.append(str(i)) or outcomes.append(result))
        for d in calls:
            try:
                await d
            except Exception:
                pass
        assert order == [str(i) for i in range(6)]  # delivered in call order
        assert outcomes[0] == "one" and outcomes[2] == "three" and outcomes[4] == "five"
        assert isinstance(outcomes[1], Failure) and outcomes[1].check(Boom)
        assert isinstance(outcomes[3], Failure) and outcomes[3].check(ValueError)
        assert outcomes[5].consec == 2  # read after the two bumps of the group
        assert astore.transactions == 1  # one group
        other = SQLiteStore(path)  # what the file holds
        try:
            assert other.get("a.example").consec == 2
            assert other.get("c.example").consec == 2  # it read the third call's write
            assert other.get("b.example") is None  # the failed callers wrote nothing
        finally:
            other.close()
    finally:
        astore.close()


@pytest_twisted.ensureDeferred
async def test_group_commit_groups_only_the_calls_of_one_reactor_turn(tmp_path):
    """Calls of one turn: one transaction; calls of the next turn: the next. Negative control: a group is
    capped at ``group_max`` calls."""
    from twisted.internet import reactor

    astore = SQLiteStore(str(tmp_path / "pace.sqlite3"), clock=lambda: T0).open_async(group_max=4)
    try:
        first = [astore.update(f"h{i}.example", lambda old, now: (FULL, None)) for i in range(3)]
        await defer.gatherResults(first)
        assert astore.transactions == 1
        await deferLater(reactor, 0)
        second = [astore.update(f"h{i}.example", lambda old, now: (OTHER, None)) for i in range(10)]
        await defer.gatherResults(second)
        assert astore.transactions == 1 + 3  # 10 calls, at most 4 per group
        assert (await astore.get("h9.example")) == OTHER
    finally:
        astore.close()


# --------------------------------------------------------------------------------------------------
# SQLite only: when the WAL is checkpointed, and how the event log is written (docs/spec.md §6)


def _wal_pages(path: str) -> int:
    """The longest the WAL has been, in pages: its file's size (the file is reused, never cut, when the WAL
    starts over), a 32-byte header then 24 bytes and one 4096-byte page per frame."""
    return max(0, os.path.getsize(path + "-wal") - 32) // (4096 + 24)


def test_checkpoint_returns_the_wal_length_and_the_wal_starts_over_after_it(tmp_path):
    """``checkpoint()`` reports the WAL's frames and how many it copied back; after a complete one the next
    write starts the WAL over. Negative control: without a checkpoint the WAL only grows."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, clock=lambda: T0)
    inline = store.nowait()
    try:
        for i in range(40):
            put(inline, f"h{i}.example", FULL)
        frames, copied = store.checkpoint()
        assert frames >= 40 and copied == frames
        for i in range(5):
            put(inline, f"h{i}.example", OTHER)
        again, _ = store.checkpoint()
        assert 5 <= again < frames  # started over: only the 5 writes since
        for i in range(40):
            put(inline, f"h{i}.example", FULL)
        assert _wal_pages(path) >= frames  # the file keeps its longest length
    finally:
        inline.close()
        store.close()


def test_wal_pages_is_read_beside_the_real_file_behind_a_symbolic_link(tmp_path):
    """SQLite keeps the WAL beside the file a symbolic link points to; ``wal_pages`` looks there.
    Negative control: nothing is beside the link itself."""
    real = tmp_path / "data" / "pace.sqlite3"
    real.parent.mkdir()
    store = SQLiteStore(str(real), clock=lambda: T0)
    link = tmp_path / "link.sqlite3"
    link.symlink_to(real)
    linked = SQLiteStore(str(link), clock=lambda: T0)
    try:
        for i in range(30):
            put(linked, f"h{i}.example", FULL)
        assert not os.path.exists(str(link) + "-wal")
        assert linked.wal_pages() == store.wal_pages() == _wal_pages(str(real)) >= 30
    finally:
        linked.close()
        store.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("restart_frames", [2500, 10**9])
async def test_the_wal_is_checkpointed_about_every_restart_frames_pages(tmp_path, monkeypatch, restart_frames):
    """The first checkpoint comes once the WAL file has passed ``restart_frames`` pages (looked at every
    250 writes); the next ones after as many writes as made the WAL that long, so it stays near that
    length; the calls made during a checkpoint's second phase wait and complete in call order. Negative control: with a
    length out of reach, no checkpoint, no call held, a WAL as long as the writes."""
    from twisted.internet import reactor

    checkpoints: list[tuple[int, int]] = []
    original = SQLiteStore.checkpoint

    def spy(self, **kwargs):
        checkpoints.append(original(self, **kwargs))
        return checkpoints[-1]

    monkeypatch.setattr(SQLiteStore, "checkpoint", spy)
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async(restart_frames=restart_frames)
    writes = 4000
    held = 0
    order: list[int] = []
    try:
        for i in range(writes):
            d = astore.update(f"h{i % 7}.example", lambda old, now, i=i: (replace(FULL, consec=i), i))
            d.addCallback(order.append)
            await deferLater(reactor, 0)  # one update per reactor turn: one group, one transaction each
            held += not d.called  # still waiting after its turn: held by a checkpoint
        await d.addTimeout(30, reactor)  # the last call: calls complete in call order (a slow fsync may hold it)
        assert order == list(range(writes))  # whatever was held: in call order
        assert (await astore.get(f"h{(writes - 1) % 7}.example")).consec == writes - 1  # the last write
        if restart_frames == 2500:
            # Learned: not one every 250 writes (each checkpoint in one or two phases: the second copies the
            # pages written during the first, holding the calls).
            assert 2 <= len(checkpoints) <= 6 and held > 0, checkpoints
            assert checkpoints[0][0] > 2500  # the first: once the file had passed the length
            assert all(frames <= 2500 + 1000 for frames, _ in checkpoints), checkpoints  # the WAL started over
        else:
            assert checkpoints == [] and held == 0
            assert _wal_pages(path) >= writes - 10, _wal_pages(path)  # never started over
    finally:
        astore.close()


@pytest_twisted.ensureDeferred
async def test_a_checkpoint_never_holds_the_crawl_over_20000_bookings(tmp_path, monkeypatch):
    """20,000 bookings (a host row and an address row each, 1,000 hosts) made as a crawl makes them: 16 in
    flight, the next one a reactor turn after one completes. The WAL is checkpointed on the way, and while
    each checkpoint's first phase runs on the store's thread, the bookings go on: calls made after it began
    complete before it ends (the old checkpoint held every call for all of it): an order, which a loaded
    machine cannot flip. The longest wait of a call, from the call to its result on the reactor, is printed,
    not judged (a loaded machine stretches it; ``bench/wal.py`` measures it over a long crawl)."""
    from twisted.internet import reactor

    phases: list[tuple[float, float]] = []
    original = SQLiteStore.checkpoint

    def spy(self, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, **kwargs)
        finally:
            phases.append((started, time.perf_counter()))

    monkeypatch.setattr(SQLiteStore, "checkpoint", spy)
    astore = SQLiteStore(str(tmp_path / "pace.sqlite3")).open_async(restart_frames=2000)
    done: list[tuple[float, float]] = []  # (called, completed), perf_counter seconds
    count = [0]

    async def crawl_slot() -> None:
        while count[0] < 20_000:
            i = count[0]
            count[0] += 1
            host, address = f"h{i % 1000}.example", f"ip:10.0.{i % 4}.{i % 250}"

            def book(states, now, host=host, address=address):
                return {host: replace(FULL, next_allowed=now + 1, updated=now),
                        address: replace(OTHER, next_allowed=now + 0.5, updated=now)}, None

            called = time.perf_counter()
            await astore.update_many([host, address], book)
            done.append((called, time.perf_counter()))
            await deferLater(reactor, 0)  # the download, as short as can be

    try:
        await defer.gatherResults([defer.ensureDeferred(crawl_slot()) for _ in range(16)])
    finally:
        astore.close()
    longest = max(end - start for start, end in done)
    print(f"20,000 bookings: {astore.transactions} transactions, {len(phases)} checkpoint phases, "
          f"longest wait {longest * 1000:.1f} ms")
    assert len(done) == 20_000
    first_phases = [(a, b) for a, b in phases[:-1] if b - a > 0.002]  # the close's own checkpoint left out
    assert first_phases, phases  # the run met checkpoints (else it proves nothing)
    for start, end in first_phases[:1]:  # the first phase of the first checkpoint: the crawl went on
        assert any(start < called and completed < end for called, completed in done), (start, end)


@pytest_twisted.ensureDeferred
async def test_sqlite_event_batches_are_written_inline_in_chunks_one_per_reactor_turn(tmp_path, monkeypatch):
    """A batch is written on the reactor's thread through the no-wait connection, ``event_chunk`` events per
    transaction with a reactor turn between two, every event kept in order. Negative control: the first
    chunk is written before the call returns, the rest are not."""
    import threading

    from twisted.internet import reactor

    chunks: list[tuple[int, int]] = []
    original = SQLiteStore.append_events

    def spy(self, events):
        chunks.append((threading.get_ident(), len(events)))
        return original(self, events)

    monkeypatch.setattr(SQLiteStore, "append_events", spy)
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async(event_chunk=40)
    try:
        d = astore.append_events([ev(T0 + i, steps=i) for i in range(100)])
        assert chunks == [(threading.get_ident(), 40)] and not d.called
        await d
        assert chunks == [(threading.get_ident(), 40)] * 2 + [(threading.get_ident(), 20)]
        assert [e.steps for e in astore.store.events()] == list(range(100))
        await deferLater(reactor, 0)  # (the code after `await d` ran inside d's callback)
        d2 = astore.append_events([ev(T0 + 200)])  # one chunk, nothing waiting: written before the call returns
        assert d2.called
    finally:
        astore.close()


@pytest_twisted.ensureDeferred
async def test_sqlite_event_batch_meeting_another_writer_goes_to_its_own_thread(tmp_path, monkeypatch):
    """While another process's write holds the lock, a batch is handed to the event log's thread (which
    waits for the lock) and the reactor is not blocked; a batch appended while it is there follows it
    (written after it, in order), and once it is written batches are inline again. Negative control: the
    batch is not written while the lock is held."""
    import threading

    from twisted.internet import reactor

    writers: list[tuple[str, int]] = []
    original = SQLiteStore.append_events

    def spy(self, events):
        result = original(self, events)  # raises StoreBusy on the no-wait connection: not recorded
        writers.append((threading.current_thread().name, events[0].steps))
        return result

    monkeypatch.setattr(SQLiteStore, "append_events", spy)
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        first = astore.append_events([ev(T0 + 1, steps=1)])
        ticks = 0
        while ticks < 5:
            await deferLater(reactor, 0.01)  # the reactor keeps turning meanwhile
            ticks += 1
        assert not first.called and writers == []
        other.execute("COMMIT")
        second = astore.append_events([ev(T0 + 2, steps=2)])  # the first may still be on its thread
        await first
        await second
        assert [steps for _, steps in writers] == [1, 2]
        assert "scrapy-polite-events" in writers[0][0], writers
        assert [e.steps for e in astore.store.events()] == [1, 2]
        third = astore.append_events([ev(T0 + 3, steps=3)])
        assert third.called and writers[-1] == (threading.main_thread().name, 3)  # inline again
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
        astore.close()


@pytest_twisted.ensureDeferred
async def test_a_batch_appended_by_a_batch_callback_waits_for_the_next_reactor_turn(tmp_path, monkeypatch):
    """One chunk per reactor turn even when a batch's callback appends the next batch. Negative control:
    the appended batch is written, on the next turn."""
    from twisted.internet import reactor

    turn = [0]
    chunks: list[int] = []
    original = SQLiteStore.append_events

    def spy(self, events):
        chunks.append(turn[0])
        return original(self, events)

    monkeypatch.setattr(SQLiteStore, "append_events", spy)
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async(event_chunk=2)
    appended: list[defer.Deferred[None]] = []
    try:
        first = astore.append_events([ev(T0 + i, steps=i) for i in range(4)])  # two chunks: turns 0 and 1
        first.addCallback(lambda _: appended.append(astore.append_events([ev(T0 + 9, steps=9)])))
        for _ in range(4):
            turn[0] += 1
            await deferLater(reactor, 0)
        assert appended and appended[0].called
        assert len(chunks) == len(set(chunks)) == 3, chunks  # three chunks, on three turns
        assert [e.steps for e in astore.store.events()] == [0, 1, 2, 3, 9]
    finally:
        astore.close()


@pytest_twisted.ensureDeferred
async def test_event_batches_waiting_at_the_close_are_written(tmp_path):
    """A batch whose chunks are still waiting for their reactor turns when the store closes is written on
    the event log's thread before the close returns; nothing is lost. Negative control: it was not all
    written before the close."""
    path = str(tmp_path / "pace.sqlite3")
    astore = SQLiteStore(path, clock=lambda: T0).open_async(event_chunk=10)
    d = astore.append_events([ev(T0 + i, steps=i) for i in range(35)])
    assert not d.called and len(astore.store.events()) == 10
    astore.close()
    store = SQLiteStore(path)  # written by the time close() returns
    try:
        assert [e.steps for e in store.events()] == list(range(35))
    finally:
        store.close()
    await d  # its result arrives on a reactor turn


def test_a_no_wait_connection_follows_a_replaced_file_without_waiting_for_its_lock(tmp_path, monkeypatch):
    """The table's file is replaced under the crawl while another connection holds the new file's lock: the no-wait
    connection (the reactor's) sets the new file up without waiting — it answers StoreBusy and keeps the old file —
    and follows once the lock is gone (docs/spec.md §6, "A table that comes back empty"). Negative control: the
    waiting connection sets the new file up with the store's timeout (it may wait: it runs on the table's thread)."""
    from scrapy_polite.stores import StoreBusy
    from scrapy_polite.stores.sqlite import schema
    from scrapy_polite.stores.sqlite import store as store_module

    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, timeout=2.0, clock=lambda: T0)
    inline = store.nowait()
    timeouts: list[float] = []
    connect = schema.connect
    monkeypatch.setattr(schema, "connect", lambda p, t: (timeouts.append(t), connect(p, t))[1])
    monkeypatch.setattr(store_module, "FOLLOW_EVERY", 0.0)  # every call looks at the path
    other = None
    try:
        put(inline, "a.example", FULL)
        for suffix in ("", "-wal", "-shm"):
            os.remove(path + suffix)
        other = set_up_under_way(path)  # another process writes the new file (its first transaction)
        with pytest.raises(StoreBusy):
            inline.get("a.example")
        assert timeouts == [0.0]  # it never waited for the lock
        assert inline._file != schema.file_id(path)  # kept the old file
        monkeypatch.setattr(store_module, "FOLLOW_EVERY", 3600.0)  # no look for an hour, unless one is owed
        with pytest.raises(StoreBusy):  # and writes nothing to it: the failed look is owed at the next call
            put(inline, "b.example", FULL)
        other.execute("COMMIT")
        assert inline.get("a.example") is None  # the new file: the old rows are not in it
        assert inline._file == schema.file_id(path) and timeouts == [0.0, 0.0, 0.0]
        monkeypatch.setattr(store_module, "FOLLOW_EVERY", 0.0)
        store.get("a.example")  # negative control: the waiting connection follows with its timeout
        assert timeouts == [0.0, 0.0, 0.0, 2.0]
    finally:
        if other is not None:
            other.close()
        inline.close()
        store.close()


def test_a_step_that_asks_again_after_the_close_fails_at_once_and_leaves_no_timer():
    """An update whose step was running when the table closed, and asks for another step after a wait, fails
    with the close's error at once: no timer is left on the reactor after the close. Negative control: before the
    close the same answer waits on the reactor's clock."""
    from twisted.internet.task import Clock

    from scrapy_polite.stores.threads import Stepper

    class Pool:
        """Runs each step by hand: ``pending`` holds the Deferred of the step running."""

        def __init__(self) -> None:
            self.pending: list[defer.Deferred[Any]] = []

        def run_aside(self, fn: Any) -> defer.Deferred[Any]:
            d: defer.Deferred[Any] = defer.Deferred()
            self.pending.append(d)
            return d

    class Steps:
        def step(self) -> Any:
            raise AssertionError("the pool runs the steps by hand")

    clock, pool = Clock(), Pool()
    stepper = Stepper(clock, pool, lambda: StoreClosed("closed"))  # type: ignore[arg-type]
    waiting = stepper.run(Steps())  # type: ignore[arg-type]
    pool.pending.pop().callback(Again(0.5))
    assert len(clock.getDelayedCalls()) == 1 and not waiting.called  # negative control: it waits for its step
    stopped = stepper.run(Steps())  # type: ignore[arg-type]
    stepper.stop()
    failures: list[Failure] = []
    waiting.addErrback(failures.append)
    assert clock.getDelayedCalls() == [] and len(failures) == 1  # the waiting one's timer was cancelled
    pool.pending.pop().callback(Again(0.5))  # the running step answers after the close
    stopped.addErrback(failures.append)
    assert clock.getDelayedCalls() == [] and len(failures) == 2
    assert all(f.check(StoreClosed) for f in failures)


_SHUTDOWN_SCRIPT = """
import sys, time
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import reactor
from scrapy_polite.stores.threads import CallPool
if sys.argv[1] == "control":
    CallPool._at_shutdown = lambda self: None  # the pool left running, as before
pool = CallPool(reactor, name="scrapy-polite-store")
reactor.callWhenRunning(lambda: pool.run_aside(time.sleep, 0).addCallback(lambda _: reactor.stop()))
reactor.run()
print("reactor stopped", flush=True)
"""


@pytest.mark.parametrize("case", ["fixed", "control"])
def test_a_table_left_open_does_not_keep_the_process_from_exiting(case):
    """Trial: a second Ctrl-C (Scrapy's forced shutdown) stops the reactor without closing the spider, so the table's
    thread pools were never stopped and the process waited for them forever (only SIGKILL ended it). The reactor's
    shutdown now stops a pool the table did not; the control, a pool left running, still keeps the process."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _SHUTDOWN_SCRIPT, case], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        code = proc.wait(timeout=30 if case == "fixed" else 5)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        proc.kill()
        out = proc.communicate()[0]
    assert "reactor stopped" in out  # the reactor stopped in both: only the pool's threads differ
    assert (code == 0) if case == "fixed" else (code is None)
