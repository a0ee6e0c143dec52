"""The SQLite WAL's bound (docs/spec.md §6, "The WAL's bound"): crawls sharing one file, each checkpointing
on its own store's thread, let the WAL start over, so its file stays bounded (``bench/wal.py`` measures it
over 1,000,000 bookings)."""

from __future__ import annotations

import os
import struct

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.task import deferLater

from scrapy_polite.policy import HostState
from scrapy_polite.stores import SQLiteStore

RESTART_FRAMES = 300
BOOKINGS = 5000  # per crawl
#: Bookings in flight per crawl: one, so each is a transaction of its own (the group commit bundles those made in
#: one reactor turn): 5,000 writes per store, five times the checkpoints' floor of 1,000 writes.
IN_FLIGHT = 1


def _wal_pages(path: str) -> int:
    """The longest the WAL has been, in pages (its file is reused, never cut, when the WAL starts over)."""
    try:
        return max(0, os.path.getsize(path + "-wal") - 32) // (4096 + 24)
    except OSError:
        return 0


def _wal_frames(path: str) -> int:
    """The frames the WAL holds now: ``mxFrame`` of the WAL-index header at the start of the ``-shm`` file (a
    32-bit integer in the machine's order at byte 16, sqlite.org/walformat.html). Unlike the file's length, it
    starts from nothing again when the WAL starts over in a file that is reused, not cut. 0 when there is none."""
    try:
        with open(path + "-shm", "rb") as f:
            header = f.read(20)
    except OSError:
        return 0
    return struct.unpack_from("=I", header, 16)[0] if len(header) == 20 else 0


def _growth(samples: list[int]) -> tuple[int, int]:
    """From the WAL's frames (:func:`_wal_frames`) sampled through a run, in order: how many pages the WAL grew by
    in all (what its file would hold had it never started over: the control's length), and how many times it
    was seen starting over (fewer frames than at the sample before; the growth since counts from nothing)."""
    grown, drops, before = 0, 0, 0
    for frames in samples:
        if frames < before:
            drops += 1
            grown += frames
        else:
            grown += frames - before
        before = frames
    return grown, drops


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("second_phase", ["restart", "passive"])
async def test_two_crawls_sharing_the_file_keep_the_wal_bounded(tmp_path, monkeypatch, second_phase):
    """Two crawls' stores on one file (as two processes sharing a pace table), each booking all the time
    (:data:`IN_FLIGHT` bookings in flight each, a host row and an address row per booking): the WAL's file is
    cut and starts over through the run, so it does not grow with the writes, because a checkpoint's second phase
    (``checkpoint(restart_wait=...)``, SQLite's TRUNCATE) makes the other crawl's writes wait while it copies
    the last pages, then starts the WAL over itself. Negative control: with a PASSIVE second phase the other
    crawl writes between the complete copy and the next write of this one, the WAL rarely starts over, and
    its file grows with the writes (the 681 MB of ``bench/wal.py --processes 2 --bookings 20000`` before the
    fix). Both judged by counts and against the run's own growth (the frames the WAL was seen to grow by),
    not by a page count; ``bench/wal.py`` measures the bound in pages."""
    from twisted.internet import reactor

    if second_phase == "passive":
        original = SQLiteStore.checkpoint
        monkeypatch.setattr(SQLiteStore, "checkpoint", lambda self, restart_wait=None: original(self))
    path = str(tmp_path / "pace.sqlite3")
    stores = [SQLiteStore(path).open_async(restart_frames=RESTART_FRAMES) for _ in range(2)]
    largest = [0]
    samples: list[int] = []
    made = [0, 0]

    async def slot(which: int) -> None:
        store = stores[which]
        while made[which] < BOOKINGS:
            i = made[which]
            made[which] += 1
            host, address = f"h{which}-{i % 400}.example", f"ip:10.{which}.{i % 4}.{i % 250}"

            def book(states, now, host=host, address=address):
                return {host: HostState(next_allowed=now + 1, updated=now),
                        address: HostState(next_allowed=now + 0.5, updated=now)}, None

            await store.update_many([host, address], book)
            if i % 25 == 0:
                samples.append(_wal_frames(path))
                largest[0] = max(largest[0], _wal_pages(path))
            await deferLater(reactor, 0)  # the download, as short as can be

    try:
        await defer.gatherResults([defer.ensureDeferred(slot(which)) for which in (0, 1) for _ in range(IN_FLIGHT)])
        samples.append(_wal_frames(path))
        largest[0] = max(largest[0], _wal_pages(path))
    finally:
        for store in stores:
            store.close()
    cuts = sum(store.cuts for store in stores)
    grown, drops = _growth(samples)
    print(f"2 crawls x {BOOKINGS} bookings, second phase {second_phase}: the WAL's file at most {largest[0]} pages "
          f"of {grown} written, cut {cuts} times (seen starting over {drops} times)")
    # 10,000 bookings write about 51,000-53,000 pages (``grown``, from the WAL-index's frame count, which a start-over
    # in a reused file resets too: only the frames written between a sample and a start-over go unseen). Without
    # the second phase's TRUNCATE the file is never cut and holds them all: its longest is the whole growth
    # (measured 52,917 of 52,917). With it, a store checkpoints 250 writes after a cut or after a second phase
    # whose 50 ms wait ran out (more of those on a loaded machine, whose writes outlast the wait more often),
    # 1,000 (the floor of docs/spec.md §6) after a complete copy: the WAL at its longest measured 2,000-6,500 pages,
    # 4,400-8,800 with the machine loaded 5 times over, at most a sixth of the growth (a 3x margin to the bound
    # below); the bug's is all of it.
    # Judged by counts and by the ratio to the run's own growth, not by pages (``bench/wal.py`` measures those).
    if second_phase == "restart":
        assert cuts > 0 and drops > 0, (cuts, drops)  # the second phases cut its file and the WAL started over
        assert largest[0] < grown / 2, (largest[0], grown)  # started over through the run: not growing with it
    else:
        assert cuts == 0, (cuts, drops)  # never cut (a start-over in the reused file may still come, rarely)
        assert largest[0] > 4 * BOOKINGS, (largest[0], grown)  # what the TRUNCATE prevents (52,917 measured)


