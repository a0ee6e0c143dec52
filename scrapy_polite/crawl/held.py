"""Where the scheduler keeps held (deferred) requests: in memory up to a bound, the rest on disk (docs/spec.md §5).

:class:`HeldRequests` keeps the requests of each host in the order they were held, and gives them back in
that order (first in, first out per host, across memory and disk). A request is kept in memory while fewer
than ``POLITE_MAX_HELD_IN_MEMORY`` held requests (of all hosts) are and none of its host's is on disk; any
other is written to its host's disk queue, one Scrapy disk queue per host, as Scrapy's
``DownloaderAwarePriorityQueue`` keeps one per download slot:

* under ``JOBDIR``, in ``JOBDIR/polite_held/<host>-<hash>/``: ``requests.sqlite3``, a
  ``scrapy.squeues.PickleFifoSQLiteQueue`` (queuelib's SQLite queue, in WAL mode), and ``host.json``, the
  host and its due time (epoch seconds of the store's clock; replaced atomically). There **every** held
  request is written when it is held, one SQLite transaction each (committed to the WAL without an fsync,
  about 20 µs), so a crawl killed at
  any moment (``kill -9``) loses none of the requests it held; a resumed crawl holds them again
  (:meth:`HeldRequests.load`). An operating-system crash or power cut may lose the last ones written;
* without ``JOBDIR``, a ``scrapy.squeues.PickleFifoDiskQueue`` per host in a temporary directory, removed
  at close.

Requests are serialised the way Scrapy's own disk queues do it (``request.to_dict(spider=...)``, pickled;
read back with ``request_from_dict``), so their callbacks and errbacks must be methods of the spider. A
request that cannot be serialised stays in memory, beyond the bound if need be (under ``JOBDIR`` it is then
lost to a kill and reported at close, ``polite/deferred/not_saved``), in its place in its host's order: after
the host's older requests on disk, before the newer ones.

At most :data:`OPEN_QUEUES` disk queues are open at once (each holds file descriptors); the least recently
used one is closed and reopened when next needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import sqlite3
import tempfile
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.squeues import PickleFifoDiskQueue
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.request import request_from_dict

from .._compat import commit_without_fsync, pickle_fifo_sqlite_queue

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


#: Scrapy's SQLite queue of requests (built on Scrapy 2.18, which does not export it).
PickleFifoSQLiteQueue = pickle_fifo_sqlite_queue()

logger = logging.getLogger(__name__)

__all__ = ["HELD_DIR", "OPEN_QUEUES", "HeldRequests", "read_held"]

#: The directory under ``JOBDIR`` that keeps held requests across runs.
HELD_DIR = "polite_held"
#: The file in which versions before this module saved held requests; read once on resume
#: (:meth:`HeldRequests.load_legacy`).
DEFERRED_FILE = "polite_deferred.pickle"
#: How many per-host disk queues may be open at once.
OPEN_QUEUES = 64

_HOST_FILE = "host.json"
_QUEUE_FILE = "requests.sqlite3"


def _dir_name(host: str) -> str:
    """A file-system-safe, collision-free directory name for ``host`` (readable prefix + hash)."""
    readable = "".join(c if c.isascii() and (c.isalnum() or c in "-._") else "_" for c in host)[:80]
    return f"{readable}-{hashlib.sha1(host.encode('utf-8')).hexdigest()[:16]}"


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` atomically: a reader (or a restart after a kill) sees the old file
    or the new one, never a torn one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_host_file(directory: str) -> tuple[str, float | None] | None:
    """The host and due time recorded in ``directory``, or None when the file is missing or unreadable."""
    try:
        with open(os.path.join(directory, _HOST_FILE), encoding="utf-8") as f:
            data = json.load(f)
        host = data["host"]
        due = data.get("due")
        if not isinstance(host, str) or not (due is None or isinstance(due, (int, float))):
            return None
        return host, None if due is None else float(due)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _create_wal_database(path: str) -> None:
    """Create an empty SQLite file in WAL mode (persisted in the file), so the queue that opens it next
    commits with one WAL append instead of a rollback journal."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=WAL").fetchone()
    finally:
        db.close()


def read_held(jobdir: str) -> Iterator[tuple[str, float | None, dict[str, Any]]]:
    """Every request held under ``jobdir`` (as a killed or closed crawl left them), without a crawler.

    Yields:
        ``(host, due or None, request dict)`` per request, host by host, each host's in the order held;
        the dict is ``request.to_dict()`` (``request_from_dict`` makes the request again).

    Raises:
        sqlite3.Error, pickle.UnpicklingError: a queue file that cannot be read.
    """
    root = os.path.join(jobdir, HELD_DIR)
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        directory = os.path.join(root, name)
        found = _read_host_file(directory)
        path = os.path.join(directory, _QUEUE_FILE)
        if found is None or not os.path.exists(path):
            continue
        host, due = found
        db = sqlite3.connect(path)
        try:
            has_table = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'queue'").fetchone()
            rows = db.execute("SELECT item FROM queue ORDER BY id").fetchall() if has_table else []
        finally:
            db.close()
        for (item,) in rows:
            yield host, due, pickle.loads(item)


