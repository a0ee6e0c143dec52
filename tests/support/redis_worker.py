"""One scrapy-redis worker of the shared-frontier tests (``tests/test_e2e_frontier.py``), in its own process.

Usage::

    python -m tests.support.redis_worker CONFIG.json

``CONFIG.json`` holds ``name`` (the spider's name: the Redis keys are ``<name>:requests``,
``<name>:start_urls``, ``<name>:polite:…``), ``worker`` (this worker's label, sent as its User-Agent),
``kind`` (``RedisSpider`` or ``RedisCrawlSpider``), ``settings`` (merged over the scrapy-redis settings
README's "Running many crawlers" shows), ``ready_dir`` and ``barrier`` (``[label, delay]`` pairs: this
worker starts reading its start URLs once each ``<label>.ready`` file has existed for ``delay`` seconds, so
that workers started together start together, or one a known time after another), ``fetched`` (a file each parsed page is appended to, ``<status> <url>``, one
``write`` per page to a file opened with ``O_APPEND``, with the page's ``meta['feed']`` and its throttle
retries, so a killed worker's pages are known) and ``out``
(the stats and ``finish_reason`` as JSON, written when the crawl ends). ``"lease_wait": false`` (a negative
control of ``tests/test_e2e_frontier_handoff.py``) switches off the idle worker's wait for the leases of a
worker that stopped renewing: it then closes as before issue 30, when its idle window is shorter than
``POLITE_LEASE_TIME``. ``"patch"``: the names of :func:`tests.support.fleet.apply_patches` (``["no_hold"]``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scrapy import signals  # noqa: E402
from scrapy.crawler import CrawlerProcess  # noqa: E402
from scrapy_redis.spiders import RedisCrawlSpider, RedisSpider  # noqa: E402

#: The settings of README's "Running many crawlers" (the store and REDIS_URL come from the test).
FARM_SETTINGS: dict[str, Any] = {
    "ADDONS": {"scrapy_polite.Addon": 0},
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER_PERSIST": True,
    "MAX_IDLE_TIME_BEFORE_CLOSE": 2,
    "POLITE_LEASE_TIME": 2.0,
    "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"],
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    "COOKIES_ENABLED": False,
    "RETRY_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "DOWNLOAD_TIMEOUT": 20,
}


def spider_class(config: dict[str, Any]) -> type[Any]:
    """The worker's spider: a ``RedisSpider`` or ``RedisCrawlSpider`` named ``config['name']`` that appends
    every page it parses to ``config['fetched']``."""
    base = RedisCrawlSpider if config.get("kind") == "RedisCrawlSpider" else RedisSpider
    fd = os.open(config["fetched"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self: Any, response: Any) -> None:
        os.write(fd, f"{response.status} {response.url} {response.meta.get('feed', '-')} "
                     f"{response.meta.get('polite_throttle_retries', 0)}\n".encode())

    attrs: dict[str, Any] = {"name": config["name"], "parse": record, "parse_start_url": record}
    if base is RedisCrawlSpider:
        attrs["rules"] = ()
    return type("FarmSpider", (base,), attrs)


def barrier(config: dict[str, Any]) -> Callable[..., Any]:
    """A ``spider_opened`` handler (awaited by the engine before it takes any request) that waits for the
    barrier of ``config``."""
    ready = config["ready_dir"]

    def passed(label: str, delay: float) -> bool:
        path = os.path.join(ready, f"{label}.ready")
        return os.path.exists(path) and time.time() >= os.path.getmtime(path) + delay

    async def wait(spider: Any) -> None:
        open(os.path.join(ready, f"{config['worker']}.ready"), "w").close()
        while not all(passed(label, delay) for label, delay in config["barrier"]):
            await asyncio.sleep(0.02)

    return wait


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    from tests.support.fleet import apply_patches

    apply_patches(config.get("patch", []))  # test-only changes (negative controls), as tests/support/fleet.py's
    if config.get("lease_wait") is False:
        from scrapy_polite.frontier import worker as frontier_worker

        frontier_worker.stopped_leasers = lambda *args, **kwargs: []  # type: ignore[assignment]
    settings = {**FARM_SETTINGS, "USER_AGENT": config["worker"], **config["settings"]}
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(spider_class(config))
    wait = barrier(config)
    crawler.signals.connect(wait, signal=signals.spider_opened)
    process.crawl(crawler)
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    with open(config["out"], "w") as f:
        json.dump({k: v for k, v in stats.items() if isinstance(v, (int, float, str))}, f)


if __name__ == "__main__":
    main()
