"""The SQLite pace table's rows: a :class:`~scrapy_polite.policy.HostState` as a ``hosts`` row and back, one
connection's rows read through a cache (:class:`Rows`), the event log's rows, and the operations on them
(:data:`Op`), each written once and run by the store alone (:meth:`SQLiteStore.update
<scrapy_polite.stores.sqlite.SQLiteStore.update>`, ...) or with the others of its group in one transaction
(:meth:`SQLiteStore.run_group <scrapy_polite.stores.sqlite.SQLiteStore.run_group>`, docs/spec.md §6 "Group
commit")."""

from __future__ import annotations

import dataclasses
import math
import operator
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

from ...policy import HostState, state_from_fields
from ..base import Event, ManyUpdateFn, Snapshot, UpdateFn

__all__ = ["CALLER_ERRORS", "Op", "REFUSALS", "Rows", "get_op", "read", "read_op", "update", "update_many",
           "update_many_op", "update_op"]

T = TypeVar("T")

#: The store's clock (epoch seconds), read inside the transaction.
Clock = Callable[[], float]

#: One operation on the rows: ``op(rows, clock)`` → its result, on the rows of the store's connection
#: (:class:`Rows`) inside its transaction (a write's ``BEGIN IMMEDIATE``, alone or with its group) or a read's.
#: It writes nothing unless it returns: a caller's function that raises, a key written that was not read, a row
#: SQLite refuses all leave the rows as they were.
Op = Callable[["Rows", Clock], T]

#: What SQLite raises for one call's own bad row or argument (not for the file): in a group commit that call
#: fails alone (:meth:`SQLiteStore.run_group <scrapy_polite.stores.sqlite.SQLiteStore.run_group>`).
CALLER_ERRORS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError)
#: Those, and Python's ``sqlite3`` refusing an integer beyond SQLite's 64 bits (``OverflowError``).
REFUSALS = (*CALLER_ERRORS, OverflowError)

# -- the codec --------------------------------------------------------------------------------------------------

#: The ``hosts`` columns after ``host``, one per :class:`HostState` field, in this order.
HOST_FIELDS = ("next_allowed", "consec", "crawl_delay", "ok_seen", "throttled_at", "updated", "ratelimit_interval",
               "ratelimit_until", "quota_left", "quota_reset", "quota_limit", "quota_window", "quota_serial", "booked",
               "latency", "strain", "run_retry_after", "held_until", "held_by", "origin_delays")
if (set(HOST_FIELDS) != {f.name for f in dataclasses.fields(HostState)}
        or [f.name for f in dataclasses.fields(HostState) if f.type == "str"] != [HOST_FIELDS[-1]]):  # pragma: no cover
    raise AssertionError("every HostState field needs a column in HOST_FIELDS (and a migration), its one text field "
                         "last (encode sums the others)")
COLUMNS = ", ".join(HOST_FIELDS)
SELECT_ONE = f"SELECT {COLUMNS} FROM hosts WHERE host = ?"
WRITE = f"INSERT OR REPLACE INTO hosts (host, {COLUMNS}) VALUES ({', '.join(['?'] * (len(HOST_FIELDS) + 1))})"

EVENT_COLUMNS = ("at, kind, host, url, status, delay, due, reason, retry_after, steps, address, started, source, "
                 "interval, ip_interval, hold, seq")
EVENT_INSERT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * len(Event._fields))})"
EVENT_TRIM = "DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?"

#: The number columns: every one but the last, ``origin_delays`` (text).
_NUMBERS = HOST_FIELDS[:-1]
_GET_NUMBERS = operator.attrgetter(*_NUMBERS)
_OK_SEEN = HOST_FIELDS.index("ok_seen")


def decode(row: Sequence[Any] | None) -> HostState | None:
    """A ``hosts`` row (the columns of :data:`HOST_FIELDS`) as its :class:`HostState`: the same value
    ``HostState(**fields)`` makes (:func:`~scrapy_polite.policy.state_from_fields`; two or three per booking)."""
    if row is None:
        return None
    fields = dict(zip(HOST_FIELDS, row))
    fields["ok_seen"] = bool(fields["ok_seen"])
    return state_from_fields(fields)


