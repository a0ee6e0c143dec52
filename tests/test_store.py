"""Tests of scrapy_polite.store: one shared suite run against every backend, then what only SQLite has
(persistence across processes, schema version, failing closed with an error naming the path and the fix),
``open_store`` URIs, and the multi-process no-lost-update guarantee of docs/spec.md §6.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import pytest

from scrapy_polite.policy import HostState
from scrapy_polite.stores import SCHEMA_VERSION, MemoryStore, SQLiteStore, StoreError, open_store
from scrapy_polite.stores.sqlite import rows
from tests.support.stores import set_up_under_way, write_sqlite_file, write_version_1_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T0 = 1_800_000_000.0

#: A state with every field away from its default, with awkward floats, to catch any lossy column.
FULL = HostState(next_allowed=T0 + 0.123456789, consec=7, crawl_delay=2.5, ok_seen=True,
                 throttled_at=T0 - 1e-6, updated=T0 + 1 / 3)


def _put(store, host, state):
    store.update(host, lambda old, now: (state, None))


# --------------------------------------------------------------------------------------------------
# The shared suite
# --------------------------------------------------------------------------------------------------


def test_get_missing_host_is_none(store):
    assert store.get("nobody.example") is None


def test_update_writes_and_returns_fn_result(store):
    seen = []

    def fn(old, now):
        seen.append(old)
        return FULL, "result"

    assert store.update("a.example", fn) == "result"
    assert seen == [None]  # fn saw "no row"
    assert store.get("a.example") == FULL


def test_update_sees_the_current_state(store):
    _put(store, "a.example", FULL)
    seen = []
    store.update("a.example", lambda old, now: (seen.append(old), (replace(old, consec=old.consec + 1), None))[1])
    assert seen == [FULL]
    assert store.get("a.example").consec == FULL.consec + 1


def test_update_with_none_leaves_an_existing_row_untouched(store):
    _put(store, "a.example", FULL)
    assert store.update("a.example", lambda old, now: (None, 42)) == 42
    assert store.get("a.example") == FULL


def test_update_with_none_creates_no_row(store):
    assert store.update("a.example", lambda old, now: (None, "nothing")) == "nothing"
    assert store.get("a.example") is None
    assert list(store.items()) == []


def test_update_that_raises_changes_nothing(store):
    _put(store, "a.example", FULL)

    def boom(old, now):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        store.update("a.example", boom)
    assert store.get("a.example") == FULL
    # ...and the store is still usable afterwards (no transaction left open).
    _put(store, "b.example", FULL)
    assert store.get("b.example") == FULL


def test_update_overwrites(store):
    _put(store, "a.example", FULL)
    second = HostState(next_allowed=1.0, updated=2.0)
    _put(store, "a.example", second)
    assert store.get("a.example") == second


def test_hosts_are_independent(store):
    _put(store, "a.example", FULL)
    _put(store, "b.example", HostState(consec=1))
    assert store.get("a.example") == FULL
    assert store.get("b.example") == HostState(consec=1)


def test_delete(store):
    _put(store, "a.example", FULL)
    assert store.delete("a.example") is True
    assert store.get("a.example") is None
    assert store.delete("a.example") is False
    assert store.delete("never.example") is False


def test_items_sorted_by_host(store):
    for host in ["c.example", "a.example", "b.example"]:
        _put(store, host, replace(FULL, consec=ord(host[0])))
    items = list(store.items())
    assert [host for host, _ in items] == ["a.example", "b.example", "c.example"]
    assert [state.consec for _, state in items] == [ord("a"), ord("b"), ord("c")]
    assert all(isinstance(state, HostState) for _, state in items)


def test_items_of_empty_store(store):
    assert list(store.items()) == []


def test_expire(store):
    before = T0
    _put(store, "stale.example", HostState(updated=before - 10, next_allowed=before - 5))
    _put(store, "stale-but-backing-off.example", HostState(updated=before - 10, next_allowed=before + 300))
    _put(store, "recent.example", HostState(updated=before + 1, next_allowed=before - 5))
    _put(store, "boundary.example", HostState(updated=before, next_allowed=before))  # strictly before
    assert store.expire(before) == 1
    assert store.get("stale.example") is None
    assert [h for h, _ in store.items()] == ["boundary.example", "recent.example", "stale-but-backing-off.example"]
    assert store.expire(before) == 0


def test_ok_seen_is_a_bool(store):
    _put(store, "a.example", FULL)
    _put(store, "b.example", HostState())
    assert store.get("a.example").ok_seen is True
    assert store.get("b.example").ok_seen is False


def test_uri(store):
    assert store.uri.startswith(("memory://", "sqlite:///"))


# --------------------------------------------------------------------------------------------------
# SQLite only
# --------------------------------------------------------------------------------------------------


def test_sqlite_reopen_returns_what_was_written(tmp_path):
    path = str(tmp_path / "pace.sqlite3")
    other = HostState(next_allowed=0.0, consec=0, crawl_delay=0.0, ok_seen=False, throttled_at=0.0, updated=0.0)
    s = SQLiteStore(path)
    _put(s, "a.example", FULL)
    _put(s, "xn--bcher-kva.example", other)
    s.close()
    s = SQLiteStore(path)
    try:
        got = s.get("a.example")
        assert got == FULL  # every field exactly, floats included
        assert got.ok_seen is True and isinstance(got.consec, int)
        assert s.get("xn--bcher-kva.example") == other
        assert s.get("xn--bcher-kva.example").ok_seen is False
    finally:
        s.close()


def test_sqlite_is_visible_to_a_second_connection_at_once(tmp_path):
    path = str(tmp_path / "pace.sqlite3")
    writer, reader = SQLiteStore(path), SQLiteStore(path)
    try:
        _put(writer, "a.example", FULL)
        assert reader.get("a.example") == FULL  # committed, not buffered until close
    finally:
        writer.close()
        reader.close()


def test_sqlite_records_schema_version_and_uses_wal(tmp_path):
    path = tmp_path / "pace.sqlite3"
    SQLiteStore(str(path)).close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def _new_file_locked(path):
    """A new file (rollback journal, as SQLite makes it) whose write lock another connection holds, as a process
    setting the table up holds it: a WAL switch meeting it answers "database is locked" at once, busy timeout
    or not (:func:`~tests.support.stores.set_up_under_way`: nothing another reader sees yet; a file that held
    tables at version 0 would be another application's, refused)."""
    return set_up_under_way(path)


def test_sqlite_opens_a_new_file_another_process_is_setting_up(tmp_path, monkeypatch):
    """A fleet started together on a new table: the openers that meet another's lock during the switch to the
    WAL wait for it, as for any lock (a crawl that failed here crawled nothing: a CI run lost a process this
    way). The lock is let go once the opener has met it and waits; the store opens, in WAL, without an error."""
    from scrapy_polite.stores.sqlite import schema

    path = str(tmp_path / "pace.sqlite3")
    holder = _new_file_locked(path)
    waited = threading.Event()
    sleep = time.sleep

    def waits(seconds):
        waited.set()
        sleep(seconds)

    monkeypatch.setattr(schema.time, "sleep", waits)
    release = threading.Thread(target=lambda: waited.wait(30) and holder.execute("COMMIT"))
    release.start()
    try:
        store = SQLiteStore(path, timeout=30.0)
        store.close()
    finally:
        waited.set()
        release.join()
        holder.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_sqlite_a_lock_held_past_the_timeout_fails_naming_the_lock(tmp_path):
    """Negative control: a lock held longer than the store's ``timeout`` is an error, after about that long
    (not at once, not forever), whose fix names the lock, not the directory's permissions."""
    path = str(tmp_path / "pace.sqlite3")
    holder = _new_file_locked(path)
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match="database is locked") as info:
            SQLiteStore(path, timeout=0.5)
    finally:
        holder.close()
    assert time.monotonic() - started >= 0.5
    assert "another connection kept the file locked" in str(info.value)
    assert "writable" not in str(info.value)