@dataclass
class _Host:
    """One host's held requests in the order held: ``order`` is a FIFO of requests kept in memory and of
    runs (an ``int``: that many consecutive requests in its disk queue), so a request kept in memory after
    its host spilled (one that cannot be serialised) comes back after the older ones on disk."""

    order: deque[Request | int] = field(default_factory=deque)
    in_memory: int = 0
    on_disk: int = 0
    due: float | None = None  # the due time recorded on disk (JOBDIR only)

    def __len__(self) -> int:
        return self.in_memory + self.on_disk

    def append_memory(self, request: Request) -> None:
        """A request held in memory, behind the others."""
        self.order.append(request)
        self.in_memory += 1

    def append_disk(self, count: int = 1) -> None:
        """``count`` requests written to the disk queue, behind the others."""
        if self.order and isinstance(self.order[-1], int):
            self.order[-1] += count
        else:
            self.order.append(count)
        self.on_disk += count

    def memory_requests(self) -> list[Request]:
        """The requests held in memory, in the order held."""
        return [item for item in self.order if not isinstance(item, int)]

    def drop_memory(self) -> None:
        """Forget the requests held in memory (closing); the runs on disk stay."""
        self.order = deque(item for item in self.order if isinstance(item, int))
        self.in_memory = 0

    def drop_disk(self) -> None:
        """Forget the runs on disk (the queue has no more records to read)."""
        self.order = deque(item for item in self.order if not isinstance(item, int))
        self.on_disk = 0


