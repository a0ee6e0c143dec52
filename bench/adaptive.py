"""Benchmark: adaptive pacing (``POLITE_ADAPTIVE``) against Scrapy's AutoThrottle, on a server that slows down
when it is asked too fast.

Usage::

    python bench/adaptive.py [--pages 150] [--rounds 3]

The server (loopback, one host) answers each request after a latency that rises with the rate it is asked for:
``latency = BASE × (1 + (rate / KNEE)²)`` seconds, ``rate`` being its arrivals of the last second; beyond
``CAPACITY`` requests per second it is overloaded and answers ``504`` at once (no Retry-After: a gateway in
front of a saturated backend). ``--pages`` URLs are crawled per crawl, in the same run and in alternating
rounds, two ways, each from a fresh start (a fresh pace table, AutoThrottle's fresh per-process state):

* ``Scrapy + AutoThrottle``: ``AUTOTHROTTLE_ENABLED = True`` (target concurrency 1.0, its default), no add-on;
* ``polite + POLITE_ADAPTIVE``: the add-on with ``POLITE_ADAPTIVE = True`` (``--factor``: 2.0, its default).

Both get the same floor (``DOWNLOAD_DELAY`` = AutoThrottle's smallest delay and its start delay =
``POLITE_HOST_INTERVAL`` = ``--floor``) and Scrapy's ``RetryMiddleware`` (``RETRY_TIMES = 2``, which retries a
504); the add-on has no per-IP pacing (one host). Printed per mode, the medians over the rounds: pages per
second (pages answered 200 / the makespan, first request's start to last response's end), the server's p95
latency (of every answer, and of the 200s alone: a fast 504 lowers the first), the number of 5xx answers,
the moment of the last 5xx (seconds after the crawl's first request) and the pages lost. Target: the add-on's
p95 lower than AutoThrottle's at no lower pages/s, and its 5xx stopping earlier.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from twisted.internet import asyncioreactor  # noqa: E402

asyncioreactor.install()

from twisted.internet import defer, task  # noqa: E402

from tests.support.crawl import ListSpider, polite_settings, run_crawl  # noqa: E402
from tests.support.server import ArrivalServer, Reply, RequestInfo  # noqa: E402

#: Seconds: the server's latency when idle.
BASE = 0.02
#: Requests per second at which the latency has quadrupled.
KNEE = 10.0
#: Requests per second beyond which the server answers 504 (``--capacity``).
CAPACITY = 12.0


class Load:
    """The server's load model: its latency rises with the rate of the last second; overloaded, it answers 504."""

    def __init__(self, capacity: float = CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._arrivals: deque[float] = deque()

    def handler(self, info: RequestInfo, count: int) -> Reply:
        with self._lock:
            now = info.start
            self._arrivals.append(now)
            while self._arrivals and self._arrivals[0] < now - 1.0:
                self._arrivals.popleft()
            rate = float(len(self._arrivals))
        if rate > self.capacity:
            return Reply.text("overloaded", status=504, delay=0.005)
        return Reply.html(f"<p>{info.path}</p>", delay=BASE * (1.0 + (rate / KNEE) ** 2))


def modes(tmp: str, floor: float, round_no: int, factor: float) -> list[tuple[str, dict]]:
    common = {"RETRY_ENABLED": True, "LOG_LEVEL": "WARNING", "CONCURRENT_REQUESTS": 16}
    return [
        ("Scrapy + AutoThrottle", {**common, "AUTOTHROTTLE_ENABLED": True, "DOWNLOAD_DELAY": floor,
                                   "AUTOTHROTTLE_START_DELAY": floor}),
        ("polite + POLITE_ADAPTIVE", {**common, **polite_settings(
            POLITE_HOST_INTERVAL=floor, POLITE_IP_INTERVAL=0, POLITE_ADAPTIVE=True, POLITE_ADAPTIVE_FACTOR=factor,
            POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], POLITE_STORE=f"sqlite:///{tmp}/round{round_no}.sqlite3")}),
    ]


