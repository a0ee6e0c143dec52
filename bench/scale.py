"""Benchmark: the SQLite pace table at 1,000,000 hosts.

Usage::

    python bench/scale.py [--hosts 1000000] [--stale 0.1] [--bookings 20000] [--pages 50]

A table of ``--hosts`` host rows is written through the store's own API (``SQLiteStore.update_many``, 10,000
rows a transaction), ``--stale`` of them last updated 31-60 days ago, the others within the last 30 days
(``POLITE_STORE_EXPIRE`` is 30 days), then measured beside a table of 1,000 rows built the same way:

* **file size**: the database file after a WAL checkpoint, and bytes per row (the 10,000 ``ip:`` rows
  included);
* **booking**: ``--bookings`` booking transactions as the downloader middleware runs them
  (:func:`scrapy_polite.crawl.booking.booking_update` on ``update_many``, the host's row and one of 10,000
  ``ip:`` rows, :meth:`PacingPolicy.book <scrapy_polite.policy.PacingPolicy.book>` inside), each on a host
  picked at random from the table, on the no-wait connection the crawl uses inline (``SQLiteStore.nowait``):
  median and p99 in microseconds;
* **expiry**: ``SQLiteStore.expire`` as a crawl runs it when it opens the table (rows idle longer than
  ``POLITE_STORE_EXPIRE``): the first run, which removes the stale rows, and a second one with none left;
* **crawl process**: a real crawl (``scrapy_polite`` add-on, ``--pages`` pages on each of 4 loopback hosts) in
  a fresh process on a copy of the table: its peak RSS (``ru_maxrss``), the time from its start to its first
  request and its whole run time, beside the same crawl on the small table. The crawl opens the table and
  expires it itself, as every crawl does.

Nothing leaves the machine. The defaults take about 3 minutes and 250 MB of disk on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from scrapy_polite.crawl.booking import booking_update  # noqa: E402
from scrapy_polite.policy import HostState, PacingPolicy  # noqa: E402
from scrapy_polite.stores import SQLiteStore  # noqa: E402

DAY = 24 * 3600.0
EXPIRE = 30 * DAY
POLICY = PacingPolicy(host_interval=1.0)
ADDRESSES = [f"10.{i // 250 % 250}.{i % 250}.1" for i in range(10_000)]


def host_name(i: int) -> str:
    return f"h{i}.scale.example"


def fill(path: str, n: int, stale: float, now: float, rng: random.Random) -> float:
    """Write ``n`` host rows (a fraction ``stale`` idle 31-60 days, the others 0-30 days) plus the ``ip:``
    rows of :data:`ADDRESSES`; the seconds it took."""
    store = SQLiteStore(path)
    started = time.perf_counter()
    batch = 10_000

    for first in range(0, n, batch):
        keys = [host_name(i) for i in range(first, min(n, first + batch))]
        rows = {}
        for key in keys:
            age = rng.uniform(31, 60) * DAY if rng.random() < stale else rng.uniform(0, 29) * DAY
            rows[key] = HostState(next_allowed=now - age + 1.0, consec=rng.choice([0, 0, 0, 1, 2]),
                                  crawl_delay=rng.choice([0.0, 0.0, 5.0]), ok_seen=True, updated=now - age)

        def write(states: dict[str, HostState | None], _now: float, rows: dict[str, HostState] = rows
                  ) -> tuple[dict[str, HostState], None]:
            return rows, None

        store.update_many(keys, write)

    def write_ips(states: dict[str, HostState | None], _now: float) -> tuple[dict[str, HostState], None]:
        return {f"ip:{a}": HostState(next_allowed=now - 1, updated=now) for a in ADDRESSES}, None

    store.update_many([f"ip:{a}" for a in ADDRESSES], write_ips)
    store.checkpoint()
    store.close()
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bookings(path: str, n_hosts: int, n: int, rng: random.Random) -> list[float]:
    """Latencies (µs) of ``n`` booking transactions on random hosts, on the crawl's no-wait connection."""
    owner = SQLiteStore(path)
    store = owner.nowait()
    timings = []
    for i in range(n):
        host = host_name(rng.randrange(n_hosts))
        keys, fn = booking_update(POLICY, host, [rng.choice(ADDRESSES)], 0.0, 2.0)
        t = time.perf_counter()
        store.update_many(keys, fn)
        timings.append((time.perf_counter() - t) * 1e6)
        if i % 1500 == 1499:
            owner.checkpoint()  # as the crawl's store thread does (about every 1500 writes on a large table)
    store.close()
    owner.close()
    return timings


