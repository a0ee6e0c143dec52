"""Where the scheduler keeps held (deferred) requests: in memory up to a bound, the rest on disk (docs/spec.md §5).

:class:`HeldRequests` keeps the requests of each host by priority (``Request.priority``), and gives them back
the highest priority first, as Scrapy's priority queues do, and each priority's in the order held (first in,
first out per host and priority, across memory and disk): a host held for its pace does not turn the crawl's
priorities (``DEPTH_PRIORITY``, a spider's own) into the order the scheduler handed requests out. A request is
kept in memory while fewer than ``POLITE_MAX_HELD_IN_MEMORY`` held requests (of all hosts) are and none of its
host's is on disk; any other is written to its host's disk queue of its priority, one Scrapy disk queue per
host and priority, as Scrapy's ``DownloaderAwarePriorityQueue`` keeps one per download slot and priority:

* under ``JOBDIR``, in ``JOBDIR/polite_held/``, written when held, so that a crawl killed at any moment
  (``kill -9``) loses none of the requests it held; a resumed crawl holds them again (:meth:`HeldRequests.load`;
  the layout: :mod:`scrapy_polite.crawl.held_disk`);
* without ``JOBDIR``, a ``scrapy.squeues.PickleFifoDiskQueue`` per host and priority in a temporary directory,
  removed at close.

Requests are serialised the way Scrapy's own disk queues do it (``request.to_dict(spider=...)``, pickled;
read back with ``request_from_dict``), so their callbacks and errbacks must be methods of the spider. A
request that cannot be serialised stays in memory, beyond the bound if need be (under ``JOBDIR`` it is then
lost to a kill and reported at close, ``polite/deferred/not_saved``), in its place in its host's order: after
the host's older requests on disk, before the newer ones.

At most :data:`OPEN_QUEUES` disk queues are open at once (each holds file descriptors); the least recently
used one is closed and reopened when next needed.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import sqlite3
import tempfile
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.squeues import PickleFifoDiskQueue
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.request import request_from_dict

from .._compat import commit_without_fsync, pickle_fifo_sqlite_queue
from .held_disk import (
    HELD_DIR,
    HOST_FILE,
    create_wal_database,
    dir_name,
    queue_files,
    queue_name,
    read_held,
    read_host_file,
    write_json,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


#: Scrapy's SQLite queue of requests (built on Scrapy 2.18, which does not export it).
PickleFifoSQLiteQueue = pickle_fifo_sqlite_queue()

logger = logging.getLogger(__name__)

__all__ = ["HELD_DIR", "OPEN_QUEUES", "HeldRequests", "read_held", "seen_again"]

#: The file in which versions before this module saved held requests; read once on resume
#: (:meth:`HeldRequests.load_legacy`).
DEFERRED_FILE = "polite_deferred.pickle"
#: How many per-host disk queues may be open at once.
OPEN_QUEUES = 64

@dataclass
class _Host:
    """One host's held requests, by priority (``Request.priority``: the highest first, as Scrapy's priority queues
    hand requests out): per priority a FIFO of requests kept in memory and of runs (an ``int``: that many
    consecutive requests in the disk queue of that priority), so a request kept in memory after its host spilled
    (one that cannot be serialised) comes back after the older ones of its priority on disk."""

    queues: dict[int, deque[Request | int]] = field(default_factory=dict)
    in_memory: int = 0
    on_disk: int = 0
    due: float | None = None  # the due time recorded on disk (JOBDIR only)

    def __len__(self) -> int:
        return self.in_memory + self.on_disk

    def append_memory(self, priority: int, request: Request) -> None:
        """A request held in memory, behind the others of its ``priority``."""
        self.queues.setdefault(priority, deque()).append(request)
        self.in_memory += 1

    def append_disk(self, priority: int, count: int = 1) -> None:
        """``count`` requests of ``priority`` written to its disk queue, behind the others of that priority."""
        order = self.queues.setdefault(priority, deque())
        if order and isinstance(order[-1], int):
            order[-1] += count
        else:
            order.append(count)
        self.on_disk += count

    def memory_requests(self) -> list[Request]:
        """The requests held in memory, in the order they would be handed out."""
        return [item for priority in sorted(self.queues, reverse=True) for item in self.queues[priority]
                if not isinstance(item, int)]

    def drop_memory(self) -> None:
        """Forget the requests held in memory (closing); the runs on disk stay."""
        for priority, order in list(self.queues.items()):
            self.queues[priority] = deque(item for item in order if isinstance(item, int))
        self.in_memory = 0
        self._forget_empty()

    def drop_disk(self, priority: int) -> int:
        """Forget the runs on disk of ``priority`` (its queue has no more records to read; its FIFO is kept, maybe
        empty, for the caller); returns how many requests they counted."""
        order = self.queues.get(priority, deque())
        lost = sum(item for item in order if isinstance(item, int))
        kept = [item for item in order if not isinstance(item, int)]
        order.clear()
        order.extend(kept)
        self.on_disk -= lost
        return lost

    def _forget_empty(self) -> None:
        for priority in [priority for priority, order in self.queues.items() if not order]:
            del self.queues[priority]


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
        #: (host, priority) -> open disk queue, least recent first
        self._queues: OrderedDict[tuple[str, int], Any] = OrderedDict()
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
        priority = int(request.priority)  # (a bool passes Scrapy's check of an int)
        if not entry.on_disk and self._in_memory < self.max_in_memory:
            entry.append_memory(priority, request)
            self._in_memory += 1
            return
        try:
            later = due is not None and (entry.due is None or due > entry.due)
            if later:
                entry.due = due
            if self.durable and (later or not entry.on_disk):  # the host file goes first, then the queue
                self._write_host_file(host, entry)
            self._queue(host, priority).push(request)
        except ValueError as exc:  # Scrapy's serialisation refused it: a callback that is not a spider method
            self._keep_in_memory(entry, priority, request, "cannot be serialised", exc)
            return
        except (OSError, sqlite3.Error) as exc:
            self._keep_in_memory(entry, priority, request, "could not be written to disk", exc)
            return
        entry.append_disk(priority)
        self.written += 1

    def _keep_in_memory(self, entry: _Host, priority: int, request: Request, why: str, exc: Exception) -> None:
        """Hold ``request`` in memory after all, still behind the host's older requests (on disk or not);
        warn once per ``why`` (under ``JOBDIR`` the scheduler reports each such request at close instead)."""
        entry.append_memory(priority, request)
        self._in_memory += 1
        if why not in self._warned and not self.durable:
            self._warned.add(why)
            logger.warning("scrapy-polite: a deferred request %s %s (%s); it is kept in memory beyond "
                           "POLITE_MAX_HELD_IN_MEMORY, as is any other such request", request, why, exc)

    def pop(self, host: str) -> Request | None:
        """The host's first held request (its highest priority's first in, first out across memory and disk),
        removed; None when it has none (or none can be read back)."""
        entry = self.hosts.get(host)
        if entry is None:
            return None
        request: Request | None = None
        while request is None and entry.queues:
            priority = max(entry.queues)
            order = entry.queues[priority]
            head = order[0]
            self._total -= 1
            if not isinstance(head, int):  # a request held in memory
                order.popleft()
                entry.in_memory -= 1
                self._in_memory -= 1
                request = head
            else:  # the next request of a run on disk
                if head > 1:
                    order[0] = head - 1
                else:
                    order.popleft()
                entry.on_disk -= 1
                request = self._read(host, priority, entry)
            if not order:
                del entry.queues[priority]
        if not entry.in_memory and not entry.on_disk:
            del self.hosts[host]
            self._remove_directory(host)
        return request

    def _read(self, host: str, priority: int, entry: _Host) -> Request | None:
        """The next request of the host's disk queue of ``priority``; None when it cannot be read back (counted in
        :attr:`unreadable`, and when the queue has fewer records than counted, its other runs are forgotten)."""
        try:
            request: Request | None = self._queue(host, priority).pop()
        except Exception as exc:  # a record written by another spider version, a damaged file
            self.unreadable += 1
            logger.error("scrapy-polite: a deferred request of %s cannot be read back: %s", host, exc)
            return None
        if request is None:  # the queue has fewer records than counted: nothing more to read from it
            lost = entry.drop_disk(priority)
            self.unreadable += lost + 1
            self._total -= lost
        return request

    # -- disk ------------------------------------------------------------------------------------------------

    def _directory(self, host: str) -> str:
        if self._root is None:
            if self._temp is None:
                self._temp = tempfile.mkdtemp(prefix="scrapy-polite-held-")
            return os.path.join(self._temp, dir_name(host))
        return os.path.join(self._root, dir_name(host))

    def _write_host_file(self, host: str, entry: _Host) -> None:
        directory = self._directory(host)
        os.makedirs(directory, exist_ok=True)
        write_json(os.path.join(directory, HOST_FILE), {"host": host, "due": entry.due})

    def _queue(self, host: str, priority: int) -> Any:
        """The host's open disk queue of ``priority`` (opened or created on demand; the least recently used one beyond
        :data:`OPEN_QUEUES` is closed)."""
        key = (host, priority)
        queue = self._queues.get(key)
        if queue is not None:
            self._queues.move_to_end(key)
            return queue
        while len(self._queues) >= OPEN_QUEUES:
            self._close_queue(*self._queues.popitem(last=False))
        directory = self._directory(host)
        if self.durable:
            path = os.path.join(directory, queue_name(priority))
            if not os.path.exists(path):
                os.makedirs(directory, exist_ok=True)
                create_wal_database(path)
            queue = build_from_crawler(PickleFifoSQLiteQueue, self.crawler, path)
            commit_without_fsync(queue)
        else:
            queue = build_from_crawler(PickleFifoDiskQueue, self.crawler, os.path.join(directory, f"p{priority}"))
        self._queues[key] = queue
        return queue

    def _close_queue(self, key: tuple[str, int], queue: Any) -> None:
        """Close one disk queue; when its host has nothing on disk any more and no other queue open, remove the host's
        directory."""
        host = key[0]
        try:
            queue.close()  # queuelib removes an empty queue's files
        except (OSError, sqlite3.Error) as exc:
            logger.error("scrapy-polite: could not close the deferred requests of %s on disk: %s", host, exc)
        self._remove_directory(host)

    def _remove_directory(self, host: str) -> None:
        """Remove the host's directory once it holds nothing (it has no held request left, none of its queues is open,
        and, under ``JOBDIR``, no queue file is left: one :meth:`load` could not read is kept). A host still held keeps
        it, even with nothing on disk: one of its queues may be closing while another opens, or being read."""
        if host in self.hosts or (self._root is None and self._temp is None):
            return
        if any(other == host for other, _ in self._queues):
            return
        directory = self._directory(host)
        if self.durable and queue_files(directory):
            return
        shutil.rmtree(directory, ignore_errors=True)

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
            recorded = read_host_file(directory)
            files = queue_files(directory)
            if recorded is None or not files:
                shutil.rmtree(directory, ignore_errors=True)
                continue
            host, due = recorded
            counts = [self._open_saved(host, directory, priority, path) for priority, path in files]
            if any(counts):
                self.hosts[host].due = due
                found[host] = due
            elif None not in counts:  # every queue empty (none that cannot be read)
                shutil.rmtree(directory, ignore_errors=True)
        return found

    def _open_saved(self, host: str, directory: str, priority: int, path: str) -> int | None:
        """Open a disk queue a previous run left and hold its requests as a run; returns how many (0: it was empty, and
        is closed), or None when it cannot be read (logged)."""
        try:
            queue = build_from_crawler(PickleFifoSQLiteQueue, self.crawler, path)
            commit_without_fsync(queue)
            count = len(queue)
        except sqlite3.Error as exc:
            logger.error("scrapy-polite: the deferred requests of %s in %s cannot be read: %s", host, directory, exc)
            return None
        if not count:
            queue.close()
            return 0
        self.hosts.setdefault(host, _Host()).append_disk(priority, count)
        self._total += count
        self._queues[(host, priority)] = queue
        while len(self._queues) > OPEN_QUEUES:
            self._close_queue(*self._queues.popitem(last=False))
        return count

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

    def report_close(self, count: int, left: list[Request], summary: str, *, stopped: bool = False) -> None:
        """Count and log the close (:meth:`close`) of ``count`` held requests, ``left`` of them in memory (not kept):
        under ``JOBDIR`` those on disk are kept for resume and those left are logged and counted as not saved; without
        it every one is counted as not crawled (``summary``: what was held, for the log), logged at WARNING when the
        crawl ended by itself, at INFO when it was ``stopped`` on request (a ``CLOSESPIDER_*`` limit, the spider's
        ``CloseSpider``, Ctrl-C), as Scrapy drops its pending requests then (trial: a WARNING at each page limit)."""
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
            (logger.info if stopped else logger.warning)(
                "scrapy-polite: %d deferred %s not crawled (set JOBDIR to resume them). %s",
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
        logger.info("scrapy-polite: %d held requests are kept in %s for resume. %s", count - len(left),
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


def seen_again(crawler: Crawler, inner: Any, jobdir: str) -> None:
    """Record the requests resumed from ``jobdir`` in the wrapped scheduler's dupe filter (its ``df``), as when they
    were first scheduled (``dont_filter`` ones are not, as Scrapy's scheduler does not). After a kill, Scrapy's
    ``requests.seen`` lacks the fingerprints it had not flushed, and the spider's start requests yielded again passed
    it: each held request was fetched twice in the resumed crawl (trial; docs/spec.md §5, "Deferral"). Run on a
    thread while the engine waits for the scheduler's ``open`` (about 26 µs per request), one request read at a
    time; a record that cannot be read back is skipped here (it is reported when handed out); a failure of the
    filter is logged at WARNING."""
    df = getattr(inner, "df", None)
    if df is None:
        return
    try:
        for _, _, data in read_held(jobdir, skip_unreadable=True):
            try:
                request = request_from_dict(data, spider=crawler.spider)
            except (ValueError, KeyError, TypeError, AttributeError):  # a callback of another spider version
                continue
            if not request.dont_filter:
                df.request_seen(request)
    except Exception as exc:
        logger.warning("scrapy-polite: the deferred requests resumed from %s could not be recorded in the dupe "
                       "filter (%s): a request the spider yields again may be fetched twice", jobdir, exc)