async def one_run(srv: ArrivalServer, settings: dict, args: argparse.Namespace) -> dict[str, float]:
    pages, timeout = args.pages, args.timeout
    srv.clear()
    srv.route("/*", Load(args.capacity).handler)
    urls = [srv.url(f"/p/{i}") for i in range(pages)]
    crawler = await run_crawl(ListSpider, settings, urls=urls, timeout=timeout)
    hits = sorted(srv.arrivals(), key=lambda a: a.start)
    t0 = hits[0].start
    ok = {f.url for f in crawler.spider.fetched if f.status == 200}
    makespan = max(a.end for a in hits) - t0
    latencies = sorted(a.end - a.start for a in hits)
    errors = [a for a in hits if a.status >= 500]
    served = sorted(a.end - a.start for a in hits if a.status == 200) or [0.0]
    return {
        "pages_s": len(ok) / makespan,
        "p95": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "p95_200": served[min(len(served) - 1, int(0.95 * len(served)))],
        "5xx": float(len(errors)),
        "last_5xx": max((a.start - t0 for a in errors), default=0.0),
        "lost": float(len(set(urls) - ok)),
        "makespan": makespan,
    }


async def main(args: argparse.Namespace) -> None:
    tmp = tempfile.mkdtemp(prefix="polite-adaptive-")
    srv = ArrivalServer("127.0.6.10")
    try:
        warm = ArrivalServer("127.0.6.99")
        try:
            await run_crawl(ListSpider, {"LOG_LEVEL": "WARNING"}, urls=[warm.url("/warm")])
        finally:
            warm.stop()
        print(f"adaptive-pacing benchmark: {args.pages} pages of one host, latency {BASE * 1000:.0f} ms × "
              f"(1 + (rate / {KNEE:g}/s)²), 504 beyond {args.capacity:g} requests/s; floor {args.floor:g} s; "
              f"POLITE_ADAPTIVE_FACTOR {args.factor:g}; {args.rounds} alternating rounds, medians")
        results: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds):
            order = modes(tmp, args.floor, r, args.factor)
            if r % 2:
                order.reverse()
            for name, settings in order:
                results.setdefault(name, []).append(await one_run(srv, settings, args))
        header = (f"{'mode':26} {'pages/s':>8} {'p95 latency ms':>14} {'p95 of 200s ms':>14} {'5xx':>6} "
                  f"{'last 5xx at s':>13} {'lost':>5} {'makespan s':>10}")
        print(header)
        print("-" * len(header))
        medians: dict[str, dict[str, float]] = {}
        for name, runs in results.items():
            m = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            medians[name] = m
            print(f"{name:26} {m['pages_s']:8.2f} {m['p95'] * 1000:14.0f} {m['p95_200'] * 1000:14.0f} "
                  f"{m['5xx']:6.0f} {m['last_5xx']:13.2f} {m['lost']:5.0f} {m['makespan']:10.2f}")
        auto, polite = medians["Scrapy + AutoThrottle"], medians["polite + POLITE_ADAPTIVE"]
        print(f"ratios polite / AutoThrottle: pages/s {polite['pages_s'] / auto['pages_s']:.2f}, "
              f"p95 {polite['p95'] / auto['p95']:.2f} (of 200s {polite['p95_200'] / auto['p95_200']:.2f}); "
              f"5xx {polite['5xx']:.0f} vs {auto['5xx']:.0f}, "
              f"last 5xx at {polite['last_5xx']:.2f} s vs {auto['last_5xx']:.2f} s")
        print("target: p95 ratio < 1 at a pages/s ratio >= 1, and the add-on's 5xx stop earlier")
    finally:
        srv.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", type=float, default=0.02, help="both pacers' smallest interval, s (0.02)")
    parser.add_argument("--capacity", type=float, default=CAPACITY,
                        help=f"requests per second beyond which the server answers 504 ({CAPACITY:g})")
    parser.add_argument("--factor", type=float, default=2.0, help="POLITE_ADAPTIVE_FACTOR (its default, 2.0)")
    parser.add_argument("--timeout", type=float, default=300.0)
    task.react(lambda _reactor: defer.ensureDeferred(main(parser.parse_args())))
