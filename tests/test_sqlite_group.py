"""SQLite's group commit (docs/spec.md §6, "Group commit"): a call whose row SQLite refuses fails alone and
writes none of its rows, without a savepoint: the rows it wrote before the refused one are put back as its
own transaction read them (``SQLiteStore.run_group`` of the operations of ``stores.sqlite.rows``); and a row reads
back as the HostState written."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_polite.policy import HostState
from scrapy_polite.stores import SQLiteStore, StoreError
from scrapy_polite.stores.sqlite import rows

OLD = HostState(next_allowed=3.0, consec=2, crawl_delay=1.5, ok_seen=True, throttled_at=1.0, updated=2.0)
GOOD = HostState(next_allowed=10.0, updated=5.0)
EARLIER = HostState(next_allowed=7.0, consec=1, updated=4.0)
#: Rows the store refuses: a NaN (IntegrityError, before any write: test_a_nan_is_refused_in_every_column...), an
#: integer beyond 64 bits (Python's sqlite3 raises OverflowError), a value of a type it cannot store
#: (ProgrammingError); the last two in the middle of a call's writes.
REFUSED = {
    "nan": HostState(next_allowed=float("nan"), updated=5.0),
    "overflow": HostState(next_allowed=10.0, quota_left=2 ** 70, updated=5.0),
    "type": HostState(next_allowed=10.0, latency=[1.0], updated=5.0),  # type: ignore[arg-type]
}


def _raw_rows(path: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT * FROM hosts ORDER BY host").fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("refusal", sorted(REFUSED))
@pytest.mark.parametrize("bad_at", [0, 1, 2])
def test_a_refused_row_undoes_its_calls_earlier_rows_and_nothing_else(tmp_path, refusal, bad_at):
    """An update_many over three rows (one there before the group, one absent, one written earlier in the
    same group) whose row at ``bad_at`` SQLite refuses fails with a StoreError and leaves all three as its
    own transaction read them: the row that was there keeps its old value, the absent one stays absent, the
    one written by an earlier call of the group keeps that call's value (not the value before the group).
    Negative control: the group's other calls, before and after it, commit."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path)
    try:
        store.update("old.example", lambda _s, _now: (OLD, None))
        before = dict(store.items())
        keys = ["old.example", "absent.example", "earlier.example"]
        writes = {key: GOOD for key in keys}
        writes[keys[bad_at]] = REFUSED[refusal]
        out = store.run_group([
            rows.update("earlier.example", lambda _s, _now: (EARLIER, "earlier")),
            rows.update_many(keys, lambda _states, _now: (dict(writes), "many")),
            rows.read(keys),
            rows.update("after.example", lambda _s, _now: (GOOD, "after")),
        ])
        assert [ok for ok, _ in out] == [True, False, True, True], out
        assert isinstance(out[1][1], StoreError) and "refused a row" in str(out[1][1])
        seen = out[2][1].states  # read in the same transaction, right after the refused call
        assert seen == {"old.example": OLD, "absent.example": None, "earlier.example": EARLIER}
        after = dict(store.items())
        assert after == {**before, "earlier.example": EARLIER, "after.example": GOOD}
    finally:
        store.close()


