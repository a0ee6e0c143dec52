"""The add-on's shape with nothing inside: components that hook into Scrapy where scrapy-polite does and do
nothing there — ONLY a benchmark baseline (``bench/overhead.py --shell``).

What a crawl pays for the add-on is its work plus the cost of being called: Scrapy's machinery around every
downloader-middleware method, signal receiver, scheduler wrapper and download handler it installs. These
components are called at the same places, as often, and of the same kind (``async def`` middleware methods,
an ``async def`` download handler that awaits Scrapy's own, a scheduler that delegates to Scrapy's), so
``shell/plain`` in the overhead benchmark is the floor under ``polite/plain`` for any add-on of this shape:

* a downloader middleware at the end of the chain with ``async def process_request``, ``async def
  process_response`` and ``async def process_exception`` (the pacing middleware);
* an extension with a receiver for ``spider_idle`` (the give-up's ``response_received`` receiver is connected
  only while a given-up response is on its way, the record's ``response_downloaded`` only once a request goes to
  another handler than the add-on's pinned ones, which record in the handler: neither here);
* a scheduler that wraps Scrapy's (``enqueue_request``, ``next_request``, ``has_pending_requests``, ``len``);
* an HTTP/1.1 download handler whose ``async def download_request`` awaits Scrapy's.

Nothing in scrapy-polite uses this module.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request, signals
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.core.scheduler import Scheduler
from scrapy.http import Response

__all__ = ["SHELL_SETTINGS"]


class ShellMiddleware:
    async def process_request(self, request: Request) -> None:
        return None

    async def process_response(self, request: Request, response: Response) -> Response:
        return response

    async def process_exception(self, request: Request, exception: Exception) -> None:
        return None


class ShellExtension:
    @classmethod
    def from_crawler(cls, crawler: Any) -> ShellExtension:
        ext = cls()
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        return ext

    def spider_idle(self) -> None:
        pass


class ShellScheduler:
    """Scrapy's scheduler, wrapped (every call delegated)."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner

    @classmethod
    def from_crawler(cls, crawler: Any) -> ShellScheduler:
        return cls(Scheduler.from_crawler(crawler))

    def open(self, spider: Any) -> Any:
        return self.inner.open(spider)

    def close(self, reason: str) -> Any:
        return self.inner.close(reason)

    def has_pending_requests(self) -> bool:
        return self.inner.has_pending_requests()

    def enqueue_request(self, request: Request) -> bool:
        return self.inner.enqueue_request(request)

    def next_request(self) -> Request | None:
        return self.inner.next_request()

    def __len__(self) -> int:
        return len(self.inner)


class ShellDownloadHandler(HTTP11DownloadHandler):
    async def download_request(self, request: Request) -> Response:
        return await super().download_request(request)


#: Settings that install the shell on top of plain Scrapy's.
SHELL_SETTINGS: dict[str, Any] = {
    "DOWNLOADER_MIDDLEWARES": {ShellMiddleware: 960},
    "EXTENSIONS": {ShellExtension: 0},
    "SCHEDULER": ShellScheduler,
    "DOWNLOAD_HANDLERS": {"http": ShellDownloadHandler, "https": ShellDownloadHandler},
}