def test_sqlite_migrates_an_empty_version_0_file(tmp_path):
    path = tmp_path / "pace.sqlite3"
    sqlite3.connect(path).close()  # a valid, empty database: user_version 0
    s = SQLiteStore(str(path))
    try:
        _put(s, "a.example", FULL)
        assert s.get("a.example") == FULL
    finally:
        s.close()


def test_sqlite_migrates_a_version_1_file_keeping_its_rows_and_adding_the_event_log(tmp_path):
    from scrapy_polite.stores import Event

    path = tmp_path / "pace.sqlite3"
    row = write_version_1_file(path)  # the hosts table only
    s = SQLiteStore(str(path))
    try:
        assert s.get("a.example") == row
        assert s.events() == []
        s.append_events([Event(T0, "booking", "a.example")])
        assert s.events() == [Event(T0, "booking", "a.example")]
    finally:
        s.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"hosts", "events", "openers", "identity", "clocks"}
        assert _indexes(db) == []  # version 1's index on hosts.updated (every write paid for it) is dropped
    finally:
        db.close()


def test_sqlite_an_event_s_absent_fields_are_null_in_the_file(tmp_path):
    """The event log binds an absent field (None) as a float NaN, which SQLite stores as NULL: the file holds NULL
    in each absent field, and the value in each other one (the negative control), whatever the column's type."""
    from scrapy_polite.stores import Event

    path = str(tmp_path / "pace.sqlite3")
    s = SQLiteStore(path)
    sparse = Event(T0, "wait", "b.example", delay=0.25)
    full = Event(T0, "response", "a.example", url="http://a.example/", status=200, delay=1.0, due=T0 + 1,
                 reason="throttle", retry_after=3.0, steps=1, address="192.0.2.1", started=T0 - 1, source="m:1",
                 interval=1.0, ip_interval=0.5, hold=2.0, seq=0)
    try:
        s.append_events([sparse, full])
        assert s.events() == [sparse, full]
    finally:
        s.close()
    db = sqlite3.connect(path)
    try:
        columns = ", ".join(f"typeof({name})" for name in Event._fields)
        stored = db.execute(f"SELECT {columns} FROM events ORDER BY id").fetchall()
    finally:
        db.close()
    for event, types in zip([sparse, full], stored, strict=True):
        assert [kind == "null" for kind in types] == [value is None for value in event], (event, types)


