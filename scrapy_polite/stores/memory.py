"""``memory://``: the in-process pace table, for tests and one-off runs (docs/spec.md §6)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ..policy import HostState
from .base import ManyUpdateFn, Snapshot, UpdateFn

__all__ = ["MemoryStore"]

T = TypeVar("T")


class MemoryStore:
    """An in-process pace table (``memory://``). Thread-safe; lost when the process ends.

    Args:
        clock: the store's clock, epoch seconds (tests inject one).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.uri = "memory://"
        self._rows: dict[str, HostState] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def get(self, key: str) -> HostState | None:
        with self._lock:
            return self._rows.get(key)

    def read(self, keys: Sequence[str]) -> Snapshot:
        with self._lock:
            return Snapshot({key: self._rows.get(key) for key in keys}, self._clock())

    def update(self, key: str, fn: UpdateFn[T]) -> T:
        with self._lock:
            new, result = fn(self._rows.get(key), self._clock())
            if new is not None:
                self._rows[key] = new
            return result

    def update_many(self, keys: Sequence[str], fn: ManyUpdateFn[T]) -> T:
        with self._lock:
            new, result = fn({key: self._rows.get(key) for key in keys}, self._clock())
            stray = set(new).difference(keys)
            if stray:
                raise ValueError(f"update function wrote {sorted(stray)!r}, which it did not read")
            self._rows.update(new)
            return result

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._rows.pop(key, None) is not None

    def items(self) -> Iterator[tuple[str, HostState]]:
        with self._lock:
            rows = sorted(self._rows.items())
        return iter(rows)

    def expire(self, before: float) -> int:
        with self._lock:
            stale = [k for k, s in self._rows.items() if s.updated < before and s.next_allowed < before]
            for key in stale:
                del self._rows[key]
            return len(stale)

    def close(self) -> None:
        pass
