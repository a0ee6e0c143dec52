"""Benchmark of the SQLite WAL's bound: does the ``-wal`` file stay bounded over a long crawl?

Usage::

    python bench/wal.py [--bookings 1000000] [--hosts 100000] [--addresses 10000] [--sample-every 100]
                        [--per-turn 1] [--records] [--processes 1] [--restart-frames 8192]

What runs: ``--bookings`` bookings through the crawl's real path, the pacer's async SQLite store
(``SQLiteStore(path).open_async()``, i.e. :class:`~scrapy_polite.stores.sqlite.AsyncSQLiteStore`: group commit
inline on the no-wait connection, :meth:`SQLiteStore.run_group <scrapy_polite.stores.sqlite.SQLiteStore.run_group>`,
the WAL checkpointed in two phases on the store's thread, docs/spec.md §6), on a running reactor. One booking is
the downloader middleware's transaction (:func:`scrapy_polite.crawl.booking.booking_update`: ``update_many([host,
ip:...], PacingPolicy.book)``) of a random host among ``--hosts`` already in the table (over ``--addresses``
addresses, each host on 1 or 2 of them, as in ``bench/booking.py``). ``--per-turn`` bookings start in one
reactor turn (they form one group) and are awaited, then one reactor turn passes (the crawl's other work);
``--records`` adds, in the next turn, each booked host's response record (``update(host, after_response 200)``),
as a crawl does after every page. ``--processes`` runs that many such crawls at once on the one file (each
its own store, as processes sharing a pace table do).

Printed (every ``--sample-every`` bookings the ``-wal`` file's size is looked at with ``os.stat``):

* the largest ``-wal`` file size seen, in MB and in pages (frames: a 32-byte header, then a page and a 24-byte
  frame header each), and at which booking; the final size; the bound the store aims at
  (``--restart-frames`` pages, the store's default 8192) for comparison;
* the checkpoints the store ran, how many needed their second phase (the one that holds the calls), and how
  many of those started the WAL over and cut its file (SQLite's TRUNCATE: docs/spec.md §6, "The WAL's bound");
* bookings per second over the run, the store's write transactions, and the longest wait of a booking (from
  the call to its result; a checkpoint's second phase holds the calls that wait behind it).

Nothing leaves the machine. ``--bookings 1000000`` (the default) runs in several minutes on two cores;
``--bookings 50000`` in seconds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sqlite3
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from booking import IP_INTERVAL, POLICY, _Clock, fill, rows, table  # bench/ is sys.path[0] as a script

from scrapy_polite.crawl.booking import booking_update
from scrapy_polite.policy import HostState
from scrapy_polite.stores import SQLiteStore


def frames(size: int, page_size: int) -> int:
    """The frames (pages) a ``-wal`` file of ``size`` bytes holds."""
    return max(0, size - 32) // (page_size + 24)


def record(state: HostState | None, now: float) -> tuple[HostState, None]:
    """A response record: a 200 just finished (``PacingPolicy.after_response``)."""
    return POLICY.after_response(state, status=200, end=now).state, None


def crawl_process(path: str, n_hosts: int, n_addresses: int, n_bookings: int, every: int, per_turn: int,
                  records: bool, restart_frames: int, seed: int, barrier: Any = None) -> dict[str, Any]:
    """One crawl's bookings on its own reactor (this process runs it once); what it measured."""
    from twisted.internet import defer, reactor, task

    hosts, _, host_addresses = table(n_hosts, n_addresses)
    store = SQLiteStore(path, clock=_Clock(time.time())).open_async(reactor, restart_frames=restart_frames)
    out: dict[str, Any] = {}

    async def crawl() -> None:
        rng = random.Random(seed)
        perf = time.perf_counter
        largest = (0, 0)  # (size, booking)
        longest = 0.0
        booked = 0
        if barrier is not None:
            barrier.wait()  # every process starts together (a blocking wait before the first booking)
        started = perf()
        done = 0
        next_sample = every
        while done < n_bookings:
            batch = [hosts[rng.randrange(n_hosts)] for _ in range(min(per_turn, n_bookings - done))]
            t0 = perf()
            calls = []
            for host in batch:
                keys, fn = booking_update(POLICY, host, host_addresses[host], 1.0, IP_INTERVAL)
                calls.append(store.update_many(keys, fn))
            results = await defer.gatherResults(calls, consumeErrors=True)
            longest = max(longest, perf() - t0)
            booked += sum(result[0].booked for result in results)
            done += len(batch)
            await task.deferLater(reactor, 0, lambda: None)  # the crawl's other work: one reactor turn
            if records:
                await defer.gatherResults([store.update(host, record) for host in batch], consumeErrors=True)
            if done >= next_sample:
                next_sample += every
                size = os.stat(path + "-wal").st_size
                if size > largest[0]:
                    largest = (size, done)
        out.update(largest=largest, longest=longest, booked=booked, elapsed=perf() - started)

    def start() -> None:
        d = defer.Deferred.fromCoroutine(crawl())
        d.addErrback(lambda f: out.setdefault("error", f.getTraceback()))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)
    try:
        if "error" in out:
            raise SystemExit(f"the run failed:\n{out['error']}")
        out.update(checkpoints=store.checkpoints, second=store.second_phases,  # type: ignore[attr-defined]
                   cuts=store.cuts, transactions=store.transactions)  # type: ignore[attr-defined]
    finally:
        store.close()
    return out


