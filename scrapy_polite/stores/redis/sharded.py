"""The update algorithm of the ``sharded`` layout (``?layout=sharded``, docs/spec.md §6 and docs/scale.md): one
hash tag per row, so the rows spread over every slot of a cluster, and an update whose rows span slots (a
booking) locks and reads each slot's rows, decides, and writes each slot's rows, one pipelined round trip per
phase."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ...policy import HostState
from ..base import Again, ManyUpdateFn, StoreError
from .codec import ABSENT, FIELD_ARGS, FIELDS, Row, decode
from .updates import Steps, rows_args

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = ["LOCK_LEASE", "ShardedUpdate"]

T = TypeVar("T")

#: Seconds an update whose rows span slots (``layout=sharded``) holds their locks at most: it locks them, decides,
#: and writes them within two round trips per slot; a process that dies in between blocks those rows this long.
LOCK_LEASE = 5.0


@dataclass
class _Group:
    """The rows of one hash slot in a :class:`ShardedUpdate`: their indices in the update's keys, their Redis
    keys and the update's idempotence record in that slot."""

    indices: list[int]
    names: list[str]
    record: str


class ShardedUpdate(Steps[T]):
    """One update of a ``sharded`` table (docs/scale.md), step by step (:class:`~scrapy_polite.stores.base.
    UpdateSteps`).

    Rows in one slot (a single-row update, or rows whose tags share a slot, or any update on a single server):
    the optimistic read and write of :class:`~scrapy_polite.stores.redis.updates.OptimisticUpdate`, whose write
    also fails on a row another update has locked. Rows in several slots (a booking: the host's row and an
    address's): **lock, decide, write** — each slot's rows are locked and read in one script (in the order of
    the slots, so two updates never wait on each other in a cycle: a step that finds a row locked releases what
    it took and tries again later), the update function runs on them with the clock of the first key's slot,
    then each slot's new rows are written, and its locks released, in one script with the slot's idempotence
    record. An update is applied in every slot or, only when its process stalls past :data:`LOCK_LEASE`
    between two writes and another update takes the lock, in the first slots only (it then raises
    :class:`StoreError`: the caller does not act on it, so a booking's request is not sent; only more spacing
    than asked for results). The resend of a write whose reply was lost finds each slot's record.
    """

    _keep_token = True  # its retry reuses the token: records and locks

    def __init__(self, store: RedisStore, keys: list[str], fn: ManyUpdateFn[T], identity: Any) -> None:
        super().__init__(store, keys, fn, identity)
        token = self._pending.token
        names = [store.keys.row(key) for key in keys]
        self._groups = [_Group(g, [names[i] for i in g], store.keys.record(names[g[0]], token))
                        for g in store.keys.slot_groups(keys)]
        #: Attempt → the write arguments of each group (a resend after a lost reply writes the same rows).
        self._writes: dict[int, list[list[Any]]] = self._pending.writes

    def _step(self) -> T | Again:
        return self._one_slot_step() if len(self._groups) == 1 else self._locked_step()

    def _args(self, group: _Group, attempt: int, mode: str, rows: list[Row], new: dict[str, HostState],
              now: float) -> list[Any]:
        return [attempt, self._record_ttl_ms(), self._pending.token, mode,
                *(rows[i].version for i in group.indices), *FIELD_ARGS,
                *rows_args(self._store, [self._keys[i] for i in group.indices], new, now)]

    # -- one slot: optimistic ---------------------------------------------------------------------------

    def _one_slot_step(self) -> T | Again:
        group = self._groups[0]
        store = self._store

        def write(attempt: int, rows: list[Row], new: dict[str, HostState], now: float) -> Any:
            args = self._args(group, attempt, "w", rows, new, now)
            return store.server.run("write", lambda: store.scripts.shard_write(keys=[*group.names, group.record],
                                                                               args=args))

        return self._optimistic_step(group.record, write)

    # -- several slots: lock, decide, write -------------------------------------------------------------

    def _unlock(self, groups: Sequence[_Group]) -> None:
        if groups:
            store = self._store
            store.server.run_scripts(store.scripts.shard_unlock,
                                     [(group.names, [self._pending.token]) for group in groups])

    def _locked_step(self) -> T | Again:
        store = self._store
        lease = max(1, int(LOCK_LEASE * 1000))
        # Every slot's lock-and-read in one pipelined round trip (the nodes answer in parallel). A slot whose rows
        # another update holds is not locked; the slots that were are released, and the update tries again.
        replies = store.server.run_scripts(store.scripts.shard_lock,
                                           [([*group.names, group.record], [self._pending.token, lease, *FIELDS])
                                            for group in self._groups])
        locked = [group for group, reply in zip(self._groups, replies)
                  if not isinstance(reply, bytes) and int(reply[0]) == 1]
        done = [int(reply) for reply in replies if isinstance(reply, bytes)]
        if done:  # an earlier attempt of this update was written in some slot: finish it (its writes check
            return self._finish(done[0])  # the versions it read, so a row written since is never overwritten)
        if len(locked) < len(self._groups):
            self._unlock(locked)
            return self._lost_race(reread=True)
        rows = self._locked_rows(replies)
        try:
            new, result, now = self._decide(rows)
        except BaseException:
            self._unlock(locked)
            raise
        if not new and not self._pending.results:
            self._unlock(locked)
            return result
        attempt = len(self._pending.results)
        self._pending.results[attempt] = result
        self._writes[attempt] = [self._args(group, attempt, "c", rows, new, now) for group in self._groups]
        return self._finish(attempt)

    def _locked_rows(self, replies: list[Any]) -> list[Row]:
        """The rows every slot's lock-and-read returned, in the order of the keys; the clock of the first key's
        slot (a booking's: the host's)."""
        rows: list[Row] = [ABSENT] * len(self._keys)
        for group, reply in zip(self._groups, replies):
            if 0 in group.indices:
                self._clock_read(reply[1], reply[2])
            for index, values in zip(group.indices, reply[3:]):
                rows[index] = decode(values)
        return rows

    def _finish(self, attempt: int) -> T | Again:
        """Write every slot's rows of ``attempt``, in one pipelined round trip (a slot already written returns
        its record)."""
        writes = self._writes.get(attempt)
        if writes is None:  # the record of an attempt this process no longer knows (its pending was forgotten)
            raise StoreError(f"scrapy-polite lost track of an update of its pace table {self._store.uri} "
                             f"({', '.join(self._keys)}). Fix: retry.")
        store = self._store
        replies = store.server.run_scripts(store.scripts.shard_write,
                                           [([*group.names, group.record], args)
                                            for group, args in zip(self._groups, writes)])
        refused = [group for group, reply in zip(self._groups, replies) if reply == 0]
        if refused:
            self._unlock(refused)
            if len(refused) == len(self._groups):  # another update took every lock after its lease: nothing
                return self._lost_race(reread=True)  # was written, try again
            raise StoreError(f"scrapy-polite's update of {', '.join(self._keys)} in its pace table "
                             f"{self._store.uri} was written in {len(self._groups) - len(refused)} of its "
                             f"{len(self._groups)} slots only: its process stalled past the locks' lease "
                             f"({LOCK_LEASE:g} s) and another update took a lock. Nothing was sent on it. Fix: a "
                             "less loaded machine or Redis.")
        return self._applied(str(attempt).encode())
