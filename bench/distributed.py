"""Benchmark of the shared pace table: the Redis store beside SQLite, 1, 4 and 8 processes, in one run.

Usage::

    python bench/distributed.py [--seconds 3] [--processes 1,4,8] [--hosts 10000] [--addresses 1000]
                                [--redis redis://127.0.0.1:6379/0] [--cluster [redis+cluster://h:p,h:p]]

Without ``--redis`` it starts its own ``redis-server`` on a free loopback port (persistence off) and stops it
at the end. SQLite is one file in a temporary directory (WAL, ``synchronous=NORMAL``), all processes on it.
Every booking is the downloader middleware's booking transaction (as ``Booker`` runs it: the host's row and
one address's row, in one ``update_many`` whose function is :meth:`PacingPolicy.book
<scrapy_polite.policy.PacingPolicy.book>`).

Figures printed:

1. **bookings per second and booking latency** (p50, p99 in ms), P processes booking as fast as they can for
   ``--seconds``: spread over H hosts on A addresses (little contention), then on 5 hot hosts on 2
   addresses (every process on the same rows: lost races retried). The intervals are 1 µs so that every
   booking writes both rows; ``retries`` is update-function runs beyond one per booking (lost races).
   Target: an uncontended booking takes ≤ 2 round trips; p99 with 8 processes ≤ 5 ms on loopback.
2. **spacing**: P processes book 5 hosts on 3 addresses (three share one) with real intervals (50 ms per
   host, 20 ms per address), each waiting for the moment the table names, as the pacer does; every booking is kept with
   the table's time, and the merged log is checked: two bookings of one host (or one address) closer than
   the interval are violations (target 0).
3. **from the reactor**: one process booking through :class:`~scrapy_polite.stores.AsyncStore` (the
   thread pool the pacer uses for Redis), one at a time and 16 at a time: what a booking costs the crawl.

With ``--cluster`` it measures instead the Redis Cluster (docs/scale.md): bookings per second and latency of
P processes over H hosts on A addresses, for the table in one slot (``layout=table``, the default) and the
sharded table (``layout=sharded``: one hash tag per row, a booking's host and address rows locked and written
slot by slot), on a cluster of 1 master and one of 3 masters that it starts on loopback (``redis-server
--cluster-enabled yes``, persistence off, stopped at the end), or on the cluster whose URL is given.

Nothing leaves the machine. The defaults run in about a minute on two cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from scrapy_polite.policy import Booking, HostState, PacingPolicy, ip_key
from scrapy_polite.stores import PaceStore, SQLiteStore, StoreOptions

#: Every booking writes both rows (a zero interval would book nothing).
TINY = PacingPolicy(host_interval=1e-6, max_backoff=1.0)
TINY_IP = 1e-6

#: Three hosts on one address (the address's budget binds) and two alone on theirs (the host's binds).
SPACING_HOSTS = {"h0.bench": "10.0.0.1", "h1.bench": "10.0.0.1", "h2.bench": "10.0.0.1",
                 "h3.bench": "10.0.0.2", "h4.bench": "10.0.0.3"}
SPACING_HOST_INTERVAL = 0.050
SPACING_IP_INTERVAL = 0.020


def booking_update(policy: PacingPolicy, host: str, addresses: list[str], floor: float, ip_interval: float
                   ) -> tuple[list[str], Any]:
    """The booking transaction of one request, as the pacer's ``Booker`` runs it: the keys (the host's row,
    then each address's) and the update function (:meth:`PacingPolicy.book`), whose result is
    ``(booking, the store's now)``."""
    keys = {a: ip_key(a) for a in addresses}

    def fn(states: dict[str, HostState | None], now: float) -> tuple[dict[str, HostState], tuple[Booking, float]]:
        booking = policy.book(states[host], {a: states[k] for a, k in keys.items()}, now=now, floor=floor,
                              ip_interval=ip_interval)
        return {(host if a == "" else keys[a]): state for a, state in booking.writes.items()}, (booking, now)

    return [host, *keys.values()], fn


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values))) - 1))
    return sorted_values[rank]


def open_store(kind: str, where: str, prefix: str) -> PaceStore:
    if kind == "redis":
        from scrapy_polite.stores.redis import RedisStore

        return RedisStore(where, StoreOptions(prefix=prefix, expire=60.0))  # bench rows do not linger
    return SQLiteStore(where)


# --------------------------------------------------------------------------------------------------
# Workers (one process each)
# --------------------------------------------------------------------------------------------------


