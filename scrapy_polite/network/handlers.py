"""Which download handler runs each scheme, and what the add-on can guarantee with it (docs/spec.md §4.1).

Every handler gets the same pacing (booking, deferral, throttles, quotas, the pace table, the event log):
that is the middleware's and the extension's, whatever downloads the request. What differs is the address
rule, by what the handler lets the add-on control:

* **pinned**: the add-on makes the connection itself, to the booked address — Scrapy's HTTP/1.1 handler and
  Scrapy's HTTP/2 handler, both replaced by ours (:mod:`scrapy_polite.handler`); and scrapy-playwright, whose
  browser reaches the network only through the crawl's own proxy (:mod:`scrapy_polite.browser_proxy`), which
  connects to the address it checked (unless :func:`~scrapy_polite.browser.proxy_refusal` says why it cannot);
* **checked**: the handler resolves host names itself (httpx, aiohttp, scrapy-playwright without the proxy, or a
  handler the user names in ``POLITE_CHECKED_HANDLERS``): the add-on still resolves, applies the address rules and books
  on that address before the request, but the handler's own lookup may answer another address (the
  rebinding window). Each such request is counted (``polite/unpinned/<handler>``), and a response that
  reports the address it came from is checked again after the fact;
* any other handler is **refused**: the crawl does not start (docs/spec.md §7).
"""

from __future__ import annotations

import ipaddress
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from .._compat import HAS_H2
from ..browser import proxy_refusal
from ..browser_proxy import CHROMIUM_ARGS, ProxyOptions
from ..policy import host_key
from ..settings import checked_handlers
from ..vocabulary import HOST_META, IP_META

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

    from .addresses import AddressFilter

__all__ = [
    "CHECKED",
    "HANDLER_FAMILIES",
    "PINNED",
    "PINNED_H2_HANDLER",
    "PINNED_HTTP11_HANDLER",
    "PLAYWRIGHT_HANDLER",
    "SchemeMode",
    "UnpinnedRequests",
    "UnsafeHandlerError",
    "component_path",
    "handler_modes",
    "is_playwright_handler",
    "log_modes",
    "own_handler_schemes",
    "proxy_context",
    "same_address",
]

logger = logging.getLogger(__name__)

PINNED = "pinned"
CHECKED = "checked"

PINNED_HTTP11_HANDLER = "scrapy_polite.handler.PinnedHTTP11DownloadHandler"
PINNED_H2_HANDLER = "scrapy_polite.handler.PinnedH2DownloadHandler"
PLAYWRIGHT_HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
#: Scrapy's HTTP/1.1 handler: it and its subclasses send a request with ``meta['proxy']`` to that proxy.
_HTTP11 = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"


@dataclass(frozen=True)
class _Family:
    """A handler the add-on knows: its mode, the stats label, and the pinned handler that replaces it."""

    mode: str
    label: str
    replacement: str | None = None
    #: The handler sends a request with ``meta['proxy']`` to that proxy, which resolves the host (Scrapy's HTTP/1.1,
    #: httpx and aiohttp handlers); scrapy-playwright ignores it and Scrapy's HTTP/2 handler refuses it.
    honours_proxy: bool = False


#: Every handler the add-on knows (docs/guides/safety.md, "Download handlers"), by import path.
HANDLER_FAMILIES: dict[str, _Family] = {
    _HTTP11: _Family(PINNED, "http11", PINNED_HTTP11_HANDLER, honours_proxy=True),
    "scrapy.core.downloader.handlers.http.HTTPDownloadHandler": _Family(PINNED, "http11", PINNED_HTTP11_HANDLER,
                                                                      honours_proxy=True),
    PINNED_HTTP11_HANDLER: _Family(PINNED, "http11", PINNED_HTTP11_HANDLER, honours_proxy=True),
    "scrapy.core.downloader.handlers.http2.H2DownloadHandler": _Family(PINNED, "http2", PINNED_H2_HANDLER),
    PINNED_H2_HANDLER: _Family(PINNED, "http2", PINNED_H2_HANDLER),
    "scrapy.core.downloader.handlers._httpx.HttpxDownloadHandler": _Family(CHECKED, "httpx", honours_proxy=True),
    "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler": _Family(CHECKED, "aiohttp",
                                                                               honours_proxy=True),
    PLAYWRIGHT_HANDLER: _Family(CHECKED, "playwright"),
}

