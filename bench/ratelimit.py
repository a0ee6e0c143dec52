"""Benchmark: a crawl of a server that enforces a quota and announces it in rate-limit header fields.

Usage::

    python bench/ratelimit.py [--pages 200] [--quota 20] [--window 2] [--crawlers 4]

The server (loopback, :class:`tests.support.quota.Quota`) allows ``--quota`` requests per ``--window`` seconds
(a token bucket: a burst of ``--quota``, then ``quota / window`` per second) and answers ``429`` +
``Retry-After`` beyond it. ``--pages`` URLs are crawled, in one run, four ways:

* ``plain Scrapy``: no add-on, Scrapy's defaults (``CONCURRENT_REQUESTS_PER_DOMAIN=8``, no delay,
  ``RetryMiddleware`` with ``RETRY_TIMES=2``);
* ``polite, headers ignored``: the add-on with ``POLITE_RATELIMIT_HEADERS = False``;
* ``polite, RateLimit-Policy``: the add-on reading ``RateLimit-Policy: "default";q=Q;w=W`` and ``RateLimit``;
* ``polite, X-RateLimit-*``: the add-on reading ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (no window
  announced; the server counts fixed windows, GitHub's kind);
* ``polite, X-RateLimit-*, N crawlers``: the same, the pages dealt out among ``--crawlers`` crawls at once on one
  SQLite table (as that many processes would share it): requests of one crawler are booked while another's
  are in flight, so the quota is kept by counting it in the shared row (docs/spec.md §2, "Quota booking").

The add-on runs with ``POLITE_HOST_INTERVAL=0.02`` and no per-IP pacing, so only the quota can slow it down.
Printed for each: the 429s received, the pages lost (URLs whose page never reached the spider as a 200), the
makespan (first request's start to last response's end) and its ratio to the quota-bound ideal,
``pages × window / quota``. Targets for the add-on reading the headers: 0 429s, 0 pages lost, ratio ≤ 1.1.
Runs in about a minute and a half with the defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from twisted.internet import asyncioreactor  # noqa: E402

asyncioreactor.install()

from twisted.internet import defer, task  # noqa: E402

from tests.support.crawl import ListSpider, polite_settings, run_crawl  # noqa: E402
from tests.support.quota import Quota  # noqa: E402
from tests.support.server import ArrivalServer  # noqa: E402

BASE = "127.0.5."


def modes(tmp: str, crawlers: int) -> list[tuple[str, str, dict, int]]:
    """(name, header form, settings, crawlers) of each run."""
    common = {"CONCURRENT_REQUESTS": 16, "RETRY_ENABLED": True, "LOG_LEVEL": "WARNING"}
    polite = {**common, **polite_settings(POLITE_HOST_INTERVAL=0.02, POLITE_IP_INTERVAL=0, POLITE_MAX_IDLE_WAIT=60.0,
                                          POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"])}
    return [
        ("plain Scrapy", "ietf", dict(common), 1),
        ("polite, headers ignored", "ietf", {**polite, "POLITE_RATELIMIT_HEADERS": False,
                                             "POLITE_STORE": f"sqlite:///{tmp}/ignored.sqlite3"}, 1),
        ("polite, RateLimit-Policy", "ietf", {**polite, "POLITE_STORE": f"sqlite:///{tmp}/ietf.sqlite3"}, 1),
        ("polite, X-RateLimit-*", "x-delta", {**polite, "POLITE_STORE": f"sqlite:///{tmp}/x.sqlite3"}, 1),
        (f"polite, X-*, {crawlers} crawlers", "x-delta", {**polite, "POLITE_STORE": f"sqlite:///{tmp}/xn.sqlite3"},
         crawlers),
    ]


async def one_run(srv: ArrivalServer, quota: Quota, settings: dict, pages: int, timeout: float,
                  crawlers: int = 1) -> dict:
    srv.route("/*", quota.handler())
    urls = [srv.url(f"/p/{i}") for i in range(pages)]
    t0 = time.time()
    runs = [defer.Deferred.fromCoroutine(run_crawl(ListSpider, settings, urls=urls[k::crawlers], timeout=timeout))
            for k in range(crawlers)]
    done = await defer.DeferredList(runs, fireOnOneErrback=True, consumeErrors=True)
    crawlers_run = [c for _, c in done]
    hits = sorted(srv.arrivals(), key=lambda a: a.start)
    fetched = {f.url for c in crawlers_run for f in c.spider.fetched if f.status == 200}

    def total(key: str) -> int:
        return sum(c.stats.get_value(key) or 0 for c in crawlers_run)

    return {
        "requests": len(hits), "refused": quota.refused, "lost": len(set(urls) - fetched),
        "makespan": max(a.end for a in hits) - min(a.start for a in hits), "duration": time.time() - t0,
        "retries": total("retry/count"), "polite_retries": total("polite/throttle/retries"),
        "reason": ",".join(sorted({str(c.stats.get_value("finish_reason")) for c in crawlers_run})),
    }


async def main(args: argparse.Namespace) -> None:
    tmp = tempfile.mkdtemp(prefix="polite-ratelimit-")
    servers: list[ArrivalServer] = []
    try:
        warm = ArrivalServer(f"{BASE}99")
        servers.append(warm)
        await run_crawl(ListSpider, {"LOG_LEVEL": "WARNING"}, urls=[warm.url("/warm")])
        ideal = Quota(quota=args.quota, window=args.window).ideal(args.pages)
        print(f"rate-limit benchmark: {args.pages} pages of one host allowing {args.quota} requests per "
              f"{args.window:g} s (429 beyond it); ideal makespan {ideal:.1f} s; CONCURRENT_REQUESTS=16, "
              f"RETRY_ENABLED=True")
        header = (f"{'mode':26} {'requests':>8} {'429s':>6} {'lost':>5} {'makespan s':>10} {'/ ideal':>8} "
                  f"{'RETRY_TIMES used':>16} {'polite retries':>14}  finish_reason")
        print(header)
        print("-" * len(header))
        for i, (name, form, settings, crawlers) in enumerate(modes(tmp, args.crawlers)):
            srv = ArrivalServer(f"{BASE}{10 + i}")
            servers.append(srv)
            quota = Quota(form=form, quota=args.quota, window=args.window)
            r = await one_run(srv, quota, settings, args.pages, args.timeout, crawlers)
            print(f"{name:26} {r['requests']:8d} {r['refused']:6d} {r['lost']:5d} {r['makespan']:10.2f} "
                  f"{r['makespan'] / ideal:8.2f} {r['retries']:16d} {r['polite_retries']:14d}  {r['reason']}")
        print("targets for the add-on reading the headers: 0 429s, 0 pages lost, makespan / ideal <= 1.1")
    finally:
        for srv in servers:
            srv.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--quota", type=int, default=20, help="requests allowed per window (default 20)")
    parser.add_argument("--window", type=float, default=2.0, help="the quota's window, seconds (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--crawlers", type=int, default=4, help="crawls sharing one table in the last mode (4)")
    task.react(lambda _reactor: defer.ensureDeferred(main(parser.parse_args())))