def keyed(rows: Iterable[Sequence[Any]]) -> list[tuple[str, HostState]]:
    """Rows of ``host`` and the columns of :data:`HOST_FIELDS` as ``(key, state)``."""
    return [(row[0], state) for row in rows if (state := decode(row[1:])) is not None]


def encode(key: str, state: HostState) -> tuple[Any, ...]:
    """The ``hosts`` row of ``key`` (``ok_seen``, a bool, as the integer 1 or 0: Python's ``sqlite3`` binds a bool
    through its adaptation, two failed attribute lookups, about 4,000 instructions per row; an int at once).

    Raises:
        sqlite3.IntegrityError: a field is NaN: refused as SQLite refuses a NaN in a NOT NULL column, in every
            column. SQLite itself would not: ``INSERT OR REPLACE`` puts a column's default in place of the NULL
            a NaN becomes, so a NaN ``ratelimit_until`` would be stored as 0 (the quota no longer held).
    """
    values = _GET_NUMBERS(state)
    text = state.origin_delays
    try:
        total = sum(values)  # one C loop over the numbers: a NaN in any of them makes the sum NaN
    except TypeError:  # a field that is no number: SQLite's own refusal of its type says which
        return (key, *values, text)
    if total != total:
        bad = [name for name, value in zip(_NUMBERS, values) if value != value]
        if bad:  # (not when only an infinity and its opposite made the NaN: SQLite stores those)
            raise sqlite3.IntegrityError(f"the row of {key!r} has {', '.join(bad)} NaN, not a number")
    ok_seen = values[_OK_SEEN]
    if type(ok_seen) is bool:
        return (key, *values[:_OK_SEEN], int(ok_seen), *values[_OK_SEEN + 1:], text)
    return (key, *values, text)


def _real(value: Any) -> float:
    """A number as a REAL column reads it back (an integer as a float, -0.0 as 0.0)."""
    if not isinstance(value, (int, float)):  # (text, bytes: SQLite may keep them as they are; not predicted here)
        raise TypeError(f"a {type(value).__name__} value")
    return float(value) + 0.0


def _text(value: Any) -> str:
    """Text as a TEXT column reads it back: itself."""
    if not isinstance(value, str):  # (numbers, bytes: SQLite stores them as text or a blob; not predicted here)
        raise TypeError(f"a {type(value).__name__} value")
    return value


def _integer(value: Any) -> Any:
    """A number as an INTEGER column reads it back: an integral float strictly between the smallest and the largest
    64-bit integers as an int (SQLite stores it so: ``sqlite3VdbeIntegerAffinity``), any other float as itself, a
    bool (or another int) as an int."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and -2.0**63 < value < 2.0**63 else float(value)
    if isinstance(value, int):
        return int(value)
    raise TypeError(f"a {type(value).__name__} value")


#: Per column of :data:`HOST_FIELDS`, how SQLite reads back what was written, by the column's affinity (the
#: field's annotated type: ``float`` fields are REAL columns, ``int`` and ``bool`` ones INTEGER, ``str`` ones TEXT;
#: :func:`decode` makes the bool).
_CONVERTERS: dict[str, Callable[[Any], Any]] = {"float": _real, "bool": _integer, "int": _integer, "str": _text}


def _per_column(by_type: dict[str, T]) -> tuple[T, ...]:
    """``by_type``'s value for each column of :data:`HOST_FIELDS`, by its field's annotated type's name."""
    types = {field.name: str(field.type) for field in dataclasses.fields(HostState)}
    return tuple(by_type[types[name]] for name in HOST_FIELDS)


_AS_READ = _per_column(_CONVERTERS)
#: Per column of :data:`HOST_FIELDS`, the one type whose values every column reads back as they are (a REAL column's
#: float but -0.0, an INTEGER column's int, a TEXT column's str; ``ok_seen``'s int, which :func:`encode` made of a
#: bool and :func:`decode` makes a bool again).
_EXACT: tuple[type, ...] = _per_column({"float": float, "bool": int, "int": int, "str": str})
_FLOATS_OF = operator.itemgetter(*[i for i, kind in enumerate(_EXACT) if kind is float])
_ONES = (1.0,) * sum(kind is float for kind in _EXACT)


