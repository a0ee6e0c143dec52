"""The layout of held requests on disk under ``JOBDIR`` (docs/spec.md §5; :mod:`scrapy_polite.crawl.held` keeps them).

In ``JOBDIR/polite_held/<host>-<hash>/``, one directory per host: ``host.json``, the host and its due time (epoch
seconds of the store's clock; replaced atomically), and one ``scrapy.squeues.PickleFifoSQLiteQueue`` (queuelib's
SQLite queue, in WAL mode) per priority with held requests: ``requests.sqlite3`` for priority 0 (the file of
versions before priorities, which a resumed crawl reads as priority 0), ``requests.p<priority>.sqlite3`` for any
other. **Every** held request is written when it is held, one SQLite transaction each (committed to the WAL
without an fsync, about 20 µs), so a crawl killed at any moment (``kill -9``) loses none of the requests it held.
An operating-system crash or power cut may lose the last ones written.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

__all__ = ["HELD_DIR", "HOST_FILE", "create_wal_database", "dir_name", "queue_files", "queue_name", "read_held",
           "read_host_file", "write_json"]

#: The directory under ``JOBDIR`` that keeps held requests across runs.
HELD_DIR = "polite_held"
#: A host directory's record of its host and due time.
HOST_FILE = "host.json"
#: A disk queue's file name (its priority in the name, none for 0).
QUEUE_FILE = re.compile(r"requests(?:\.p(-?[1-9][0-9]*))?\.sqlite3")


def queue_name(priority: int) -> str:
    """The file of a host's disk queue of ``priority``: ``requests.sqlite3`` for priority 0 (the one queue per host of
    versions before priorities), ``requests.p<priority>.sqlite3`` for any other."""
    return "requests.sqlite3" if priority == 0 else f"requests.p{int(priority)}.sqlite3"


def queue_files(directory: str) -> list[tuple[int, str]]:
    """``(priority, path)`` of the disk queues in a host's ``directory``, the highest priority first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(match.group(1) or 0), os.path.join(directory, name))
             for name in names if (match := QUEUE_FILE.fullmatch(name))]
    return sorted(found, key=lambda item: -item[0])


def dir_name(host: str) -> str:
    """A file-system-safe, collision-free directory name for ``host`` (readable prefix + hash)."""
    readable = "".join(c if c.isascii() and (c.isalnum() or c in "-._") else "_" for c in host)[:80]
    return f"{readable}-{hashlib.sha1(host.encode('utf-8')).hexdigest()[:16]}"


def write_json(path: str, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` atomically: a reader (or a restart after a kill) sees the old file
    or the new one, never a torn one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_host_file(directory: str) -> tuple[str, float | None] | None:
    """The host and due time recorded in ``directory``, or None when the file is missing or unreadable."""
    try:
        with open(os.path.join(directory, HOST_FILE), encoding="utf-8") as f:
            data = json.load(f)
        host = data["host"]
        due = data.get("due")
        if not isinstance(host, str) or not (due is None or isinstance(due, (int, float))):
            return None
        return host, None if due is None else float(due)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def create_wal_database(path: str) -> None:
    """Create an empty SQLite file in WAL mode (persisted in the file), so the queue that opens it next
    commits with one WAL append instead of a rollback journal."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=WAL").fetchone()
    finally:
        db.close()


def read_held(jobdir: str, *, skip_unreadable: bool = False) -> Iterator[tuple[str, float | None, dict[str, Any]]]:
    """Every request held under ``jobdir`` (as a killed or closed crawl left them), without a crawler, read one at a
    time (a host's queue is not loaded into memory at once).

    Args:
        jobdir: the ``JOBDIR``.
        skip_unreadable: skip a queue file or a record that cannot be read (a damaged file, a record of another
            spider version), instead of raising.

    Yields:
        ``(host, due or None, request dict)`` per request, host by host, each host's in the order it would be
        handed out (the highest priority first, each priority's in the order held);
        the dict is ``request.to_dict()`` (``request_from_dict`` makes the request again).

    Raises:
        sqlite3.Error, pickle.UnpicklingError (or any error of unpickling): a queue file or a record that cannot be
        read, unless ``skip_unreadable``.
    """
    root = os.path.join(jobdir, HELD_DIR)
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        directory = os.path.join(root, name)
        found = read_host_file(directory)
        if found is None:
            continue
        host, due = found
        for _, path in queue_files(directory):
            db = sqlite3.connect(path)
            try:
                try:
                    has_table = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'queue'").fetchone()
                    rows = db.execute("SELECT item FROM queue ORDER BY id") if has_table else ()
                except sqlite3.Error:
                    if not skip_unreadable:
                        raise
                    continue
                for (item,) in rows:
                    try:
                        data = pickle.loads(item)
                    except Exception:  # a class gone from the code, a damaged record: skipped only when told
                        if not skip_unreadable:
                            raise
                        continue
                    yield host, due, data
            finally:
                db.close()
