"""The Redis keys of one pace table (docs/spec.md §6, "Backends" and "Redis: the sharded layout").

``layout=table``: ``<prefix>{pace}:<key>`` for the rows, ``<prefix>{pace}`` for the version counter,
``<prefix>{pace}#events`` for the event log and ``<prefix>{pace}#done:<id>`` for the idempotence records: one
hash tag, so the table lives in one slot of a cluster. ``layout=sharded``: ``<prefix>{<key>}`` per row, its
records ``<prefix>{<key>}#done:<id>`` in its slot, the event log ``<prefix>{events}#events``.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.crc import key_slot

__all__ = ["Keys"]


class Keys:
    """The names of one table's keys.

    Args:
        prefix: ``POLITE_STORE_PREFIX``.
        sharded: the ``sharded`` layout (one hash tag per row).
        cluster: a Redis Cluster (the slots matter).

    Attributes:
        counter: the version counter (``table``; in ``sharded`` the key tested at start for a ``table``
            table under the same prefix).
        events: the event log's stream (``#``: never a row's key, which has ``:``; ``sharded``: a slot of its
            own, appends are batched off the hot path).
    """

    def __init__(self, prefix: str, *, sharded: bool, cluster: bool) -> None:
        self._prefix = prefix
        self._sharded = sharded
        self._cluster = cluster
        base = f"{prefix}{{pace}}"
        self._rows = f"{base}:"
        self._done = f"{base}#done:"
        self.counter = base
        self.events = f"{prefix}{{events}}#events" if sharded else f"{base}#events"

    def row(self, key: str) -> str:
        """A row's Redis key: ``<prefix>{pace}:<key>`` (``table``), ``<prefix>{<key>}`` (``sharded``)."""
        return f"{self._prefix}{{{key}}}" if self._sharded else self._rows + key

    def record(self, row_name: str, token: str) -> str:
        """The idempotence record of update ``token`` in the slot of the row key ``row_name``."""
        return f"{row_name}#done:{token}" if self._sharded else self._done + token

    def routing(self, keys: Sequence[str]) -> str:
        """A key of the slot of ``keys`` (a read names one beside its rows: on a cluster it routes the script)."""
        return self.row(keys[0]) if self._sharded and keys else self.counter

    def slot_groups(self, keys: Sequence[str]) -> list[list[int]]:
        """The indices of ``keys`` grouped by the hash slot of their row's Redis key, the groups in the order of
        their slots (the order an update locks them in): one group unless the table is ``sharded`` on a
        cluster (a single server runs any script on any keys)."""
        if not (self._sharded and self._cluster) or len(keys) < 2:
            return [list(range(len(keys)))]
        groups: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key_slot(self.row(key).encode()), []).append(index)
        return [groups[slot] for slot in sorted(groups)]

    def scan_pattern(self) -> str:
        """The ``SCAN MATCH`` pattern of every row key (its characters escaped)."""
        start = self._scan_start()
        return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in start) + ("*}" if self._sharded else "*")

    def key_of(self, row_name: str) -> str:
        """The table's key of a row's Redis key (the inverse of :meth:`row`)."""
        start = self._scan_start()
        return row_name[len(start):-1] if self._sharded else row_name[len(start):]

    def _scan_start(self) -> str:
        return f"{self._prefix}{{" if self._sharded else self._rows
