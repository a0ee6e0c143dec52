"""The address rules for a browser's own requests (scrapy-playwright; docs/spec.md §4.1).

A page rendered by scrapy-playwright makes requests of its own — scripts, images, XHR/``fetch``, redirects,
popups, WebSockets, service workers — that never pass through Scrapy's downloader. Two ways to hold them to the
address rules, by what the settings allow:

* **pinned** (the usual case: Chromium launched by scrapy-playwright): every browser context goes through the
  crawl's own forward proxy (:class:`~scrapy_polite.browser_proxy.BrowserProxy`), which checks each target with
  the add-on's resolver and connects to the address it checked; :func:`proxy_refusal` says when that cannot be
  done, and :func:`bind_browser` starts the proxy with the spider and stops it at close;
* **checked** (a remote browser, another browser type or provider, a browser proxy of the project's own): the
  add-on installs a :class:`BrowserRequestGuard` as scrapy-playwright's ``PLAYWRIGHT_ABORT_REQUEST``, which aborts
  every browser request whose host

  - the URL Standard refuses (docs/spec.md §1), or
  - is a non-public address, or a name with any non-public address in its answer (the browser resolves the
    name itself and may connect to any of them: docs/spec.md §4.1), or that does not resolve,

  each counted in ``polite/unpinned/browser_aborted``. Playwright asks the predicate only about the first URL of a
  redirect chain, and popups (``window.open``), WebSockets and service workers are not intercepted (the add-on
  blocks service workers in ``PLAYWRIGHT_CONTEXTS``): docs/guides/safety.md, "Known limits of the browser guard".

Neither needs an import of Playwright: the guard reads only the request's ``url``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from scrapy import signals
from scrapy.utils.misc import load_object

from .browser_proxy import CHROMIUM_ARGS, BrowserProxy, ProxyOptions
from .crawl.reactor import await_deferred
from .network.addresses import AddressFilter
from .network.hosts import InvalidHost, url_host
from .resolver import PublicHostnameResolver

__all__ = ["ABORTED_STAT", "BrowserRequestGuard", "bind_browser", "find_browser_proxy", "proxy_refusal"]

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


#: scrapy-playwright's default browser provider (its only one before 0.0.48's pluggable providers).
_DEFAULT_PROVIDER = "scrapy_playwright.provider.PlaywrightBrowserProvider"


def proxy_refusal(settings: Any) -> str | None:
    """Why scrapy-playwright's browser cannot be given the crawl's proxy under ``settings`` (the browser's own
    requests are then only *checked*), or None: it can, and the browser is *pinned* (docs/spec.md §4.1).

    The proxy needs a Chromium that scrapy-playwright launches on this machine with the launch options and the
    context options the add-on writes: not a remote browser (``PLAYWRIGHT_CDP_URL``, ``PLAYWRIGHT_CONNECT_URL``),
    not another browser type or provider, and no browser proxy of the project's own (in ``PLAYWRIGHT_LAUNCH_OPTIONS``
    or a context of ``PLAYWRIGHT_CONTEXTS``)."""
    for name in ("PLAYWRIGHT_CDP_URL", "PLAYWRIGHT_CONNECT_URL"):
        if settings.get(name):
            return f"{name} connects to a browser elsewhere, which cannot be given the crawl's loopback proxy"
    browser_type = settings.get("PLAYWRIGHT_BROWSER_TYPE") or "chromium"
    if browser_type != "chromium":
        return f"PLAYWRIGHT_BROWSER_TYPE is {browser_type!r}: the proxy is installed for chromium only"
    provider = settings.get("PLAYWRIGHT_BROWSER_PROVIDER")
    if provider and _path(provider) != _DEFAULT_PROVIDER:
        return f"PLAYWRIGHT_BROWSER_PROVIDER is {_path(provider)}, which may launch the browser its own way"
    options = {"PLAYWRIGHT_LAUNCH_OPTIONS": settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")}
    for name, kwargs in settings.getdict("PLAYWRIGHT_CONTEXTS").items():
        options[f"PLAYWRIGHT_CONTEXTS[{name!r}]"] = dict(kwargs or {})
    for where, kwargs in options.items():
        proxy = kwargs.get("proxy")
        if proxy and not isinstance(proxy, ProxyOptions):
            return f"{where} sets a proxy of its own"
        flags = [arg for arg in kwargs.get("args") or ()
                 if str(arg).split("=", 1)[0] in _PROXY_FLAGS and arg not in CHROMIUM_ARGS]
        if flags:  # Chromium takes the last of a repeated flag: these would override the crawl's proxy
            return f"{where} gives Chromium proxy flags of its own ({', '.join(map(str, flags))})"
    return None


#: Chromium's flags that choose its proxy: a project's own would override the crawl's.
_PROXY_FLAGS = frozenset({"--proxy-server", "--no-proxy-server", "--proxy-pac-url", "--proxy-auto-detect",
                          "--proxy-bypass-list"})


def _path(component: object) -> str:
    if isinstance(component, str):
        return component
    return f"{getattr(component, '__module__', '?')}.{getattr(component, '__qualname__', component)}"


def find_browser_proxy(settings: Any) -> BrowserProxy | None:
    """The crawl's :class:`~scrapy_polite.browser_proxy.BrowserProxy`, which the add-on put in
    ``PLAYWRIGHT_LAUNCH_OPTIONS`` (its ``proxy``), or None."""
    proxy = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS").get("proxy")
    return proxy.proxy if isinstance(proxy, ProxyOptions) else None


def bind_browser(crawler: Any, *, address_filter: AddressFilter, resolver: Callable[[], PublicHostnameResolver],
                 inc: Callable[[str], None]) -> None:
    """Bind the browser's rule of the crawl (the proxy, or the guard) to the crawl's address rules, resolver and
    counter; the proxy listens from ``spider_opened`` (before ``engine_started``, when scrapy-playwright launches
    the browser) to ``spider_closed``, which also logs the browser's connections per host."""
    guard = crawler.settings.get("PLAYWRIGHT_ABORT_REQUEST")
    if isinstance(guard, BrowserRequestGuard):
        guard.bind(address_filter=address_filter, resolver=resolver, inc=inc)
    proxy = find_browser_proxy(crawler.settings)
    if proxy is None:
        return
    proxy.bind(address_filter=address_filter, resolver=resolver, inc=inc)
    lifecycle = _ProxyLifecycle(proxy)
    crawler.signals.connect(lifecycle.spider_opened, signal=signals.spider_opened)
    crawler.signals.connect(lifecycle.spider_closed, signal=signals.spider_closed)
    proxy.lifecycle = lifecycle  # type: ignore[attr-defined]  # signals hold their receivers weakly


class _ProxyLifecycle:
    """Starts the crawl's proxy when the spider opens and stops it when the spider closes."""

    def __init__(self, proxy: BrowserProxy) -> None:
        self.proxy = proxy

    def spider_opened(self, spider: Any) -> None:
        server = self.proxy.start()
        logger.info("scrapy-polite: the browser's requests go through scrapy-polite's proxy at %s: each is "
                    "checked and connected to the address it was checked on", server)

    async def spider_closed(self, spider: Any, reason: str) -> None:
        if self.proxy.per_host:
            logger.info("scrapy-polite: the browser's connections per host: %s", self.proxy.summary())
        await await_deferred(self.proxy.stop())
