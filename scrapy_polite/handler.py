"""The HTTP(S) download handler that connects to the booked address (SPEC §3–4).

:class:`PinnedHTTP11DownloadHandler` is Scrapy's HTTP/1.1 handler with one change: a request the
middleware booked on an address (``meta['polite_ip']``) is connected to **that address**, and the
keep-alive pool keys connections by it, so a pooled connection to another address of the same host is
never reused. The Host header, TLS SNI and certificate checks still use the URL's host name.

The connection itself goes through the reactor's name resolver with the address as a literal, so the
public-address filter of :class:`~scrapy_polite.resolver.PublicHostnameResolver` is applied once more at
connect time. Requests through an HTTP proxy (``meta['proxy']``) are handled as by Scrapy: the proxy
resolves the target, so pinning cannot apply (the middleware says so in the log and in stats).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler

from ._compat import HAS_H2, download_pinned
from .pacer import Redefer, find_pacer
from .vocabulary import BURST_META

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["PinnedH2DownloadHandler", "PinnedHTTP11DownloadHandler"]

logger = logging.getLogger(__name__)


class _Pinned:
    """What both pinned handlers do around their download: a throttled burst request sent back to be deferred
    (:func:`_redefer_if_throttled`), the download through the handler's pinned path (:meth:`_download_pinned`), and the
    response recorded as it leaves (:func:`_record`)."""

    crawler: Crawler

    def _download_pinned(self, request: Request) -> Awaitable[Response]:
        """The pinned download: each handler sets it to its function of ``(handler, request)`` in
        :mod:`scrapy_polite._compat`."""
        raise NotImplementedError

    async def download_request(self, request: Request) -> Response:
        if request.meta.get(BURST_META):  # the usual case: no call, no lookup of the pacer
            _redefer_if_throttled(self.crawler, request)
        response = await self._download_pinned(request)
        _record(self, request, response)
        return response


class PinnedHTTP11DownloadHandler(_Pinned, HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler, connecting each booked request to ``meta['polite_ip']``.

    Installed for ``http`` and ``https`` by the add-on. Raises ``NotConfigured`` without a Twisted
    reactor (as Scrapy's handler does).
    """

    _download_pinned = download_pinned


if HAS_H2:  # Scrapy's HTTP/2 handler needs the optional h2 package
    from scrapy.core.downloader.handlers.http2 import H2DownloadHandler

    from ._compat import download_pinned_h2

    class PinnedH2DownloadHandler(_Pinned, H2DownloadHandler):
        """Scrapy's HTTP/2 handler (``https`` only, as Scrapy's), connecting each booked request to
        ``meta['polite_ip']`` and keying its HTTP/2 connections by that address (docs/spec.md §4.1).

        Installed for ``https`` by the add-on in place of ``scrapy.core.downloader.handlers.http2.H2DownloadHandler``.
        Raises ``NotConfigured`` without a Twisted reactor (as Scrapy's handler does); ``h2`` must be installed
        (``pip install scrapy-polite[http2]``).
        """

        _download_pinned = download_pinned_h2


def _record(handler: Any, request: Request, response: Response) -> None:
    """Record the downloaded ``response`` here, as it leaves the handler (:meth:`Recorder.downloaded
    <scrapy_polite.crawl.recording.Recorder.downloaded>`, docs/spec.md §5, "Recording"), as the middleware's
    ``response_downloaded`` receiver does for other handlers: without Scrapy's signal dispatch per page. The
    crawl's recorder is kept with the handler (one per crawler) once found. A record that raises is logged; the
    response still goes on (as from a signal's receiver)."""
    recorder = vars(handler).get("_polite_recorder")
    if recorder is None:
        pacer = find_pacer(handler.crawler)
        if pacer is None:  # the handler without the add-on's middleware: nothing records
            return
        recorder = vars(handler)["_polite_recorder"] = pacer.recorder
    try:
        recorder.downloaded(request, response)
    except Exception:
        logger.exception("scrapy-polite could not record %s for %s", response.status, request.url)


def _redefer_if_throttled(crawler: Crawler, request: Request) -> None:
    """Raise :class:`~scrapy_polite.crawl.seams.Redefer` for a burst request decided before its host throttled and
    queued in Scrapy's slot since: it must not be sent into the backoff. Called for a burst request
    (``meta['polite_burst']``) only."""
    pacer = find_pacer(crawler)
    if pacer is not None and pacer.recorder.throttled_since(request) and pacer.booker.can_defer(request):
        raise Redefer(request.url)
