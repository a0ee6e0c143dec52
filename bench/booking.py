"""Benchmark of the pace table's hot path: the booking transaction and the read-modify-write rate.

Usage::

    python bench/booking.py [--hosts 100000] [--addresses 10000] [--bookings 20000]
                            [--updates 20000] [--rounds 5] [--rmw-hosts 5]

Figures printed, each next to its baseline measured in the same run, on the same file settings (a
temporary file in WAL mode, ``synchronous=NORMAL``):

1. **booking latency**: the downloader middleware's booking transaction as the pacer runs it
   (:func:`scrapy_polite.crawl.booking.booking_update`: ``store.update_many([host, ip:...], fn)`` whose ``fn``
   is :meth:`PacingPolicy.book <scrapy_polite.policy.PacingPolicy.book>`), with H hosts over A addresses
   already in the table (each host on 1 or 2 addresses, 70 % on one), for

   * ``SQLiteStore.update_many`` — the store's own connection (it waits for locks, checkpoints the WAL
     every 1000 pages itself);
   * ``AsyncStore.update_many`` — what the pacer calls: inline on the no-wait connection, the WAL
     checkpointed on the store's thread once it holds about 8192 pages (docs/spec.md §6: here about
     every 1500 bookings, which touch pages all over the table), the result read from the fired Deferred;
   * ``MemoryStore.update_many`` and the ``PacingPolicy.book`` step alone, for scale.

   Median, p99 and p99.9 in microseconds per booking (target: p99 ≤ 100 µs on SQLite).
2. **read-modify-write rate**: what the recorder does after every response, one row per transaction:
   ``SQLiteStore.update(host, fn)`` with ``fn`` = :meth:`PacingPolicy.after_response
   <scrapy_polite.policy.PacingPolicy.after_response>` for a 429 (one more backoff step), next to raw SQLite
   doing the same single-row transaction from Python's ``sqlite3``: ``BEGIN IMMEDIATE; SELECT ...;
   INSERT OR REPLACE ...; COMMIT`` (the same table, statements and pragmas). ``--rounds`` alternating rounds
   each; medians printed (target: ours ≥ 80 % of raw, issue 17).

Nothing leaves the machine. The defaults run in about 30 s on two cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from scrapy_polite.crawl.booking import booking_update
from scrapy_polite.policy import HostState, PacingPolicy, ip_key
from scrapy_polite.stores import AsyncStore, MemoryStore, SQLiteStore

POLICY = PacingPolicy(host_interval=1.0)
IP_INTERVAL = 2.0
#: The pace table's columns: the key, then one per HostState field (the schema names them alike).
_FIELDS = [f.name for f in dataclasses.fields(HostState)]
_COLUMNS = ", ".join(["host", *_FIELDS])
_SELECT = f"SELECT {', '.join(_FIELDS)} FROM hosts WHERE host = ?"
_WRITE = f"INSERT OR REPLACE INTO hosts ({_COLUMNS}) VALUES ({', '.join('?' * (len(_FIELDS) + 1))})"


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of an ascending list."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))]


# --------------------------------------------------------------------------------------------------
# 1. booking latency
# --------------------------------------------------------------------------------------------------


def table(n_hosts: int, n_addresses: int) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """``(hosts, addresses, host -> its sorted addresses)``, deterministic."""
    rng = random.Random(42)
    addresses = sorted({f"{(i >> 16) % 200 + 20}.{(i >> 8) & 255}.{i & 255}.{rng.randrange(1, 254)}"
                        for i in range(n_addresses)})
    hosts = [f"host{i}.bench.example" for i in range(n_hosts)]
    host_addresses = {host: sorted(rng.sample(addresses, 1 if rng.random() < 0.7 else 2)) for host in hosts}
    return hosts, addresses, host_addresses


def rows(hosts: list[str], addresses: list[str], now: float) -> list[tuple[str, HostState]]:
    """Every host and address booked once, some time ago."""
    rng = random.Random(7)
    out = [(host, HostState(next_allowed=now - rng.uniform(0, 60), ok_seen=True, updated=now - 60))
           for host in hosts]
    out += [(ip_key(a), HostState(next_allowed=now - rng.uniform(0, 60), updated=now - 60)) for a in addresses]
    return out


def fill(path: str, table_rows: list[tuple[str, HostState]]) -> None:
    """Create the store's file at ``path`` and insert ``table_rows`` in one transaction."""
    SQLiteStore(path).close()  # the schema
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.executemany(_WRITE, [(k, *dataclasses.astuple(s)) for k, s in table_rows])
    db.execute("COMMIT")
    db.close()