def rate_worker(kind: str, where: str, prefix: str, seconds: float, hosts: int, addresses: int, seed: int,
                barrier: Any, out: Any) -> None:
    store = open_store(kind, where, prefix)
    rng = random.Random(seed)
    runs = [0]
    latencies: list[float] = []
    try:
        barrier.wait()
        deadline = time.perf_counter() + seconds
        while True:
            i = rng.randrange(hosts)
            keys, book = booking_update(TINY, f"h{i}.bench", [f"10.{(i % addresses) // 256}.0.{(i % addresses) % 256}"],
                                        0.0, TINY_IP)

            def counted(states: Any, now: float, book: Any = book) -> Any:
                runs[0] += 1
                return book(states, now)

            start = time.perf_counter()
            booking, _now = store.update_many(keys, counted)
            end = time.perf_counter()
            assert booking.booked
            latencies.append(end - start)
            if end >= deadline:
                break
    finally:
        store.close()
    out.put((latencies, runs[0] - len(latencies)))


def spacing_worker(kind: str, where: str, prefix: str, seconds: float, index: int, barrier: Any,
                   out: Any) -> None:
    store = open_store(kind, where, prefix)
    policy = PacingPolicy(host_interval=SPACING_HOST_INTERVAL, max_backoff=1.0)
    hosts = list(SPACING_HOSTS)
    booked: list[tuple[str, str, float]] = []
    try:
        barrier.wait()
        deadline = time.monotonic() + seconds
        turn = index
        while time.monotonic() < deadline:
            host = hosts[turn % len(hosts)]
            address = SPACING_HOSTS[host]
            keys, book = booking_update(policy, host, [address], 0.0, SPACING_IP_INTERVAL)
            booking, now = store.update_many(keys, book)
            if booking.booked:
                booked.append((host, address, now))
                turn += 1
            else:  # wait for the moment the table names (the pacer's wait in line), then try again
                time.sleep(min(max(booking.start - now, 0.0), 0.05))
    finally:
        store.close()
    out.put(booked)


def run_workers(target: Any, args_for: Any, processes: int) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args_for(p), barrier, out)) for p in range(processes)]
    for w in workers:
        w.start()
    results = [out.get(timeout=300) for _ in workers]
    for w in workers:
        w.join(60)
        if w.exitcode != 0:
            raise SystemExit(f"a worker failed (exit code {w.exitcode})")
    return results


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


def rate(kind: str, where: str, processes: int, seconds: float, hosts: int, addresses: int) -> dict[str, float]:
    prefix = f"bench:{kind}:{processes}:{hosts}:{time.time_ns()}:"
    results = run_workers(rate_worker, lambda p: (kind, where, prefix, seconds, hosts, addresses, p), processes)
    latencies = sorted(x for lat, _ in results for x in lat)
    retries = sum(r for _, r in results)
    total_seconds = max(sum(lat) for lat, _ in results)
    return {"bookings": len(latencies), "per_second": len(latencies) / total_seconds,
            "p50": percentile(latencies, 50) * 1e3, "p99": percentile(latencies, 99) * 1e3,
            "retries": retries / max(1, len(latencies))}


def spacing(kind: str, where: str, processes: int, seconds: float) -> dict[str, Any]:
    prefix = f"bench:spacing:{kind}:{processes}:{time.time_ns()}:"
    results = run_workers(spacing_worker, lambda p: (kind, where, prefix, seconds, p), processes)
    bookings = [b for r in results for b in r]
    violations = 0
    closest = {"host": float("inf"), "ip": float("inf")}
    for what, interval, key in (("host", SPACING_HOST_INTERVAL, 0), ("ip", SPACING_IP_INTERVAL, 1)):
        groups: dict[str, list[float]] = {}
        for b in bookings:
            groups.setdefault(b[key], []).append(b[2])
        for times in groups.values():
            times.sort()
            for a, b in zip(times, times[1:]):
                closest[what] = min(closest[what], b - a)
                if b - a < interval - 1e-6:
                    violations += 1
    return {"bookings": len(bookings), "violations": violations, "closest_host": closest["host"] * 1e3,
            "closest_ip": closest["ip"] * 1e3}


