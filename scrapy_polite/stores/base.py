"""The store protocol every pace-table backend implements (docs/spec.md §6).

A store keeps one :class:`~scrapy_polite.policy.HostState` row per key: host keys
(:func:`scrapy_polite.policy.host_key`) and ``ip:ADDRESS`` keys for the per-address budgets.

**The store supplies the clock.** Every update function receives the store's ``now`` (Unix epoch
seconds) and every read returns it, so a backend with a server clock (Redis ``TIME``) is the one clock of
every booking and record across machines. The embedded backends read the monotonic process clock
(:data:`scrapy_polite.clock.process_clock`: epoch seconds that a step of the wall clock does not move) inside
the transaction, so a wait for another writer's lock never books a moment in the past.

**The event log** lives beside the rows (:meth:`PaceStore.append_events`, :meth:`PaceStore.events`): a bounded
log of :class:`Event` shared by every process using the store, written in batches off the crawl's hot path
(:mod:`scrapy_polite.reports.events`).

**Optional abilities are declared, not probed** (docs/spec.md §6, "Abilities"): a backend lists the protocols
below among its bases (Redis), or has their members (the embedded backends: a protocol among a class's bases
makes every ``isinstance`` against that class go through typing's slower check, and the store calls ask
such questions on their hot path); the crawl asks :func:`has_ability` once, when the table is opened (that
check costs tens of microseconds: never per call). An ability declared by a flag (:class:`ServerClock`,
:class:`ExpiringRows`, :class:`ProcessLocal`) is had only when the flag **is** ``True``: a backend that says
``server_clock = False`` has no server clock (``isinstance`` against a runtime protocol only sees that the
member exists). A backend without one is used the plain way:

* :class:`ServerClock` — its ``now`` is a server's clock (Redis ``TIME``): due times are converted to this
  process's clock, outages are waited out. Without: the clock is this process's, and a store error stops
  the crawl at once.
* :class:`SharedClock` — an embedded table's clock is this process's shifted by a fixed offset, one for
  every opener of this boot (SQLite). Without: this process's clock itself.
* :class:`ExpiringRows` — rows expire on their own (key TTLs). Without: stale rows are swept at start
  (:meth:`PaceStore.expire`).
* :class:`CallThreads` — each call waits on the network: the generic threaded table
  (:class:`~scrapy_polite.stores.ThreadedStore`) runs ``threads`` of them at once. Without: one store thread.
* :class:`SteppedStore` — updates run as steps that never sleep (Redis's optimistic writes). Without: an
  update is one call.
* :class:`BackingOffListing` — one query lists the hosts in backoff (SQLite). Without: the rows are
  scanned (:func:`hosts_backing_off`).
* :class:`ProcessLocal` — the table lives in this process's memory (``memory://``): nothing is shared with
  another process nor kept after it. Without: the table is shared, named by its URI (and key prefix).
* :class:`KeyPrefixed` — one server holds many tables, told apart by ``prefix`` (``POLITE_STORE_PREFIX``).
  Without: the URI alone names the table (:func:`table_name`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from ..policy import HostState
from ..vocabulary import EVENT_KINDS

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from .asyncstore import AsyncStore

__all__ = [
    "ABILITY_FLAGS",
    "Again",
    "BackingOffListing",
    "CallThreads",
    "ExpiringRows",
    "KeyPrefixed",
    "ProcessLocal",
    "ServerClock",
    "SharedClock",
    "EVENT_KINDS",
    "DEFAULT_EVENTS_MAX",
    "Event",
    "PaceStore",
    "Snapshot",
    "StoreClosed",
    "StoreCorrupt",
    "StoreError",
    "StoreBusy",
    "StoreOptions",
    "StoreUnavailable",
    "SteppedStore",
    "TABLE_KEY",
    "UpdateFn",
    "UpdateSteps",
    "ManyUpdateFn",
    "has_ability",
    "hosts_backing_off",
    "table_name",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
A = TypeVar("A")

#: An update function: ``(state or None, now)`` in, ``(new state or None to leave the row untouched, a
#: result for the caller)`` out. It must be pure: a backend may call it more than once (a retried
#: transaction).
UpdateFn = Callable[[HostState | None, float], tuple[HostState | None, T]]

#: A multi-row update function: ``({key: state or None}, now)`` in, ``({key: new state}, result)`` out.
ManyUpdateFn = Callable[[dict[str, HostState | None], float], tuple[dict[str, HostState], T]]


class StoreError(RuntimeError):
    """The pace table cannot be opened, read or written. The message names the store and the fix."""


class StoreBusy(StoreError):
    """An operation found the table contended (a no-wait SQLite connection found it locked; a Redis
    optimistic write lost its race too often); it may be retried where waiting is allowed."""


class StoreCorrupt(StoreError):
    """The store's data is damaged: the file is not a database or is malformed (a file cut short), or an entry
    of the event log cannot be read. Not transient; the message names the store and the fix. ``scrapy polite
    audit`` reports it as a log it cannot check (exit 2)."""


class StoreClosed(StoreError):
    """A call reached the pace table after it was closed (a late record at the crawl's close): it did
    nothing, and nothing was written. Not a failure of the store: the crawl is over, so it is not reported
    as one (docs/spec.md §6, "Closing")."""


class StoreUnavailable(StoreError):
    """A server store cannot be reached right now (connection refused or lost, the server loading its data
    after a restart). Transient: the crawl waits and retries until ``POLITE_STORE_TIMEOUT`` has passed
    since the outage began (:class:`~scrapy_polite.crawl.outage.StoreGuard`); an operation that raised it may
    or may not have been applied, and the backend makes its retry safe."""


@dataclass(frozen=True)
class Snapshot:
    """A consistent read of several rows and the store's clock at that read.

    Attributes:
        states: key → state (None: no row).
        now: the store's clock, Unix epoch seconds.
    """

    states: dict[str, HostState | None]
    now: float



#: The key of the table's identity row (docs/spec.md §6, "A table that comes back empty"): ``held_by`` is the
#: table's random id, written when a crawl first finds the table without one; never stale (``updated`` is
#: infinite). No host key starts with ``#`` (a forbidden host code point) and address keys start with ``ip:``.
TABLE_KEY = "#table"

#: ``POLITE_EVENT_LOG_SIZE``'s default: the most events one table keeps (the oldest are deleted first).
DEFAULT_EVENTS_MAX = 100_000


class Event(NamedTuple):
    """One entry of the event log kept beside the pace table (docs/guides/operating.md, "The event log").

    Every time is Unix epoch seconds of **the store's clock** (the one bookings use); every duration is seconds.
    Fields a kind does not use are None.

    Attributes:
        at: when it happened.
        kind: one of :data:`EVENT_KINDS`: ``booking`` (a request booked on its host; ``delay``: the interval
            booked, ``due``: the host's next allowed, ``address``: the address booked), ``wait`` (a request waits
            ``delay`` in line), ``deferral`` (a request left the downloader; ``reason``: ``throttled``,
            ``crawl_delay``, ``line`` or ``ip_line``; ``due``: when it may come back, None for a line),
            ``response`` (``status``, ``retry_after``, ``delay``: the delay chosen, ``due``: the host's next
            allowed, ``steps``: its backoff steps, ``started``: when the request was booked), ``failure``
            (the same for a download failure that reached the server's side, ``reason``: its name),
            ``backoff`` (a throttle took a backoff step; ``reason``: its cause, the status or the failure's
            name; ``delay``, ``due``, ``steps``, ``retry_after``), ``robots_delay`` (a robots.txt delay
            adopted, ``delay``), ``refusal`` (a request refused, ``reason``: ``non_public`` or ``no_host``),
            ``operator`` (``scrapy polite reset`` / ``crawl-delay``: ``reason`` names the verb), ``restored``
            (the table came back empty and this process wrote back what it knew, docs/spec.md §6: host ``""``
            for the table, ``steps``: the rows restored, ``started``: when this process last found the table
            whole; then one per host restored, ``delay``: its Crawl-delay, ``due``: its next allowed), ``opened``
            and ``closed`` (host ``""``: a crawler's log began, numbered before its first event, and was closed
            cleanly, numbered after its last: a process with more ``opened`` than ``closed`` was killed or still
            runs, and the events of its last second may be missing, ``scrapy polite audit``).
        host: the host key (``""`` for a URL without a host).
        url, status, delay, due, reason, retry_after, steps, address, started: see ``kind``; a ``response`` or
            ``failure`` also names the ``address`` its request was booked on.
        source: the process that wrote it, ``"machine:pid"``.
        interval: ``booking``: the host's interval this booking applied, seconds (the effective interval of
            docs/spec.md §2 with every override, as the booking computed it); None in a log written before it
            was recorded (``scrapy polite audit`` then reads ``delay``).
        ip_interval: ``booking``: the address's interval it applied (``POLITE_IP_INTERVAL``, 0: not paced by
            address); ``response``/``failure``: the interval its address was finished with (§3).
        hold: ``response``/``failure``: seconds the host is held because its announced quota is spent
            (docs/spec.md §2, "Announced quotas"); None: no hold.
        seq: the event's number among the events its process wrote to this store (0, 1, 2, ...): a gap, or a
            first number above 0, shows that events were lost or trimmed (``scrapy polite audit``). None for
            an operator's event and in older logs.
    """

    at: float
    kind: str
    host: str
    url: str | None = None
    status: int | None = None
    delay: float | None = None
    due: float | None = None
    reason: str | None = None
    retry_after: float | None = None
    steps: int | None = None
    address: str | None = None
    started: float | None = None
    source: str = ""
    interval: float | None = None
    ip_interval: float | None = None
    hold: float | None = None
    seq: int | None = None


@dataclass(frozen=True)
class StoreOptions:
    """Options a backend may use when it is opened by :func:`~scrapy_polite.stores.open_store`.

    Attributes:
        prefix: ``POLITE_STORE_PREFIX``, the key prefix of a shared server (Redis).
        timeout: ``POLITE_STORE_TIMEOUT``, seconds a server may stay unreachable mid-crawl.
        expire: ``POLITE_STORE_EXPIRE``, seconds a row is kept past its ``next_allowed`` and last update.
        events_max: ``POLITE_EVENT_LOG_SIZE``, the most events the table's event log keeps (the oldest
            are deleted first when an append goes beyond it).
        mark: the opener is a crawl: a file store (SQLite) leaves its "running" mark and looks for those of
            unclean stops (docs/spec.md §6, "After a crash"). False for the ``scrapy polite`` commands and
            other readers: a command that dies must not pass for a crawl's crash.
    """

    prefix: str = "polite:"
    timeout: float = 60.0
    expire: float = 30 * 24 * 3600.0
    events_max: int = DEFAULT_EVENTS_MAX
    mark: bool = False


class PaceStore(Protocol):
    """What every backend provides. Times are Unix epoch seconds of the store's clock.

    Every method raises :class:`StoreError` when the backend fails.
    """

    uri: str

    def now(self) -> float:
        """The store's clock (epoch seconds)."""
        ...

    def get(self, key: str) -> HostState | None:
        """The key's state, or None."""
        ...

    def read(self, keys: Sequence[str]) -> Snapshot:
        """The rows of ``keys`` and the store's clock, read together."""
        ...

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        """Atomically read the key's state, apply ``fn(state, now)``, write the new state (when not None)
        and return ``fn``'s result. No concurrent update, from any process, is lost."""
        ...

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        """Atomically read the rows of ``keys``, apply ``fn(states, now)``, write the states it returns
        (only keys among ``keys``) and return its result. Books a request on its host and an address in
        one transaction (docs/spec.md §3)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove the key's row; True when there was one."""
        ...

    def items(self) -> Iterator[tuple[str, HostState]]:
        """Every ``(key, state)`` row, sorted by key."""
        ...

    def expire(self, before: float) -> int:
        """Remove rows last updated before ``before`` whose ``next_allowed`` has passed; the count."""
        ...

    def append_events(self, events: Sequence[Event]) -> None:
        """Append ``events`` to the table's event log, shared by every process using the store, then delete
        the oldest entries beyond the store's cap (``events_max``). Appends of several processes interleave;
        none is lost."""
        ...

    def events(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        """The ``limit`` events (at most) appended last whose ``at`` is ``>= since`` (None: any) and whose host
        is ``host`` (None: any), oldest first (by ``at``, then by order of appending). Events are appended
        after they happen, so the last appended are the latest but for a batch's few seconds."""
        ...

    def close(self) -> None:
        """Release the backend."""
        ...

    def open_async(self, reactor: Any = None) -> AsyncStore:
        """This backend's async table (:class:`~scrapy_polite.stores.asyncstore.AsyncStore`), which a crawl
        uses: each backend implements its own (docs/spec.md §6, "Never blocking the crawl"); a synchronous
        third-party backend returns :class:`~scrapy_polite.stores.asyncstore.ThreadedStore` ``(self,
        reactor)``. Closing the table closes the backend."""
        ...


class Again(NamedTuple):
    """What :meth:`UpdateSteps.step` returns when its update lost a race: call ``step`` again after ``delay``
    seconds (0: at once). docs/spec.md §6, "Redis: contention".

    Attributes:
        delay: seconds to wait before the next step (>= 0).
    """

    delay: float


class UpdateSteps(Protocol[T_co]):
    """One update of a server store, cut into steps that never sleep (docs/spec.md §6, "Redis: contention"): each
    :meth:`step` is at most one read and one write round trip. The caller waits between two steps however
    it likes — an async table on the reactor's clock, so a lost race never holds a
    store thread while it waits."""

    def step(self) -> T_co | Again:
        """Try the update once more: its result (the update is done), or :class:`Again` (it lost a race).

        Raises:
            StoreError: as :meth:`PaceStore.update`; :class:`StoreBusy` once the update lost too many races.
        """
        ...


@runtime_checkable
class SteppedStore(Protocol):
    """A store whose updates can be run step by step (:class:`UpdateSteps`), e.g. Redis's optimistic writes.
    Its async table runs each step on a store thread and waits between two steps on
    the reactor, so one contended row delays only the updates of that row (docs/spec.md §6, "Redis: contention")."""

    def update_steps(self, key: str, fn: UpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`PaceStore.update` as steps; no I/O until the first step."""
        ...

    def update_many_steps(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> UpdateSteps[T]:
        """:meth:`PaceStore.update_many` as steps; no I/O until the first step."""
        ...


# -- optional abilities (docs/spec.md §6, "Abilities") ---------------------------------------------------------


@runtime_checkable
class ServerClock(Protocol):
    """A store whose clock is a server's (Redis ``TIME``): its ``now`` is the one clock of every booking and
    record across machines. The pacer converts its due times to this process's clock
    (:class:`~scrapy_polite.clock.ClockSync`) and waits out its outages
    (:class:`~scrapy_polite.crawl.outage.StoreGuard`, ``POLITE_STORE_TIMEOUT``). A store without it reads this
    process's monotonic clock, and a store error stops the crawl at once (docs/spec.md §6).

    Declared by listing it among the backend's bases (the member then has its value), or by the member
    ``server_clock = True``; any other value (``False``) declares that the backend has none (:func:`has_ability`).
    """

    #: The declaration itself: True (a store whose member is anything else has no server clock).
    server_clock: Literal[True] = True


@runtime_checkable
class SharedClock(Protocol):
    """An embedded table whose clock is this process's shifted by a fixed offset, one clock for every process
    that opens it on this boot of the machine (SQLite: docs/spec.md §6, "One clock per file"). The pacer turns
    its due times into this process's clock with it (:class:`~scrapy_polite.clock.ClockSync`). A store without
    it and without a :class:`ServerClock` reads this process's clock itself (offset 0)."""

    #: Seconds, this process's clock minus the table's, fixed while the table is open.
    clock_offset: float


@runtime_checkable
class ExpiringRows(Protocol):
    """A store whose rows expire on their own (Redis key TTLs of ``POLITE_STORE_EXPIRE`` seconds): the
    crawl's start does not sweep the table. A store without it is swept at start with
    :meth:`PaceStore.expire` (rows idle for ``POLITE_STORE_EXPIRE`` seconds whose ``next_allowed`` has
    passed). Declared like :class:`ServerClock`: only ``expires_rows = True`` declares it (:func:`has_ability`)."""

    #: The declaration itself: True (a store whose member is anything else is swept).
    expires_rows: Literal[True] = True


@runtime_checkable
class CallThreads(Protocol):
    """A store whose every call waits on the network: :class:`~scrapy_polite.stores.ThreadedStore` runs up to
    ``threads`` calls at once on its pool (their round trips overlap). A store without it gets one thread."""

    #: Threads that may call the store at once (>= 1).
    threads: int


@runtime_checkable
class BackingOffListing(Protocol):
    """A store that lists the hosts in backoff with one query (SQLite: a table of a million hosts is not
    read whole). A store without it is scanned with :meth:`PaceStore.items` (:func:`hosts_backing_off`)."""

    def backing_off(self, now: float) -> Iterator[tuple[str, HostState]]:
        """Every host row (no ``ip:`` key) with backoff steps (``consec > 0``) whose ``next_allowed`` is after
        ``now`` (the store's clock, epoch seconds), sorted by key.

        Raises:
            StoreError: the table cannot be read.
        """
        ...


@runtime_checkable
class ProcessLocal(Protocol):
    """A table that lives in this process's memory (``memory://``): no other process shares it and nothing
    of it outlives the process, so its events are numbered alone (:attr:`Event.seq`) and there is nothing
    to read back from its URI after the crawl. A store without it is shared, named by :func:`table_name`.
    Declared like :class:`ServerClock`: only ``process_local = True`` declares it (:func:`has_ability`)."""

    #: The declaration itself: True (a store whose member is anything else is shared).
    process_local: Literal[True] = True


@runtime_checkable
class KeyPrefixed(Protocol):
    """A server that holds many tables, told apart by a key prefix (``POLITE_STORE_PREFIX``): the URI and
    the prefix together name one table (:func:`table_name`). A store without it is named by its URI."""

    #: The prefix of every key of this table.
    prefix: str


#: The abilities declared by a flag: the protocol → the member that must be ``True`` (docs/spec.md §6,
#: "Abilities"). Every other ability is a method or a value, had when the backend has the member.
ABILITY_FLAGS: dict[object, str] = {ServerClock: "server_clock", ExpiringRows: "expires_rows",
                            ProcessLocal: "process_local"}


def has_ability(store: object, ability: Callable[..., A]) -> TypeIs[A]:
    """``store`` has the optional ``ability`` (one of the protocols above; docs/spec.md §6, "Abilities"): for
    an ability declared by a flag (:data:`ABILITY_FLAGS`: :class:`ServerClock`, :class:`ExpiringRows`,
    :class:`ProcessLocal`) the backend's flag **is** ``True`` (``server_clock = False`` declares no server
    clock, where ``isinstance`` would only see that the member exists); for any other (:class:`SharedClock`,
    :class:`CallThreads`, :class:`SteppedStore`, :class:`BackingOffListing`, :class:`KeyPrefixed`) it has the
    protocol's members (``isinstance``). Costs tens of microseconds: asked once, when the table is opened,
    never per call.

    ``ability`` is typed as a callable returning the protocol because a type checker refuses a protocol class
    where ``type[A]`` is expected (PEP 544); pass the protocol class itself.
    """
    if not isinstance(store, ability):  # type: ignore[arg-type]  # a runtime_checkable protocol class
        return False
    flag = ABILITY_FLAGS.get(ability)
    return flag is None or getattr(store, flag) is True


def table_name(store: PaceStore) -> str | None:
    """The name every process that shares ``store``'s table gives it: its URI, and its key prefix when it
    has one (:class:`KeyPrefixed`); None for a table of this process's own (:class:`ProcessLocal`)."""
    if has_ability(store, ProcessLocal):
        return None
    if has_ability(store, KeyPrefixed):
        return f"{store.uri} {store.prefix}"
    return store.uri


def hosts_backing_off(store: PaceStore, now: float) -> list[tuple[str, HostState]]:
    """Every host row (no ``ip:`` key) with backoff steps whose ``next_allowed`` is after ``now`` (the store's
    clock, epoch seconds), sorted by key: the store's own query when it has one (:class:`BackingOffListing`),
    else a scan of its rows. Blocking (call it off the reactor).

    Raises:
        StoreError: the table cannot be read.
    """
    if has_ability(store, BackingOffListing):
        return list(store.backing_off(now))
    return [(key, state) for key, state in store.items()
            if not key.startswith("ip:") and state.consec > 0 and state.next_allowed > now]