#: The schemes whose handler decides the address rule (the others name no network host, or are not HTTP).
SCHEMES = ("http", "https")


class UnsafeHandlerError(RuntimeError):
    """A configured download handler would bypass the address rules (docs/spec.md §4.1)."""


@dataclass(frozen=True)
class SchemeMode:
    """How one scheme is downloaded.

    Attributes:
        scheme: ``"http"`` or ``"https"``.
        mode: :data:`PINNED` or :data:`CHECKED`.
        handler: the import path of the handler that will run (ours for a pinned scheme).
        label: the handler's short name, for stats (``polite/unpinned/<label>``) and the log.
        component: what ``DOWNLOAD_HANDLERS[scheme]`` is set to: our handler's path for a pinned scheme,
            the configured entry itself (a path or a class object) for a checked one.
        browser: scrapy-playwright's handler through the crawl's proxy (pinned): the browser follows
            redirects itself, and its contexts must use the proxy.
        proxy: then, the crawl's proxy options once the add-on installed them (``PLAYWRIGHT_LAUNCH_OPTIONS['proxy']``).
        honours_proxy: the handler sends a request with ``meta['proxy']`` to that proxy (a handler the add-on knows:
            Scrapy's HTTP/1.1, httpx, aiohttp), so the proxy, not the handler, resolves the request's host.
    """

    scheme: str
    mode: str
    handler: str
    label: str
    component: Any = None
    browser: bool = False
    proxy: Any = field(default=None, compare=False)
    honours_proxy: bool = False

    def __post_init__(self) -> None:
        if self.component is None:
            object.__setattr__(self, "component", self.handler)


def component_path(component: object) -> str:
    """The import path of a component given as a path or as a class."""
    if isinstance(component, str):
        return component
    return f"{getattr(component, '__module__', '?')}.{getattr(component, '__qualname__', component)}"


def is_playwright_handler(handler: object) -> bool:
    """Whether ``handler`` (an import path or a class) is scrapy-playwright's handler or a subclass of it, so
    that the browser's own requests need the guard (docs/spec.md §4.1). False when scrapy-playwright is not
    installed or ``handler`` cannot be loaded (Scrapy then reports it)."""
    return component_path(handler) == PLAYWRIGHT_HANDLER or _is_subclass(handler, PLAYWRIGHT_HANDLER)


