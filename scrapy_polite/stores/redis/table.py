"""Redis's async table (docs/spec.md §6, "Never blocking the crawl" and "Redis: contention"): every call is a
network round trip on the store's client, run on threads of its own; its updates run step by step, the wait
after a lost race on the reactor's clock, so a hot row never holds a thread and delays only its own updates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet import defer

from ..asyncstore import PooledTable
from ..base import ManyUpdateFn, UpdateFn

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = ["AsyncRedisStore"]

T = TypeVar("T")


class AsyncRedisStore(PooledTable["RedisStore"]):
    """Redis's async table (:meth:`RedisStore.open_async <scrapy_polite.stores.redis.RedisStore.open_async>`):
    reads and the event log's batches on a pool of the store's ``threads`` threads (two: their round trips
    overlap), its updates always step by step (:meth:`RedisStore.update_steps
    <scrapy_polite.stores.redis.RedisStore.update_steps>`: each step on the pool, the wait after a lost race on
    the reactor's clock). A close during an outage waits for the calls already sent (each at most its socket
    timeout) on a thread of the reactor's pool.

    Args:
        store: the Redis store (opened).
        reactor: the Twisted reactor (defaults to the installed one).
        threads: the pool's size (None: the store's ``threads``). With more than one, calls made together
            may complete in another order (each caller waits for its own).
    """

    def __init__(self, store: RedisStore, reactor: Any = None, *, threads: int | None = None) -> None:
        super().__init__(store, reactor, threads=store.threads if threads is None else threads)

    def update(self, key: str, fn: UpdateFn[T]) -> defer.Deferred[T]:
        return self._steps(self.store.update_steps, key, fn)

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> defer.Deferred[T]:
        return self._steps(self.store.update_many_steps, keys, fn)
