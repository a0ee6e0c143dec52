"""The Scrapy add-on: ``ADDONS = {"scrapy_polite.Addon": 0}`` enables everything with defaults (docs/spec.md §7).

It installs

* :class:`~scrapy_polite.middleware.PoliteDownloaderMiddleware` at downloader-middleware priority 950 (or
  after the last other downloader middleware configured above that);
* :class:`~scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware` in place of Scrapy's ``RobotsTxtMiddleware`` (same
  priority; the robots.txt lifecycle of RFC 9309, docs/spec.md §5, "The robots.txt lifecycle", and the early
  deferral), unless robots.txt handling is disabled, turned off by the project or is a project's own subclass of
  Scrapy's: with ``ROBOTSTXT_OBEY``, :class:`~scrapy_polite.middleware.PoliteEarlyDeferMiddleware` at 50 then does
  the early deferral;
* :class:`~scrapy_polite.extension.PoliteExtension`;
* :class:`~scrapy_polite.scheduler.PoliteScheduler` as ``SCHEDULER``, wrapping the project's own scheduler
  (moved to ``POLITE_SCHEDULER_BASE``);
* the ``POLITE_*`` defaults (:data:`scrapy_polite.settings.declaration.DEFAULTS`), at add-on priority, so project and
  spider settings override them;
* the ``scrapy check`` contracts ``@polite_delay``, ``@public_only`` and ``@paced_requests``
  (:mod:`scrapy_polite.contracts`) in ``SPIDER_CONTRACTS`` of the process settings.

A configuration that cannot run safely or an invalid setting stops the crawl before any request, with one
ERROR line (:func:`~scrapy_polite.startup.refuse_to_start`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

from ._compat import crawler_engine
from .browser import BrowserRequestGuard, proxy_refusal
from .browser_proxy import CHROMIUM_ARGS, BrowserProxy, ProxyOptions
from .crawl.seams import ResolverNotInstalled
from .network.handlers import (
    CHECKED,
    SchemeMode,
    UnsafeHandlerError,
    component_path,
    handler_modes,
    is_playwright_handler,
    log_modes,
)
from .resolver import PublicHostnameResolver
from .settings import (
    DEFAULTS,
    DNSConfig,
    PoliteConfig,
    SettingsError,
    check_setting_names,
    polite_enabled,
)
from .startup import refuse_to_start

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings, Settings

    from .network.addresses import AddressFilter

__all__ = ["Addon", "CONTRACTS", "UnsafeHandlerError", "check_resolver"]

logger = logging.getLogger(__name__)

MIDDLEWARE = "scrapy_polite.middleware.PoliteDownloaderMiddleware"
EXTENSION = "scrapy_polite.extension.PoliteExtension"
SCHEDULER = "scrapy_polite.scheduler.PoliteScheduler"
RESOLVER = "scrapy_polite.resolver.PublicHostnameResolver"
#: The setting through which scrapy-playwright asks whether to abort a browser request.
PLAYWRIGHT_ABORT = "PLAYWRIGHT_ABORT_REQUEST"
PLAYWRIGHT_CONTEXTS = "PLAYWRIGHT_CONTEXTS"
PLAYWRIGHT_LAUNCH = "PLAYWRIGHT_LAUNCH_OPTIONS"
MIDDLEWARE_PRIORITY = 950
EARLY_MIDDLEWARE = "scrapy_polite.middleware.PoliteEarlyDeferMiddleware"
EARLY_MIDDLEWARE_PRIORITY = 50
ROBOTS_MIDDLEWARE = "scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware"
SCRAPY_ROBOTS_MIDDLEWARE = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
#: The ``scrapy check`` contracts (docs/guides/contracts.md), by ``SPIDER_CONTRACTS`` priority.
CONTRACTS = {
    "scrapy_polite.contracts.PoliteDelayContract": 50,
    "scrapy_polite.contracts.PublicOnlyContract": 51,
    "scrapy_polite.contracts.PacedRequestsContract": 52,
}


class Addon:
    """Enables scrapy-polite in a Scrapy project or spider."""

    @classmethod
    def update_pre_crawler_settings(cls, settings: BaseSettings) -> None:
        """Install :class:`~scrapy_polite.resolver.PublicHostnameResolver` as ``TWISTED_DNS_RESOLVER``.

        The resolver is per process and Scrapy builds it from the process settings, so this runs only
        for ``ADDONS`` in the project settings (not a spider's ``custom_settings``). A resolver the project
        configured explicitly is kept, and the crawl then refuses to start (docs/spec.md §7).

        Also registers the contracts in ``SPIDER_CONTRACTS``: ``scrapy check`` reads them from the process
        settings. With an invalid address or DNS setting the resolver is not installed (it could not be
        built): the crawl then refuses to start, naming the setting."""
        _register_contracts(settings)
        try:
            if not polite_enabled(settings):
                return
            DNSConfig.from_settings(settings)
        except SettingsError:
            return  # reported by update_settings, before any request
        if (settings.getpriority("TWISTED_DNS_RESOLVER") or 0) <= SETTINGS_PRIORITIES["addon"]:
            settings.set("TWISTED_DNS_RESOLVER", RESOLVER, priority="addon")

    def update_settings(self, settings: Settings) -> None:
        """Install the components and the ``POLITE_*`` defaults (project and spider settings win).

        Raises:
            SettingsError: a bad ``POLITE_*`` setting; UnsafeHandlerError: see :func:`_check_handlers` —
                each reported first as one ERROR line (:func:`~scrapy_polite.startup.refuse_to_start`).
        """
        for name, value in DEFAULTS.items():
            if settings.getpriority(name) is None:
                settings.set(name, value, priority="addon")
        _register_contracts(settings)
        try:
            if not polite_enabled(settings):
                return
            check_setting_names(settings)
            PoliteConfig.from_settings(settings)
            modes = _check_handlers(settings)
        except (SettingsError, UnsafeHandlerError) as exc:
            raise refuse_to_start(exc, settings) from None
        disabled = _disabled_components(settings)  # before the writes below, which settings.py's own None would lose to
        if disabled is not None:
            raise refuse_to_start(disabled, settings)
        for scheme, mode in modes.items():
            settings["DOWNLOAD_HANDLERS"][scheme] = mode.component  # a checked handler's class stays a class
        if any(mode.browser for mode in modes.values()):
            _install_browser_proxy(settings)
        # Otherwise only a checked scheme can run scrapy-playwright; a pinned one never loads it (importing
        # Playwright costs a crawl's start-up a second).
        elif any(mode.mode == CHECKED and is_playwright_handler(mode.component) for mode in modes.values()):
            reason = proxy_refusal(settings)
            if reason is not None:
                logger.warning("scrapy-polite: scrapy-playwright's browser cannot be given scrapy-polite's proxy (%s): "
                               "its own requests are only checked, by PLAYWRIGHT_ABORT_REQUEST", reason)
            _install_browser_guard(settings)
        log_modes(modes)
        settings["DOWNLOADER_MIDDLEWARES"][MIDDLEWARE] = _last_priority(settings)
        if _install_robots_middleware(settings) and settings.getbool("ROBOTSTXT_OBEY"):
            # robots.txt is judged by a middleware other than ours: the early deferral needs a middleware of its own.
            settings["DOWNLOADER_MIDDLEWARES"][EARLY_MIDDLEWARE] = EARLY_MIDDLEWARE_PRIORITY
        settings["EXTENSIONS"][EXTENSION] = 0
        current = settings.get("SCHEDULER")
        current_path = current if isinstance(current, str) else f"{current.__module__}.{current.__qualname__}"
        if current_path != SCHEDULER:
            # Wrap the project's scheduler unless POLITE_SCHEDULER_BASE was chosen explicitly.
            if (settings.getpriority("POLITE_SCHEDULER_BASE") or 0) <= SETTINGS_PRIORITIES["addon"]:
                settings.set("POLITE_SCHEDULER_BASE", current, priority="addon")  # a class stays a class
            priority = max(settings.getpriority("SCHEDULER") or 0, SETTINGS_PRIORITIES["addon"])
            settings.set("SCHEDULER", SCHEDULER, priority=priority)


def _check_handlers(settings: Settings) -> dict[str, SchemeMode]:
    """Each scheme's handler mode (:func:`~scrapy_polite.network.handlers.handler_modes`, docs/spec.md §4.1); refuse a
    handler the add-on does not know and the user did not accept (``POLITE_CHECKED_HANDLERS``), and a crawl
    without a Twisted reactor: they would silently lose the public-address guarantee.

    Raises:
        UnsafeHandlerError: naming the handler (or setting) in use and what to change.
    """
    if not settings.getbool("POLITE_ALLOW_PRIVATE") and not settings.getbool("TWISTED_REACTOR_ENABLED", True):
        raise UnsafeHandlerError(
            "scrapy-polite needs TWISTED_REACTOR_ENABLED = True: without the Twisted reactor, Scrapy's "
            "download handlers resolve host names themselves and non-public addresses could be reached. "
            "Remove TWISTED_REACTOR_ENABLED = False, or set POLITE_ALLOW_PRIVATE = True to accept that risk.")
    return handler_modes(settings)


def _install_browser_guard(settings: Settings) -> None:
    """Set scrapy-playwright's ``PLAYWRIGHT_ABORT_REQUEST`` to a fresh
    :class:`~scrapy_polite.browser.BrowserRequestGuard` (bound to the crawl when its pacer starts), unless
    the project set its own predicate: then the project's is asked after ours (docs/spec.md §4.1). Also blocks
    service workers in the browser contexts the settings configure (:func:`_block_service_workers`)."""
    _block_service_workers(settings)
    current = settings.get(PLAYWRIGHT_ABORT)
    if isinstance(current, BrowserRequestGuard):
        return
    settings.set(PLAYWRIGHT_ABORT, BrowserRequestGuard(then=current),
                 priority=max(settings.getpriority(PLAYWRIGHT_ABORT) or 0, SETTINGS_PRIORITIES["addon"]))


def _install_browser_proxy(settings: Settings) -> None:
    """Make scrapy-playwright's browser use the crawl's :class:`~scrapy_polite.browser_proxy.BrowserProxy`
    (docs/spec.md §4.1): its options as ``proxy`` in ``PLAYWRIGHT_LAUNCH_OPTIONS`` (every context made from the
    launched browser uses it) and in each persistent context (``user_data_dir``) of ``PLAYWRIGHT_CONTEXTS`` (launched
    with its own options), with Chromium's flags for it (:data:`~scrapy_polite.browser_proxy.CHROMIUM_ARGS`: no
    implicit bypass of loopback addresses, WebRTC through the proxy only). The proxy listens from the spider's
    opening (:func:`~scrapy_polite.browser.bind_browser`). Idempotent."""
    launch = settings.getdict(PLAYWRIGHT_LAUNCH)
    if isinstance(launch.get("proxy"), ProxyOptions):
        return
    proxy = BrowserProxy(connect_timeout=settings.getfloat("DOWNLOAD_TIMEOUT", 180.0))
    launch["proxy"] = proxy.options
    launch["args"] = [*launch.get("args", ()), *CHROMIUM_ARGS]
    settings.set(PLAYWRIGHT_LAUNCH, launch,
                 priority=max(settings.getpriority(PLAYWRIGHT_LAUNCH) or 0, SETTINGS_PRIORITIES["addon"]))
    contexts = {name: dict(kwargs or {}) for name, kwargs in settings.getdict(PLAYWRIGHT_CONTEXTS).items()}
    if any(kwargs.get("user_data_dir") for kwargs in contexts.values()):
        for kwargs in contexts.values():
            if kwargs.get("user_data_dir"):
                kwargs["proxy"] = proxy.options
                kwargs["args"] = [*kwargs.get("args", ()), *CHROMIUM_ARGS]
        settings.set(PLAYWRIGHT_CONTEXTS, contexts,
                     priority=max(settings.getpriority(PLAYWRIGHT_CONTEXTS) or 0, SETTINGS_PRIORITIES["addon"]))


def _install_robots_middleware(settings: Settings) -> bool:
    """Put :class:`~scrapy_polite.robotstxt.PoliteRobotsTxtMiddleware` in place of Scrapy's ``RobotsTxtMiddleware``
    with Scrapy's add-on helper (``replace_in_component_priority_dict``), at its priority, in
    ``DOWNLOADER_MIDDLEWARES_BASE`` and, when the project lists Scrapy's there too, in ``DOWNLOADER_MIDDLEWARES``.

    Left alone: robots.txt handling disabled (Scrapy's set to None), ours set to None by the project (its opt-out),
    ours (or a subclass of ours) configured already
    (Scrapy's is then disabled: one robots.txt gate), a project's own subclass of Scrapy's (kept, with a WARNING when
    ``ROBOTSTXT_OBEY`` is on: the RFC 9309 lifecycle is then not in force).

    Returns:
        Whether a robots.txt middleware other than ours is in force (the early deferral, which ours decides, then
        needs :class:`~scrapy_polite.middleware.PoliteEarlyDeferMiddleware`: docs/spec.md §5).
    """
    scrapy_cls = load_object(SCRAPY_ROBOTS_MIDDLEWARE)
    ours_cls = load_object(ROBOTS_MIDDLEWARE)
    enabled = {}  # the robots.txt middlewares in force: class → key, over the base and the project's lists
    for key, priority in settings.getwithbase("DOWNLOADER_MIDDLEWARES").items():
        try:
            cls = load_object(key) if isinstance(key, str) else key
        except (ImportError, NameError, ValueError, AttributeError):
            continue  # Scrapy reports it when it builds the middlewares
        if isinstance(cls, type) and issubclass(cls, scrapy_cls) and priority is not None:
            enabled[cls] = key
    listed = settings.getdict("DOWNLOADER_MIDDLEWARES")
    if any(value is None and _loads_to(key, ours_cls) for key, value in listed.items()):
        return bool(enabled)  # the project turned ours off (``{PoliteRobotsTxtMiddleware: None}``): its choice
    if any(issubclass(cls, ours_cls) for cls in enabled):
        for cls, key in enabled.items():
            if cls is scrapy_cls:
                settings["DOWNLOADER_MIDDLEWARES"][key] = None
        return False
    others = [cls for cls in enabled if cls is not scrapy_cls]
    if others:
        if settings.getbool("ROBOTSTXT_OBEY"):
            logger.warning("scrapy-polite: robots.txt is handled by %s, not by %s: a robots.txt answered 5xx or that "
                           "cannot be reached is not read as \"disallow everything\" (RFC 9309), nor asked again",
                           ", ".join(component_name(c) for c in others), ROBOTS_MIDDLEWARE)
        return True
    if scrapy_cls not in enabled:
        return False  # robots.txt handling is disabled
    for name in ("DOWNLOADER_MIDDLEWARES_BASE", "DOWNLOADER_MIDDLEWARES"):
        # Both, when the project lists Scrapy's too: else the base's entry would come back from under it.
        if any(_loads_to(key, scrapy_cls) and value is not None for key, value in settings.getdict(name).items()):
            settings.replace_in_component_priority_dict(name, scrapy_cls, ours_cls)
    return False


def _loads_to(key: Any, cls: type) -> bool:
    try:
        return (load_object(key) if isinstance(key, str) else key) is cls
    except (ImportError, NameError, ValueError, AttributeError):
        return False


def _register_contracts(settings: BaseSettings) -> None:
    """Add :data:`CONTRACTS` to ``SPIDER_CONTRACTS`` (a priority the project set is kept)."""
    contracts = settings["SPIDER_CONTRACTS"]
    for path, priority in CONTRACTS.items():
        if path not in contracts:
            contracts[path] = priority


def check_resolver(settings: BaseSettings, address_filter: AddressFilter, reactor: Any = None) -> None:
    """Refuse a crawl whose process will not resolve through
    :class:`~scrapy_polite.resolver.PublicHostnameResolver` (docs/spec.md §7), before any request.

    ``reactor``: the installed reactor, when one is installed. A running reactor must have the resolver
    installed already (``scrapy crawl`` installs ``TWISTED_DNS_RESOLVER`` before the crawl starts); a
    reactor not running yet (a ``CrawlerProcess`` before ``start()``) will get ``TWISTED_DNS_RESOLVER``,
    which must then be ours.

    Raises:
        ResolverNotInstalled: naming what is wrong (the add-on enabled only in a spider's
            ``custom_settings``, another ``TWISTED_DNS_RESOLVER``, a ``CrawlerRunner`` without the
            resolver) and the fix. Not raised with ``POLITE_ALLOW_PRIVATE``.
    """
    if address_filter.allow_private:
        return
    configured = component_name(settings.get("TWISTED_DNS_RESOLVER"))
    if reactor is not None and getattr(reactor, "running", False):
        installed = getattr(reactor, "nameResolver", None)
        if isinstance(installed, PublicHostnameResolver):
            return
        found = f"the reactor's name resolver is {type(installed).__name__}"
    elif configured == RESOLVER:
        return
    else:
        found = f"TWISTED_DNS_RESOLVER is {configured}"
    if (settings.getpriority("TWISTED_DNS_RESOLVER") or 0) > SETTINGS_PRIORITIES["addon"]:
        raise ResolverNotInstalled(
            f"{found}, not {RESOLVER}, so non-public addresses could be reached. Fix: remove the "
            "TWISTED_DNS_RESOLVER setting (the add-on installs its own).")
    if configured != RESOLVER:
        raise ResolverNotInstalled(
            f"the add-on is enabled only in the spider's custom_settings, so the per-process DNS resolver is "
            f"not scrapy-polite's ({found}) and non-public addresses could be reached. Fix: move "
            "ADDONS = {'scrapy_polite.Addon': 0} to the project settings (settings.py, the settings "
            "given to CrawlerProcess, or -s 'ADDONS={\"scrapy_polite.Addon\": 0}' for scrapy runspider).")
    raise ResolverNotInstalled(
        f"{found}, not {RESOLVER}, so non-public addresses could be reached. Fix: with CrawlerRunner, "
        "install it before the crawl: PublicHostnameResolver.from_crawler(runner, reactor)"
        ".install_on_reactor().")


def component_name(component: object) -> str:
    """The import path of a component given as a path or as a class."""
    return component_path(component)


#: Scrapy's own downloader middlewares that never answer a request from ``process_request`` (they return None, or
#: drop it): a request the scheduler holds for its host's line before they see it loses nothing (``next_new``).
NEVER_ANSWER = frozenset(f"scrapy.downloadermiddlewares.{path}" for path in (
    "offsite.OffsiteMiddleware", "robotstxt.RobotsTxtMiddleware", "httpauth.HttpAuthMiddleware",
    "downloadtimeout.DownloadTimeoutMiddleware", "defaultheaders.DefaultHeadersMiddleware",
    "useragent.UserAgentMiddleware", "retry.RetryMiddleware", "ajaxcrawl.AjaxCrawlMiddleware",
    "redirect.MetaRefreshMiddleware", "httpcompression.HttpCompressionMiddleware", "redirect.RedirectMiddleware",
    "cookies.CookiesMiddleware", "httpproxy.HttpProxyMiddleware", "stats.DownloaderStats"))


def answering_middlewares(settings: Any) -> list[str]:
    """The enabled downloader middlewares that may answer a request before the pacing middleware sees it: the HTTP
    cache when ``HTTPCACHE_ENABLED``, and any other with a ``process_request`` that is neither Scrapy's own (in
    :data:`NEVER_ANSWER`) nor the add-on's (scrapy-poet's ``InjectionMiddleware``, a project's cache or mock). While
    one is there the scheduler holds no new request for its host's line as it hands it out: such a page is never held
    back (docs/spec.md §5, :func:`~scrapy_polite.scheduler.next_new`)."""
    found = []
    for key, priority in settings.getwithbase("DOWNLOADER_MIDDLEWARES").items():
        path = component_name(key)
        if priority is None or path in NEVER_ANSWER or path.startswith("scrapy_polite."):
            continue
        if path == HTTP_CACHE:
            if settings.getbool("HTTPCACHE_ENABLED"):
                found.append(path)
            continue
        try:
            cls = load_object(key) if isinstance(key, str) else key
        except (ImportError, NameError, AttributeError, ValueError):  # Scrapy reports it when it builds the list
            continue
        if hasattr(cls, "process_request"):
            found.append(path)
    return found


HTTP_CACHE = "scrapy.downloadermiddlewares.httpcache.HttpCacheMiddleware"


class CacheAnswers(Protocol):
    """What :func:`cache_answers` returns: whether the HTTP cache answers ``request`` (``usable`` takes its entry)."""

    def __call__(self, request: Any, usable: Callable[[Any], bool] | None = None) -> bool: ...


def cache_answers(crawler: Any, answering: list[str] | None = None) -> CacheAnswers | None:
    """When Scrapy's HTTP cache is the only downloader middleware that may answer a request first
    (:func:`answering_middlewares`): ``answers(request, usable=None)``, True when the cache will answer it (a fresh
    entry, or a miss it drops: ``HTTPCACHE_IGNORE_MISSING``), as ``HttpCacheMiddleware.process_request`` decides, and
    ``usable(cached_response)`` (when given) accepts the entry, so the scheduler holds
    for its host's line only a request the cache lets through (docs/spec.md §5; trial: a crawl with the cache on sent
    575 requests through the downloader for 297 pages). A failed read is a miss, as for the cache (which logs it).
    None: the cache is not the only one, or its instance is not in the crawler's downloader. ``answering``: the
    crawl's :func:`answering_middlewares`, when the caller worked them out already."""
    if (answering if answering is not None else answering_middlewares(crawler.settings)) != [HTTP_CACHE]:
        return None
    middlewares = getattr(getattr(getattr(crawler_engine(crawler), "downloader", None), "middleware", None),
                          "middlewares", ())
    cache = next((mw for mw in middlewares if component_name(type(mw)) == HTTP_CACHE), None)
    if cache is None:
        return None

    def answers(request: Any, usable: Callable[[Any], bool] | None = None) -> bool:
        if request.meta.get("dont_cache") or not cache.policy.should_cache_request(request):
            return False
        try:
            cached = cache.storage.retrieve_response(crawler.spider, request)
        except Exception as exc:  # a miss to the cache too (it reads the entry again, and logs it)
            logger.debug("scrapy-polite: the HTTP cache's entry of %s could not be read (%r)", request, exc)
            cached = None
        if cached is None:
            return bool(cache.ignore_missing)  # dropped by the cache, or sent
        if not cache.policy.is_cached_response_fresh(cached, request):  # stale: revalidated by a request
            return False
        return usable is None or usable(cached)

    return answers