class _Clock:
    """A store clock that moves 10 ms per reading (100 bookings per simulated second, like a busy crawl),
    so most bookings find their host free."""

    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        self.t += 0.01
        return self.t


def book_loop(update_many, hosts: list[str], host_addresses: dict[str, list[str]], n_ops: int
              ) -> tuple[list[float], int]:
    """``n_ops`` bookings of random hosts through ``update_many``; ``(sorted µs per booking, booked)``."""
    rng = random.Random(1)
    timings: list[float] = []
    booked = 0
    perf = time.perf_counter_ns
    n = len(hosts)
    for _ in range(n_ops):
        host = hosts[rng.randrange(n)]
        t0 = perf()
        keys, fn = booking_update(POLICY, host, host_addresses[host], 1.0, IP_INTERVAL)
        result = update_many(keys, fn)
        timings.append((perf() - t0) / 1000.0)
        booked += result[0].booked
    timings.sort()
    return timings, booked


def async_book_loop(store: AsyncStore, hosts: list[str], host_addresses: dict[str, list[str]], n_ops: int
                    ) -> tuple[list[float], int, int]:
    """The same through the pacer's :class:`AsyncStore`, on a running reactor, with a reactor turn between
    two bookings (as in a crawl; it completes the store thread's checkpoints). With SQLite's group commit
    (docs/spec.md §6) every booking's result comes on the next reactor turn, so its time includes that turn.
    ``(timings, booked, number of bookings that waited more than 1 ms: a checkpoint's hold, the thread)``."""
    from twisted.internet import defer, reactor, task

    from scrapy_polite.crawl.reactor import await_deferred

    out: dict[str, object] = {}

    async def run() -> None:
        rng = random.Random(1)
        timings: list[float] = []
        booked = threaded = 0
        perf = time.perf_counter_ns
        n = len(hosts)
        for _ in range(n_ops):
            host = hosts[rng.randrange(n)]
            t0 = perf()
            keys, fn = booking_update(POLICY, host, host_addresses[host], 1.0, IP_INTERVAL)
            d = store.update_many(keys, fn)
            result = await await_deferred(d)
            timings.append((perf() - t0) / 1000.0)
            threaded += timings[-1] > 1000.0
            booked += result[0].booked
            await task.deferLater(reactor, 0, lambda: None)  # the crawl's other work: one reactor turn
        timings.sort()
        out["result"] = (timings, booked, threaded)

    def start() -> None:
        d = defer.Deferred.fromCoroutine(run())
        d.addErrback(lambda f: out.setdefault("error", f.getTraceback()))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)  # once per process: this is the only part that runs it
    if "error" in out:
        raise SystemExit(f"AsyncStore booking failed:\n{out['error']}")
    return out["result"]  # type: ignore[return-value]