def test_a_refused_row_restores_the_old_row_byte_for_byte(tmp_path):
    """The row put back is the one read, column for column (not a HostState rewritten: every value and
    type as it was in the file). Negative control: an accepted update_many of the same rows changes them."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path)
    try:
        store.update_many(["a.example", "b.example"],
                          lambda _s, _now: ({"a.example": OLD, "b.example": EARLIER}, None))
        raw = _raw_rows(path)
        out = store.run_group([rows.update_many(["a.example", "b.example"], lambda _s, _now: (
            {"a.example": GOOD, "b.example": REFUSED["nan"]}, None))])
        assert not out[0][0]
        assert _raw_rows(path) == raw
        out = store.run_group([rows.update_many(["a.example", "b.example"], lambda _s, _now: (
            {"a.example": GOOD, "b.example": GOOD}, None))])
        assert out[0][0] and _raw_rows(path) != raw
        assert store.get("a.example") == GOOD and store.get("b.example") == GOOD
    finally:
        store.close()


def test_a_group_of_two_row_bookings_takes_no_savepoint(tmp_path, monkeypatch):
    """The rule costs nothing until a row is refused: an accepted two-row update_many in a group runs no
    SAVEPOINT (it cost 8-15 µs of CPU per booking on a loaded 2-core machine). Negative control: the trace
    sees the rows' writes and a refused call's put-back (a DELETE of the row it had added)."""
    path = str(tmp_path / "pace.sqlite3")
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):  # every connection the store opens: its statements watched
        db = connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", traced)
    store = SQLiteStore(path)
    monkeypatch.setattr(sqlite3, "connect", connect)
    tracer = sqlite3.connect(path, isolation_level=None)  # only to read the file afterwards
    try:
        statements.clear()
        store.run_group([rows.update_many(["a.example", "ip:192.0.2.1"], lambda _s, _now: (
            {"a.example": GOOD, "ip:192.0.2.1": GOOD}, None))])
        assert not any("SAVEPOINT" in s.upper() for s in statements), statements
        assert sum(s.startswith("INSERT OR REPLACE INTO hosts") for s in statements) == 2
        statements.clear()
        out = store.run_group([rows.update_many(["b.example", "ip:192.0.2.2"], lambda _s, _now: (
            {"b.example": GOOD, "ip:192.0.2.2": REFUSED["overflow"]}, None))])  # refused by SQLite mid-call
        assert not out[0][0]
        assert any(s.startswith("DELETE FROM hosts") for s in statements), statements
        assert tracer.execute("SELECT COUNT(*) FROM hosts WHERE host = 'b.example'").fetchone() == (0,)
    finally:
        tracer.close()
        store.close()


_FLOATS = st.floats(allow_nan=False, width=64)
_INTS = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)


def _strategy_for(field: dataclasses.Field) -> st.SearchStrategy:
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    return {"float": _FLOATS, "int": _INTS, "bool": st.booleans(), "str": st.text()}[kind]


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({f.name: _strategy_for(f) for f in dataclasses.fields(HostState)}))
def test_a_row_read_back_is_the_host_state_written(fields):
    """Any HostState (every float, infinities included; every 64-bit integer; both booleans; any text) written through
    a group commit reads back as the same value, each field of its own type (``ok_seen`` a bool, not SQLite's
    integer), a frozen value like any other. Negative control: a different state does not compare equal."""
    state = HostState(**fields)
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(os.path.join(directory, "pace.sqlite3"))
        try:
            out = store.run_group([
                rows.update_many(["a.example", "ip:192.0.2.1"], lambda _s, _now: (
                    {"a.example": state, "ip:192.0.2.1": GOOD}, None)),
                rows.read(["a.example"]),
            ])
            back = out[1][1].states["a.example"]
            assert back == state == store.get("a.example") and hash(back) == hash(state)
            assert all(type(getattr(back, name)) is type(value) for name, value in fields.items())
            assert back != dataclasses.replace(state, consec=state.consec ^ 1)
            with pytest.raises(dataclasses.FrozenInstanceError):
                back.consec = 1  # type: ignore[misc]
        finally:
            store.close()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(HostState) if f.type == "float"])
def test_a_nan_is_refused_in_every_column_not_replaced_by_its_default(tmp_path, field):
    """SQLite refuses a NaN only in a NOT NULL column without a default; in the others (every column added since
    the first schema) INSERT OR REPLACE would store the default instead (a NaN ratelimit_until as 0: the quota
    no longer held). The store refuses it in every float column, and the row stays as it was. Negative
    control: a finite value in the same column lands."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path)
    try:
        store.update("a.example", lambda _s, _now: (OLD, None))
        bad = dataclasses.replace(OLD, **{field: float("nan")})
        good = dataclasses.replace(OLD, **{field: 123.5})
        out = store.run_group([rows.update("a.example", lambda _s, _now: (bad, None)),
                               rows.update_many(["b.example"], lambda _s, _now: ({"b.example": bad}, None)),
                               rows.update("c.example", lambda _s, _now: (good, None))])
        assert [ok for ok, _ in out] == [False, False, True], out
        assert field in str(out[0][1]) and isinstance(out[1][1], StoreError)
        assert store.get("a.example") == OLD and store.get("b.example") is None
        assert store.get("c.example") == good
    finally:
        store.close()


#: Values of any kind a field may be given (a policy's int in a float field, an integral float in an int field,
#: a bool, -0.0, floats at and beyond the ends of 64-bit integers): the cache must hold each as the file reads it.
_EDGES = [-0.0, 2.0 ** 63, -(2.0 ** 63), 2.0 ** 63 - 1024, -(2.0 ** 63) + 1024, 2.0 ** 52 + 0.5]
_ANY = st.one_of(_FLOATS, _INTS, st.booleans(), st.sampled_from(_EDGES))


def _typed(state: HostState) -> list[tuple[str, object]]:
    return [(type(value).__name__, repr(value)) for value in dataclasses.astuple(state)]