def _child(queue: Any, *args: Any) -> None:
    queue.put(crawl_process(*args))


def run(path: str, n_hosts: int, n_addresses: int, n_bookings: int, every: int, per_turn: int, records: bool,
        restart_frames: int, processes: int) -> None:
    now = time.time()
    hosts, addresses, _ = table(n_hosts, n_addresses)
    table_rows = rows(hosts, addresses, now)
    fill(path, table_rows)
    keeper = SQLiteStore(path)  # keeps the -wal file from being removed between the crawls; no transaction open
    page_size = keeper.page_size
    print(f"{n_bookings:,} bookings of {len(hosts):,} hosts over {len(addresses):,} addresses "
          f"({len(table_rows):,} rows, {os.path.getsize(path) / 1e6:.1f} MB file, {page_size} B pages), "
          f"{per_turn} per reactor turn{', each with its response record' if records else ''}"
          f"{f', in each of {processes} processes sharing the file' if processes > 1 else ''}; "
          f"the -wal file looked at every {every:,} bookings")
    args = (path, n_hosts, n_addresses, n_bookings, every, per_turn, records, restart_frames)
    try:
        if processes == 1:
            results = [crawl_process(*args, 1)]
        else:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            barrier = context.Barrier(processes)
            children = [context.Process(target=_child, args=(queue, *args, 1 + i, barrier)) for i in range(processes)]
            for child in children:
                child.start()
            results = [queue.get() for _ in children]
            for child in children:
                child.join()
        final = os.stat(path + "-wal").st_size
    finally:
        keeper.close()
    size, at = max(r["largest"] for r in results)
    cuts = sum(r["cuts"] for r in results)
    checkpoints = sum(r["checkpoints"] for r in results)
    second = sum(r["second"] for r in results)
    total = n_bookings * processes
    elapsed = max(r["elapsed"] for r in results)
    bound = 32 + restart_frames * (page_size + 24)
    print(f"  largest -wal file     {size / 1e6:8.1f} MB = {frames(size, page_size):,} pages (at booking {at:,}); "
          f"the store's aim {restart_frames:,} pages = {bound / 1e6:.1f} MB: "
          f"{'within' if size <= bound else f'{size / bound:.2f}x'} it")
    print(f"  final -wal file       {final / 1e6:8.1f} MB = {frames(final, page_size):,} pages "
          f"(cut to nothing by a second phase that starts the WAL over, else reused: as long as the longest WAL since)")
    print(f"  checkpoints run       {checkpoints:8,}   ({second:,} needed the second phase, which holds the calls; "
          f"one every {total / max(1, checkpoints):,.0f} bookings); {cuts:,} second phases started the WAL over "
          "and cut its file")
    print(f"  bookings/s            {total / elapsed:8,.0f}   ({elapsed:.1f} s, "
          f"{sum(r['transactions'] for r in results):,} write transactions, "
          f"{sum(r['booked'] for r in results):,} booked now, the longest wait of a booking "
          f"{max(r['longest'] for r in results) * 1000:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bookings", type=int, default=1_000_000, help="bookings in the run (default 1000000)")
    parser.add_argument("--hosts", type=int, default=100_000, help="hosts in the table (default 100000)")
    parser.add_argument("--addresses", type=int, default=10_000, help="addresses in the table (default 10000)")
    parser.add_argument("--sample-every", type=int, default=100,
                        help="bookings between two looks at the -wal file (default 1000)")
    parser.add_argument("--per-turn", type=int, default=1, help="bookings started per reactor turn (default 1)")
    parser.add_argument("--records", action="store_true", help="each booking followed by its response record")
    parser.add_argument("--processes", type=int, default=1,
                        help="crawl processes sharing the file, each making --bookings bookings (default 1)")
    parser.add_argument("--restart-frames", type=int, default=8192,
                        help="the store's restart_frames (default 8192, the pacer's)")
    args = parser.parse_args()
    print(f"scrapy-polite WAL bench — Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="polite-bench-") as directory:
        run(os.path.join(directory, "wal.sqlite3"), args.hosts, args.addresses, args.bookings,
            max(1, args.sample_every), max(1, args.per_turn), args.records, args.restart_frames, max(1, args.processes))


if __name__ == "__main__":
    main()