def from_reactor(where: str, bookings: int, hosts: int) -> dict[str, float]:
    """Bookings through Redis's async table (AsyncRedisStore, as the pacer opens it) awaited on a running reactor:
    one at a time, 16 at a time."""
    from twisted.internet import defer, task

    from scrapy_polite.stores.redis import RedisStore

    figures: dict[str, float] = {}

    async def main(reactor: Any) -> None:
        backend = RedisStore(where, StoreOptions(prefix=f"bench:reactor:{time.time_ns()}:"))
        store = backend.open_async(reactor)
        rng = random.Random(7)

        async def one() -> float:
            i = rng.randrange(hosts)
            keys, book = booking_update(TINY, f"h{i}.bench", [f"10.1.{i % 250}.1"], 0.0, TINY_IP)
            start = time.perf_counter()
            await store.update_many(keys, book)
            return time.perf_counter() - start

        try:
            for _ in range(200):  # warm up the pool's threads and connections
                await one()
            serial = sorted([await one() for _ in range(bookings)])
            figures["serial_p50"], figures["serial_p99"] = percentile(serial, 50) * 1e3, percentile(serial, 99) * 1e3
            started = time.perf_counter()
            concurrent: list[float] = []
            for _ in range(bookings // 16):
                concurrent += await defer.gatherResults([defer.Deferred.fromCoroutine(one()) for _ in range(16)])
            elapsed = time.perf_counter() - started
            concurrent.sort()
            figures["concurrent_per_second"] = len(concurrent) / elapsed
            figures["concurrent_p50"] = percentile(concurrent, 50) * 1e3
            figures["concurrent_p99"] = percentile(concurrent, 99) * 1e3
        finally:
            store.close()

    def run(reactor: Any) -> Any:
        return defer.Deferred.fromCoroutine(main(reactor))

    try:
        task.react(run)
    except SystemExit as exit_:
        if exit_.code:
            raise
    return figures


# --------------------------------------------------------------------------------------------------
# A local redis-server
# --------------------------------------------------------------------------------------------------


class LocalRedis:
    """``redis-server`` on a free loopback port, persistence off, stopped by :meth:`stop`."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(binary):
            raise SystemExit("no redis-server: apt-get install -y redis-server, or pass --redis URL")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.directory = tempfile.mkdtemp(prefix="polite-bench-redis-")
        self.process = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", self.directory],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise SystemExit("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def with_layout(url: str, layout: str) -> str:
    """``url`` with the store option ``layout=`` (docs/scale.md)."""
    return f"{url}{'&' if '?' in url else '?'}layout={layout}"


class ServerTime:
    """The scripts' time on each primary of a cluster (``INFO commandstats``: ``evalsha`` and ``eval`` calls and
    µs), between :meth:`reset` and :meth:`read`: what a booking costs the servers, whatever the clients cost."""

    def __init__(self, url: str) -> None:
        import redis
        from redis.cluster import RedisCluster

        first = url.split("://", 1)[1].split("?", 1)[0].split(",")[0].rpartition("@")[2]
        host, _, port = first.rpartition(":")
        cluster = RedisCluster(host=host, port=int(port))
        try:
            self.nodes = [redis.Redis(host=n.host, port=n.port) for n in cluster.get_primaries()]
        finally:
            cluster.close()

    def reset(self) -> None:
        for node in self.nodes:
            node.config_resetstat()

    def read(self) -> list[float]:
        """Seconds of script time on each primary since :meth:`reset`."""
        out = []
        for node in self.nodes:
            stats = node.info("commandstats")
            out.append(sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval")) / 1e6)
        return out

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def cluster_rates(urls: list[tuple[str, str]], counts: list[int], seconds: float, hosts: int, addresses: int,
                  rounds: int) -> None:
    """Figure 1 on each cluster of ``urls`` (``(label, url)``), for both layouts, ``rounds`` alternating rounds
    (the median by bookings/s printed). ``srv µs`` is the scripts' time on all primaries per booking;
    ``busiest``: the share of it on the busiest primary; ``capacity``: the bookings per second at which that
    primary's scripts would fill one core (1 s / its µs per booking): what the cluster serves once the
    servers, not these clients, are the limit."""
    print(f"1. bookings on a Redis Cluster, {hosts} hosts on {addresses} addresses (median of {rounds} rounds):")
    print(f"   {'cluster':<10} {'layout':<8} {'processes':>9} {'bookings/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'retries':>8} {'srv µs':>7} {'busiest':>8} {'capacity/s':>11}")
    timers = {url: ServerTime(url) for _, url in urls}
    try:
        for p in counts:
            for label, url in urls:
                for layout in ("table", "sharded"):
                    runs = []
                    for _ in range(rounds):
                        timers[url].reset()
                        r = rate("redis", with_layout(url, layout), p, seconds, hosts, addresses)
                        spent = timers[url].read()
                        r["server_us"] = sum(spent) / r["bookings"] * 1e6
                        r["busiest"] = max(spent) / max(sum(spent), 1e-9)
                        r["capacity"] = r["bookings"] / max(max(spent), 1e-9)
                        runs.append(r)
                    pick = sorted(runs, key=lambda r: r["per_second"])[len(runs) // 2]
                    print(f"   {label:<10} {layout:<8} {p:>9} {pick['per_second']:>11.0f} {pick['p50']:>8.3f} "
                          f"{pick['p99']:>8.3f} {pick['retries']:>8.3f} {pick['server_us']:>7.1f} "
                          f"{pick['busiest']:>8.0%} {pick['capacity']:>11.0f}", flush=True)
    finally:
        for timer in timers.values():
            timer.close()
    print()


def cluster_main(args: argparse.Namespace, counts: list[int]) -> None:
    started: list[Any] = []
    try:
        if args.cluster != "local":
            urls = [("given", args.cluster)]
        else:
            from tests.support.redis_cluster import LocalCluster

            urls = []
            for masters in (1, 3):
                local = LocalCluster(nodes=masters)
                started.append(local)
                local.start()
                urls.append((f"{masters} master{'s' if masters > 1 else ''}", local.url))
        print(f"clusters: {', '.join(f'{label}: {url}' for label, url in urls)}; {os.cpu_count()} cores; "
              f"{args.seconds:g} s per run\n")
        cluster_rates(urls, counts, args.seconds, args.hosts, args.addresses, args.rounds)
        print("2. spacing on the sharded table, 5 hosts on 3 addresses:")
        print(f"   {'cluster':<10} {'processes':>9} {'bookings':>9} {'violations':>10} {'closest host':>13} "
              f"{'closest ip':>11}")
        for label, url in urls:
            for p in counts:
                r = spacing("redis", with_layout(url, "sharded"), p, args.seconds)
                print(f"   {label:<10} {p:>9} {r['bookings']:>9} {r['violations']:>10} {r['closest_host']:>10.3f} ms "
                      f"{r['closest_ip']:>8.3f} ms", flush=True)
    finally:
        for local in started:
            local.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--processes", default="1,4,8", help="process counts, comma-separated")
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--addresses", type=int, default=1000)
    parser.add_argument("--redis", default=None, help="a Redis URL (default: start a local redis-server)")
    parser.add_argument("--cluster", nargs="?", const="local", default=None,
                        help="measure a Redis Cluster instead (a redis+cluster:// URL; default: start a cluster "
                             "of 1 master and one of 3 on loopback)")
    parser.add_argument("--rounds", type=int, default=3, help="--cluster: alternating rounds per figure")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]
    if args.cluster is not None:
        cluster_main(args, counts)
        return

    local = None if args.redis else LocalRedis()
    redis_url = args.redis or (local.url if local else "")
    directory = tempfile.mkdtemp(prefix="polite-bench-")
    sqlite_path = os.path.join(directory, "pace.sqlite3")
    SQLiteStore(sqlite_path).close()
    try:
        print(f"redis: {redis_url}; sqlite: {sqlite_path}; {os.cpu_count()} cores; {args.seconds:g} s per run\n")
        for title, hosts, addresses in ((f"{args.hosts} hosts on {args.addresses} addresses", args.hosts,
                                         args.addresses), ("5 hot hosts on 2 addresses", 5, 2)):
            print(f"1. bookings, {title}:")
            print(f"   {'store':<7} {'processes':>9} {'bookings/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'retries':>8}")
            for kind, where in (("redis", redis_url), ("sqlite", sqlite_path)):
                for p in counts:
                    r = rate(kind, where, p, args.seconds, hosts, addresses)
                    print(f"   {kind:<7} {p:>9} {r['per_second']:>11.0f} {r['p50']:>8.3f} {r['p99']:>8.3f} "
                          f"{r['retries']:>8.3f}", flush=True)
            print()
        print(f"2. spacing: 5 hosts on 3 addresses, {SPACING_HOST_INTERVAL * 1e3:g} ms per host, "
              f"{SPACING_IP_INTERVAL * 1e3:g} ms per address:")
        print(f"   {'store':<7} {'processes':>9} {'bookings':>9} {'violations':>10} {'closest host':>13} "
              f"{'closest ip':>11}")
        for kind, where in (("redis", redis_url), ("sqlite", sqlite_path)):
            for p in counts:
                r = spacing(kind, where, p, args.seconds)
                print(f"   {kind:<7} {p:>9} {r['bookings']:>9} {r['violations']:>10} {r['closest_host']:>10.3f} ms "
                      f"{r['closest_ip']:>8.3f} ms", flush=True)
        print()
        f = from_reactor(redis_url, 3000, args.hosts)
        print("3. from the reactor, AsyncStore over Redis (1 process):")
        print(f"   one at a time: p50 {f['serial_p50']:.3f} ms, p99 {f['serial_p99']:.3f} ms")
        print(f"   16 at a time:  {f['concurrent_per_second']:.0f} bookings/s, p50 {f['concurrent_p50']:.3f} ms, "
              f"p99 {f['concurrent_p99']:.3f} ms")
    finally:
        if local is not None:
            local.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
