"""Opening a pace table from its ``POLITE_STORE`` URI: one registry of backends by URI scheme.

``memory://`` → :class:`~scrapy_polite.stores.memory.MemoryStore`; ``sqlite:///path`` (or a plain path)
→ :class:`~scrapy_polite.stores.sqlite.SQLiteStore`; ``redis://``, ``rediss://`` and ``unix://`` (one server),
``redis+cluster://`` and ``rediss+cluster://`` (a Redis Cluster) →
:class:`~scrapy_polite.stores.redis.RedisStore` (imported when first used: the ``redis`` client is an optional
dependency, ``pip install scrapy-polite[redis]``). Other backends register their schemes with
:func:`register_store`. The crawl and the ``scrapy polite`` command both open stores here; a crawl then asks
the backend for its own async table (its ``open_async``: :func:`~scrapy_polite.stores.asyncstore.open_async`).
"""

from __future__ import annotations

from collections.abc import Callable

from .base import PaceStore, StoreError, StoreOptions
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["open_store", "register_store", "registered_schemes", "StoreFactory", "sqlite_path"]

#: Builds a store from its URI and the options: ``factory(uri, options) -> PaceStore``; raises
#: :class:`StoreError` when it cannot be opened.
StoreFactory = Callable[[str, StoreOptions], PaceStore]

_FACTORIES: dict[str, StoreFactory] = {}


def register_store(scheme: str, factory: StoreFactory) -> None:
    """Make ``POLITE_STORE = "<scheme>://..."`` open a store with ``factory``. A crawl uses the store through
    its ``open_async`` (:meth:`PaceStore.open_async <scrapy_polite.stores.base.PaceStore.open_async>`): a
    synchronous backend returns :class:`~scrapy_polite.stores.asyncstore.ThreadedStore` ``(self, reactor)``."""
    _FACTORIES[scheme.lower()] = factory


def registered_schemes() -> list[str]:
    """The URI schemes :func:`open_store` knows, sorted."""
    return sorted(_FACTORIES)


def sqlite_path(uri: str) -> str | None:
    """The file a ``sqlite:///path`` URI (or a plain path) names, or None for any other URI.

    SQLAlchemy's convention: ``sqlite:///relative/path``, ``sqlite:////absolute/path``.
    """
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    if "://" in uri or uri.startswith("memory:"):
        return None
    return uri


def open_store(uri: str, options: StoreOptions | None = None) -> PaceStore:
    """Build the store a ``POLITE_STORE`` URI names.

    Args:
        uri: ``memory://``; ``sqlite:///relative/path`` or ``sqlite:////absolute/path``; a plain filesystem
            path (taken as SQLite); or ``<scheme>://...`` of a registered backend.
        options: backend options (key prefix, timeouts); defaults when None.

    Raises:
        StoreError: an unknown scheme, a URI naming no file, or the store cannot be opened.
    """
    options = options or StoreOptions()
    scheme = uri.partition(":")[0].lower() if ":" in uri else ""
    if "://" not in uri and scheme != "memory":
        scheme = "sqlite"
    factory = _FACTORIES.get(scheme)
    if factory is None:
        known = ", ".join(f"'{s}://...'" for s in registered_schemes())
        raise StoreError(f"POLITE_STORE {uri!r} has an unknown scheme. Fix: use one of {known}.")
    return factory(uri, options)


def _open_memory(uri: str, options: StoreOptions) -> PaceStore:
    return MemoryStore.of_process(events_max=options.events_max)


def _open_sqlite(uri: str, options: StoreOptions) -> PaceStore:
    path = sqlite_path(uri)
    if not path:
        raise StoreError(f"POLITE_STORE {uri!r} names no file. Fix: e.g. POLITE_STORE = 'sqlite:///polite.sqlite3'.")
    return SQLiteStore(path, events_max=options.events_max, mark=options.mark)


def _open_redis(uri: str, options: StoreOptions) -> PaceStore:
    try:
        from .redis import RedisStore  # noqa: PLC0415  (optional dependency: the redis client)
    except ImportError as exc:
        if exc.name not in ("redis", "redis.backoff", "redis.retry", "redis.exceptions", "redis.cluster", "redis.crc"):
            raise
        scheme = uri.partition(":")[0]
        raise StoreError(f"POLITE_STORE {scheme}://... needs the redis client, which is not installed ({exc}). "
                         "Fix: pip install 'scrapy-polite[redis]'.") from exc
    return RedisStore(uri, options)


register_store("memory", _open_memory)
register_store("sqlite", _open_sqlite)
for _scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
    register_store(_scheme, _open_redis)
