"""Benchmark of the address side of scrapy-polite: the resolver and the per-request booking.

Usage::

    python bench/resolver.py [--cache-ops N] [--cold-names N] [--concurrency C]
                             [--hosts H] [--addresses A] [--bookings B] [--sqlite-bookings S]

Figures printed:

1. ``PublicHostnameResolver.resolve()`` from a warm cache (the path of every request after the first
   to a host): resolutions per second, on the reactor thread (a cached answer fires synchronously);
   the names are those resolved cold in 2.
2. ``resolve()`` of cold names against a local DNS server (``tests/support/dns_server.py`` on
   127.0.0.1, A and AAAA per name): resolutions per second one at a time and with C in flight. This
   measures the resolver's own overhead (thread hand-off, dnspython, two queries per name) with a
   nameserver that answers in microseconds; a real recursive resolver adds its network latency.
3. The downloader middleware's booking transaction (docs/spec.md §3): ``pacer._book(...)`` run by
   ``store.update_many([host, ip:addr...], ...)``, with H hosts over A addresses already in the table
   (each host on 1 or 2 addresses), for ``MemoryStore`` and ``SQLiteStore`` (a temporary file):
   median and p99 in microseconds per booking, plus the pure ``_book`` step alone.

Nothing leaves the machine: the DNS server binds 127.0.0.1 and the DNS answers are never connected to.
The defaults run in about 20 s on two cores.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package and tests.support importable

from scrapy_polite.pacer import _book, _ip_key  # noqa: E402
from scrapy_polite.policy import HostState, PacingPolicy  # noqa: E402
from scrapy_polite.resolver import PublicHostnameResolver  # noqa: E402
from scrapy_polite.stores import MemoryStore, SQLiteStore  # noqa: E402
from tests.support.dns_server import LocalDNSServer  # noqa: E402

POLICY = PacingPolicy(host_interval=1.0)
IP_INTERVAL = 2.0


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(q / 100 * (len(sorted_values) - 1)))))
    return sorted_values[index]


# --------------------------------------------------------------------------------------------------
# 1–2. cold names against the local DNS server, then the same names from the cache
# --------------------------------------------------------------------------------------------------


def _octets(i: int) -> tuple[int, int]:
    return i // 250 % 250, i % 250 + 1


def bench_resolver(n_names: int, concurrency: int, cache_ops: int) -> None:
    from twisted.internet import defer, reactor

    records = {}
    for i in range(2 * n_names):
        records[f"c{i}.cold.bench"] = [("8.8.{}.{}".format(*_octets(i)), 300), ("2606:4700::1111", 300)]
    server = LocalDNSServer(records)
    outcome: dict[str, float] = {}

    async def run() -> None:
        resolver = PublicHostnameResolver(reactor, nameservers=[server.nameserver], timeout=5.0)
        # warm up the thread pool and dnspython's imports
        await resolver.resolve("c0.cold.bench")
        names = [f"c{i}.cold.bench" for i in range(1, n_names)]
        t0 = time.perf_counter()
        for name in names:
            await resolver.resolve(name)
        outcome["sequential"] = len(names) / (time.perf_counter() - t0)

        names = [f"c{i}.cold.bench" for i in range(n_names, 2 * n_names)]
        queue = list(reversed(names))

        async def worker() -> None:
            while queue:
                await resolver.resolve(queue.pop())

        t0 = time.perf_counter()
        await defer.gatherResults([defer.Deferred.fromCoroutine(worker()) for _ in range(concurrency)])
        outcome["concurrent"] = len(names) / (time.perf_counter() - t0)
        outcome["lookups"] = resolver.counts["lookups"]

        # The same names again: fresh cache entries (TTL 300 s), answered synchronously.
        results: list[object] = []
        sink = results.append
        t0 = time.perf_counter()
        for i in range(cache_ops):
            resolver.resolve(names[i % len(names)]).addCallback(sink)
        outcome["cache"] = cache_ops / (time.perf_counter() - t0)
        assert len(results) == cache_ops and resolver.counts["lookups"] == outcome["lookups"]
        assert results[0] == ["8.8.{}.{}".format(*_octets(n_names)), "2606:4700::1111"], results[0]

    def main() -> None:
        d = defer.Deferred.fromCoroutine(run())
        d.addErrback(lambda f: (outcome.setdefault("error", 1), print(f.getTraceback(), file=sys.stderr)))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(main)
    reactor.run(installSignalHandlers=False)
    server.stop()
    if "error" in outcome:
        raise SystemExit("cold-name benchmark failed")
    pool = reactor.getThreadPool().max
    print(f"resolve() from cache:        {outcome['cache']:12,.0f} resolutions/s "
          f"({1e6 / outcome['cache']:.2f} µs each; {cache_ops:,} resolutions over {n_names:,} names)")
    print(f"resolve() cold, 1 in flight: {outcome['sequential']:12,.0f} resolutions/s "
          f"(A + AAAA each, local DNS server on 127.0.0.1)")
    print(f"resolve() cold, {concurrency} in flight:{outcome['concurrent']:11,.0f} resolutions/s "
          f"(reactor thread pool: {pool} threads; {int(outcome['lookups']):,} lookups, "
          f"{server.total():,} queries)")


# --------------------------------------------------------------------------------------------------
# 3. booking
# --------------------------------------------------------------------------------------------------


def _table(n_hosts: int, n_addresses: int, now: float) -> tuple[list[str], list[str], dict[str, list[str]]]:
    rng = random.Random(42)
    addresses = sorted(f"{(i >> 16) % 200 + 20}.{(i >> 8) & 255}.{i & 255}.{rng.randrange(1, 254)}"
                       for i in range(n_addresses))
    addresses = sorted(set(addresses))
    hosts = [f"host{i}.bench.example" for i in range(n_hosts)]
    host_addresses = {}
    for host in hosts:
        k = 1 if rng.random() < 0.7 else 2
        host_addresses[host] = sorted(rng.sample(addresses, k))
    return hosts, addresses, host_addresses


def _rows(hosts: list[str], addresses: list[str], now: float) -> list[tuple[str, HostState]]:
    rng = random.Random(7)
    rows = []
    for host in hosts:  # every host and address already booked once, some time ago
        rows.append((host, HostState(next_allowed=now - rng.uniform(0, 60), ok_seen=True, updated=now - 60)))
    for address in addresses:
        rows.append((_ip_key(address), HostState(next_allowed=now - rng.uniform(0, 60), updated=now - 60)))
    return rows


def _book_loop(store, hosts, host_addresses, n_ops: int, start: float) -> tuple[list[float], int]:
    rng = random.Random(1)
    timings: list[float] = []
    booked = 0
    now = start
    perf = time.perf_counter_ns
    for _ in range(n_ops):
        host = hosts[rng.randrange(len(hosts))]
        free = host_addresses[host]
        now += 0.01  # the crawl's clock moves on (100 bookings per simulated second)
        keys = [host] + [_ip_key(a) for a in free]
        t0 = perf()
        booking = store.update_many(keys, _book(POLICY, host, free, now, 1.0, IP_INTERVAL))
        timings.append((perf() - t0) / 1000.0)
        booked += booking.booked
    timings.sort()
    return timings, booked


def bench_booking(n_hosts: int, n_addresses: int, n_ops: int, n_sqlite_ops: int) -> None:
    now = time.time()
    hosts, addresses, host_addresses = _table(n_hosts, n_addresses, now)
    rows = _rows(hosts, addresses, now)
    print(f"booking: {len(hosts):,} hosts over {len(addresses):,} addresses in the table "
          f"({len(rows):,} rows); one booking = _book(...) in store.update_many([host, ip:...])")

    # the pure step: _book's function on a dict of states
    states = dict(rows)
    rng = random.Random(3)
    perf = time.perf_counter_ns
    pure: list[float] = []
    t = now
    for _ in range(n_ops):
        host = hosts[rng.randrange(len(hosts))]
        free = host_addresses[host]
        t += 0.01
        keys = [host] + [_ip_key(a) for a in free]
        t0 = perf()
        new, _ = _book(POLICY, host, free, t, 1.0, IP_INTERVAL)({k: states.get(k) for k in keys})
        pure.append((perf() - t0) / 1000.0)
        states.update(new)
    pure.sort()
    print(f"  _book step alone:          median {statistics.median(pure):7.2f} µs   "
          f"p99 {_percentile(pure, 99):7.2f} µs   ({n_ops:,} bookings)")

    memory = MemoryStore()
    for key, state in rows:
        memory.update(key, lambda _s, state=state: (state, None))
    timings, booked = _book_loop(memory, hosts, host_addresses, n_ops, now)
    print(f"  MemoryStore.update_many:   median {statistics.median(timings):7.2f} µs   "
          f"p99 {_percentile(timings, 99):7.2f} µs   ({n_ops:,} bookings, {booked:,} booked now)")

    with tempfile.TemporaryDirectory(prefix="polite-bench-") as tmp:
        path = os.path.join(tmp, "pace.sqlite3")
        SQLiteStore(path).close()  # creates the schema
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO hosts (host, next_allowed, consec, crawl_delay, ok_seen, throttled_at, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(k, s.next_allowed, s.consec, s.crawl_delay, int(s.ok_seen), s.throttled_at, s.updated)
             for k, s in rows])
        db.execute("COMMIT")
        db.close()
        store = SQLiteStore(path)
        try:
            timings, booked = _book_loop(store, hosts, host_addresses, n_sqlite_ops, now)
        finally:
            store.close()
        size = os.path.getsize(path) / 1e6
    print(f"  SQLiteStore.update_many:   median {statistics.median(timings):7.2f} µs   "
          f"p99 {_percentile(timings, 99):7.2f} µs   ({n_sqlite_ops:,} bookings, {booked:,} booked now; "
          f"WAL, synchronous=NORMAL, {size:.1f} MB file in {tempfile.gettempdir()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-ops", type=int, default=200_000)
    parser.add_argument("--cold-names", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--hosts", type=int, default=100_000)
    parser.add_argument("--addresses", type=int, default=10_000)
    parser.add_argument("--bookings", type=int, default=100_000)
    parser.add_argument("--sqlite-bookings", type=int, default=20_000)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"scrapy-polite resolver/booking bench — Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    bench_booking(args.hosts, args.addresses, args.bookings, args.sqlite_bookings)
    bench_resolver(args.cold_names, args.concurrency, args.cache_ops)  # last: it runs (and stops) the reactor
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
