"""The Redis table's updates, step by step (:class:`~scrapy_polite.stores.base.UpdateSteps`; docs/spec.md §6,
"Redis: exactly once" and "Redis: contention"): what every update shares (:class:`Steps`: its identity and
idempotence record, the decision, the wait after a lost race), the optimistic algorithm of the ``table``
layout (:class:`OptimisticUpdate`); the ``sharded`` layout's is in :mod:`.sharded`.

**Optimistic writes.** A read is one small script (``TIME`` + ``HMGET``…, atomic, so several rows are one
snapshot); a write is one generic script that writes the new rows only if **every row read** still has the
version read (absent = 0), else returns the current rows and the clock, on which the update function is applied
again. So an uncontended booking is two round trips, and a contended one costs one more per lost race.

**Exactly once.** Every update has a random id; the write that applies it also sets its idempotence record (to
the number of the attempt that was applied), with a TTL of ``POLITE_STORE_TIMEOUT`` + :data:`DONE_MARGIN`
seconds, in the same script. Each write first looks for that key and applies nothing when it is there: so the
resend of a write whose reply was lost (by the store, by a cluster client, or by the crawl's retry after
:class:`~scrapy_polite.stores.base.StoreUnavailable`, which uses the same update function and so the same id)
returns the first result instead of applying the update again.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ...policy import HostState
from ..base import Again, ManyUpdateFn, StoreBusy, StoreUnavailable, UpdateSteps
from .codec import FIELD_ARGS, Row, decode, encode

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = ["DONE_MARGIN", "MAX_ATTEMPTS", "MAX_BUSY_SECONDS", "OptimisticUpdate", "Pending", "PendingWrites", "Steps",
           "finish", "rows_args"]

T = TypeVar("T")

#: Lost races one update may meet before it gives up (each costs one round trip; the winner of every race
#: makes progress, so this is only reached under extreme contention on one row) …
MAX_ATTEMPTS = 10_000
#: … or seconds it may spend losing them (counted from its second lost race).
MAX_BUSY_SECONDS = 10.0
#: Seconds an idempotence record outlives ``POLITE_STORE_TIMEOUT``: the crawl retries an update only while
#: the outage has lasted less than that timeout, so the record is still there for every retry.
DONE_MARGIN = 120.0

#: Writes of unknown outcome remembered for their retry (oldest forgotten first).
_PENDING_LIMIT = 10_000


@dataclass
class Pending:
    """What is known of an update whose write may have been applied: its id and each attempt's result."""

    token: str
    results: dict[int, Any] = field(default_factory=dict)
    #: ``sharded``, rows in several slots: attempt → each slot's write (a retry finishes a partial write).
    writes: dict[int, list[list[Any]]] = field(default_factory=dict)