def _book(store: SQLiteStore, key: str) -> None:
    store.update(key, lambda state, now: (HostState(next_allowed=now + 1.0, updated=now), None))


def test_a_truncate_whose_wait_runs_out_is_said_as_could_not_run_and_the_lock_wait_comes_back(tmp_path):
    """A second phase that meets another connection's write lock past its wait copies what it can and does not
    start the WAL over: checkpoint says (-1, -1) (the crawl's store then watches the WAL's length again), not
    the (frames, frames) of a complete copy; the store's own wait for a lock is its timeout again after it."""
    import sqlite3
    import threading
    import time

    path = str(tmp_path / "pace.sqlite3")
    store = SQLiteStore(path, timeout=5.0)
    other = sqlite3.connect(path, isolation_level=None, timeout=5.0, check_same_thread=False)
    try:
        for i in range(50):
            _book(store, f"h{i}.test")
        other.execute("BEGIN IMMEDIATE")  # another process's write in progress
        started = time.monotonic()
        assert store.checkpoint(restart_wait=0.05) == (-1, -1)
        assert time.monotonic() - started < 2.0
        assert os.path.getsize(path + "-wal") > 0  # not cut
        # The store waits for a lock again (its timeout, not the checkpoint's 50 ms): a write meeting the other
        # connection's lock for 0.3 s waits for it and lands.
        threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
        _book(store, "after.test")
        assert store.get("after.test") is not None
        # Negative control: nothing in the way, the TRUNCATE starts the WAL over and cuts its file.
        assert store.checkpoint(restart_wait=0.05) == (0, 0)
        assert os.path.getsize(path + "-wal") == 0
    finally:
        other.close()
        store.close()