def _disabled_components(settings: Settings) -> SettingsError | None:
    """The error when the project disabled the add-on's downloader middleware or its extension (``None`` in
    ``DOWNLOADER_MIDDLEWARES`` or ``EXTENSIONS``: settings.py, a spider, ``-s``) while ``POLITE_ENABLED`` is on
    (trial: without the middleware every request went unpaced, 0.00 s apart, without a word; without the extension
    the spider closed with deferred requests not crawled), else None (docs/spec.md §7)."""
    for setting, path in (("DOWNLOADER_MIDDLEWARES", MIDDLEWARE), ("EXTENSIONS", EXTENSION)):
        components = settings.getwithbase(setting)
        if any(component_name(key) == path and value is None for key, value in components.items()):
            return SettingsError(f"{setting} disables scrapy-polite's {path.rsplit('.', 1)[1]} (None) while the add-on "
                                 f"is on: requests would go unpaced or be lost. Fix: remove that entry, or turn the "
                                 f"add-on off with POLITE_ENABLED = False", setting=setting)
    return None


def _last_priority(settings: Settings) -> int:
    """Our middleware's priority: 950, or after every other enabled downloader middleware, so that none can
    return a request or response from ``process_request`` behind our back (the host's line would stay
    taken) and we see each request as it will be sent."""
    others = [v for k, v in settings.getwithbase("DOWNLOADER_MIDDLEWARES").items()
              if v is not None and component_name(k) not in (MIDDLEWARE, EARLY_MIDDLEWARE)]
    return max([MIDDLEWARE_PRIORITY] + [int(v) + 1 for v in others])


def _block_service_workers(settings: Settings) -> None:
    """Set ``service_workers="block"`` in each browser context of scrapy-playwright's ``PLAYWRIGHT_CONTEXTS``
    that does not choose it itself (a service worker's requests are not seen by ``PLAYWRIGHT_ABORT_REQUEST``;
    docs/spec.md §4.1). Without ``PLAYWRIGHT_CONTEXTS``, the ``default`` context is declared with only that
    option. Contexts made from a request's ``playwright_context_kwargs`` are the project's own: not changed."""
    configured = settings.getdict(PLAYWRIGHT_CONTEXTS)
    contexts = {name: dict(kwargs or {}) for name, kwargs in configured.items()} or {"default": {}}
    for kwargs in contexts.values():
        kwargs.setdefault("service_workers", "block")
    settings.set(PLAYWRIGHT_CONTEXTS, contexts,
                 priority=max(settings.getpriority(PLAYWRIGHT_CONTEXTS) or 0, SETTINGS_PRIORITIES["addon"]))
