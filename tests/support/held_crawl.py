"""A crawl that holds many requests of one throttled host, sampling the crawl process's memory (RSS).

Run it in a fresh process, so that the figures are this crawl's alone::

    python -m tests.support.held_crawl --requests 20000 --max-in-memory 500 [--jobdir DIR]

The pace table is a SQLite file in a temporary directory (``--store`` to choose another), as in a real
crawl. One loopback host (an :class:`~tests.support.server.ArrivalServer` in this process, 127.0.5.1) answers the
first request ``429`` + ``Retry-After: 3600``; the spider's ``--requests`` start requests (``dont_filter``, so
the dupe filter keeps nothing) are then all deferred and held by the scheduler, and the crawl closes with
reason ``polite_deferred`` (``POLITE_MAX_IDLE_WAIT = 1``). Every 0.05 s the number of held requests and the
process's RSS are sampled (Linux ``/proc/self/statm``).

Prints one JSON object: ``samples`` (``[held, rss_bytes]`` pairs), ``stats`` (the crawl's ``polite/...``
stats and ``finish_reason``), ``seconds`` (the crawl's duration) and ``arrivals`` (requests the server saw).
``tests/test_held.py`` and ``bench/held.py`` run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import scrapy  # noqa: E402
from scrapy import signals  # noqa: E402
from scrapy.crawler import CrawlerProcess  # noqa: E402
from twisted.internet import task  # noqa: E402

from scrapy_polite.pacer import find_pacer  # noqa: E402
from tests.support.server import ArrivalServer, Reply, scripted  # noqa: E402

__all__ = ["rss_bytes"]


def rss_bytes() -> int:
    """This process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class HoldSpider(scrapy.Spider):
    """``count`` start requests of ``base`` (``/p/0`` …), each ``dont_filter``; samples held count and RSS."""

    name = "hold"

    def __init__(self, base: str = "", count: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base = base
        self.count = int(count)
        self.samples: list[tuple[int, int]] = []
        self._loop: task.LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> HoldSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        return spider

    async def start(self) -> AsyncIterator[Any]:
        for i in range(self.count):
            yield scrapy.Request(f"{self.base}/p/{i}", dont_filter=True, callback=self.parse, errback=self.failed)

    def parse(self, response: Any) -> None:
        pass

    def failed(self, failure: Any) -> None:
        pass

    def _sample(self) -> None:
        pacer = find_pacer(self.crawler)
        scheduler = pacer.booker.scheduler if pacer is not None else None
        held = scheduler.held_count() if scheduler is not None else 0
        self.samples.append((held, rss_bytes()))

    def _opened(self, spider: Any) -> None:
        self._loop = task.LoopingCall(self._sample)
        self._loop.start(0.05)

    def _closed(self, spider: Any) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--max-in-memory", type=int, default=500)
    parser.add_argument("--jobdir", default=None)
    parser.add_argument("--store", default=None, help="POLITE_STORE (default: a SQLite file in a temporary directory)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="held-crawl-")

    srv = ArrivalServer("127.0.5.1")
    srv.route("/*", scripted(Reply.throttle(429, "3600")))
    settings: dict[str, Any] = {
        "ADDONS": {"scrapy_polite.Addon": 0},
        "POLITE_STORE": args.store or f"sqlite:///{os.path.join(workdir, 'pace.sqlite3')}",
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "POLITE_IP_INTERVAL": 0,
        "POLITE_MAX_IDLE_WAIT": 1.0,
        "POLITE_MAX_HELD_IN_MEMORY": args.max_in_memory,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "ERROR",
        "RETRY_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
    }
    if args.jobdir:
        settings["JOBDIR"] = args.jobdir
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(HoldSpider)
    started = time.monotonic()
    process.crawl(crawler, base=srv.url("").rstrip("/"), count=args.requests)
    process.start()
    seconds = time.monotonic() - started
    srv.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    spider = crawler.spider
    print(json.dumps({
        "samples": spider.samples if isinstance(spider, HoldSpider) else [],
        "stats": {k: v for k, v in stats.items() if k.startswith("polite/") or k == "finish_reason"},
        "seconds": seconds,
        "arrivals": len(srv.arrivals()),
    }))


if __name__ == "__main__":
    main()