def reads_back_as_written(state: HostState, row: Sequence[Any]) -> bool:
    """Whether reading back the ``hosts`` row ``row`` (:func:`encode`'s of ``state``, key first) gives ``state``
    itself: a HostState (no subclass) whose ``ok_seen`` is a bool, whose every column has its exact type
    (:data:`_EXACT`) and whose floats all have their sign bit clear (-0.0 reads back as 0.0; a negative float, never
    a policy's, takes :func:`as_read`'s way too). Two C loops: the way most written rows take instead of
    :func:`as_read` and :func:`decode`."""
    columns = row[1:]
    return (type(state) is HostState and type(state.ok_seen) is bool and tuple(map(type, columns)) == _EXACT
            and min(map(math.copysign, _ONES, _FLOATS_OF(columns))) > 0)


def as_read(row: Sequence[Any]) -> tuple[Any, ...]:
    """The columns after ``host`` that reading back the ``hosts`` row ``row`` (:func:`encode`'s, key first)
    gives: :func:`decode` makes of them the state SQLite would.

    Raises:
        TypeError: a field holds no number (what SQLite makes of it is not predicted here).
    """
    return tuple([convert(value) for convert, value in zip(_AS_READ, row[1:])])


#: The most rows one connection's cache holds (about 1.1 KB each): beyond it, the row cached first is dropped to
#: make room (read again from the file when next wanted), so a crawl over a million hosts holds no million rows.
CACHE_ROWS = 10_000

#: A cached row: its state (None: no row) and its columns as the file holds them (None: no row).
_Cached = tuple[HostState | None, Sequence[Any] | None]
_STATE = operator.itemgetter(0)


class Rows:
    """The ``hosts`` rows of one connection, read through a cache that holds while no other connection has
    committed to the file (docs/spec.md §6, "The rows' cache"): the cache is dropped whenever ``PRAGMA
    data_version`` (which changes with every commit of another connection, of any process, and with another
    connection's checkpoint that starts the WAL over) differs from when it was filled, which :meth:`sync` checks
    before the first row a transaction or a read (:meth:`begin`) reads. A row written through :meth:`put` is cached
    as SQLite will read it back (:func:`as_read`); a transaction rolled back, and a call's rows put back after a
    refusal, drop the cache (:meth:`forget`). It holds at most :data:`CACHE_ROWS` rows. Used only under the
    store's connection lock, as the connection.

    Args:
        db: the store's connection (autocommit: every transaction is the store's own ``BEGIN``).

    Attributes:
        db: the connection.
    """

    __slots__ = ("_rows", "_synced", "_version", "db", "holds")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._rows: dict[str, _Cached] = {}
        self._version: int | None = None
        self._synced = False  # checked since begin()
        #: A row written (since the store last reset it) takes an in-flight hold: its transaction is committed at
        #: once, never written behind (docs/spec.md §6, "Write-behind").
        self.holds = False

    def begin(self) -> None:
        """A transaction or a read begins: the cache is checked before the first row it reads or writes (not at
        all when it reads none: an event log's)."""
        self._synced = False

    def sync(self) -> None:
        """Drop the cache when another connection committed since it was filled (one ``PRAGMA data_version``:
        inside a write transaction, which reads the newest state, or as a read of its own)."""
        version = self.db.execute("PRAGMA data_version").fetchone()[0]
        self._synced = True
        if version != self._version:
            self._rows.clear()
            self._version = version

    def forget(self) -> None:
        """Drop the cache: the connection's transaction was rolled back, or it changed rows itself."""
        self._rows.clear()
        self._version = None

    def get(self, key: str) -> HostState | None:
        """The row of ``key`` (None: there is none): cached, or read (and cached)."""
        if not self._synced:
            self.sync()
        try:
            return self._rows[key][0]
        except KeyError:
            return self._read(key)[0]

    def found(self, keys: Sequence[str]) -> dict[str, HostState | None]:
        """key → the row of each of ``keys`` (:meth:`get`'s), in C calls when all are cached (the way of a crawl
        alone on its table)."""
        if self._synced:
            try:
                return dict(zip(keys, map(_STATE, map(self._rows.__getitem__, keys))))
            except KeyError:
                pass
        return dict(zip(keys, map(self.get, keys)))

    def columns(self, key: str) -> Sequence[Any] | None:
        """The columns after ``host`` of the row of ``key`` as the file holds them (None: no row)."""
        self.get(key)  # (cached now, read when it was not)
        return self._rows[key][1]

    def _read(self, key: str) -> _Cached:
        row = self.db.execute(SELECT_ONE, (key,)).fetchone()
        cached = (decode(row), row)
        self._keep(key, cached)
        return cached

    def _keep(self, key: str, cached: _Cached) -> None:
        """Cache the row of ``key``, dropping the row cached first when the cache is full."""
        rows = self._rows
        if len(rows) >= CACHE_ROWS and key not in rows:
            del rows[next(iter(rows))]
        rows[key] = cached

    def cached(self, keys: Sequence[str]) -> dict[str, HostState | None] | None:
        """The cached rows of ``keys``, or None when one of them is not cached (no row is read)."""
        try:
            return {key: self._rows[key][0] for key in keys}
        except KeyError:
            return None

    def put(self, rows: Sequence[tuple[Any, ...]], states: Sequence[HostState]) -> None:
        """Write ``rows`` (:func:`encode`'s of ``states``, in the same order) in one statement each; cache each
        written row as it reads back: its state itself when that is what reads back (:func:`reads_back_as_written`),
        else what :func:`as_read` predicts.

        Raises:
            sqlite3.Error, OverflowError: SQLite refused a row (:data:`REFUSALS`), or the file failed; the rows
                before it are written (:func:`write_rows` puts them back).
        """
        if not self._synced:
            self.sync()
        for row, state in zip(rows, states, strict=True):
            self.db.execute(WRITE, row)
            if state.held_by:
                self.holds = True
            if reads_back_as_written(state, row):
                self._keep(row[0], (state, row[1:]))
                continue
            try:
                columns = as_read(row)
            except TypeError:
                self._rows.pop(row[0], None)  # read back from the file next time
            else:
                self._keep(row[0], (decode(columns), columns))