class PendingWrites:
    """The updates whose write was sent but whose connection was lost (applied or not, nobody knows), by
    ``(update function, keys)``: the retry of the same update takes over its id and results (thread-safe;
    the oldest are forgotten past a limit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: OrderedDict[tuple[Any, tuple[str, ...]], Pending] = OrderedDict()

    def take(self, name: tuple[Any, tuple[str, ...]]) -> Pending | None:
        with self._lock:
            return self._pending.pop(name, None)

    def remember(self, name: tuple[Any, tuple[str, ...]], pending: Pending) -> None:
        with self._lock:
            self._pending[name] = pending
            self._pending.move_to_end(name)
            while len(self._pending) > _PENDING_LIMIT:
                self._pending.popitem(last=False)


class Steps(Generic[T]):
    """What every update of a :class:`~scrapy_polite.stores.redis.RedisStore` shares, step by step
    (:class:`~scrapy_polite.stores.base.UpdateSteps`): its identity and pending record, the decision on the rows
    read, the optimistic read-then-write of one slot, and the wait after a lost race.

    ``identity`` (the caller's update function) and ``keys`` name one logical update: when a write of it was
    sent but its connection was lost (applied or not, nobody knows), the next update with the same function
    on the same keys takes over its id (so its record) and the results of its attempts: it first reads the
    record with the rows, and returns the result of the attempt that was applied when there is one.
    """

    #: On an outage, keep the update's id for its retry even when nothing was sent yet (its locks carry it).
    _keep_token = False

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        self._store = store
        self._keys = keys
        self._fn = fn
        self._name = (identity, tuple(keys))
        pending = store.pending.take(self._name)
        #: An earlier call of this update may have been applied: look for its record before anything else.
        self._check = pending is not None
        self._pending = pending or Pending(uuid.uuid4().hex)
        self._rows: list[Row] | None = None
        self._now = 0.0
        self._now_at = 0.0  # time.monotonic() when the server's clock read self._now
        self._lost = 0
        self._busy_until: float | None = None

    def step(self) -> T | Again:
        try:
            return self._step()
        except StoreUnavailable:
            if self._keep_token or self._pending.results:  # a write may be in flight: its retry must find it
                self._store.pending.remember(self._name, self._pending)
            raise

    def _step(self) -> T | Again:
        raise NotImplementedError

    def _applied(self, attempt: bytes) -> T:
        """The result of the attempt whose write the record names."""
        return self._pending.results[int(attempt)]  # type: ignore[no-any-return]

    def _record_ttl_ms(self) -> int:
        return max(1, int(self._store.done_ttl * 1000))

    def _clock_read(self, seconds: Any, micros: Any) -> None:
        """The server's clock as a reply gave it, read now."""
        self._now = int(seconds) + int(micros) / 1e6
        self._now_at = time.monotonic()

    def _decide(self, rows: list[Row]) -> tuple[dict[str, HostState], T, float]:
        """The update function on ``rows``: the new rows, the result and the ``now`` it ran with.

        Raises:
            ValueError: the function wrote a row it did not read.
        """
        # The server's clock as read, moved on by the time since (this process's monotonic clock): a step that
        # waited in the pool's queue after a lost race must not book at a moment already past.
        now = self._now + max(0.0, time.monotonic() - self._now_at)
        new, result = self._fn({key: row.state for key, row in zip(self._keys, rows)}, now)
        stray = set(new).difference(self._keys)
        if stray:
            raise ValueError(f"update function wrote {sorted(stray)!r}, which it did not read")
        return new, result, now

    def _optimistic_step(self, record: str,
                         write: Callable[[int, list[Row], dict[str, HostState], float], Any]) -> T | Again:
        """One step of an update whose rows are in one slot: read the rows (and ``record``, when an earlier
        attempt may have been applied), decide, and ``write(attempt, rows, new, now)`` if the rows still have
        the versions read (the script's reply: the record's value, the current rows, or success)."""
        if self._rows is None:
            check = self._check or bool(self._pending.results)  # an earlier attempt may have been applied
            rows, self._now, found = self._store.read_rows(self._keys, record if check else None)
            self._now_at = time.monotonic()
            if found is not None:
                return self._applied(found)
            self._rows = rows
        rows = self._rows
        new, result, now = self._decide(rows)
        if not new and not self._pending.results:
            return result  # nothing to write, and no earlier write of this update to fence off
        attempt = len(self._pending.results)
        self._pending.results[attempt] = result
        reply = write(attempt, rows, new, now)
        if isinstance(reply, bytes):  # the record was there: an earlier attempt (or its resend) was applied
            return self._applied(reply)
        if not isinstance(reply, list):
            return result
        self._clock_read(reply[0], reply[1])
        self._rows = [decode(values) for values in reply[2:]]
        return self._lost_race(reread=False)

    def _lost_race(self, reread: bool) -> Again:
        """The wait after a lost race: none after the first (unless ``reread``: the rows must be read again),
        then a random moment, doubling, and the rows are read again.

        Raises:
            StoreBusy: :data:`MAX_ATTEMPTS` lost races, or :data:`MAX_BUSY_SECONDS` of them.
        """
        self._lost += 1
        if self._lost >= MAX_ATTEMPTS:
            raise self._busy()
        if self._lost < 2 and not reread:
            return Again(0.0)
        # Lost twice in a row: step aside a random moment, so that writers of one row stop colliding, then
        # read the rows again (those of the reply are stale by then: writing on them would surely lose).
        self._busy_until = self._busy_until or time.monotonic() + MAX_BUSY_SECONDS
        if time.monotonic() > self._busy_until:
            raise self._busy()
        self._rows = None
        return Again(random.uniform(0.0, min(0.02, 0.0001 * 2 ** (self._lost - 1))))

    def _busy(self) -> StoreBusy:
        return StoreBusy(f"scrapy-polite could not write its pace table {self._store.uri}: {len(self._keys)} rows "
                         f"({', '.join(self._keys)}) changed under every one of its attempts (at most "
                         f"{MAX_ATTEMPTS}, {MAX_BUSY_SECONDS:g} s). Fix: fewer processes on these hosts, or a less "
                         "loaded Redis.")


class OptimisticUpdate(Steps[T]):
    """One optimistic read-modify-write of a ``table`` layout (one slot), step by step (:class:`Steps`)."""

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        super().__init__(store, keys, fn, identity)
        self._record = store.keys.record(store.keys.counter, self._pending.token)
        self._names = [*map(store.keys.row, keys), store.keys.counter, self._record]

    def _step(self) -> T | Again:
        return self._optimistic_step(self._record, self._write)

    def _write(self, attempt: int, rows: list[Row], new: dict[str, HostState], now: float) -> Any:
        store = self._store
        args: list[Any] = [attempt, self._record_ttl_ms(), *(row.version for row in rows), *FIELD_ARGS,
                           *rows_args(store, self._keys, new, now)]
        return store.server.run("write", partial(store.scripts.write, keys=self._names, args=args))


def rows_args(store: RedisStore, keys: Sequence[str], new: dict[str, HostState], now: float) -> list[Any]:
    """The write arguments of the rows of ``new`` among ``keys``: for each, its position in ``keys`` (from 1),
    its expiry (:meth:`RedisStore.expiry_ms <scrapy_polite.stores.redis.RedisStore.expiry_ms>`) and its field
    values."""
    out: list[Any] = []
    for position, key in enumerate(keys, start=1):
        state = new.get(key)
        if state is not None:
            out.extend((position, store.expiry_ms(state, now), *encode(state)))
    return out


def finish(steps: UpdateSteps[T]) -> T:
    """Run ``steps`` to their end on this thread, sleeping between two.

    Only the blocking :meth:`RedisStore.update <scrapy_polite.stores.redis.RedisStore.update>` /
    ``update_many`` run here: ``scrapy polite`` and scripts, never a crawl. A crawl reaches the store through
    its async table (:class:`~scrapy_polite.stores.redis.AsyncRedisStore`), which runs the same steps itself,
    each on a store thread and the wait between two on the reactor's clock, so this sleep never runs on the
    reactor nor holds a store thread (docs/spec.md §6, "Redis: contention")."""
    while True:
        out = steps.step()
        if not isinstance(out, Again):
            return out
        if out.delay > 0:
            time.sleep(out.delay)
