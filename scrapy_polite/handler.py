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

from typing import TYPE_CHECKING, Any

import scrapy.core.downloader.handlers.http11 as http11
from scrapy.core.downloader.handlers.http11 import (
    HTTP11DownloadHandler,
    _BindAddressAgent,
    _ScrapyAgent,
)
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS

from .pacer import Redefer, find_pacer

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

__all__ = ["PinnedHTTP11DownloadHandler"]


class _PinnedAgent(_BindAddressAgent):
    """A Twisted Agent whose endpoint is the booked address and whose pool key includes it."""

    def __init__(self, *, address: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._address = address

    def _getEndpoint(self, uri: Any) -> Any:
        factory = self._endpointFactory
        kwargs: dict[str, Any] = {}
        if factory._connectTimeout is not None:
            kwargs["timeout"] = factory._connectTimeout
        kwargs["bindAddress"] = factory._bindAddress
        endpoint = HostnameEndpoint(factory._reactor, self._address, uri.port, **kwargs)
        if uri.scheme == b"https":
            creator = factory._policyForHTTPS.creatorForNetloc(uri.host, uri.port)
            return wrapClientTLS(creator, endpoint)
        return endpoint

    def _requestWithEndpoint(self, key: Any, endpoint: Any, *args: Any) -> Any:
        return super()._requestWithEndpoint(key + (self._address,), endpoint, *args)


class _PinnedScrapyAgent(_ScrapyAgent):
    def _get_agent(self, request: Request, timeout: float) -> Any:
        address = request.meta.get("polite_ip")
        if not address or request.meta.get("proxy"):
            return super()._get_agent(request, timeout)
        from twisted.internet import reactor

        bindaddress = http11.normalize_bind_address(request.meta.get("bindaddress") or self._bindAddress)
        return _PinnedAgent(address=address, reactor=reactor, contextFactory=self._contextFactory,
                            connectTimeout=timeout, bindAddress=bindaddress, pool=self._pool)


class PinnedHTTP11DownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler, connecting each booked request to ``meta['polite_ip']``.

    Installed for ``http`` and ``https`` by the add-on. Raises ``NotConfigured`` without a Twisted
    reactor (as Scrapy's handler does).
    """

    async def download_request(self, request: Request) -> Response:
        pacer = find_pacer(self._crawler)
        if (pacer is not None and request.meta.get("polite_burst") and pacer.throttled_since(request)
                and pacer.can_defer(request)):
            # Decided before its host throttled, queued in Scrapy's slot since: do not send it into the backoff.
            raise Redefer(request.url)
        # Scrapy's HTTP11DownloadHandler.download_request, with the pinning agent.
        spider = self._crawler.spider
        agent = _PinnedScrapyAgent(
            contextFactory=self._contextFactory,
            bindAddress=self._bind_address,
            pool=self._pool,
            maxsize=getattr(spider, "download_maxsize", self._default_maxsize),
            warnsize=getattr(spider, "download_warnsize", self._default_warnsize),
            fail_on_dataloss=self._fail_on_dataloss,
            crawler=self._crawler,
            tls_verbose_logging=self._tls_verbose_logging,
        )
        try:
            with http11.wrap_twisted_exceptions():
                return await http11.maybe_deferred_to_future(agent.download_request(request))
        except http11.ResponseDataLossError:
            if not self._fail_on_dataloss_warned:
                http11.logger.warning(http11.get_dataloss_msg(request.url))
                self._fail_on_dataloss_warned = True
            raise
