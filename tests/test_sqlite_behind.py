"""Write-behind (docs/spec.md §6, "Write-behind"): a SQLite table opened by one crawl alone keeps its group
commit's write transaction open for the next groups, at most ``write_behind`` seconds; another opener waits for
that transaction (SQLite's write lock), so it never books on rows older than the first crawl's bookings, and the
first crawl stops writing behind once the other's mark is in the file. An unclean stop of an opener that wrote
behind treats every row as just booked.

Each rule has its negative control: the same steps without write-behind, or with the other opener gone."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, threads
from twisted.internet.task import deferLater

from scrapy_polite.policy import HostState
from scrapy_polite.stores import SQLiteStore, StoreError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _booked(at: float):
    def fn(states, now):
        return {key: HostState(next_allowed=now + at, updated=now) for key in states}, now
    return fn


def _committed(path: str, key: str) -> float | None:
    """The row of ``key`` as another connection reads it (what is committed), or None."""
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT next_allowed FROM hosts WHERE host = ?", (key,)).fetchone()
        return None if row is None else float(row[0])
    finally:
        db.close()


def _sleep(seconds: float) -> defer.Deferred[None]:
    return deferLater(reactor, seconds, lambda: None)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("behind", [1.0, 0.0])
async def test_a_table_opened_alone_commits_its_groups_within_the_window(tmp_path, behind):
    """Alone in the file, the crawl's groups of one window share one transaction, committed within
    ``write_behind`` seconds (not seen by another connection before). Negative control: without write-behind, each
    group is committed when its calls fire."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, mark=True)
    table = store.open_async(write_behind=behind)
    try:
        before = SQLiteStore.write_transactions
        await table.update_many(["a.example"], _booked(10.0))
        await table.update_many(["b.example"], _booked(10.0))
        seen = (_committed(path, "a.example"), _committed(path, "b.example"))
        if behind:
            assert seen == (None, None)  # in the open window
            assert SQLiteStore.write_transactions - before == 1  # both groups in one transaction
            await _sleep(behind + 0.3)
        else:
            assert None not in seen and SQLiteStore.write_transactions - before == 2
        assert _committed(path, "a.example") is not None and _committed(path, "b.example") is not None
    finally:
        await table.close_async()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("behind", [1.0, 0.0])
async def test_a_write_in_an_open_window_runs_at_once(tmp_path, behind):
    """In an open window (the file's write lock held), a write call is a group of its own in the window's
    transaction, run at once: its Deferred has fired when the call returns, in call order, an update function's
    error its own. Negative control: without a window, the call waits for the next reactor turn's group."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, mark=True)
    table = store.open_async(write_behind=behind)
    try:
        await table.update_many(["a.example"], _booked(10.0))  # the first group: opens the window
        await _sleep(0.01)  # (resumed inside the group's delivery: a write made there waits for the next group)
        d = table.update_many(["b.example"], _booked(20.0))
        assert d.called is bool(behind)
        assert await d is not None
        if behind:
            def boom(states, now):
                raise ValueError("the caller's own")

            failed = table.update_many(["a.example"], boom)
            assert failed.called
            with pytest.raises(ValueError, match="the caller's own"):
                await failed
            after = table.update_many(["c.example"], _booked(5.0))  # the window goes on: the error was the call's
            assert after.called and _committed(path, "c.example") is None
            await after
        await _sleep(behind + 0.3)
        assert _committed(path, "b.example") is not None
    finally:
        await table.close_async()


@pytest_twisted.ensureDeferred
async def test_a_write_made_while_a_group_is_delivered_completes_after_the_group(tmp_path):
    """Calls complete in call order: a write that a caller's callback makes while its group's results are handed
    out waits for the next group, even in an open window (it would otherwise complete before the group's later
    calls, which were made first). Negative control: the same write made after the group runs at once."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, mark=True)
    table = store.open_async(write_behind=1.0)
    done: list[str] = []
    try:
        later: list[defer.Deferred] = []

        def first(_result):
            done.append("A")
            later.append(table.update_many(["c.example"], _booked(1.0)).addCallback(lambda _: done.append("C")))

        a = table.update_many(["a.example"], _booked(1.0)).addCallback(first)  # one turn: one group, A and B
        b = table.update_many(["b.example"], _booked(1.0)).addCallback(lambda _: done.append("B"))
        await defer.gatherResults([a, b])
        await later[0]
        assert done == ["A", "B", "C"]
        await _sleep(0.01)  # (this coroutine resumed inside the delivery: the next turn is after it)
        d = table.update_many(["d.example"], _booked(1.0))  # the window open, nothing delivered: at once
        assert d.called
        await d
    finally:
        await table.close_async()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("held_by", [7, 0])
