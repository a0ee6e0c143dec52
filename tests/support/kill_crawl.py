"""One crawl of the kill -9 test (``tests/test_crash.py``), run in its own process and killed at a random moment.

Usage::

    python -m tests.support.kill_crawl CONFIG.json

``CONFIG.json`` holds ``urls`` (this run's start URLs, each requested with ``dont_filter``), ``store`` (the
``POLITE_STORE`` URI, a SQLite file), ``jobdir`` (``JOBDIR``), ``report`` and ``log`` (files this process
writes).
The crawl uses the add-on with ``POLITE_HOST_INTERVAL = 0.2``, ``POLITE_IP_INTERVAL = 0``, Scrapy's
``RetryMiddleware`` (429 and 503 retried, so a throttled URL is deferred and held) and ``JOBDIR``.

Scrapy's own ``JOBDIR`` queue of pending requests is written at close only (queuelib's disk queues keep
their index in memory until then), so a ``kill -9`` loses or scrambles it whatever scrapy-polite does; the
test is about the requests scrapy-polite holds, so the pending queue is kept in memory
(``SCHEDULER_DISK_QUEUE``) and the test issues again, in each run, the URLs that are neither answered nor
held.

The log is the probe of the test: one line per request held (``H host url``, written when
:meth:`HeldRequests.push <scrapy_polite.crawl.held.HeldRequests.push>` has returned) and per request handed out
again (``R host``, written before :meth:`~scrapy_polite.crawl.held.HeldRequests.pop` runs), each line one
``write`` to a file opened with ``O_APPEND``: at any moment of a kill, the log tells which requests the
process held.

The report (replaced atomically): ``{"resumed": N}`` once the spider is open (``polite/deferred/resumed``,
the held requests this run took over from ``JOBDIR``), then, when the crawl ends, also ``finish_reason``
and the ``polite/...`` stats.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import scrapy  # noqa: E402
from scrapy import signals  # noqa: E402
from scrapy.crawler import CrawlerProcess  # noqa: E402

from scrapy_polite.crawl.held import HeldRequests  # noqa: E402


def write_report(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class KillSpider(scrapy.Spider):
    name = "kill"

    def __init__(self, urls: list[str] | None = None, report: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls_ = list(urls or [])
        self.report = report

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> KillSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        return spider

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls_:
            yield scrapy.Request(url, dont_filter=True, callback=self.parse, errback=self.failed)

    def parse(self, response: Any) -> None:
        pass

    def failed(self, failure: Any) -> None:
        pass

    def _opened(self, spider: Any) -> None:
        stats = self.crawler.stats
        resumed = stats.get_value("polite/deferred/resumed", 0) if stats is not None else 0
        write_report(self.report, {"resumed": resumed})


def probe(path: str) -> None:
    """Log every push and pop of the held requests to ``path`` (see the module docstring)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    push, pop = HeldRequests.push, HeldRequests.pop

    def logged_push(self: HeldRequests, host: str, request: Any, due: float | None) -> None:
        push(self, host, request, due)
        os.write(fd, f"H {host} {request.url}\n".encode())

    def logged_pop(self: HeldRequests, host: str) -> Any:
        os.write(fd, f"R {host}\n".encode())
        return pop(self, host)

    HeldRequests.push = logged_push  # type: ignore[method-assign]
    HeldRequests.pop = logged_pop  # type: ignore[method-assign]


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    probe(config["log"])
    settings: dict[str, Any] = {
        "ADDONS": {"scrapy_polite.Addon": 0},
        "POLITE_STORE": config["store"],
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "POLITE_HOST_INTERVAL": 0.2,
        "POLITE_IP_INTERVAL": 0,
        "POLITE_MAX_IDLE_WAIT": 30.0,
        "JOBDIR": config["jobdir"],
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "RETRY_ENABLED": True,
        "RETRY_TIMES": 50,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "DOWNLOAD_TIMEOUT": 10,
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(KillSpider)
    process.crawl(crawler, urls=config["urls"], report=config["report"])
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    report = {"resumed": stats.get("polite/deferred/resumed", 0), "finish_reason": stats.get("finish_reason"),
              "stats": {k: v for k, v in stats.items() if k.startswith("polite/")}}
    write_report(config["report"], report)


if __name__ == "__main__":
    main()
