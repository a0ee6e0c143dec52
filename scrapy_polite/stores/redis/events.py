"""The Redis table's event log (README, "The event log"): one stream beside the rows, each entry one event as a
JSON list of its fields."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..base import Event, StoreCorrupt
from .client import Connection
from .codec import text

__all__ = ["EventStream"]


class EventStream:
    """The table's event log: the stream ``name``, capped at ``events_max`` entries, expiring ``expire_after``
    seconds after its last append.

    Args:
        server: the table's connection.
        name: the stream's key.
        events_max: the most entries kept (``POLITE_EVENT_LOG_SIZE``).
        expire_after: ``POLITE_STORE_EXPIRE``, seconds.
    """

    def __init__(self, server: Connection, name: str, events_max: int, expire_after: float) -> None:
        self._server = server
        self._name = name
        self._events_max = events_max
        self._expire_after = expire_after

    def append(self, events: Sequence[Event]) -> None:
        """``XADD`` each event (one JSON field) to the stream, then ``XTRIM MAXLEN`` to the cap (exact) and refresh
        the stream's expiry (``POLITE_STORE_EXPIRE``), in one pipelined round trip. A batch whose connection was
        lost after it was sent may be appended twice (the log is diagnostic)."""
        if not events:
            return
        client, cluster = self._server.client, self._server.cluster

        def call() -> list[Any]:
            pipe = client.pipeline(transaction=not cluster)  # redis-py 5: no MULTI on a cluster
            for event in events:
                pipe.xadd(self._name, {"e": json.dumps(list(event), separators=(",", ":"))})
            pipe.xtrim(self._name, maxlen=self._events_max, approximate=False)
            if self._expire_after * 1000 < 2**62:
                pipe.pexpire(self._name, max(1, int(self._expire_after * 1000)))
            return list(pipe.execute())

        self._server.run("write", call)

    def read(self, since: float | None = None, host: str | None = None, limit: int = 1000) -> list[Event]:
        """See :meth:`PaceStore.events <scrapy_polite.stores.base.PaceStore.events>`. Reads the stream newest
        first, 1000 entries a round trip, until it holds ``limit`` matching events, or reaches entries appended
        more than a minute before ``since`` (an entry's id is the server's time of its append, which comes after
        the event)."""
        if limit <= 0:
            return []
        margin = 60.0
        found: list[tuple[float, str, Event]] = []
        upper = "+"
        while True:
            chunk = self._server.run("read", partial(self._server.client.xrevrange, self._name, upper, "-", 1000))
            if not chunk:
                break
            for raw_id, fields in chunk:
                if not fields:  # an entry without fields: not ours
                    continue
                event = self._decode(fields, raw_id)
                if (since is None or event.at >= since) and (host is None or event.host == host):
                    found.append((event.at, text(raw_id), event))
                    if len(found) == limit:
                        break
            if len(found) >= limit:
                break
            last_id = text(chunk[-1][0])
            appended = int(last_id.partition("-")[0]) / 1000.0
            if since is not None and appended < since - margin:
                break
            if len(chunk) < 1000:
                break
            upper = _before(last_id)  # not "(id": exclusive ranges need Redis 6.2
        found.sort(key=lambda f: (f[0], _stream_order(f[1])))
        return [f[2] for f in found]

    def _decode(self, fields: dict[bytes, bytes], raw_id: Any) -> Event:
        """One entry: a JSON list of :class:`Event`'s fields in order; an entry written before a field was added
        is shorter (the missing fields are None).

        Raises:
            StoreCorrupt: the entry is not such a list.
        """
        try:
            values = json.loads(fields[b"e"])
            if not isinstance(values, list) or not 3 <= len(values) <= len(Event._fields):
                raise ValueError(f"expected a list of 3 to {len(Event._fields)} fields")
            return Event(*values)
        except (KeyError, ValueError, TypeError) as exc:
            raise StoreCorrupt(f"the event log {self._name} holds an entry that cannot be read (id {text(raw_id)}: "
                               f"{exc}). Fix: delete the entry (XDEL), or the stream to start a fresh log") from None


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id``."""
    ms, seq = _stream_order(entry_id)
    return f"{ms}-{seq - 1}" if seq > 0 else f"{ms - 1}-{2**64 - 1}"


def _stream_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"ms-seq"`` as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