def test_sqlite_an_event_field_no_dictionary_can_look_up_is_bound_as_before(tmp_path):
    """An event field that is unhashable (``append_events`` looks each field up to bind a None as NULL) is bound
    as it was: a bytearray is stored (and read back as bytes), a list is refused with a StoreError, not a
    TypeError."""
    from scrapy_polite.stores import Event

    s = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    try:
        s.append_events([Event(T0, "wait", "a.example", url=bytearray(b"x"))])  # type: ignore[arg-type]
        assert s.events()[0].url == b"x" and s.events()[0].status is None
        with pytest.raises(StoreError):
            s.append_events([Event(T0, "wait", "a.example", reason=["x"])])  # type: ignore[arg-type]
        assert len(s.events()) == 1
    finally:
        s.close()


def test_sqlite_an_event_s_absent_fields_stay_null_when_floats_have_an_adapter(tmp_path):
    """A process that registered an adapter for floats (``sqlite3.register_adapter``, process-wide; run in a
    process of its own) would have a NaN adapted too: the events are then bound with their None fields, which
    stay NULL. Negative control: the adapter is used (a float field is stored as what it returns)."""
    script = f"""
import sqlite3
from scrapy_polite.stores import Event, SQLiteStore
sqlite3.register_adapter(float, lambda value: "adapted")
s = SQLiteStore({str(tmp_path / "pace.sqlite3")!r})
s.append_events([Event(5.5, "wait", "a.example", delay=0.25)])
s.close()
db = sqlite3.connect({str(tmp_path / "pace.sqlite3")!r})
print(db.execute("SELECT typeof(url), typeof(status), typeof(due), typeof(delay), delay FROM events").fetchall())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[('null', 'null', 'null', 'text', 'adapted')]", done.stderr


def _indexes(db):
    return db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'hosts'").fetchall()


def test_sqlite_a_file_with_version_1_s_index_loses_it_and_keeps_its_rows(tmp_path):
    """Version 1's index on ``hosts.updated`` (every write paid for it) is dropped by the opening that finds it,
    without a new schema version (processes of earlier releases open the file still): a current file that has it
    keeps every row and its version, and the expiry, which filtered on it, reads the whole table and keeps its
    answer. Negative control: the file had the index."""
    path = str(tmp_path / "pace.sqlite3")
    s = SQLiteStore(path)
    _put(s, "stale.example", HostState(updated=T0 - 10, next_allowed=T0 - 5))
    _put(s, "recent.example", HostState(updated=T0 + 1, next_allowed=T0 - 5))
    s.close()
    db = sqlite3.connect(path)
    db.execute("CREATE INDEX hosts_updated ON hosts (updated)")
    db.commit()
    assert _indexes(db) == [("hosts_updated",)]
    db.close()
    s = SQLiteStore(path)
    try:
        assert s.expire(T0) == 1
        assert [h for h, _ in s.items()] == ["recent.example"]
    finally:
        s.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
        assert _indexes(db) == []
    finally:
        db.close()


def test_sqlite_newer_schema_is_refused_naming_the_path(tmp_path):
    path = tmp_path / "pace.sqlite3"
    SQLiteStore(str(path)).close()  # a pace table a newer version wrote: ours, one version on
    write_sqlite_file(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert str(path) in message
    assert f"schema version {SCHEMA_VERSION + 1} is newer" in message and "Fix: upgrade scrapy-polite" in message
    # Fail closed, and never discard the newer file.
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    db.close()


def test_sqlite_unwritable_location_names_the_path_and_the_fix(tmp_path):
    # Tests run as root, so a chmod'ed directory would still be writable; a parent that is a regular
    # file makes the directory impossible to create for everyone.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    path = blocker / "sub" / "pace.sqlite3"
    with pytest.raises(StoreError) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert str(path) in message
    assert "Fix" in message


@pytest.mark.parametrize("content", [
    pytest.param(b"not a db", id="short text"),
    pytest.param(b"this is not a database\n" * 200, id="long text"),
    pytest.param(bytes(range(256)) * 16, id="binary"),
])
def test_sqlite_corrupt_file_names_the_path_and_suggests_moving_it_away(tmp_path, content):
    path = tmp_path / "pace.sqlite3"
    path.write_bytes(content)
    with pytest.raises(StoreError) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert str(path) in message
    assert "Fix" in message
    assert "move it away" in message
    assert path.read_bytes() == content  # never discarded or overwritten


#: Files of another application: a table of its own, its own ``hosts`` table, a schema version of its own.
FOREIGN = [
    pytest.param(("CREATE TABLE t(a)", "INSERT INTO t VALUES (1)"), "t", id="a table of its own"),
    pytest.param(("CREATE TABLE hosts(id INTEGER PRIMARY KEY, name TEXT)",), "hosts", id="its own hosts table"),
    pytest.param(("CREATE TABLE x(a)", "PRAGMA user_version = 3"), "x", id="an older version number"),
    pytest.param(("CREATE TABLE x(a)", f"PRAGMA user_version = {SCHEMA_VERSION}"), "x", id="this version number"),
    pytest.param(("CREATE TABLE x(a)", f"PRAGMA user_version = {SCHEMA_VERSION + 1}"), "x", id="a newer number"),
]


@pytest.mark.parametrize(("statements", "table"), FOREIGN)
def test_sqlite_a_database_of_another_application_is_refused_and_left_untouched(tmp_path, statements, table):
    path = tmp_path / "app.sqlite3"
    before = write_sqlite_file(path, *statements)
    with pytest.raises(StoreError) as info:
        SQLiteStore(str(path), mark=True)
    message = str(info.value)
    assert f"sqlite:///{path}" in message and "is not a scrapy-polite pace table" in message, message
    assert f"its tables: {table}" in message, message
    assert "Fix: point POLITE_STORE to another file" in message, message
    assert "writable" not in message and "no such" not in message, message
    assert path.read_bytes() == before  # not a table added, not even the WAL journal's mark
    assert sorted(os.listdir(tmp_path)) == ["app.sqlite3"]


def test_sqlite_a_pace_table_with_a_table_of_another_application_beside_it_is_opened(tmp_path):
    """Negative control of the test above: a table of another application beside ours does not make the file
    foreign; neither does an empty file (a new table) or an empty database (version 0, no table)."""
    path = tmp_path / "pace.sqlite3"
    SQLiteStore(str(path)).close()
    write_sqlite_file(path, "CREATE TABLE t(a)")
    empty, blank = tmp_path / "empty.sqlite3", tmp_path / "blank.sqlite3"
    empty.write_bytes(b"")
    write_sqlite_file(blank, "PRAGMA user_version = 0")
    for opened in (path, empty, blank):
        with contextlib.closing(SQLiteStore(str(opened))) as store:
            _put(store, "a.example", FULL)
            assert store.get("a.example") == FULL, opened


def test_sqlite_a_directory_is_refused_naming_it(tmp_path):
    path = tmp_path / "pace.sqlite3"
    path.mkdir()
    with pytest.raises(StoreError) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert f"{path} is a directory, not a file" in message, message
    assert "Fix: point POLITE_STORE to a file" in message, message
    assert "writable" not in message, message
    assert os.listdir(path) == []


# --------------------------------------------------------------------------------------------------
# open_store
# --------------------------------------------------------------------------------------------------


def test_open_store_memory():
    s = open_store("memory://")
    assert isinstance(s, MemoryStore)
    s.close()


def test_open_store_sqlite_relative_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///rel.sqlite3")
    try:
        assert isinstance(s, SQLiteStore)
        assert s.path == str(tmp_path / "rel.sqlite3")
        assert (tmp_path / "rel.sqlite3").exists()
    finally:
        s.close()


def test_open_store_sqlite_absolute(tmp_path):
    path = tmp_path / "deeper" / "abs.sqlite3"
    s = open_store(f"sqlite:///{path}")  # "sqlite:///" + "/tmp/..." = four slashes
    try:
        assert str(path).startswith("/")
        assert isinstance(s, SQLiteStore)
        assert s.path == str(path)
        assert path.exists()
    finally:
        s.close()


def test_open_store_plain_path_is_sqlite(tmp_path):
    s = open_store(str(tmp_path / "plain.sqlite3"))
    try:
        assert isinstance(s, SQLiteStore)
    finally:
        s.close()


@pytest.mark.parametrize("uri", ["redis2://x", "postgres://db/x", "sqlite:///"])
def test_open_store_refuses_what_it_cannot_open(uri):
    with pytest.raises(StoreError) as info:
        open_store(uri)
    assert uri in str(info.value)
    assert "Fix" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Concurrency: four processes, read-modify-write on the same hosts, no update lost
# --------------------------------------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import os, sys, time
    from dataclasses import replace
    sys.path.insert(0, {root!r})
    from scrapy_polite.policy import HostState
    from scrapy_polite.stores import SQLiteStore

    path, go, updates = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SQLiteStore(path)
    deadline = time.monotonic() + 60
    while not os.path.exists(go):  # start together, for the most contention
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.001)

    def increment(old, now):
        old = old or HostState()
        return replace(old, consec=old.consec + 1), None

    for i in range(updates):
        store.update("h%d.example" % (i % 5), increment)
    store.close()
""")