def _cached_and_read(state: HostState) -> tuple[HostState | None, HostState | None]:
    """``state`` written by one store: its own read (from its cache) and a second connection's (from the file)."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "pace.sqlite3")
        store, fresh = SQLiteStore(path), SQLiteStore(path)
        try:
            store.update("a.example", lambda _s, _now: (OLD, None))
            assert store.get("a.example") == OLD  # cached before the write
            store.update("a.example", lambda _s, _now: (state, None))
            return store.get("a.example"), fresh.get("a.example")
        finally:
            store.close()
            fresh.close()


@settings(max_examples=80, deadline=None)
@given(st.fixed_dictionaries({f.name: _ANY for f in dataclasses.fields(HostState)}))
def test_a_cached_row_is_the_row_the_file_reads_back(fields):
    """The rows' cache (``rows.Rows``) holds a written row as SQLite reads it back, type by type (a REAL column
    reads an int as a float and -0.0 as 0.0, an INTEGER column an integral float as an int): the writing store's
    own read (from its cache) and a second connection's (from the file) are the same value of the same types."""
    cached, read = _cached_and_read(HostState(**fields))
    assert cached is not None and read is not None
    assert _typed(cached) == _typed(read)


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({f.name: _strategy_for(f) for f in dataclasses.fields(HostState)}))
def test_a_row_of_its_fields_types_is_cached_as_the_file_reads_it_back(fields):
    """A state whose every field has its own type (the rows a policy writes), with any float (-0.0, negative,
    infinite) and any 64-bit integer: its own read (from the cache, mostly the state written itself) and a second
    connection's (from the file) are the same value of the same types, a HostState."""
    cached, read = _cached_and_read(HostState(**fields))
    assert cached is not None and read is not None
    assert _typed(cached) == _typed(read) and type(cached) is type(read) is HostState


class _Subclass(HostState):
    pass


def test_a_state_that_reads_back_as_itself_is_cached_as_it_is():
    """The way most written rows take (``rows.reads_back_as_written``): the state written is the state cached,
    without predicting its columns and decoding them. Negative controls: a state the file reads back otherwise
    (-0.0, an int in a float field, an integral float in an int field, an int ``ok_seen``, a subclass) is cached as
    the file reads it."""
    state = dataclasses.replace(OLD, next_allowed=12.5, quota_left=-1)
    cached, read = _cached_and_read(state)
    assert cached is state and read == state
    for other in (dataclasses.replace(OLD, next_allowed=-0.0), dataclasses.replace(OLD, latency=2),
                  dataclasses.replace(OLD, ok_seen=1), dataclasses.replace(OLD, ok_seen=0),
                  dataclasses.replace(OLD, consec=2.0), _Subclass(**dataclasses.asdict(OLD))):
        cached, read = _cached_and_read(other)
        assert cached is not other and cached is not None and read is not None
        assert _typed(cached) == _typed(read) and type(cached) is type(read) is HostState


@pytest.mark.parametrize(("changes", "differs"), [
    ({"latency": 2}, True),  # an int in a REAL column reads back as a float
    ({"next_allowed": -0.0}, True),  # -0.0 as 0.0
    ({"consec": 3.0, "booked": 2.0 ** 40}, True),  # integral floats in INTEGER columns as ints
    ({"held_by": True}, True),  # a bool in an INTEGER column as an int
    ({"latency": None, "next_allowed": 50.0}, True),  # NULL in a column with a default: the default (read again)
    ({"latency": b"1.5", "next_allowed": 50.0}, False),  # bytes in a REAL column stay bytes (read again)
])
def test_what_the_file_reads_back_and_the_cache_follow_the_file(changes, differs):
    """The cases the cache's conversion is for, each read from the cache as from the file. Negative control of
    the test above: the conversions' cases read back differently from the state written."""
    state = dataclasses.replace(OLD, **changes)
    cached, read = _cached_and_read(state)
    assert cached is not None and read is not None
    assert (_typed(read) != _typed(state)) is differs
    assert _typed(cached) == _typed(read)


def test_the_cache_sees_every_commit_of_another_connection(tmp_path):
    """A store that read a row (now in its cache) reads another connection's later commit of it: in an update
    (inside its write transaction), in a read outside one, and in a group's read. Negative control: the cache
    is used (a second read of an unchanged row runs no SELECT)."""
    path = str(tmp_path / "pace.sqlite3")
    store, other = SQLiteStore(path), SQLiteStore(path)
    try:
        store.update("a.example", lambda _s, _now: (OLD, None))
        assert store.get("a.example") == OLD and store.get("b.example") is None
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        assert store.get("a.example") == OLD and store.read(["a.example", "b.example"]).states["a.example"] == OLD
        assert not [s for s in statements if s.startswith("SELECT")], statements
        other.update("a.example", lambda _s, _now: (GOOD, None))
        assert store.get("a.example") == GOOD
        other.update("a.example", lambda _s, _now: (EARLIER, None))
        seen = store.update("a.example", lambda old, _now: (None, old))
        assert seen == EARLIER
        other.update("a.example", lambda _s, _now: (OLD, None))
        assert store.run_group([rows.read(["a.example"])])[0][1].states["a.example"] == OLD
        other.delete("a.example")
        assert store.read(["a.example", "b.example"]).states["a.example"] is None
    finally:
        store.close()
        other.close()


