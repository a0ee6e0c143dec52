"""The optional abilities of a store are declared protocols (scrapy_polite/stores/base.py; docs/spec.md §6,
"Abilities"), and a backend without one is used the plain way.

Each ability gets a test with a plain backend (:class:`PlainStore`: the :class:`~scrapy_polite.stores.PaceStore`
protocol and nothing more, the shape of a third-party backend registered with ``register_store``) and a
negative control with the ability declared, where the consumer must take the other road. No crawl runs: the
consumers are called directly (the pacer's one needs Scrapy's crawler object, nothing more).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import pytest_twisted
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.internet import defer

from scrapy_polite.clock import ClockSync
from scrapy_polite.crawl.outage import StoreGuard, TableWatch
from scrapy_polite.pacer import Pacer, open_pace_table
from scrapy_polite.policy import HostState
from scrapy_polite.reports.events import EventLog
from scrapy_polite.settings import PoliteConfig
from scrapy_polite.stores import (
    ABILITY_FLAGS,
    Again,
    AsyncStore,
    BackingOffListing,
    CallThreads,
    Event,
    ExpiringRows,
    KeyPrefixed,
    MemoryStore,
    ProcessLocal,
    ServerClock,
    SharedClock,
    Snapshot,
    SQLiteStore,
    SteppedStore,
    StoreError,
    StoreOptions,
    asyncstore,
    base,
    has_ability,
    hosts_backing_off,
    register_store,
    table_name,
)

NOW = 2_000_000_000.0


class PlainStore:
    """The store protocol and nothing more (rows kept by a :class:`MemoryStore` inside, which is not exposed)."""

    def __init__(self, uri: str = "plain://table") -> None:
        self.uri = uri
        self._rows = MemoryStore(clock=lambda: NOW)
        self.calls: list[str] = []

    def now(self) -> float:
        return self._rows.now()

    def get(self, key: str) -> HostState | None:
        self.calls.append("get")
        return self._rows.get(key)

    def read(self, keys: Sequence[str]) -> Snapshot:
        return self._rows.read(keys)

    def update(self, key: str, fn: Any) -> Any:
        self.calls.append("update")
        return self._rows.update(key, fn)

    def update_many(self, keys: Sequence[str], fn: Any) -> Any:
        return self._rows.update_many(keys, fn)

    def delete(self, key: str) -> bool:
        return self._rows.delete(key)

    def items(self) -> Iterator[tuple[str, HostState]]:
        self.calls.append("items")
        return self._rows.items()

    def expire(self, before: float) -> int:
        self.calls.append(f"expire {before}")
        return self._rows.expire(before)

    def append_events(self, events: Sequence[Event]) -> None:
        self._rows.append_events(events)

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        return self._rows.events(since, host, limit)

    def close(self) -> None:
        self.calls.append("close")

    def open_async(self, reactor: Any = None) -> Any:
        """A synchronous backend opts into the generic threaded table (the documented path of a third-party
        backend: nothing chooses it by the backend's type)."""
        return asyncstore.ThreadedStore(self, reactor)


def _rows() -> dict[str, HostState]:
    """Rows the backing-off listing must tell apart: one in backoff, one whose backoff is over, one without
    steps, an address row in backoff (never a host)."""
    return {
        "backing.example": HostState(next_allowed=NOW + 60, consec=2, updated=NOW - 1),
        "over.example": HostState(next_allowed=NOW - 5, consec=3, updated=NOW - 100),
        "calm.example": HostState(next_allowed=NOW + 60, consec=0, updated=NOW - 1),
        "ip:192.0.2.1": HostState(next_allowed=NOW + 60, consec=1, updated=NOW - 1),
    }


def _fill(store: Any) -> None:
    for key, state in _rows().items():
        store.update(key, lambda _old, _now, state=state: (state, None))


# -- the real backends declare what they have ---------------------------------------------------------------

def test_the_embedded_backends_declare_only_their_abilities(tmp_path):
    memory, sqlite = MemoryStore(), SQLiteStore(str(tmp_path / "t.sqlite3"))
    try:
        assert has_ability(memory, ProcessLocal) and not has_ability(sqlite, ProcessLocal)
        assert has_ability(sqlite, BackingOffListing) and not has_ability(memory, BackingOffListing)
        assert has_ability(sqlite, SharedClock) and not has_ability(memory, SharedClock)
        for ability in (ServerClock, ExpiringRows, CallThreads, KeyPrefixed, SteppedStore):
            assert not has_ability(memory, ability), ability
            assert not has_ability(sqlite, ability), ability
    finally:
        sqlite.close()


def test_redis_lists_its_abilities_among_its_bases():
    redis_module = pytest.importorskip("scrapy_polite.stores.redis")
    bases = redis_module.RedisStore.__mro__
    for ability in (ServerClock, ExpiringRows, CallThreads, KeyPrefixed, SteppedStore):
        assert ability in bases, ability
    assert ProcessLocal not in bases and BackingOffListing not in bases
    assert redis_module.RedisStore.server_clock is True and redis_module.RedisStore.expires_rows is True
    assert PlainStore not in bases and not isinstance(PlainStore(), ServerClock)  # the plain backend has none


# -- ExpiringRows and CallThreads: opening the table ------------------------------------------------------------

class ExpiringStore(PlainStore):
    expires_rows = True  # ExpiringRows, declared by its member

    def expire(self, before: float) -> int:
        raise AssertionError("a store whose rows expire on their own is not swept")


class ThreadedStore(PlainStore):
    threads = 2  # CallThreads


def _open(store: PlainStore, expire: float = 3600.0) -> AsyncStore:
    register_store("plaintest", lambda uri, options: store)
    return open_pace_table("plaintest://table", StoreOptions(expire=expire))


class NoAsyncStore(PlainStore):
    """A backend that implements no async table (as if written before the stores had one)."""

    @property
    def open_async(self) -> Any:  # type: ignore[override]
        raise AttributeError("open_async")


def test_a_backend_without_an_async_table_is_refused_with_the_fix():
    """A backend is never given an async table by its type: one without ``open_async`` is refused at the
    crawl's opening, the message naming the opt-in, and the backend is closed again. Negative control: the
    plain backend, which opts into the generic threaded table, opens with it."""
    store = NoAsyncStore()
    with pytest.raises(StoreError, match="ThreadedStore"):
        _open(store)
    assert store.calls[-1] == "close"
    astore = _open(PlainStore())
    try:
        assert isinstance(astore, asyncstore.ThreadedStore)
    finally:
        astore.close()


class ExpiringDeclinedStore(PlainStore):
    expires_rows = False  # declares that its rows do not expire on their own


@pytest.mark.parametrize("store_class", [PlainStore, ExpiringDeclinedStore])
def test_a_store_without_expiring_rows_is_swept_at_start(store_class):
    store = store_class()
    _fill(store)
    store.update("stale.example", lambda _old, _now: (HostState(next_allowed=NOW - 7200, updated=NOW - 7200), None))
    astore = _open(store)
    try:
        assert store.calls.count(f"expire {NOW - 3600.0}") == 1
        assert store.get("stale.example") is None  # idle past POLITE_STORE_EXPIRE and its due passed: gone
        assert store.get("over.example") is not None  # updated within the hour: kept
    finally:
        astore.close()


def test_negative_control_a_store_whose_rows_expire_is_not_swept():
    store = ExpiringStore()
    assert isinstance(store, ExpiringRows)
    astore = _open(store)  # ExpiringStore.expire would fail the test
    astore.close()
    assert not [c for c in store.calls if c.startswith("expire")]


def _overlap(store: PlainStore, result: dict[str, bool]) -> None:
    """Make the store's ``get`` report whether a second call came in while the first was still running."""
    entered = threading.Event()
    lock = threading.Lock()
    first = [True]

    def get(key: str) -> HostState | None:
        with lock:
            am_first, first[0] = first[0], False
        if am_first:
            result["overlapped"] = entered.wait(1.0)  # a second thread comes in meanwhile, or never
        else:
            entered.set()
        return None

    store.get = get  # type: ignore[method-assign]


@pytest.mark.parametrize(("store_class", "overlapped"), [
    (PlainStore, False),  # without CallThreads: one store thread
    (ThreadedStore, True),  # negative control: a store with call threads gets them
])
@pytest_twisted.ensureDeferred
async def test_a_store_gets_as_many_call_threads_as_it_declares(store_class, overlapped):
    store = store_class()
    assert has_ability(store, CallThreads) is overlapped
    result: dict[str, bool] = {}
    _overlap(store, result)
    astore = _open(store)
    try:
        await defer.gatherResults([astore.get("a.example"), astore.get("b.example")])
    finally:
        await astore.close_async()
    assert result == {"overlapped": overlapped}


# -- SteppedStore: updates as steps ------------------------------------------------------------------------------

class SteppedPlainStore(PlainStore):
    """Its updates lose one race (``Again``) before they apply."""

    def update_steps(self, key: str, fn: Any) -> Any:
        store, tries = self, []

        class Steps:
            def step(self) -> Any:
                tries.append(key)
                store.calls.append("step")
                return Again(0.0) if len(tries) == 1 else store._rows.update(key, fn)

        return Steps()

    def update_many_steps(self, keys: Sequence[str], fn: Any) -> Any:
        raise AssertionError("not used here")

    def update(self, key: str, fn: Any) -> Any:
        raise AssertionError("a stepped store's updates run as steps")


def _bump(state: HostState | None, now: float) -> tuple[HostState, int]:
    consec = (state.consec if state else 0) + 1
    return HostState(next_allowed=now, consec=consec, updated=now), consec


@pytest_twisted.ensureDeferred
async def test_a_store_without_steps_updates_in_one_call():
    store = PlainStore()
    astore = store.open_async()
    try:
        assert [await astore.update("a.example", _bump) for _ in range(3)] == [1, 2, 3]
    finally:
        await astore.close_async()
    assert store.calls.count("update") == 3 and "step" not in store.calls


@pytest_twisted.ensureDeferred
async def test_negative_control_a_stepped_store_is_run_step_by_step():
    store = SteppedPlainStore()
    assert isinstance(store, SteppedStore)
    astore = store.open_async()
    try:
        assert await astore.update("a.example", _bump) == 1
    finally:
        await astore.close_async()
    assert store.calls.count("step") == 2  # the lost race, then the update


# -- BackingOffListing: the hosts in backoff at start ---------------------------------------------------------

def test_a_store_without_the_listing_is_scanned(tmp_path):
    store = PlainStore()
    _fill(store)
    assert not isinstance(store, BackingOffListing)
    listed = hosts_backing_off(store, NOW)
    assert [key for key, _state in listed] == ["backing.example"]  # not the address, the calm or the over one
    assert "items" in store.calls
    sqlite = SQLiteStore(str(tmp_path / "t.sqlite3"), clock=lambda: NOW)
    try:
        _fill(sqlite)
        assert hosts_backing_off(sqlite, NOW) == listed  # the same answer as the one query
    finally:
        sqlite.close()


def test_negative_control_a_store_with_the_listing_is_not_scanned():
    class Listing(PlainStore):
        def backing_off(self, now: float) -> Iterator[tuple[str, HostState]]:
            return iter([("listed.example", HostState(next_allowed=now + 1, consec=1, updated=now))])

        def items(self) -> Iterator[tuple[str, HostState]]:
            raise AssertionError("a store with its own listing is not scanned")

    assert [key for key, _ in hosts_backing_off(Listing(), NOW)] == ["listed.example"]


# -- ProcessLocal and KeyPrefixed: the table's name, the events' numbering ------------------------------------

class PrefixedStore(PlainStore):
    def __init__(self, prefix: str) -> None:
        super().__init__("plain://server")
        self.prefix = prefix  # KeyPrefixed


class SharedDeclaredStore(PlainStore):
    process_local = False  # declares that the table is not this process's own


def test_a_table_is_named_by_its_uri_and_prefix_unless_it_is_the_process_own():
    assert table_name(PlainStore("plain://server")) == "plain://server"
    assert table_name(SharedDeclaredStore("plain://server")) == "plain://server"  # False: shared, named
    assert table_name(PrefixedStore("a:")) != table_name(PrefixedStore("b:"))  # two tables of one server
    assert table_name(PrefixedStore("a:")) == table_name(PrefixedStore("a:"))
    assert table_name(MemoryStore()) is None


class Writer:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def append_events(self, events: list[Event]) -> Any:
        self.events.extend(events)
        return defer.succeed(None)


def _numbers(store: Any, count: int) -> list[int | None]:
    writer = Writer()
    log = EventLog(writer, ClockSync(lambda: NOW), table=table_name(store))
    for _ in range(count):
        log.refusal("a.example", "http://a.example/", "no_host")
    log.close()
    return [e.seq for e in writer.events]


def test_logs_of_one_shared_table_share_one_numbering():
    shared = PrefixedStore("numbering-test:")
    first, second = _numbers(shared, 2), _numbers(PrefixedStore("numbering-test:"), 2)  # (opened, 2, closed) each
    assert second == [first[-1] + n for n in range(1, 5)]  # type: ignore[operator]  # no gap: one source, one table
    other = _numbers(PrefixedStore("numbering-other:"), 1)
    assert other == [0, 1, 2]  # another table of the same server starts its own


def test_negative_control_a_table_of_the_process_own_is_numbered_alone():
    assert _numbers(MemoryStore(), 2) == [0, 1, 2, 3]  # (the log's opening and closing)
    assert _numbers(MemoryStore(), 2) == [0, 1, 2, 3]


# -- ServerClock: the pacer ------------------------------------------------------------------------------------

class ServerClockedStore(PlainStore):
    server_clock = True  # ServerClock

    def now(self) -> float:
        return NOW - 100.0  # the server's clock, 100 s behind this process's


def _pacer(store: PlainStore) -> Pacer:
    crawler = get_crawler(settings_dict={"POLITE_STORE": "memory://"})
    return Pacer(crawler, PoliteConfig.from_settings(crawler.settings), store.open_async(), clock=lambda: NOW)


class ServerClockDeclinedStore(PlainStore):
    server_clock = False  # declares that it has no server clock: isinstance(store, ServerClock) still holds

    def now(self) -> float:
        return NOW - 100.0  # off by 100 s: the offset the pacer would apply if it took it for a server's


@pytest.mark.parametrize(("store_class", "backing"), [
    (PlainStore, ["backing.example"]),
    # Its now is 100 s behind: over.example's backoff (until NOW - 5) has not ended by that clock.
    (ServerClockDeclinedStore, ["backing.example", "over.example"]),
])
@pytest_twisted.ensureDeferred
async def test_a_store_without_a_server_clock_is_on_this_process_clock_and_fails_closed(store_class, backing):
    store = store_class()
    _fill(store)
    pacer = _pacer(store)
    try:
        assert not pacer.sync.server_clock
        # Its errors stop the crawl at once: no outage to wait out (behind the watch of a table that comes back empty).
        assert isinstance(pacer.table, TableWatch) and not isinstance(pacer.table.store, StoreGuard)
        offset, rows = await deferred_from_coro(pacer.hosts_in_backoff())  # an asyncio task, as the crawl's
        assert offset == 0.0 and [key for key, _ in rows] == backing
    finally:
        pacer.close()


@pytest_twisted.ensureDeferred
async def test_negative_control_a_server_clock_is_converted_and_its_outages_waited_out():
    store = ServerClockedStore()
    _fill(store)
    pacer = _pacer(store)
    try:
        assert pacer.sync.server_clock and isinstance(pacer.table, TableWatch) and isinstance(pacer.table.store, StoreGuard)
        offset, _rows = await deferred_from_coro(pacer.hosts_in_backoff())
        assert offset == pytest.approx(100.0)  # the table's times + 100 s are this process's
    finally:
        pacer.close()


# -- has_ability: a flag must be True -----------------------------------------------------------------------------

@pytest.mark.parametrize(("ability", "flag"), sorted(ABILITY_FLAGS.items(), key=lambda item: item[1]))
@pytest.mark.parametrize(("value", "has"), [(True, True), (False, False), (1, False), ("yes", False), (None, False)])
def test_a_flag_declares_its_ability_only_when_it_is_true(ability, flag, value, has):
    store = type("Declaring", (PlainStore,), {flag: value})()
    assert isinstance(store, ability)  # what a runtime protocol sees: the member exists, whatever its value
    assert has_ability(store, ability) is has
    assert not has_ability(PlainStore(), ability)  # no member: no ability


def test_every_flag_ability_is_checked_by_its_value():
    """A protocol of stores/base.py whose member is a ``Literal[True]`` declaration is listed in ABILITY_FLAGS
    (else has_ability would take ``flag = False`` for the ability); a method or value ability is not."""
    flags = {name: cls for name, cls in vars(base).items()
             if isinstance(cls, type) and getattr(cls, "_is_protocol", False)
             and any("Literal[True]" in str(hint) for hint in getattr(cls, "__annotations__", {}).values())}
    assert set(flags.values()) == set(ABILITY_FLAGS), flags
    for cls, member in ABILITY_FLAGS.items():
        assert getattr(cls, member) is True
    assert CallThreads not in ABILITY_FLAGS and KeyPrefixed not in ABILITY_FLAGS