PROCESSES = 4
UPDATES = 1000
HOSTS = 5


def test_sqlite_concurrent_processes_lose_no_update(tmp_path):
    path = str(tmp_path / "pace.sqlite3")
    SQLiteStore(path).close()  # schema created once, up front
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=ROOT))
    go = tmp_path / "go"
    workers = [subprocess.Popen([sys.executable, str(script), path, str(go), str(UPDATES)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(PROCESSES)]
    time.sleep(0.5)  # let them all open the store
    go.write_text("go")
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err.decode(errors="replace")

    store = SQLiteStore(path)
    try:
        counts = {host: state.consec for host, state in store.items()}
    finally:
        store.close()
    assert sum(counts.values()) == PROCESSES * UPDATES
    assert counts == {f"h{i}.example": PROCESSES * UPDATES // HOSTS for i in range(HOSTS)}


GROUP_WORKER = textwrap.dedent("""
    import os, sys, time
    from dataclasses import replace
    sys.path.insert(0, {root!r})
    from twisted.internet import defer, task
    from scrapy_polite.policy import HostState
    from scrapy_polite.stores import AsyncStore, SQLiteStore

    path, go, updates, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    def increment(old, now):
        old = old or HostState()
        return replace(old, consec=old.consec + 1), old.consec + 1

    async def main(reactor):
        astore = SQLiteStore(path).open_async(reactor)
        deadline = time.monotonic() + 60
        while not os.path.exists(go):  # start together, for the most contention
            if time.monotonic() > deadline:
                sys.exit("never told to go")
            await task.deferLater(reactor, 0.001)
        burst = 25  # the calls of one reactor turn: one group
        for start in range(0, updates, burst):
            calls = [astore.update("h%d.example" % (i % rows), increment) for i in range(start, start + burst)]
            seen = await defer.gatherResults(calls)
            assert all(isinstance(n, int) and n > 0 for n in seen), seen
        print(astore.transactions)
        await astore.close_async()

    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
""")


def test_sqlite_group_commit_across_processes_loses_no_update(tmp_path):
    """Four processes, each 2,000 updates of 10 shared rows through :class:`AsyncStore` (group commit on: 25
    calls per reactor turn, one transaction each; a group meeting another process's lock goes to the thread
    and waits): not one update lost (docs/spec.md §6, "Group commit"). Negative control: the groups were
    groups (fewer transactions than updates)."""
    path = str(tmp_path / "pace.sqlite3")
    SQLiteStore(path).close()
    script = tmp_path / "group_worker.py"
    script.write_text(GROUP_WORKER.format(root=ROOT))
    go = tmp_path / "go"
    updates, rows = 2000, 10
    workers = [subprocess.Popen([sys.executable, str(script), path, str(go), str(updates), str(rows)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(PROCESSES)]
    time.sleep(0.5)
    go.write_text("go")
    transactions = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err.decode(errors="replace")
        transactions.append(int(out.split()[-1]))
    store = SQLiteStore(path)
    try:
        counts = {host: state.consec for host, state in store.items()}
    finally:
        store.close()
    assert counts == {f"h{i}.example": PROCESSES * updates // rows for i in range(rows)}  # 0 lost
    assert all(0 < t <= updates // 10 for t in transactions), transactions  # grouped: ~80 per process


# --------------------------------------------------------------------------------------------------
# The crash window: an unclean stop is found at the next opening (docs/spec.md §6, "After a crash")
# --------------------------------------------------------------------------------------------------

OPEN_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from scrapy_polite.stores import SQLiteStore
    store = SQLiteStore(sys.argv[1], mark=True)  # as a crawl opens it
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9: the table is never closed
    elif sys.argv[2] == "close":
        store.close()
    else:  # stay open until told
        print("open", flush=True)
        sys.stdin.read()
        store.close()
""")


def _opener(tmp_path, path, how):
    script = tmp_path / "opener.py"
    script.write_text(OPEN_AND_DIE.format(root=ROOT))
    return subprocess.Popen([sys.executable, str(script), path, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_sqlite_the_running_mark_is_beaten_once_per_transaction_at_most_once_a_second(tmp_path):
    """An opener's mark says when it last wrote (its heartbeat, from which an unclean stop's repair counts): a group
    commit that begins a transaction beats it there when a second (``BEAT_EVERY``) has passed since the last beat, by
    the table's clock; the later groups of a write-behind window run in that transaction and do not. A heartbeat that
    fails rolls its group back like any failure of the file: the next group and another writer find the file free.
    Negative controls: a transaction within the second leaves it; a window's later group a second on leaves it too."""
    from scrapy_polite.stores.sqlite.marks import BEAT_EVERY

    now = [1000.0]
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, mark=True, clock=lambda: now[0])
    inline = store.nowait()
    inline.behind.seconds = 60.0  # the first group opens a window; after it, none for 15 s (each group commits)
    fn = rows.update_many(["a.example"], lambda states, t: ({"a.example": HostState(next_allowed=t, updated=t)}, t))

    def beat() -> float:
        inline.commit_window()
        db = sqlite3.connect(path)
        try:
            return float(db.execute("SELECT beat FROM openers").fetchone()[0])
        finally:
            db.close()

    try:
        now[0] += 10.0
        inline.run_group([fn])  # begins the window's transaction: beaten in it
        first = now[0]
        now[0] += 2 * BEAT_EVERY
        inline.run_group([fn])  # the same window: no beat of its own
        assert beat() == first
        now[0] += BEAT_EVERY / 4
        inline.run_group([fn])  # a transaction of its own, more than a second after the last beat
        assert beat() == now[0]
        second = now[0]
        now[0] += BEAT_EVERY / 2
        inline.run_group([fn])
        assert beat() == second  # negative control: within the second
        deny = [True]

        def refuse_the_beat(action: int, table: str | None, *_: object) -> int:
            refused = action == sqlite3.SQLITE_UPDATE and table == "openers" and deny[0]
            return sqlite3.SQLITE_DENY if refused else sqlite3.SQLITE_OK

        inline._db.set_authorizer(refuse_the_beat)  # (a failure of the file, in the beat's own UPDATE)
        now[0] += 2 * BEAT_EVERY
        with pytest.raises(StoreError):
            inline.run_group([fn])
        deny[0] = False
        other = SQLiteStore(path, timeout=0.5)  # another writer: not locked out by a transaction left open
        try:
            other.update("b.example", lambda _s, t: (HostState(next_allowed=t, updated=t), None))
        finally:
            other.close()
        assert inline.run_group([fn])[0][0]
    finally:
        inline.close()
        store.close()


def test_sqlite_an_unclean_stop_is_found_and_its_last_rows_are_treated_as_just_booked(tmp_path, caplog):
    """A process killed with the table open leaves its mark: the next opening finds it, and every row changed
    within CRASH_WINDOW seconds before its last heartbeat gets a next allowed moment at least the opening plus
    its interval (as the row knows it), logged once. Negative controls: an older row is untouched; the next
    opening finds nothing (the mark is gone); a clean close and a live opener leave nothing to find."""
    from scrapy_polite.stores.sqlite import CRASH_WINDOW

    path = str(tmp_path / "pace.sqlite3")
    SQLiteStore(path, mark=True).close()
    assert SQLiteStore(path, mark=True).recovery is None  # a clean close: nothing to find (and this one stays open)
    for how in ("close", "open"):  # negative controls: closed cleanly; still running
        proc = _opener(tmp_path, path, how)
        if how == "open":
            assert proc.stdout.readline().strip() == b"open"
        check = SQLiteStore(path, mark=True)
        assert check.recovery is None, how
        check.close()
        proc.communicate(b"", timeout=30)
        assert proc.returncode == 0
    store = SQLiteStore(path)
    now = store.now()  # the table's clock (one anchor per boot: a step of the wall clock since does not move it)
    old = HostState(next_allowed=now - 50, updated=now - 60)
    recent = HostState(next_allowed=now - 0.5, updated=now - 1.0)  # its interval, as the row knows it: 0.5 s
    address = HostState(next_allowed=now + 1.0, updated=now - 2.0)  # 3 s
    slow = HostState(next_allowed=now - 1.0, updated=now - 1.5, crawl_delay=4.0)  # its Crawl-delay: 4 s
    for key, state in [("old.example", old), ("recent.example", recent), ("ip:192.0.2.1", address),
                       ("slow.example", slow)]:
        _put(store, key, state)
    store.close()
    proc = _opener(tmp_path, path, "kill")
    proc.wait(timeout=30)
    assert proc.returncode == -9
    with caplog.at_level("WARNING", logger="scrapy_polite.stores.sqlite"):
        reopened = SQLiteStore(path, mark=True)
    try:
        found = reopened.recovery
        assert found is not None and found.pids == (proc.pid,) and found.rows == 3
        assert found.since == pytest.approx(found.last_seen - CRASH_WINDOW) and found.last_seen >= now
        assert reopened.get("old.example") == old  # changed long before: untouched
        assert reopened.get("recent.example").next_allowed >= found.opened + 0.5 - 1e-6
        assert reopened.get("ip:192.0.2.1").next_allowed >= found.opened + 3.0 - 1e-6
        assert reopened.get("slow.example").next_allowed >= found.opened + 4.0 - 1e-6
        assert [r.message for r in caplog.records if "not closed" in r.message and str(proc.pid) in r.message]
    finally:
        reopened.close()
    again = SQLiteStore(path, mark=True)
    assert again.recovery is None  # the mark was removed with the repair
    again.close()


def test_sqlite_migrates_a_version_3_file_keeping_its_rows_without_latency(tmp_path):
    """A table written before adaptive pacing (schema 3) opens, keeps its rows (no latency measured, no strain),
    and takes the new fields (docs/spec.md §2, "Adaptive pacing")."""
    path = tmp_path / "pace.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE hosts (host TEXT PRIMARY KEY, next_allowed REAL NOT NULL, consec INTEGER NOT NULL,
            crawl_delay REAL NOT NULL, ok_seen INTEGER NOT NULL, throttled_at REAL NOT NULL,
            updated REAL NOT NULL, ratelimit_interval REAL NOT NULL DEFAULT 0,
            ratelimit_until REAL NOT NULL DEFAULT 0) WITHOUT ROWID;
        CREATE INDEX hosts_updated ON hosts (updated);
        CREATE TABLE events (id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, host TEXT NOT NULL,
            url TEXT, status INTEGER, delay REAL, due REAL, reason TEXT, retry_after REAL, steps INTEGER,
            address TEXT, started REAL, source TEXT NOT NULL);
        INSERT INTO hosts VALUES ('a.example', 1800000005.5, 3, 2.5, 1, 1800000001.0, 1800000002.0, 0.5, 0);
        PRAGMA user_version = 3;
    """)
    db.close()
    s = SQLiteStore(str(path))
    try:
        old = HostState(next_allowed=1800000005.5, consec=3, crawl_delay=2.5, ok_seen=True,
                        throttled_at=1800000001.0, updated=1800000002.0, ratelimit_interval=0.5)
        assert s.get("a.example") == old and old.latency == 0.0 and old.strain == 0
        new = HostState(next_allowed=T0, latency=0.25, strain=2, updated=T0)
        _put(s, "b.example", new)
        assert s.get("b.example") == new
    finally:
        s.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
    finally:
        db.close()


def test_sqlite_a_row_sqlite_refuses_fails_only_its_own_call_in_a_group(tmp_path):
    """Group commit (docs/spec.md §6): a row SQLite itself refuses (a NaN in a NOT NULL column) fails its
    own call with a StoreError, and the group's other calls commit; an update_many whose second row is
    refused writes none of its rows. Negative control: the good calls' rows are there."""
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    good = HostState(next_allowed=10.0, updated=5.0)
    bad = HostState(next_allowed=float("nan"), updated=5.0)
    try:
        out = store.run_group([
            rows.update("a.example", lambda old, now: (good, "a")),
            rows.update("b.example", lambda old, now: (bad, "b")),
            rows.update_many(["c.example", "d.example"],
                             lambda old, now: ({"c.example": good, "d.example": bad}, "cd")),
            rows.update("e.example", lambda old, now: (good, "e")),
        ])
        assert [ok for ok, _ in out] == [True, False, False, True]
        assert isinstance(out[1][1], StoreError) and isinstance(out[2][1], StoreError)
        assert (out[0][1], out[3][1]) == ("a", "e")
        assert store.get("a.example") == good and store.get("e.example") == good
        assert store.get("b.example") is None
        assert store.get("c.example") is None and store.get("d.example") is None  # the call wrote nothing
    finally:
        store.close()


def _marks(path):
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT token, pid, boot, started FROM openers").fetchall()
    finally:
        db.close()


def test_sqlite_only_a_crawl_leaves_a_running_mark(tmp_path):
    """The crash window's marks (docs/spec.md §6, "After a crash") are a crawl's: the stores the commands
    open (open_store's default options) leave none, so a command that dies is never taken for a crawl's
    crash. Negative control: with StoreOptions(mark=True) (the crawl's opening) the mark is there."""
    from scrapy_polite.stores import StoreOptions

    path = str(tmp_path / "pace.sqlite3")
    uri = f"sqlite:///{path}"
    command = open_store(uri, StoreOptions())
    assert _marks(path) == []
    command.close()
    crawl = open_store(uri, StoreOptions(mark=True))
    try:
        assert [pid for _, pid, _, _ in _marks(path)] == [os.getpid()]
    finally:
        crawl.close()
    assert _marks(path) == []


def test_sqlite_a_mark_whose_pid_now_runs_another_process_or_another_boot_is_gone(tmp_path):
    """A mark names its process by pid, start time and boot: a restarted container's pid 1 (the same pid,
    another start time) or a reboot (another boot) left it, so it is an unclean stop. Negative controls:
    this live process's own start time and boot are alive, and a mark without a start time (a system
    without /proc) is judged by its pid alone."""
    path = str(tmp_path / "pace.sqlite3")
    SQLiteStore(path, mark=True).close()
    with open(f"/proc/{os.getpid()}/stat") as f:
        started = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    cases = [("same process", boot, started, False), ("no start time", boot, 0, False),
             ("pid reused", boot, started + 1, True), ("another boot", "another-boot", started, True)]
    for name, their_boot, their_start, gone in cases:
        db = sqlite3.connect(path)
        db.execute("INSERT INTO openers (token, pid, machine, boot, started, opened, beat) VALUES "
                   "(?, ?, ?, ?, ?, ?, ?)", (name, os.getpid(), socket.gethostname(), their_boot,
                                              their_start, time.time(), time.time()))
        db.commit()
        db.close()
        store = SQLiteStore(path, mark=True)
        try:
            assert (store.recovery is not None) == gone, name
        finally:
            store.close()
        left = [token for token, _, _, _ in _marks(path)]
        assert (name in left) == (not gone), name
        db = sqlite3.connect(path)
        db.execute("DELETE FROM openers")
        db.commit()
        db.close()


@pytest.mark.parametrize("kill_says", [PermissionError, ProcessLookupError],
                         ids=["another-users-process", "negative-control-no-process"])
def test_sqlite_a_mark_of_another_users_process_hidden_by_proc_is_not_gone(monkeypatch, kill_says):
    """With ``/proc`` mounted ``hidepid``, another user's running crawl has no ``/proc/<pid>`` for us, but
    ``kill(pid, 0)`` says it runs (PermissionError): its mark is live (its start time unknown), not an unclean
    stop to repair and remove. Negative control: a pid that runs no process is gone."""
    from scrapy_polite.stores.sqlite import marks

    def kill(pid: int, signal: int) -> None:
        raise kill_says(pid)

    monkeypatch.setattr(marks.os, "kill", kill)
    hidden = 2**22 + 12345  # no /proc entry
    assert marks._start_time(hidden) == (0 if kill_says is PermissionError else None)
    assert marks._gone(hidden, "b", 777, "b") == (kill_says is ProcessLookupError)
