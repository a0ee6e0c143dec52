"""The pace table (docs/spec.md §6): one store protocol, several backends, one registry by URI scheme.

* :mod:`.base` — :class:`PaceStore` (the protocol, the event log's ``append_events`` / ``events`` included),
  :class:`Event`, :class:`Snapshot`, :class:`StoreError`, :class:`StoreBusy`, :class:`StoreClosed`,
  :class:`StoreOptions`, and :class:`SteppedStore` / :class:`UpdateSteps` / :class:`Again` (updates run step
  by step, Redis's); the optional abilities a backend declares (:class:`ServerClock`, :class:`SharedClock`,
  :class:`ExpiringRows`, :class:`CallThreads`, :class:`BackingOffListing`, :class:`ProcessLocal`,
  :class:`KeyPrefixed`), the one question that asks for them (:func:`has_ability`) and the helpers that use a
  backend with or without them (:func:`hosts_backing_off`, :func:`table_name`);
* :mod:`.memory` — ``memory://`` (with its inline async table); :mod:`.sqlite` — ``sqlite:///path``, the
  embedded default (a package: schema, crash marks, rows, store, its async table with group commit); ``redis``
  (optional) — ``redis://``, ``redis+cluster://`` (a package: URI and cluster, Lua files, codec, client, store,
  update algorithms, event stream, its async table);
* :mod:`.registry` — :func:`open_store` from a ``POLITE_STORE`` URI, :func:`register_store`;
* :mod:`.asyncstore` — :class:`AsyncStore`, the async protocol (calls that never block the reactor), which
  each backend implements itself (``backend.open_async()``, :func:`open_async`), and :class:`ThreadedStore`,
  the generic threaded table a synchronous backend opts into; :mod:`.threads` — the thread parts the tables
  compose.

A store that cannot be opened, read or written raises :class:`StoreError`, whose message names the store
and the fix: the crawl stops (fail closed), it never falls back to unpaced crawling.
"""

from __future__ import annotations

from . import base
from .asyncstore import AsyncStore, ThreadedStore, open_async
from .base import *  # noqa: F403  (the protocol, its abilities and errors: base.__all__, declared once)
from .memory import AsyncMemoryStore, MemoryStore
from .registry import open_store, register_store, registered_schemes, sqlite_path
from .sqlite import SCHEMA_VERSION, AsyncSQLiteStore, SQLiteStore

__all__ = [
    "AsyncMemoryStore",
    "AsyncSQLiteStore",
    "AsyncStore",
    "MemoryStore",
    "SCHEMA_VERSION",
    "SQLiteStore",
    "ThreadedStore",
    "open_async",
    "open_store",
    "register_store",
    "registered_schemes",
    "sqlite_path",
]
__all__ += base.__all__
