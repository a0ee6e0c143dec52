"""The address rules for a browser's own requests (scrapy-playwright; docs/spec.md §4.1).

A page rendered by scrapy-playwright makes requests of its own — scripts, images, XHR/``fetch`` — that never
pass through Scrapy's downloader. scrapy-playwright asks its ``PLAYWRIGHT_ABORT_REQUEST`` predicate about
every one of them (and about the page request itself) before the browser sends it; the add-on installs a
:class:`BrowserRequestGuard` there, which aborts every browser request whose host

* the URL Standard refuses (docs/spec.md §1), or
* is a non-public address, or a name with any non-public address in its answer (the browser resolves the
  name itself and may connect to any of them: docs/spec.md §4.1), or that does not resolve,

each counted in ``polite/unpinned/browser_aborted``. A page's direct request for ``169.254.169.254`` is
then aborted; but Playwright asks the predicate only about the first URL of a redirect chain (an allowed URL
redirecting to an internal address reaches it), and popups (``window.open``), WebSockets and service workers
are not intercepted (the add-on blocks service workers in ``PLAYWRIGHT_CONTEXTS``): docs/guides/safety.md,
"Known limits of the browser guard". The browser resolves names itself, so, as for every *checked* handler, a DNS
answer that changes between the check and the browser's own lookup is not caught.

The guard needs no import of Playwright: it reads only the request's ``url``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from scrapy.utils.misc import load_object

from .addresses import AddressFilter
from .hosts import InvalidHost, url_host
from .reactor import await_deferred
from .resolver import PublicHostnameResolver

__all__ = ["ABORTED_STAT", "BrowserRequestGuard"]

logger = logging.getLogger(__name__)

#: The stat counting aborted browser requests (under ``polite/``).
ABORTED_STAT = "unpinned/browser_aborted"


class BrowserRequestGuard:
    """scrapy-playwright's ``PLAYWRIGHT_ABORT_REQUEST`` predicate: ``await guard(request)`` is True (abort)
    for a browser request the address rules refuse (docs/spec.md §4.1).

    Built by the add-on for a crawl whose handler is scrapy-playwright and bound to the crawl by its pacer
    (:meth:`bind`). Before it is bound, every request with a network host is aborted (fail closed).

    Args:
        then: the project's own ``PLAYWRIGHT_ABORT_REQUEST`` (a callable or its import path), asked about the
            requests the guard lets through; None for none.
    """

    def __init__(self, then: Any = None) -> None:
        self._then = then
        self._address_filter: AddressFilter | None = None
        self._resolver: Callable[[], PublicHostnameResolver] | None = None
        self._inc: Callable[[str], None] = lambda _key: None
        self._logged: set[str] = set()

    def bind(self, *, address_filter: AddressFilter, resolver: Callable[[], PublicHostnameResolver],
             inc: Callable[[str], None]) -> None:
        """Use the crawl's address rules, its resolver (a getter: raises ``ResolverNotInstalled`` when the
        process's resolver is not ours) and its counter (``inc("unpinned/browser_aborted")``)."""
        self._address_filter = address_filter
        self._resolver = resolver
        self._inc = inc

    async def __call__(self, request: Any) -> bool:
        """Whether to abort the browser's ``request`` (a Playwright ``Request``; only its ``url`` is read):
        True when the address rules refuse its host (counted), else the project's own predicate's answer
        (False without one). Never raises for a refused URL: a resolution failure aborts the request."""
        url = str(getattr(request, "url", ""))
        reason = await self._refusal(url)
        if reason is not None:
            self._inc(ABORTED_STAT)
            level = logging.DEBUG if reason in self._logged or len(self._logged) >= 100 else logging.WARNING
            self._logged.add(reason)
            logger.log(level, "scrapy-polite: aborted the browser's request for %s: %s", url, reason)
            return True
        then = self._then
        if then is None:
            return False
        if isinstance(then, str):
            then = self._then = load_object(then)
        result = then(request)
        if inspect.isawaitable(result):
            result = await result
        return bool(result)

    async def _refusal(self, url: str) -> str | None:
        """Why ``url`` may not be fetched by the browser, or None when it may."""
        try:
            host = url_host(url)
        except InvalidHost as exc:
            return exc.reason
        if host is None:  # data:, about:, blob: … : no network host
            return None
        address_filter, resolver = self._address_filter, self._resolver
        if address_filter is None or resolver is None:
            return "the crawl's address rules are not ready yet"
        if host.ip is not None:
            return None if address_filter.allows(host.ip) else f"{host.key} is not a public address"
        try:
            # The browser resolves the name itself and may connect to any address of the answer: every one
            # must be allowed (docs/spec.md §4.1), by the process's rules and the crawl's.
            addresses = await await_deferred(resolver().resolve_whole(host.key))
        except Exception as exc:  # BlockedHost, MixedAnswer, a DNS failure, ResolverNotInstalled: it may not go
            return f"{host.key} was not resolved to allowed addresses only ({exc})"
        _kept, dropped = address_filter.split(addresses)
        if dropped:
            return f"{host.key} resolves to non-public addresses ({', '.join(dropped)})"
        return None
