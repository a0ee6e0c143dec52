"""Benchmark of the pace table: our SQLite store against the reference's fixed table file.

Usage::

    python bench/store.py [--updates N] [--concurrent-updates K] [--writers W] [--hosts H]

Two figures, each measured for both designs in the same run, on the same disk:

1. throughput: read-modify-write updates per second from one process. One update is what the crawler
   does after every response: read the host's row, apply the policy to a 429 (one more backoff step),
   write the row. Ours is ``SQLiteStore.update`` with ``PacingPolicy.after_response``; the reference is
   ``pace_after`` (``bench/_reference_table.py``: the whole 160 KB file read, then rewritten with
   ``O_TRUNC``, on every update). Printed with the ratio ours/reference.
2. lost updates: W writer processes each do K such updates round-robin over H shared hosts, started
   together. Every update adds exactly one to a host's ``consec``, so ``W*K - sum(consec)`` is the number of
   updates lost. Ours must lose none (one ``BEGIN IMMEDIATE`` transaction per update); the reference has no
   lock at all.

The defaults run in well under a minute on two cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from _reference_table import ReferenceTable  # noqa: E402  (bench/ is sys.path[0] when run as a script)

from scrapy_polite.policy import PacingPolicy  # noqa: E402
from scrapy_polite.stores import SQLiteStore  # noqa: E402

POLICY = PacingPolicy()


def _hosts(n: int) -> list[str]:
    return [f"host{i}.bench.example" for i in range(n)]


# --------------------------------------------------------------------------------------------------
# One update of each design
# --------------------------------------------------------------------------------------------------


def _ours_update(store: SQLiteStore, host: str) -> None:
    store.update(host, lambda state, now: (POLICY.after_response(state, status=429, end=now).state, None))


def _reference_update(table: ReferenceTable, host: str) -> None:
    table.after(host, 429, 0)


def _open(kind: str, path: str):
    return SQLiteStore(path) if kind == "ours" else ReferenceTable(path)


def _close(kind: str, target) -> None:
    if kind == "ours":
        target.close()


def _update(kind: str, target, host: str) -> None:
    if kind == "ours":
        _ours_update(target, host)
    else:
        _reference_update(target, host)


def _total_consec(kind: str, path: str, hosts: list[str]) -> int:
    if kind == "ours":
        store = SQLiteStore(path)
        try:
            return sum(state.consec for host, state in store.items() if host in hosts)
        finally:
            store.close()
    table = ReferenceTable(path)
    return sum(table.consec(host) for host in hosts)


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


def throughput(kind: str, directory: str, updates: int, hosts: list[str]) -> float:
    """Updates per second of one process."""
    path = os.path.join(directory, f"{kind}-throughput.db")
    target = _open(kind, path)
    try:
        for host in hosts:  # warm up: every row exists, the file is in the page cache
            _update(kind, target, host)
        start = time.perf_counter()
        for i in range(updates):
            _update(kind, target, hosts[i % len(hosts)])
        elapsed = time.perf_counter() - start
    finally:
        _close(kind, target)
    return updates / elapsed


def _writer(kind: str, path: str, updates: int, hosts: list[str], barrier) -> None:
    target = _open(kind, path)
    try:
        barrier.wait()
        for i in range(updates):
            _update(kind, target, hosts[i % len(hosts)])
    finally:
        _close(kind, target)


def lost_updates(kind: str, directory: str, writers: int, updates: int, hosts: list[str]) -> tuple[int, int, float]:
    """``(lost, expected, seconds)`` for ``writers`` processes doing ``updates`` updates each."""
    path = os.path.join(directory, f"{kind}-concurrent.db")
    _close(kind, _open(kind, path))  # create the store (schema, or nothing for the reference) up front
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(writers + 1)
    processes = [context.Process(target=_writer, args=(kind, path, updates, hosts, barrier))
                 for _ in range(writers)]
    for process in processes:
        process.start()
    barrier.wait()
    start = time.perf_counter()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - start
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise SystemExit(f"{kind}: a writer process failed (exit codes {failed})")
    expected = writers * updates
    return expected - _total_consec(kind, path, hosts), expected, elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20000,
                        help="updates per design for the single-process throughput (default 20000)")
    parser.add_argument("--concurrent-updates", type=int, default=2000,
                        help="updates per writer process for the lost-update test (default 2000)")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writer processes (default 4)")
    parser.add_argument("--hosts", type=int, default=5, help="hosts shared by the updates (default 5)")
    args = parser.parse_args(argv)
    hosts = _hosts(args.hosts)

    with tempfile.TemporaryDirectory(prefix="polite-bench-") as directory:
        print(f"pace table benchmark: {args.updates} updates, {args.hosts} hosts, in {directory}")
        ours = throughput("ours", directory, args.updates, hosts)
        reference = throughput("reference", directory, args.updates, hosts)
        print(f"  SQLiteStore (ours)          {ours:12,.0f} updates/s")
        print(f"  reference 160 KB table file {reference:12,.0f} updates/s")
        print(f"  ratio ours/reference        {ours / reference:12.1f}x   (target >= 20x)")

        print(f"lost updates: {args.writers} writer processes x {args.concurrent_updates} updates, "
              f"{args.hosts} shared hosts")
        for kind, label in [("ours", "SQLiteStore (ours)         "), ("reference", "reference 160 KB table file")]:
            lost, expected, elapsed = lost_updates(kind, directory, args.writers, args.concurrent_updates, hosts)
            print(f"  {label} lost {lost:6d} of {expected} ({100 * lost / expected:5.1f}%) in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