def _is_subclass(handler: object, base_path: str) -> bool:
    """Whether ``handler`` (an import path or a class) is the class ``base_path`` names or a subclass of it; False
    when either cannot be loaded."""
    try:
        base = load_object(base_path)
        cls = load_object(handler) if isinstance(handler, str) else handler
    except (ImportError, NameError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def handler_modes(settings: Any) -> dict[str, SchemeMode]:
    """The mode of ``http`` and ``https`` under ``settings`` (``DOWNLOAD_HANDLERS``,
    ``POLITE_CHECKED_HANDLERS``, ``POLITE_ALLOW_PRIVATE``), docs/spec.md §4.1.

    A scheme without a handler entry runs our pinned HTTP/1.1 handler. A known handler has its family's
    mode (scrapy-playwright's: pinned through the crawl's proxy unless
    :func:`~scrapy_polite.browser.proxy_refusal` says why not, then checked); a handler listed in
    ``POLITE_CHECKED_HANDLERS`` is checked; any other is refused, unless
    ``POLITE_ALLOW_PRIVATE`` is set (every address is allowed then: the handler is counted as checked).

    Raises:
        UnsafeHandlerError: naming the scheme, the handler and the fixes; also for Scrapy's HTTP/2 handler
            without the h2 package (``pip install scrapy-polite[http2]``).
        SettingsError: a malformed ``POLITE_CHECKED_HANDLERS``.
    """
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    accepted = set(checked_handlers(settings))
    modes: dict[str, SchemeMode] = {}
    for scheme in SCHEMES:
        configured = handlers.get(scheme)
        path = PINNED_HTTP11_HANDLER if configured is None else component_path(configured)
        family = HANDLER_FAMILIES.get(path)
        if family is not None and family.replacement == PINNED_H2_HANDLER and not HAS_H2:
            raise UnsafeHandlerError(
                f"DOWNLOAD_HANDLERS[{scheme!r}] = {path!r} is Scrapy's HTTP/2 handler, which needs the h2 package, "
                "not installed: pip install scrapy-polite[http2] (or remove that DOWNLOAD_HANDLERS entry to use "
                "HTTP/1.1)")
        if family is not None and path == PLAYWRIGHT_HANDLER and proxy_refusal(settings) is None:
            proxy = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS").get("proxy")
            modes[scheme] = SchemeMode(scheme, PINNED, path, family.label, configured, browser=True,
                                       proxy=proxy if isinstance(proxy, ProxyOptions) else None)
        elif family is not None:
            modes[scheme] = SchemeMode(scheme, family.mode, family.replacement or path, family.label,
                                       family.replacement or configured or path, honours_proxy=family.honours_proxy)
        elif path in accepted or settings.getbool("POLITE_ALLOW_PRIVATE"):
            modes[scheme] = SchemeMode(scheme, CHECKED, path, path.rsplit(".", 1)[-1].lower(), configured,
                                       honours_proxy=_is_subclass(configured or path, _HTTP11)
                                       and not is_playwright_handler(configured or path))
        else:
            raise UnsafeHandlerError(
                f"scrapy-polite does not know DOWNLOAD_HANDLERS[{scheme!r}] = {path!r}: that handler may resolve "
                "host names itself, so non-public addresses could be reached. Remove that DOWNLOAD_HANDLERS "
                f"entry (scrapy-polite installs {PINNED_HTTP11_HANDLER}), or accept it with its weaker address "
                f"check: POLITE_CHECKED_HANDLERS = [{path!r}] (docs/guides/safety.md, \"Download handlers\").")
    return modes


def own_handler_schemes(settings: Any) -> frozenset[str]:
    """The schemes whose download handler (``DOWNLOAD_HANDLERS`` over Scrapy's ``DOWNLOAD_HANDLERS_BASE``) is one of
    the add-on's pinned handlers, which record the responses they download themselves (docs/spec.md §5,
    "Recording"); every other scheme's responses are recorded from Scrapy's ``response_downloaded`` signal."""
    handlers = settings.getwithbase("DOWNLOAD_HANDLERS")
    own = (PINNED_HTTP11_HANDLER, PINNED_H2_HANDLER)
    return frozenset(scheme for scheme in handlers
                     if handlers[scheme] is not None and component_path(handlers[scheme]) in own)


def log_modes(modes: dict[str, SchemeMode]) -> None:
    """Log the start-up line naming each scheme's mode, and one INFO line per checked handler saying what
    remains unguaranteed (docs/guides/safety.md, "Download handlers")."""
    logger.info("scrapy-polite: address rules per scheme: %s",
                ", ".join(f"{m.scheme}: {m.mode} ({m.label})" for m in modes.values()))
    seen: set[str] = set()
    if any(m.browser for m in modes.values()):
        logger.info("scrapy-polite: scrapy-playwright's browser reaches the network only through scrapy-polite's "
                    "proxy: every connection it makes (page, sub-requests, redirects, popups, WebSockets, service "
                    "workers) is checked and connected to the address it was checked on")
    for m in modes.values():
        if m.mode != CHECKED or m.handler in seen:
            continue
        seen.add(m.handler)
        schemes = "/".join(o.scheme for o in modes.values() if o.handler == m.handler)
        logger.info(
            "scrapy-polite: %s (%s) resolves host names itself: each request's host is resolved and checked, "
            "and the request booked on that address, before it is sent, but the handler's own lookup is not "
            "pinned to it (a DNS answer that changes in between is not caught before the request; such "
            "requests are counted in polite/unpinned/%s)", m.handler, schemes, m.label)


class UnpinnedRequests:
    """Counts the requests a *checked* handler sends (``polite/unpinned/<handler>``) and checks the address
    a response says it came from (docs/spec.md §4.1).

    Args:
        modes: each scheme's mode (:func:`handler_modes`).
        address_filter: the crawl's address rules.
        inc: the crawl's counter (``inc("unpinned/httpx")`` adds to ``polite/unpinned/httpx``).
    """

    def __init__(self, modes: dict[str, SchemeMode], address_filter: AddressFilter,
                 inc: Callable[[str], None]) -> None:
        self._checked = {scheme: mode for scheme, mode in modes.items() if mode.mode == CHECKED}
        #: The schemes whose responses may come from another host (a checked handler, or scrapy-playwright's
        #: browser, which follows redirects itself, pinned too).
        self._redirecting = {scheme for scheme, mode in modes.items() if mode.browser or mode.mode == CHECKED}
        #: Some scheme is downloaded by a checked handler or by scrapy-playwright's browser (each is in
        #: :attr:`_redirecting`). False in a crawl whose every handler is pinned: then every question here answers
        #: "nothing" (no count, no refusal, no foreign response), and the middleware asks none.
        self.active = bool(self._redirecting)
        #: scrapy-playwright through the crawl's proxy: the proxy options, by scheme (a request's own persistent
        #: browser context gets them too).
        self._proxied = {scheme: mode.proxy for scheme, mode in modes.items() if mode.browser}
        #: The schemes whose handler sends a request with ``meta['proxy']`` to that proxy (:meth:`through_proxy`).
        self._proxy_schemes = frozenset(scheme for scheme, mode in modes.items() if mode.honours_proxy)
        #: The schemes scrapy-playwright downloads: its browser only for ``meta['playwright']``, Scrapy's HTTP/1.1
        #: handler for any other request (which honours ``meta['proxy']``).
        self._playwright_schemes = frozenset(scheme for scheme, mode in modes.items()
                                             if is_playwright_handler(mode.component))
        self._address_filter = address_filter
        self._inc = inc
        # The verdict on each response (weakly held): asked before it is recorded (the extension) and
        # again when it is passed on (the middleware), counted once.
        self._verdicts: weakref.WeakKeyDictionary[Response, str | None] = weakref.WeakKeyDictionary()

    def mode_of(self, url: str) -> SchemeMode | None:
        """The checked mode that downloads ``url``, or None (pinned, or a scheme without a network host)."""
        if not self._checked:
            return None
        scheme = url.split(":", 1)[0].lower()
        return self._checked.get(scheme)

    def through_proxy(self, request: Request) -> bool:
        """Whether ``request`` goes to its ``meta['proxy']``, which then resolves its host: its scheme's handler
        honours the proxy (:attr:`SchemeMode.honours_proxy`; an ``s3`` URL is downloaded by the ``https`` handler).
        Scrapy's FTP handler, scrapy-playwright's browser (``meta['playwright']``; scrapy-playwright downloads any
        other request with Scrapy's HTTP/1.1 handler, which honours the proxy) and handlers the add-on does not know
        connect to the host themselves whatever ``meta['proxy']`` says: their requests are resolved and checked
        (docs/spec.md §4)."""
        meta = request.meta
        if not meta.get("proxy"):
            return False
        scheme = request.url.split(":", 1)[0].lower()
        if scheme in self._playwright_schemes:
            return not meta.get("playwright")
        return ("https" if scheme == "s3" else scheme) in self._proxy_schemes

    def resolves_itself(self, request: Request) -> bool:
        """Whether ``request``'s handler resolves its host itself (checked): then every address of the
        host's answer must be allowed, not only the booked one (docs/spec.md §4.1)."""
        return bool(self._checked) and self.mode_of(request.url) is not None

    def sent(self, request: Request) -> None:
        """Count ``request`` (booked on ``meta['polite_ip']``) as sent through a checked handler, if it is. A
        scrapy-playwright request through the crawl's proxy that makes a persistent context of its own
        (``meta['playwright_context_kwargs']`` with ``user_data_dir``: not made from the launch options) gets the
        proxy in that context too (docs/spec.md §4.1)."""
        mode = self.mode_of(request.url) if self._checked else None
        if mode is not None:
            self._inc(f"unpinned/{mode.label}")
        elif self._proxied:
            options = self._proxied.get(request.url.split(":", 1)[0].lower())
            proxy_context(request.meta.get("playwright_context_kwargs"), options)

    def foreign_response(self, request: Request, response: Response) -> bool:
        """Whether ``response`` comes from another host than the booked one (``meta['polite_host']``): a
        handler that follows redirects itself (scrapy-playwright's browser does, pinned or checked) answers with the
        last hop's response. Counted (``polite/unpinned/redirected``); its status and headers are not the
        booked host's, so they are not recorded on it (docs/spec.md §4.1)."""
        if request.url.split(":", 1)[0].lower() not in self._redirecting:
            return False
        booked = request.meta.get(HOST_META)
        url = getattr(response, "url", None)
        if booked is None or not url or host_key(url) == booked:
            return False
        self._inc("unpinned/redirected")
        return True

    def refusal(self, request: Request, response: Response) -> str | None:
        """Why ``response`` must not be passed on, nor recorded on the request's host, or None. A checked
        handler that reports the address it connected to (``response.ip_address``: httpx, aiohttp,
        scrapy-playwright) is checked after the fact: another address than the booked one (compared as IP
        addresses: ``::ffff:a.b.c.d`` is ``a.b.c.d``) is counted (``polite/unpinned/address_changed``), a
        non-public one too (``polite/unpinned/refused_response``) and refused here. Asked again about the
        same response, it answers the same without counting again."""
        if not self._checked or self.mode_of(request.url) is None:
            return None
        if response in self._verdicts:
            return self._verdicts[response]
        reason = self._verdicts[response] = self._refusal(request, response)
        return reason

    def _refusal(self, request: Request, response: Response) -> str | None:
        address = getattr(response, "ip_address", None)
        booked = request.meta.get(IP_META)
        if address is None or booked is None or same_address(address, booked):
            return None
        self._inc("unpinned/address_changed")
        if self._address_filter.allows(address):
            return None
        self._inc("unpinned/refused_response")
        address = _ip(address)  # ::ffff:a.b.c.d named as a.b.c.d
        return (f"the handler connected to {address}, not the booked {booked}, and {address} is not an allowed "
                "address (the host's DNS answer changed between the check and the handler's own lookup)")


def proxy_context(kwargs: Any, options: ProxyOptions | None) -> None:
    """Give a request's own persistent browser context (``playwright_context_kwargs`` with ``user_data_dir``,
    launched with those options alone) the crawl's proxy and Chromium's flags for it. A context made from the
    launched browser uses the launch options' proxy already; one that names a proxy of its own is the project's
    (as ``meta['proxy']`` is: docs/spec.md §4), left alone."""
    if options is None or not isinstance(kwargs, dict) or not kwargs.get("user_data_dir") or kwargs.get("proxy"):
        return
    kwargs["proxy"] = options
    kwargs["args"] = [*kwargs.get("args", ()), *CHROMIUM_ARGS]


def same_address(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` (IP address objects or texts) are one address: compared by :mod:`ipaddress`,
    an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``, RFC 4291 §2.5.5.2) as its IPv4 address; text that is
    not an address is compared as text."""
    return _ip(a) == _ip(b)


def _ip(value: object) -> object:
    try:
        ip = ipaddress.ip_address(str(value).strip("[]"))
    except ValueError:
        return str(value)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