async def test_a_booking_that_takes_an_in_flight_hold_is_committed_at_once(tmp_path, held_by):
    """A group that writes a row held in flight (docs/spec.md §3, "In flight") commits at once, and the window with
    it: a hold lost with the process would let another process book the host while the request may still be served.
    Negative control: the same row without a hold stays in the window."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, mark=True)
    table = store.open_async(write_behind=5.0)
    try:
        await table.update_many(["a.example"], _booked(10.0))  # opens the window

        def hold(states, now):
            return {"b.example": HostState(next_allowed=now + 1.0, updated=now, held_until=now + 181.0,
                                           held_by=held_by)}, None

        await table.update_many(["b.example"], hold)
        committed = (_committed(path, "a.example"), _committed(path, "b.example"))
        assert (None not in committed) if held_by else (committed == (None, None))
    finally:
        await table.close_async()


@pytest_twisted.ensureDeferred
async def test_a_second_opener_waits_for_the_window_and_the_first_stops_writing_behind(tmp_path):
    """A second opener's opening waits for the first crawl's window (the write lock), so the first booking it
    makes reads the first crawl's booking; from the second's mark on, the first commits each group (another
    connection sees it at once). Negative controls: before the second opened, the first's booking was not
    committed; after the second closed, the first writes behind again."""
    path = str(tmp_path / "pace.sqlite3")
    first = SQLiteStore(path, mark=True)
    table = first.open_async(write_behind=0.5)
    second = None
    try:
        booked = await table.update_many(["a.example"], _booked(10.0))
        assert _committed(path, "a.example") is None  # negative control: in the first's window
        second = await threads.deferToThread(SQLiteStore, path, mark=True, timeout=10.0)  # waits for the lock
        seen = await threads.deferToThread(
            second.update_many, ["a.example"], lambda states, now: ({}, states["a.example"]))
        assert seen is not None and seen.next_allowed == pytest.approx(booked + 10.0)  # never stale
        await table.update_many(["b.example"], _booked(10.0))
        assert _committed(path, "b.example") is not None  # not alone: committed with its group
        await threads.deferToThread(second.close)
        second = None
        await _sleep(0.6)  # no window for a quarter of its length after one: the last one ended at most 0.5 s ago
        await table.update_many(["c.example"], _booked(10.0))
        assert _committed(path, "c.example") is None  # alone again: behind again
    finally:
        if second is not None:
            await threads.deferToThread(second.close)
        await table.close_async()
    assert _committed(path, "c.example") is not None  # the close commits the window


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from scrapy_polite.policy import HostState
    from scrapy_polite.stores import SQLiteStore, StoreError
    from scrapy_polite.stores.sqlite import rows
    store = SQLiteStore({path!r}, mark=True)
    inline = store.nowait()
    inline.behind.seconds = 60.0 if {behind!r} else 0.0
    fn = lambda states, now: ({{k: HostState(next_allowed=now + 1.0, updated=now) for k in states}}, None)
    inline.run_group([rows.update_many(["new.example"], fn)])
    print("booked", flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
@pytest.mark.parametrize("behind", [True, False])
def test_an_opener_killed_while_writing_behind_leaves_every_row_just_booked(tmp_path, behind):
    """``kill -9`` of an opener whose booking was in its open window: the booking is lost, so the next opening
    treats every row as just booked, however long ago it last changed. Negative control: an opener that committed
    its booking leaves only the rows of the crash window to repair (the old row keeps its next allowed moment)."""
    path = str(tmp_path / "pace.sqlite3")
    seed = SQLiteStore(path)
    seed.update("old.example", lambda _s, now: (HostState(next_allowed=now - 3599.0, updated=now - 3600.0), None))
    seed.close()
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=ROOT, path=path, behind=behind)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "booked"
        assert (_committed(path, "new.example") is None) is behind
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    store = SQLiteStore(path, mark=True)
    try:
        assert store.recovery is not None
        opened = store.recovery.opened
        old = store.get("old.example")
        assert old is not None
        if behind:
            assert store.recovery.rows == 1 and old.next_allowed == pytest.approx(opened + 1.0)  # just booked
        else:
            assert store.recovery.rows == 1 and old.next_allowed < opened - 3000  # only the window's row
            assert store.get("new.example") is not None
    finally:
        store.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("later", [True, False])
async def test_a_window_rolled_back_stops_the_table_and_leaves_the_mark(tmp_path, later):
    """A group that fails in the file (here: full) inside a window rolls back the window's earlier groups, which
    were delivered: every later call fails with the StoreError (the crawl stops), and the mark is left, whether a
    call came after it or the table was closed next, so the next opening (of this process too) repairs every row.
    Negative control: the same failure outside a window fails that group alone."""
    path = str(tmp_path / "pace.sqlite3")
    for behind in (5.0, 0.0):
        path = str(tmp_path / f"pace{behind}.sqlite3")
        store = SQLiteStore(path, mark=True)
        table = store.open_async(write_behind=behind)
        await table.update_many(["a.example"], _booked(10.0))
        db = table._inline._db  # a file that cannot grow: the next big group fails
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
        with pytest.raises(StoreError):
            await table.update_many([f"k{i}.example" for i in range(2000)], _booked(10.0))
        db.execute("PRAGMA max_page_count = 1000000")
        if behind and later:
            with pytest.raises(StoreError, match="could not commit its last writes"):
                await table.update_many(["c.example"], _booked(10.0))
        elif not behind:
            await table.update_many(["c.example"], _booked(10.0))
        await table.close_async()
        db = sqlite3.connect(path)
        try:  # left, saying it wrote behind
            assert db.execute("SELECT behind FROM openers").fetchall() == ([(1,)] if behind else [])
        finally:
            db.close()
        reopened = SQLiteStore(path, mark=True)  # an opening of this very process repairs it too
        try:
            assert (reopened.recovery is not None) is bool(behind), reopened.recovery
        finally:
            reopened.close()