def raw_book_loop(path: str, hosts: list[str], host_addresses: dict[str, list[str]], n_ops: int, start: float,
                  *, checkpoint_aside: bool) -> list[float]:
    """The same transaction in raw ``sqlite3``, the floor under ours: ``BEGIN IMMEDIATE``, one ``SELECT`` per
    key, ``INSERT OR REPLACE`` of the host's and the first address's rows, ``COMMIT``; the same statements
    and pragmas; sorted µs per booking. ``checkpoint_aside``: as on the pacer's path, no autocheckpoint in the
    transaction, a second connection checkpoints every 1000 transactions, outside the timings; else
    SQLite's default autocheckpoint, inside the transaction that reaches it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL").fetchone()
    db.execute("PRAGMA synchronous=NORMAL")
    other = sqlite3.connect(path, isolation_level=None)
    if checkpoint_aside:
        db.execute("PRAGMA wal_autocheckpoint=0")
    rng = random.Random(1)
    timings: list[float] = []
    perf = time.perf_counter_ns
    execute = db.execute
    clock = _Clock(start)
    n = len(hosts)
    n_fields = len(_FIELDS)
    try:
        for i in range(n_ops):
            host = hosts[rng.randrange(n)]
            t0 = perf()
            keys = [host, *(ip_key(a) for a in host_addresses[host])]
            execute("BEGIN IMMEDIATE")
            found = [execute(_SELECT, (key,)).fetchone() for key in keys]
            now = clock()
            for key, row, interval in ((keys[0], found[0], 1.0), (keys[1], found[1], IP_INTERVAL)):
                row = row or (0.0,) * n_fields
                execute(_WRITE, (key, max(row[0], now + interval), *row[1:5], now, *row[6:]))
            execute("COMMIT")
            timings.append((perf() - t0) / 1000.0)
            if checkpoint_aside and i % 1000 == 999:
                other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        other.close()
        db.close()
    timings.sort()
    return timings


def latency_line(label: str, timings: list[float], extra: str = "") -> str:
    return (f"  {label:27} median {statistics.median(timings):7.1f} µs   p99 {percentile(timings, 99):7.1f} µs   "
            f"p99.9 {percentile(timings, 99.9):7.1f} µs{extra}")


def bench_booking(directory: str, n_hosts: int, n_addresses: int, n_ops: int) -> float:
    """Print the booking latencies; the SQLite p99 of the pacer's path (µs)."""
    now = time.time()
    hosts, addresses, host_addresses = table(n_hosts, n_addresses)
    table_rows = rows(hosts, addresses, now)
    print(f"1. booking: {len(hosts):,} hosts over {len(addresses):,} addresses in the table ({len(table_rows):,} "
          f"rows); one booking = booking_update(...) run by update_many([host, ip:...]); {n_ops:,} bookings each")

    states: dict[str, HostState | None] = dict(table_rows)

    def pure(keys, fn):
        new, result = fn({k: states.get(k) for k in keys}, clock())
        states.update(new)
        return result

    clock = _Clock(now)
    timings, _ = book_loop(pure, hosts, host_addresses, n_ops)
    print(latency_line("PacingPolicy.book alone", timings, "   (no store: a dict of states)"))

    memory = MemoryStore(clock=_Clock(now))
    for key, state in table_rows:
        memory.update(key, lambda _s, _now, state=state: (state, None))
    timings, booked = book_loop(memory.update_many, hosts, host_addresses, n_ops)
    print(latency_line("MemoryStore.update_many", timings, f"   ({booked:,} booked now)"))

    path = os.path.join(directory, "booking.sqlite3")
    fill(path, table_rows)
    store = SQLiteStore(path, clock=_Clock(now))
    try:
        timings, booked = book_loop(store.update_many, hosts, host_addresses, n_ops)
    finally:
        store.close()
    print(latency_line("SQLiteStore.update_many", timings, f"   ({booked:,} booked now; its own connection)"))
    path = os.path.join(directory, "booking-raw.sqlite3")
    fill(path, table_rows)
    timings = raw_book_loop(path, hosts, host_addresses, n_ops, now, checkpoint_aside=False)
    print(latency_line("  raw sqlite3, same", timings, "   (its floor: SQLite's autocheckpoint in the transaction)"))

    path = os.path.join(directory, "booking-async.sqlite3")
    fill(path, table_rows)
    from twisted.internet import reactor

    async_store = SQLiteStore(path, clock=_Clock(now)).open_async(reactor)
    try:
        timings, booked, threaded = async_book_loop(async_store, hosts, host_addresses, n_ops)
        wal = os.path.getsize(path + "-wal") / 1e6
    finally:
        async_store.close()
    size = os.path.getsize(path) / 1e6
    p99 = percentile(timings, 99)
    print(latency_line("AsyncStore.update_many", timings,
                       f"   ({booked:,} booked now, {threaded:,} waited > 1 ms (a hold or the thread), "
                       f"WAL {wal:.1f} MB; the pacer's path: one reactor turn, the group commit)"))
    path = os.path.join(directory, "booking-raw-async.sqlite3")
    fill(path, table_rows)
    timings = raw_book_loop(path, hosts, host_addresses, n_ops, now, checkpoint_aside=True)
    print(latency_line("  raw sqlite3, same", timings, "   (its floor: checkpoint aside every 1000)"))
    print(f"  SQLite: WAL, synchronous=NORMAL, {size:.1f} MB file in {directory}; "
          f"target p99 <= 100 µs: {'met' if p99 <= 100 else 'NOT met'} ({p99:.1f} µs)")
    return p99


