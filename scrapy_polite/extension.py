"""The signals-driven extension (docs/spec.md §5): feeds the pace table and reports.

* ``response_downloaded`` — every downloaded response's status and ``Retry-After`` go into the table
  (before any middleware, e.g. ``RetryMiddleware``, turns a 429 into a retry);
* ``robots_parsed`` (Scrapy ≥ 2.18) — the host's ``Crawl-delay`` / ``Request-rate`` for the crawler's
  user agent (``ROBOTSTXT_USER_AGENT`` or ``USER_AGENT``), read with Protego, is recorded;
* ``spider_opened`` — the spider's ``crawl_delay`` attribute (seconds) becomes a per-spider override;
* ``spider_closed`` — an INFO summary (hosts backing off, waits, deferrals) and the store is closed.

Stats are under ``polite/`` (see README).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider, NotConfigured

from .addon import MIDDLEWARE, MIDDLEWARE_PRIORITY
from .addon import component_name as name
from .pacer import Pacer, get_pacer
from .policy import host_key
from .reactor import await_deferred, installed_reactor
from .resolver import PublicHostnameResolver
from .robots import robots_delay

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["PoliteExtension"]


class PoliteExtension:
    """Connects the pacer to Scrapy's signals.

    Raises:
        NotConfigured: ``POLITE_ENABLED`` is False.
        SettingsError, StoreError: at construction (the crawl does not start).
    """

    def __init__(self, crawler: Crawler, pacer: Pacer) -> None:
        self.crawler = crawler
        self.pacer = pacer
        self._robots_status: dict[str, int] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not crawler.settings.getbool("POLITE_ENABLED", True):
            raise NotConfigured("POLITE_ENABLED is False")
        ext = cls(crawler, get_pacer(crawler))
        crawler.signals.connect(ext.response_downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(ext.robots_parsed, signal=signals.robots_parsed)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.response_received_robots, signal=signals.response_downloaded)
        ext._check_middleware_order(crawler)
        if crawler.settings.getfloat("DOWNLOAD_DELAY") > 0 or crawler.settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning(
                "scrapy-polite: DOWNLOAD_DELAY=%s / AUTOTHROTTLE_ENABLED=%s still apply on top of scrapy-polite's "
                "pacing (burst streams too). Remove them from settings.py (the startproject template sets "
                "DOWNLOAD_DELAY = 1) unless you want both.", crawler.settings.get("DOWNLOAD_DELAY"),
                crawler.settings.getbool("AUTOTHROTTLE_ENABLED"))
        return ext

    @staticmethod
    def _check_middleware_order(crawler: Crawler) -> None:
        """A downloader middleware after ours that returns a Request from ``process_request`` bypasses our
        ``process_response``/``process_exception``: warn, naming it (its host's line could stay taken)."""
        middlewares = crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES")
        ours = next((v for k, v in middlewares.items() if name(k) == MIDDLEWARE and v is not None),
                    MIDDLEWARE_PRIORITY)
        later = sorted(name(k) for k, v in middlewares.items()
                       if v is not None and v > ours and name(k) != MIDDLEWARE)
        if later:
            logger.warning(
                "scrapy-polite: downloader middlewares %s run after PoliteDownloaderMiddleware (priority %d). "
                "If one returns a Request or Response from process_request, give it a priority below %d.",
                later, ours, ours)

    def _warn_wider_address_rules(self) -> None:
        """The resolver is per process: a spider's ``POLITE_ALLOW_PRIVATE`` / ``POLITE_ALLOWED_NETWORKS`` can
        narrow the process's rules, never widen them. Say so when a spider tries (docs/spec.md §7)."""
        resolver = getattr(installed_reactor(), "nameResolver", None)
        if not isinstance(resolver, PublicHostnameResolver):
            return  # not installed: the pacer reports that on the first request
        mine, process = self.pacer.address_filter, resolver.filter
        if process.allow_private:
            return
        wider = ["POLITE_ALLOW_PRIVATE=True"] if mine.allow_private else []
        for net in mine.allowed_networks:
            if not any(net.version == other.version and net.subnet_of(other)  # type: ignore[arg-type]
                       for other in process.allowed_networks):
                wider.append(str(net))
        if wider:
            logger.warning(
                "scrapy-polite: this spider's address rules allow %s, which the process-wide resolver does not: "
                "those addresses stay refused. Put POLITE_ALLOWED_NETWORKS / POLITE_ALLOW_PRIVATE in the project "
                "settings (settings.py), not in the spider's custom_settings.", ", ".join(wider))

    def spider_idle(self, spider: Spider) -> None:
        """Keep the spider open while requests are held (docs/spec.md §5), unless everything held is due beyond
        ``POLITE_MAX_IDLE_WAIT``: then close with reason ``polite_deferred``, listing the hosts."""
        scheduler = self.pacer.scheduler
        if scheduler is None or not scheduler.held_count():
            return
        earliest = scheduler.earliest_due()
        wait = (earliest - self.pacer.clock()) if earliest is not None else 0.0
        if earliest is not None and earliest != float("inf") and wait > self.pacer.config.max_idle_wait:
            logger.info("scrapy-polite: everything left is deferred beyond POLITE_MAX_IDLE_WAIT=%g s; closing. %s",
                        self.pacer.config.max_idle_wait, scheduler.describe())
            raise CloseSpider("polite_deferred")
        raise DontCloseSpider

    def response_received_robots(self, response: Response, request: Request, spider: Spider | None = None) -> None:
        """Note robots.txt statuses: only a 2xx or 4xx robots.txt may change a host's recorded delay."""
        if request.url.endswith("/robots.txt"):
            host = host_key(request.url)
            if host is not None:
                self._robots_status[host] = response.status

    def spider_opened(self, spider: Spider) -> None:
        self._warn_wider_address_rules()
        raw = getattr(spider, "crawl_delay", None)
        if raw is None:
            return
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = float("nan")
        if not math.isfinite(value) or value < 0:
            self.pacer.inc("invalid_spider_delay")
            logger.error("%s.crawl_delay must be a number of seconds >= 0, got %r: ignored (the crawl is paced "
                         "by POLITE_HOST_INTERVAL and the hosts' own delays)", type(spider).__name__, raw)
            return
        self.pacer.spider_delay = value

    def response_downloaded(self, response: Response, request: Request, spider: Spider | None = None) -> None:
        self.pacer.record_response(request, response)

    async def robots_parsed(self, robotparser: Any, request: Request) -> None:
        host = host_key(request.url)
        if host is None:
            return
        status = self._robots_status.get(host)
        if status is not None and (status >= 500 or status == 429):
            # RFC 9309 §2.3.1.4: an unreachable robots.txt says nothing new; keep the recorded delay.
            self.pacer.inc("robots/unreachable")
            return
        try:
            delay = robots_delay(robotparser, self.pacer.user_agent)
        except Exception:  # a parser we do not know: count, log, keep crawling paced by the base interval
            self.pacer.inc("robots/errors")
            logger.exception("scrapy-polite could not read the delay of %s", request.url)
            return
        await await_deferred(self.pacer.set_crawl_delay(host, delay))

    def spider_closed(self, spider: Spider, reason: str) -> None:
        report = self.pacer.host_report()
        stats = self.crawler.stats

        def get(key: str) -> Any:
            return stats.get_value(f"polite/{key}", 0) if stats is not None else 0

        backing_off = {h: r for h, r in report.items() if r["throttles"]}
        logger.info(
            "scrapy-polite summary: %d hosts, %d paced requests, %d waits (%.1f s), %d deferrals, "
            "%d throttles%s",
            len(report), get("requests"), get("waits"), get("wait_seconds") or 0.0, get("deferrals"),
            sum(r["throttles"] for r in report.values()),
            "".join(f"\n  {h}: {r['throttles']} throttles, statuses {r['statuses']}"
                    for h, r in sorted(backing_off.items())),
        )
        self.pacer.close()
