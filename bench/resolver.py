"""Benchmark of the address side of scrapy-polite: the resolver and the per-request booking.

Usage::

    python bench/resolver.py [--cache-ops N] [--cold-names N] [--concurrency C]

Figures printed:

1. ``PublicHostnameResolver.resolve()`` from a warm cache (the path of every request after the first
   to a host): resolutions per second, on the reactor thread (a cached answer fires synchronously);
   the names are those resolved cold in 2.
2. ``resolve()`` of cold names against a local DNS server (``tests/support/dns_server.py`` on
   127.0.0.1, A and AAAA per name): resolutions per second one at a time and with C in flight. This
   measures the resolver's own overhead (thread hand-off, dnspython, two queries per name) with a
   nameserver that answers in microseconds; a real recursive resolver adds its network latency.

The booking transaction that follows the resolution (docs/spec.md §3) is measured by ``bench/booking.py``.

Nothing leaves the machine: the DNS server binds 127.0.0.1 and the DNS answers are never connected to.
The defaults run in about 10 s on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package and tests.support importable

from scrapy_polite.resolver import PublicHostnameResolver  # noqa: E402
from tests.support.dns_server import LocalDNSServer  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-ops", type=int, default=200_000)
    parser.add_argument("--cold-names", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"scrapy-polite resolver bench — Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    bench_resolver(args.cold_names, args.concurrency, args.cache_ops)  # it runs (and stops) the reactor
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
