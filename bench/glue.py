"""Benchmark: the CPU the add-on's glue costs per page, without the network.

Usage::

    python bench/glue.py [--pages 20000] [--rounds 5] [--store sqlite|memory|both] [--no-event-log]
                         [--profile FILE]

``bench/overhead.py`` measures what a real crawl pays, but on a loaded two-core machine its figures move by
several per cent from run to run. This isolates the add-on's part: one page's path through every
component the add-on installs, called as Scrapy calls them, on a running asyncio reactor, for 50 loopback
hosts with every interval 0 (as in ``bench/overhead.py``):

``PoliteScheduler.enqueue_request`` / ``next_request`` (around a trivial inner queue), the downloader
middleware's ``process_request`` (the resolution from the resolver's cache, the booking transaction, the pin),
the pacer's ``response_downloaded`` handler (the record) and the middleware's ``process_response`` (the line
and the pin released).

Printed: the process's CPU time per page of that path minus the same loop without the add-on (building the
``Request`` and the response), the median of ``--rounds`` alternating rounds, for the SQLite store (a fresh
file) and ``memory://``. Divide by plain Scrapy's CPU per page (printed by ``bench/overhead.py``, about
1.5 ms on two cores) for the share a crawl pays. ``--profile FILE`` writes a ``cProfile`` of one more pass
(``python -m pstats FILE``). Runs in about 30 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

BODY = b"<html><body>" + b"<p>lorem ipsum dolor sit amet</p>" * 20 + b"</body></html>"


class _Queue:
    """The inner scheduler: a list (Scrapy's own scheduler runs in plain Scrapy too; only the wrapper counts)."""

    def __init__(self) -> None:
        self.q: list = []

    def enqueue_request(self, request) -> bool:
        self.q.append(request)
        return True

    def next_request(self):
        return self.q.pop() if self.q else None

    def has_pending_requests(self) -> bool:
        return bool(self.q)

    def __len__(self) -> int:
        return len(self.q)


def build(store_uri: str, event_log: bool):
    """The add-on's components around one crawler: ``(scheduler, mw, extension, pacer)``."""
    from scrapy import Spider
    from scrapy.crawler import CrawlerRunner
    from scrapy.utils.test import get_crawler
    from twisted.internet import reactor

    from scrapy_polite.extension import PoliteExtension
    from scrapy_polite.middleware import PoliteDownloaderMiddleware
    from scrapy_polite.pacer import get_pacer
    from scrapy_polite.resolver import PublicHostnameResolver
    from scrapy_polite.scheduler import PoliteScheduler

    class BenchSpider(Spider):
        name = "glue"

    settings = {"ADDONS": {"scrapy_polite.Addon": 0}, "POLITE_STORE": store_uri, "POLITE_HOST_INTERVAL": 0,
                "POLITE_IP_INTERVAL": 0, "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"], "LOG_LEVEL": "WARNING"}
    if not event_log:
        settings["POLITE_EVENT_LOG"] = False
    # As CrawlerProcess does: the add-on's resolver on the reactor before the crawler is built.
    PublicHostnameResolver.from_crawler(CrawlerRunner(settings), reactor).install_on_reactor()
    crawler = get_crawler(BenchSpider, settings)
    crawler.spider = BenchSpider()
    pacer = get_pacer(crawler)
    scheduler = PoliteScheduler(crawler, _Queue(), pacer)
    pacer.booker.attach(scheduler)
    return scheduler, PoliteDownloaderMiddleware(pacer), PoliteExtension(crawler, pacer), pacer


async def measure(args, store: str, directory: str) -> tuple[list[float], int]:
    """``(µs of CPU per page of the glue, per round; paced requests)`` for one store."""
    from scrapy import Request
    from scrapy.http import HtmlResponse
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor, task

    uri = "memory://" if store == "memory" else f"sqlite:///{directory}/{store}-glue.sqlite3"
    scheduler, mw, ext, pacer = build(uri, args.event_log)
    hosts = [f"127.0.5.{10 + i}" for i in range(50)]
    urls = [f"http://{h}:8000/p/{i}" for i in range(args.pages // len(hosts) + 1) for h in hosts][: args.pages]

    async def polite_page(url: str) -> None:
        request = Request(url)
        scheduler.enqueue_request(request)
        request = scheduler.next_request()
        assert await mw.process_request(request) is None
        response = HtmlResponse(url, status=200, body=BODY, request=request)
        mw.response_downloaded(response, request)  # the handler of the signal (connected in from_crawler)
        await mw.process_response(request, response)

    async def plain_page(url: str) -> None:
        request = Request(url)
        scheduler.inner.enqueue_request(request)
        request = scheduler.inner.next_request()
        HtmlResponse(url, status=200, body=BODY, request=request)

    async def loop(page, batch: list[str]) -> float:
        c0 = time.process_time()
        for i, url in enumerate(batch):
            await page(url)
            if i % 50 == 49:  # a reactor turn now and then, as in a crawl (the store's thread reports back)
                await maybe_deferred_to_future(task.deferLater(reactor, 0, lambda: None))
        return time.process_time() - c0

    try:
        await loop(polite_page, urls[:1000])  # warm up: rows, lines, caches
        rounds = []
        for _ in range(args.rounds):
            plain = await loop(plain_page, urls)
            polite = await loop(polite_page, urls)
            rounds.append((polite - plain) / len(urls) * 1e6)
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
            await loop(polite_page, urls)
            profiler.disable()
            path = f"{args.profile}.{store}" if args.store == "both" else args.profile
            profiler.dump_stats(path)
            print(f"  cProfile of one more {store} pass written to {path}")
        return rounds, pacer.crawler.stats.get_value("polite/requests")
    finally:
        pacer.close()


async def main(args) -> None:
    stores = ["sqlite", "memory"] if args.store == "both" else [args.store]
    print(f"glue benchmark: {args.pages:,} pages over 50 hosts per round, {args.rounds} rounds, intervals 0, "
          f"event log {'default' if args.event_log else 'off'}; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="polite-glue-") as directory:
        for store in stores:
            rounds, requests = await measure(args, store, directory)
            print(f"  {store:7} {statistics.median(rounds):6.1f} µs CPU per page (rounds: "
                  + ", ".join(f"{r:.1f}" for r in rounds) + f"; {requests:,} paced requests)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=20_000, help="pages per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per store (default 5)")
    parser.add_argument("--store", choices=["sqlite", "memory", "both"], default="both")
    parser.add_argument("--no-event-log", dest="event_log", action="store_false",
                        help="POLITE_EVENT_LOG = False (the event log costs its share too)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of one more pass to FILE")
    args = parser.parse_args()

    from twisted.internet import asyncioreactor

    asyncioreactor.install()
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor

    failures: list[str] = []

    def start() -> None:
        d = deferred_from_coro(main(args))
        d.addErrback(lambda f: failures.append(f.getTraceback()))
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run()
    if failures:
        print(failures[0], file=sys.stderr, flush=True)
        os._exit(1)  # a store thread may still run: do not wait for it