# -- the operations ---------------------------------------------------------------------------------------------


def read(keys: Sequence[str]) -> Op[Snapshot]:
    """The operation of :meth:`PaceStore.read <scrapy_polite.stores.base.PaceStore.read>`."""
    return partial(read_op, keys)


def update(key: str, fn: UpdateFn[T]) -> Op[T]:
    """The operation of :meth:`PaceStore.update <scrapy_polite.stores.base.PaceStore.update>`."""
    return partial(update_op, key, fn)


def update_many(keys: Sequence[str], fn: ManyUpdateFn[T]) -> Op[T]:
    """The operation of :meth:`PaceStore.update_many <scrapy_polite.stores.base.PaceStore.update_many>`."""
    return partial(update_many_op, keys, fn)


# The operations' bodies: ``partial(body, *args)`` is the operation (the async table binds them itself, one
# Python call fewer per call on the crawl's hot path).


def get_op(key: str, table: Rows, clock: Clock) -> HostState | None:
    return table.get(key)


def read_op(keys: Sequence[str], table: Rows, clock: Clock) -> Snapshot:
    """The rows and the clock, read together: inside the transaction it runs in (a group's), else from the cache
    just checked (:meth:`Rows.sync`), with the rows it misses read in a read transaction of its own."""
    if len(keys) == 1 or table.db.in_transaction:
        return Snapshot({key: table.get(key) for key in keys}, clock())
    table.sync()
    states = table.cached(keys)
    if states is not None:
        return Snapshot(states, clock())
    db = table.db
    db.execute("BEGIN")
    try:
        table.sync()
        states = {key: table.get(key) for key in keys}
        now = clock()
    finally:
        db.execute("COMMIT")
    return Snapshot(states, now)


def update_op(key: str, fn: UpdateFn[T], table: Rows, clock: Clock) -> T:
    new, result = fn(table.get(key), clock())
    if new is not None:
        table.put((encode(key, new),), (new,))
    return result