def test_a_read_of_rows_not_cached_sees_a_commit_made_after_the_cache_was_checked(tmp_path, monkeypatch):
    """A read of several rows, some not cached, reads them in a read transaction of its own, checking the cache
    again inside it: another connection's commit made between the first check and that transaction is seen in
    the rows that were cached too. Negative control: the commit is made (the other connection reads it)."""
    path = str(tmp_path / "pace.sqlite3")
    store, other = SQLiteStore(path), SQLiteStore(path)
    try:
        store.update("a.example", lambda _s, _now: (OLD, None))
        assert store.get("a.example") == OLD
        cached = rows.Rows.cached

        def commit_first(self, keys):
            other.update("a.example", lambda _s, _now: (GOOD, None))
            return cached(self, keys)

        monkeypatch.setattr(rows.Rows, "cached", commit_first)
        snapshot = store.read(["a.example", "b.example"])
        assert other.get("a.example") == GOOD
        assert snapshot.states == {"a.example": GOOD, "b.example": None}
    finally:
        store.close()
        other.close()


def test_a_refused_row_puts_back_a_row_another_tool_wrote_column_for_column(tmp_path):
    """A row written by another tool with values this version would not write (``ok_seen`` 2), cached, then
    overwritten by a call whose next row is refused, is put back as the file held it, not as its HostState
    would be written. Negative control: an accepted write of it changes it."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path)
    try:
        store.update("a.example", lambda _s, _now: (OLD, None))
        tool = sqlite3.connect(path)
        tool.execute("UPDATE hosts SET ok_seen = 2 WHERE host = 'a.example'")
        tool.commit()
        tool.close()
        raw = _raw_rows(path)
        assert store.get("a.example") == OLD  # (ok_seen reads as True)
        out = store.run_group([rows.update_many(["a.example", "b.example"], lambda _s, _now: (
            {"a.example": GOOD, "b.example": REFUSED["overflow"]}, None))])
        assert not out[0][0]
        assert _raw_rows(path) == raw
        store.update("a.example", lambda _s, _now: (OLD, None))
        assert _raw_rows(path) != raw
    finally:
        store.close()


def test_a_rolled_back_transaction_leaves_nothing_in_the_cache(tmp_path):
    """A group whose transaction is rolled back (the file's failure after a call wrote its row) leaves the
    cache as the file is: the row reads as before the group. And the store's own deletions and expiries drop
    the cache. Negative control: the call's write reached the cache before the failure (the group wrote it)."""
    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path)
    try:
        store.update("a.example", lambda _s, _now: (OLD, None))
        seen: list[HostState | None] = []

        def write_then_fail(table, clock):
            table.put([rows.encode("a.example", GOOD)], [GOOD])
            seen.append(table.get("a.example"))
            raise sqlite3.OperationalError("disk I/O error")

        with pytest.raises(StoreError):
            store.run_group([rows.update("b.example", lambda _s, _now: (GOOD, None)), write_then_fail])
        assert seen == [GOOD]
        assert store.get("a.example") == OLD and store.get("b.example") is None
        store.delete("a.example")
        assert store.get("a.example") is None
        store.update("c.example", lambda _s, _now: (OLD, None))
        assert store.expire(OLD.next_allowed + 1) == 1 and store.get("c.example") is None
    finally:
        store.close()


def test_the_cache_holds_at_most_its_size_and_reads_what_it_dropped(tmp_path, monkeypatch):
    """The cache keeps at most ``rows.CACHE_ROWS`` rows (a crawl over a million hosts holds no million rows in
    memory): the rows cached first make room, and are read again from the file, right, when next wanted.
    Negative control: a row still cached is read without a SELECT."""
    monkeypatch.setattr(rows, "CACHE_ROWS", 8)
    store = SQLiteStore(str(tmp_path / "pace.sqlite3"))
    try:
        states = {f"h{i}.example": dataclasses.replace(OLD, next_allowed=100.0 + i) for i in range(20)}
        for key, state in states.items():
            store.update(key, lambda _s, _now, state=state: (state, None))
        assert len(store._rows._rows) == 8
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        assert store.get("h19.example") == states["h19.example"]
        assert not [s for s in statements if s.startswith("SELECT")], statements
        assert all(store.get(key) == state for key, state in states.items())
        assert len([s for s in statements if s.startswith("SELECT")]) >= 12
        assert len(store._rows._rows) == 8
    finally:
        store.close()