def expiry(path: str, now: float) -> list[tuple[int, float]]:
    """Two expiry runs as a crawl does at open: (rows removed, seconds) each."""
    store = SQLiteStore(path)
    runs = []
    for _ in range(2):
        t = time.perf_counter()
        removed = store.expire(now - EXPIRE)
        runs.append((removed, time.perf_counter() - t))
    store.close()
    return runs


def crawl(path: str, pages: int) -> dict[str, float]:
    """A real crawl on a copy of the table at ``path``, in a fresh process: peak RSS (MB), seconds to its
    first request and seconds in all."""
    from tests.support.server import ArrivalServer, page

    copy = path + ".crawl"
    shutil.copyfile(path, copy)
    servers = [ArrivalServer(f"127.0.8.{i}") for i in range(1, 5)]
    for srv in servers:
        srv.route("/*", page())
    urls = [srv.url(f"/p/{i}") for srv in servers for i in range(pages)]
    started = time.time()
    proc = subprocess.Popen([sys.executable, __file__, "--child", f"sqlite:///{copy}", json.dumps(urls)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    err = proc.stderr.read().decode() if proc.stderr else ""
    if status != 0:
        raise SystemExit(f"the crawl failed:\n{err[-3000:]}")
    arrivals = sorted(a.start for srv in servers for a in srv.arrivals())
    for srv in servers:
        srv.stop()
    os.remove(copy)
    if len(arrivals) != len(urls):
        raise SystemExit(f"the crawl fetched {len(arrivals)} of {len(urls)} pages:\n{err[-3000:]}")
    return {"rss_mb": usage.ru_maxrss / 1024, "first_request_s": arrivals[0] - started, "total_s": ended - started}


def child(store_uri: str, urls_json: str) -> None:
    """The crawl process of :func:`crawl`."""
    from scrapy.crawler import CrawlerProcess

    from tests.support.crawl import TEST_SETTINGS, ListSpider, polite_settings

    settings = {**TEST_SETTINGS, **polite_settings(POLITE_STORE=store_uri, POLITE_HOST_INTERVAL=0.05,
                                                   POLITE_IP_INTERVAL=0), "LOG_LEVEL": "WARNING"}
    process = CrawlerProcess(settings)
    process.crawl(ListSpider, urls=json.loads(urls_json))
    process.start()


@dataclass
class Result:
    rows: int
    fill_s: float
    size: int
    p50: float
    p99: float
    expiry: list[tuple[int, float]]
    crawl: dict[str, float]


def measure(directory: str, n: int, args: argparse.Namespace, now: float) -> Result:
    rng = random.Random(n)
    path = os.path.join(directory, f"pace-{n}.sqlite3")
    fill_s = fill(path, n, args.stale, now, rng)
    size = os.path.getsize(path)
    crawled = crawl(path, args.pages)
    expired = expiry(path, now)
    timings = bookings(path, n, args.bookings, rng)
    os.remove(path)
    return Result(rows=n, fill_s=fill_s, size=size, p50=statistics.median(timings), p99=percentile(timings, 0.99),
                  expiry=expired, crawl=crawled)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=1_000_000)
    parser.add_argument("--stale", type=float, default=0.1, help="fraction of rows idle beyond 30 days")
    parser.add_argument("--bookings", type=int, default=20_000)
    parser.add_argument("--pages", type=int, default=50, help="pages per loopback host in the crawl")
    args = parser.parse_args()
    now = time.time()
    directory = tempfile.mkdtemp(prefix="polite-scale-")
    try:
        results = [measure(directory, 1_000, args, now), measure(directory, args.hosts, args, now)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"SQLite pace table, {args.hosts:,} hosts vs 1,000 ({args.stale:.0%} idle beyond POLITE_STORE_EXPIRE)")
    for r in results:
        crawled = r.crawl
        (removed, first), (_, second) = r.expiry
        print(f"\n{r.rows:>9,} rows  (written in {r.fill_s:.1f} s)")
        total = r.rows + len(ADDRESSES)
        print(f"  file size        {r.size / 1e6:8.1f} MB  ({r.size / total:.0f} B per row, with the "
              f"{len(ADDRESSES):,} ip: rows)")
        print(f"  booking          p50 {r.p50:6.1f} µs   p99 {r.p99:6.1f} µs   ({args.bookings:,} bookings, "
              "random hosts)")
        print(f"  expiry           {first:6.2f} s removing {removed:,} rows;  {second:6.3f} s with none to remove")
        print(f"  crawl process    peak RSS {crawled['rss_mb']:6.1f} MB;  first request after "
              f"{crawled['first_request_s']:.2f} s;  {4 * args.pages} pages in {crawled['total_s']:.1f} s")


if __name__ == "__main__":
    main()