class HeldRequests:
    """Held requests by host, first in first out per host, with at most ``max_in_memory`` in memory.

    Args:
        crawler: the crawler (its spider serialises and restores the requests' callbacks).
        max_in_memory: ``POLITE_MAX_HELD_IN_MEMORY``; ignored under ``jobdir``, where every request that
            can be serialised is written to disk when held.
        jobdir: ``JOBDIR`` (held requests then survive a stop or a kill and are resumed), or None (a
            temporary directory, removed by :meth:`close`, takes what does not fit in memory).

    Counters (read by the scheduler for its stats): :attr:`written` requests written to disk,
    :attr:`unreadable` records that could not be read back.
    """

    def __init__(self, crawler: Crawler, *, max_in_memory: int, jobdir: str | None) -> None:
        self.crawler = crawler
        self.durable = jobdir is not None
        self.max_in_memory = 0 if self.durable else max_in_memory
        self._root: str | None = os.path.join(jobdir, HELD_DIR) if jobdir is not None else None
        self._temp: str | None = None
        #: host → its held requests (only hosts with some); read it, never change it (``host in held.hosts``: the
        #: scheduler's test on every look at a host, without a ``__contains__`` call).
        self.hosts: dict[str, _Host] = {}
        self._queues: OrderedDict[str, Any] = OrderedDict()  # host -> open disk queue, least recent first
        self._total = 0
        self._in_memory = 0
        self.written = 0
        self.unreadable = 0
        self._warned: set[str] = set()

    # -- reading -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._total

    def __contains__(self, host: object) -> bool:
        return host in self.hosts

    @property
    def in_memory(self) -> int:
        """How many held requests are in memory."""
        return self._in_memory

    @property
    def directory(self) -> str | None:
        """Where the disk queues are: ``JOBDIR/polite_held``, the temporary directory, or None (none yet)."""
        return self._root if self._root is not None else self._temp

    @property
    def open_queues(self) -> int:
        """How many disk queues are open (at most :data:`OPEN_QUEUES`)."""
        return len(self._queues)

    def items(self) -> list[tuple[str, int]]:
        """``(host, count)`` of every host with held requests, sorted by host."""
        return sorted((host, len(entry)) for host, entry in self.hosts.items())

    # -- holding and releasing -----------------------------------------------------------------------------

    def push(self, host: str, request: Request, due: float | None) -> None:
        """Hold ``request`` behind the host's other held requests.

        Args:
            host: the request's host key.
            request: the request.
            due: when the host is due, epoch seconds of the store's clock (the scheduler converts its local
                due times, docs/spec.md §5), or None (when its line frees); under ``JOBDIR`` the latest due
                time of the host is recorded for a resumed crawl, which converts it to its own clock.
        """
        entry = self.hosts.get(host)
        if entry is None:
            entry = self.hosts[host] = _Host()
        self._total += 1
        if not entry.on_disk and self._in_memory < self.max_in_memory:
            entry.append_memory(request)
            self._in_memory += 1
            return
        try:
            later = due is not None and (entry.due is None or due > entry.due)
            if later:
                entry.due = due
            if self.durable and (later or not entry.on_disk):  # the host file goes first, then the queue
                self._write_host_file(host, entry)
            self._queue(host).push(request)
        except ValueError as exc:  # Scrapy's serialisation refused it: a callback that is not a spider method
            self._keep_in_memory(entry, request, "cannot be serialised", exc)
            return
        except (OSError, sqlite3.Error) as exc:
            self._keep_in_memory(entry, request, "could not be written to disk", exc)
            return
        entry.append_disk()
        self.written += 1

    def _keep_in_memory(self, entry: _Host, request: Request, why: str, exc: Exception) -> None:
        """Hold ``request`` in memory after all, still behind the host's older requests (on disk or not);
        warn once per ``why`` (under ``JOBDIR`` the scheduler reports each such request at close instead)."""
        entry.append_memory(request)
        self._in_memory += 1
        if why not in self._warned and not self.durable:
            self._warned.add(why)
            logger.warning("scrapy-polite: a deferred request %s %s (%s); it is kept in memory beyond "
                           "POLITE_MAX_HELD_IN_MEMORY, as is any other such request", request, why, exc)

    def pop(self, host: str) -> Request | None:
        """The host's first held request (first in, first out across memory and disk), removed; None when
        it has none (or none can be read back)."""
        entry = self.hosts.get(host)
        if entry is None:
            return None
        request: Request | None = None
        while request is None and entry.order:
            head = entry.order[0]
            if not isinstance(head, int):  # a request held in memory
                entry.order.popleft()
                entry.in_memory -= 1
                self._in_memory -= 1
                self._total -= 1
                request = head
                break
            if head > 1:  # the next request of a run on disk
                entry.order[0] = head - 1
            else:
                entry.order.popleft()
            entry.on_disk -= 1
            self._total -= 1
            try:
                request = self._queue(host).pop()
            except Exception as exc:  # a record written by another spider version, a damaged file
                self.unreadable += 1
                logger.error("scrapy-polite: a deferred request of %s cannot be read back: %s", host, exc)
                continue
            if request is None:  # the queue has fewer records than counted: nothing more to read from it
                self.unreadable += entry.on_disk + 1
                self._total -= entry.on_disk
                entry.drop_disk()
        if not entry.in_memory and not entry.on_disk:
            del self.hosts[host]
        return request

    # -- disk ------------------------------------------------------------------------------------------------

    def _directory(self, host: str) -> str:
        if self._root is None:
            if self._temp is None:
                self._temp = tempfile.mkdtemp(prefix="scrapy-polite-held-")
            return os.path.join(self._temp, _dir_name(host))
        return os.path.join(self._root, _dir_name(host))

    def _write_host_file(self, host: str, entry: _Host) -> None:
        directory = self._directory(host)
        os.makedirs(directory, exist_ok=True)
        _write_json(os.path.join(directory, _HOST_FILE), {"host": host, "due": entry.due})

    def _queue(self, host: str) -> Any:
        """The host's open disk queue (opened or created on demand; the least recently used one beyond
        :data:`OPEN_QUEUES` is closed)."""
        queue = self._queues.get(host)
        if queue is not None:
            self._queues.move_to_end(host)
            return queue
        while len(self._queues) >= OPEN_QUEUES:
            self._close_queue(*self._queues.popitem(last=False))
        directory = self._directory(host)
        if self.durable:
            path = os.path.join(directory, _QUEUE_FILE)
            if not os.path.exists(path):
                os.makedirs(directory, exist_ok=True)
                _create_wal_database(path)
            queue = build_from_crawler(PickleFifoSQLiteQueue, self.crawler, path)
            commit_without_fsync(queue)
        else:
            queue = build_from_crawler(PickleFifoDiskQueue, self.crawler, directory)
        self._queues[host] = queue
        return queue

    def _close_queue(self, host: str, queue: Any) -> None:
        """Close one disk queue; when the host has nothing on disk any more, remove its directory."""
        try:
            queue.close()  # queuelib removes an empty queue's files
        except (OSError, sqlite3.Error) as exc:
            logger.error("scrapy-polite: could not close the deferred requests of %s on disk: %s", host, exc)
        entry = self.hosts.get(host)
        if entry is None or not entry.on_disk:
            shutil.rmtree(self._directory(host), ignore_errors=True)

    # -- resume and close ------------------------------------------------------------------------------------

    def load(self) -> dict[str, float | None]:
        """Hold again the requests a previous run left under ``JOBDIR`` (nothing without ``JOBDIR``).

        Returns:
            host → its recorded due time (epoch s of the store's clock; None: when its line frees) for every
            host with requests on disk.
            Directories with no request (a host emptied, or a kill before its first write) are removed.
        """
        found: dict[str, float | None] = {}
        root = self._root
        if root is None or not os.path.isdir(root):
            return found
        for name in sorted(os.listdir(root)):
            directory = os.path.join(root, name)
            recorded = _read_host_file(directory)
            path = os.path.join(directory, _QUEUE_FILE)
            if recorded is None or not os.path.exists(path):
                shutil.rmtree(directory, ignore_errors=True)
                continue
            host, due = recorded
            try:
                queue = build_from_crawler(PickleFifoSQLiteQueue, self.crawler, path)
                commit_without_fsync(queue)
                count = len(queue)
            except sqlite3.Error as exc:
                logger.error("scrapy-polite: the deferred requests of %s in %s cannot be read: %s",
                             host, directory, exc)
                continue
            if not count:
                queue.close()
                shutil.rmtree(directory, ignore_errors=True)
                continue
            entry = self.hosts.setdefault(host, _Host())
            entry.append_disk(count)
            entry.due = due
            self._total += count
            found[host] = due
            self._queues[host] = queue
            while len(self._queues) > OPEN_QUEUES:
                self._close_queue(*self._queues.popitem(last=False))
        return found

    def load_legacy(self, jobdir: str | None) -> dict[str, float]:
        """Hold the requests an older version saved in ``JOBDIR/polite_deferred.pickle``, then remove the file (one
        that cannot be read is logged and left). Returns host → its latest recorded due time (epoch s of the store's
        clock; 0.0 for "when its line frees")."""
        found: dict[str, float] = {}
        path = os.path.join(jobdir, DEFERRED_FILE) if jobdir else None
        if not path or not os.path.exists(path):
            return found
        try:
            with open(path, "rb") as f:
                data = pickle.load(f)
            for row in data.get("requests", []):
                self.push(row["host"], request_from_dict(row["request"], spider=self.crawler.spider), row["due"])
                found[row["host"]] = max(found.get(row["host"], 0.0), row["due"] or 0.0)
        except Exception:
            logger.exception("scrapy-polite: cannot read the deferred requests saved in %s", path)
        else:
            os.remove(path)  # its requests are held (on disk) now
        return found

    def report_close(self, count: int, left: list[Request], summary: str) -> None:
        """Count and log the close (:meth:`close`) of ``count`` held requests, ``left`` of them in memory (not kept):
        under ``JOBDIR`` those on disk are kept for resume and those left are logged and counted as not saved; without
        it every one is counted as not crawled (``summary``: what was held, for the log)."""
        stats = self.crawler.stats
        if stats is not None:
            if self.written:
                stats.set_value("polite/deferred/spilled", self.written)
            if self.unreadable:
                stats.set_value("polite/deferred/unreadable", self.unreadable)
        if not count:
            return
        if self._root is None:
            if stats is not None:
                stats.set_value("polite/deferred/not_crawled", count)
            logger.warning("scrapy-polite: %d deferred %s not crawled (set JOBDIR to resume them). %s",
                           count, "request was" if count == 1 else "requests were", summary)
            return
        for request in left:
            try:
                pickle.dumps(request.to_dict(spider=self.crawler.spider), protocol=4)
                reason = "it could not be written to disk"
            except Exception as exc:  # a callback that is not a spider method, unpicklable meta
                reason = str(exc)
            logger.error("scrapy-polite: cannot save deferred %s for resume: %s", request, reason)
        if left and stats is not None:
            stats.set_value("polite/deferred/not_saved", len(left))
        if stats is not None:
            stats.set_value("polite/deferred/saved", count - len(left))
        logger.info("scrapy-polite: %d deferred requests are kept in %s for resume. %s", count - len(left),
                    self._root, summary)

    def close(self) -> list[Request]:
        """Close the disk queues (under ``JOBDIR`` their requests stay for a resumed crawl; the temporary
        directory is removed) and return the requests still held in memory, which are not kept."""
        left = [request for entry in self.hosts.values() for request in entry.memory_requests()]
        for entry in self.hosts.values():
            self._in_memory -= entry.in_memory
            self._total -= entry.in_memory
            entry.drop_memory()
        while self._queues:
            self._close_queue(*self._queues.popitem(last=False))
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None
            self.hosts.clear()
            self._total = 0
        return left