def update_many_op(keys: Sequence[str], fn: ManyUpdateFn[T], table: Rows, clock: Clock) -> T:
    # C calls (zip, map, a key-set comparison), no comprehension: each would be a call of its own (Python < 3.12)
    # on each booking and record.
    keys = list(keys)  # (read twice below: an iterator given is read once)
    found = table.found(keys)
    writes, result = fn(dict(found), clock())
    if not (type(writes) is dict and writes.keys() <= found.keys()):  # a stray key, or not a dict: looked at key by key
        stray = [key for key in writes if key not in found]
        if stray:
            raise ValueError(f"update function wrote {stray[0]!r}, which it did not read")
    rows = list(map(encode, writes, writes.values()))  # a bad state raises before any write
    if len(rows) == 1:
        table.put(rows, list(writes.values()))  # one statement: it writes whole or not at all
    elif rows:
        write_rows(table, rows, list(writes.values()))
    return result


def write_rows(table: Rows, rows: Sequence[tuple[Any, ...]], states: Sequence[HostState]) -> None:
    """Write one call's rows (inside its transaction) whole or not at all: when SQLite refuses one of them (a
    NaN in a NOT NULL column, an integer beyond 64 bits, a value of a type it cannot store), the rows written
    before it are put back column for column as the file held them in this transaction (which holds the write
    lock: nothing else changed them since; no row: it is deleted), and the refusal is raised. Without a
    savepoint: the rule costs nothing until a row is refused (docs/spec.md §6, "After a crash"). A failure of the
    file (``sqlite3.Error`` other than a refusal) propagates: the whole transaction is rolled back."""
    before = [table.columns(row[0]) for row in rows]
    try:
        table.put(rows, states)
    except Exception as exc:
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, CALLER_ERRORS):
            raise
        table.forget()  # the rows put back are read from the file again
        for row, old in zip(rows, before):  # (the refused row and those after it are unchanged: rewritten as is)
            if old is None:
                table.db.execute("DELETE FROM hosts WHERE host = ?", (row[0],))
            else:
                table.db.execute(WRITE, (row[0], *old))
        raise


# -- the event log ----------------------------------------------------------------------------------------------


#: An event's field as it is bound: None as a float NaN, which SQLite stores as NULL (``sqlite3_bind_double`` of a
#: NaN, as for a NaN in a ``hosts`` column: :func:`encode`) and Python's ``sqlite3`` binds at once, where a None first
#: goes through its adaptation (a failed lookup in its adapters and two in attributes, about 3,300 instructions,
#: five or six per event); any other value as itself. ``map(_BOUND, event, event)``: no Python call per field.
_BOUND = dict[Any, Any]({None: math.nan}).get
_FLOAT_ADAPTER = (float, sqlite3.PrepareProtocol)


def append_events(events: Sequence[Event], cap: int, table: Rows, clock: Clock) -> None:
    """Inside a write transaction: append ``events`` (their None fields NULL), then delete the oldest beyond
    ``cap``. The events are bound as they are when a process registered an adapter for floats
    (``sqlite3.register_adapter``: a NaN would be adapted too), or when a field is unhashable (``_BOUND`` cannot
    look it up; SQLite then refuses it or stores it, as it would)."""
    bound: Sequence[Sequence[Any]] = events
    if _FLOAT_ADAPTER not in sqlite3.adapters:
        try:
            bound = [tuple(map(_BOUND, event, event)) for event in events]
        except TypeError:
            pass
    table.db.executemany(EVENT_INSERT, bound)
    table.db.execute(EVENT_TRIM, (cap,))


def select_events(db: sqlite3.Connection, since: float | None, host: str | None, limit: int) -> list[Event]:
    """The ``limit`` events appended last whose ``at`` is ``>= since`` and whose host is ``host`` (None:
    any), oldest first (by ``at``, then by id)."""
    where: list[str] = []
    args: list[Any] = []
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    if host is not None:
        where.append("host = ?")
        args.append(host)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    query = (f"SELECT {EVENT_COLUMNS} FROM (SELECT id, {EVENT_COLUMNS} FROM events {clause} "
             "ORDER BY id DESC LIMIT ?) ORDER BY at, id")
    return [Event._make(row) for row in db.execute(query, (*args, limit)).fetchall()]