# --------------------------------------------------------------------------------------------------
# 2. read-modify-write rate: SQLiteStore.update vs raw SQLite
# --------------------------------------------------------------------------------------------------


def ours_rate(path: str, hosts: list[str], n: int) -> float:
    """``SQLiteStore.update`` with ``after_response`` (a 429), updates per second."""
    store = SQLiteStore(path)
    after = POLICY.after_response

    def fn(state: HostState | None, now: float) -> tuple[HostState, None]:
        return after(state, status=429, end=now).state, None

    try:
        update = store.update
        for host in hosts:
            update(host, fn)
        m = len(hosts)
        t0 = time.perf_counter()
        for i in range(n):
            update(hosts[i % m], fn)
        return n / (time.perf_counter() - t0)
    finally:
        store.close()


def raw_rate(path: str, hosts: list[str], n: int) -> float:
    """Raw ``sqlite3``: the same single-row transaction, updates per second."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL").fetchone()
    db.execute("PRAGMA synchronous=NORMAL")
    execute = db.execute
    empty = (0.0,) * len(_FIELDS)

    def update(host: str) -> None:  # one more backoff step: next_allowed, consec, throttled_at, updated
        execute("BEGIN IMMEDIATE")
        row = execute(_SELECT, (host,)).fetchone() or empty
        now = time.time()
        execute(_WRITE, (host, now + 1.0, row[1] + 1, row[2], row[3], now, now, *row[6:]))
        execute("COMMIT")

    try:
        for host in hosts:
            update(host)
        m = len(hosts)
        t0 = time.perf_counter()
        for i in range(n):
            update(hosts[i % m])
        return n / (time.perf_counter() - t0)
    finally:
        db.close()


def bench_rmw(directory: str, n: int, rounds: int, n_hosts: int) -> float:
    """Print both rates (medians of alternating rounds); the ratio ours/raw."""
    hosts = [f"host{i}.bench.example" for i in range(n_hosts)]
    print(f"2. read-modify-write: {n:,} single-row transactions over {n_hosts} hosts per round, {rounds} "
          "alternating rounds, a fresh file each (WAL, synchronous=NORMAL)")
    ours: list[float] = []
    raw: list[float] = []
    for r in range(rounds):
        for kind, sink, fn in (("ours", ours, ours_rate), ("raw", raw, raw_rate)):
            path = os.path.join(directory, f"rmw-{kind}-{r}.sqlite3")
            SQLiteStore(path).close()  # the schema, the same for both
            sink.append(fn(path, hosts, n))
    o, w = statistics.median(ours), statistics.median(raw)
    print(f"  SQLiteStore.update (after_response 429)  {o:9,.0f} updates/s   (rounds: "
          + ", ".join(f"{x:,.0f}" for x in ours) + ")")
    print(f"  raw sqlite3 BEGIN IMMEDIATE/SELECT/      {w:9,.0f} updates/s   (rounds: "
          + ", ".join(f"{x:,.0f}" for x in raw) + ")")
    print("    INSERT OR REPLACE/COMMIT")
    ratio = o / w
    print(f"  ratio ours/raw {ratio:.2f}; target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100_000)
    parser.add_argument("--addresses", type=int, default=10_000)
    parser.add_argument("--bookings", type=int, default=20_000, help="bookings per store (default 20000)")
    parser.add_argument("--updates", type=int, default=20_000, help="updates per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of each rate (default 5)")
    parser.add_argument("--rmw-hosts", type=int, default=5, help="hosts the updates go round (default 5)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"scrapy-polite booking/store bench — Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="polite-bench-") as directory:
        bench_booking(directory, args.hosts, args.addresses, args.bookings)
        bench_rmw(directory, args.updates, args.rounds, args.rmw_hosts)
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
