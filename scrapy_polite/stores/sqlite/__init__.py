"""``sqlite:///path``: the embedded pace table, one SQLite file in WAL mode (docs/spec.md §6), one module per job:

* :mod:`.schema` — the file's schema, its migrations (``PRAGMA user_version``), opening a connection;
* :mod:`.marks` — the crash window: the "running" marks, their heartbeat, the repair after an unclean stop
  (:class:`Recovery`);
* :mod:`.rows` — a row as a :class:`~scrapy_polite.policy.HostState` and back, the event log's rows, and the
  operations on them, each written once (run alone or in a group commit);
* :mod:`.store` — :class:`SQLiteStore`, the store (connections, transactions, following its path);
* :mod:`.table` — :class:`AsyncSQLiteStore`, its async table (group commit), with :mod:`.checkpoints` (the
  WAL's checkpoints) and :mod:`.eventlog` (the event log's writer).
"""

from __future__ import annotations

from .checkpoints import RESTART_WAIT
from .marks import BEAT_EVERY, CRASH_WINDOW, Recovery
from .schema import SCHEMA_VERSION
from .store import FOLLOW_EVERY, SQLiteStore
from .table import GROUP_MAX, AsyncSQLiteStore

__all__ = ["AsyncSQLiteStore", "BEAT_EVERY", "CRASH_WINDOW", "FOLLOW_EVERY", "GROUP_MAX", "RESTART_WAIT",
           "Recovery", "SCHEMA_VERSION", "SQLiteStore"]
