"""The one place that touches private Scrapy and Twisted API.

Everything else in scrapy-polite uses only the public names defined here. Each private use says which
versions it was checked against; the lowest ones are the floors in ``setup.cfg``
(``tests/constraints-lowest.txt``, tox env ``lowest``), the highest the ones the main test run installs.
When a new Scrapy or Twisted release changes one of them, this module is the only one to adapt.

Checked against Scrapy 2.18.0 and 2.19.0, Twisted 22.8.0 and 26.10.0.

What it provides:

* :func:`download_pinned`: Scrapy's ``HTTP11DownloadHandler.download_request``, with an agent that
  connects a booked request (``meta['polite_ip']``) to that address and keys the keep-alive pool by it;
* :func:`pinned_agent`: that Twisted agent on its own (built from public Twisted API only);
* :func:`download_pinned_h2`: Scrapy's ``H2DownloadHandler.download_request``, with an HTTP/2 agent that
  connects a booked request to that address and keys the HTTP/2 connection pool by it;
* :func:`server_side_failure_types`: the download failures that reached the server's side;
* :func:`wake_engine`: ask the engine to pull from the scheduler again now; :func:`in_engine`: a pass not over;
  :func:`engine_closing`: the engine's close has begun;
* :func:`commit_without_fsync`: let a queuelib SQLite disk queue commit without waiting for the disk;
* :func:`fail_crawl_process`: make the process that runs a crawl exit with a non-zero status;
* :func:`stats_incrementer`: ``stats.inc_value`` without Scrapy 2.19's cost per call for its own collectors.
"""

from __future__ import annotations

import gc
import logging
import pickle
import sqlite3
from typing import TYPE_CHECKING, Any, cast

from queuelib import queue as queuelib_queue
from scrapy import crawler as scrapy_crawler
from scrapy import squeues
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler, _ScrapyAgent
from scrapy.exceptions import (
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    ResponseDataLossError,
    UnsupportedURLSchemeError,
)
from scrapy.statscollectors import MemoryStatsCollector, StatsCollector
from scrapy.utils._download_handlers import get_dataloss_msg, normalize_bind_address, wrap_twisted_exceptions
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.deprecate import warn_on_deprecated_spider_attribute
from twisted.internet import error as txerror
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed, ResponseNeverReceived
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from .vocabulary import IP_META

try:  # Scrapy's HTTP/2 handler needs the optional h2 package (pip install scrapy-polite[http2])
    from scrapy.core._http2.agent import H2Agent
    from scrapy.core.downloader.handlers.http2 import H2DownloadHandler, _ScrapyH2Agent
    HAS_H2 = True
except ImportError:
    HAS_H2 = False

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred
    from twisted.web.client import URI
    from twisted.web.iweb import IPolicyForHTTPS

__all__ = ["HAS_H2", "commit_without_fsync", "download_pinned", "download_pinned_h2", "fail_crawl_process",
           "pinned_agent", "server_side_failure_types", "stats_incrementer", "wake_engine", "crawler_engine",
           "in_engine", "engine_closing"]

#: Scrapy's HTTP/1.1 handler logs its data-loss warning here (``http11.logger``); so do we.
_http11_logger = logging.getLogger("scrapy.core.downloader.handlers.http11")


# -- The pinned agent (public Twisted API only) -------------------------------------------------------------

#: The most endpoints a pinned endpoint factory keeps (one per scheme, host and port connected to its address).
_ENDPOINTS_MAX = 256
#: The most pinned agents a handler keeps (one per address, bind address and connect timeout: see
#: :func:`download_pinned`); emptied when full (the connections stay in the handler's pool).
_AGENTS_MAX = 4096


@implementer(IAgentEndpointFactory)
class _PinnedEndpointFactory:
    """Twisted's standard endpoint factory (``_StandardEndpointFactory.endpointForURI``), connecting to
    ``address`` instead of the URI's host. TLS (SNI, certificate checks) still uses the URI's host.

    ``Agent`` asks for an endpoint for every request, pooled connection or not, but uses it only when the pool
    has no connection to reuse; a ``HostnameEndpoint`` costs an IDNA encoding of the host when it is built.
    So the endpoint returned is :class:`_EndpointAtConnect`: the ``HostnameEndpoint`` (and its TLS wrapper) is
    built only when a connection is made, and a request on a kept-alive connection builds none. That endpoint
    depends only on the URI's scheme, host and port, so one is kept per (scheme, host, port) (at most
    :data:`_ENDPOINTS_MAX`; emptied when full) and a request of a known one builds nothing."""

    def __init__(self, *, reactor: Any, address: str, context_factory: IPolicyForHTTPS,
                 connect_timeout: float | None, bind_address: tuple[str, int] | None) -> None:
        self._reactor = reactor
        #: The IP address every endpoint connects to.
        self.address = address
        self._context_factory = context_factory
        self._connect_timeout = connect_timeout
        self._bind_address = bind_address
        self._endpoints: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            if uri.scheme not in (b"http", b"https"):
                raise SchemeNotSupported(f"Unsupported scheme: {uri.scheme!r}")
            if len(self._endpoints) >= _ENDPOINTS_MAX:
                self._endpoints.clear()
            endpoint = self._endpoints[key] = _EndpointAtConnect(self, uri)
        return endpoint

    def build(self, uri: URI) -> IStreamClientEndpoint:
        """The endpoint of ``uri``: a ``HostnameEndpoint`` to the address (through the reactor's name resolver,
        whose address rules apply once more), wrapped in TLS for https.

        Raises:
            SchemeNotSupported: a scheme other than http and https.
            Exception: what the TLS setup raises for the URI's host (``creatorForNetloc``).
        """
        if uri.scheme not in (b"http", b"https"):
            raise SchemeNotSupported(f"Unsupported scheme: {uri.scheme!r}")
        kwargs: dict[str, Any] = {"bindAddress": self._bind_address}
        if self._connect_timeout is not None:
            kwargs["timeout"] = self._connect_timeout
        # Any: zope interfaces (IPolicyForHTTPS, IStreamClientEndpoint) type-check alike with or without mypy-zope.
        endpoint: Any = HostnameEndpoint(self._reactor, self.address, uri.port, **kwargs)
        if uri.scheme == b"https":
            policy: Any = self._context_factory
            endpoint = wrapClientTLS(policy.creatorForNetloc(uri.host, uri.port), endpoint)
        return cast("IStreamClientEndpoint", endpoint)


@implementer(IStreamClientEndpoint)
class _EndpointAtConnect:
    """An ``IStreamClientEndpoint`` that builds :meth:`_PinnedEndpointFactory.build`'s endpoint when, and each
    time, it connects (public Twisted API: ``IStreamClientEndpoint.connect``)."""

    def __init__(self, factory: _PinnedEndpointFactory, uri: URI) -> None:
        self._factory = factory
        self._uri = uri

    def connect(self, protocol_factory: Any) -> Deferred[Any]:
        endpoint: Any = self._factory.build(self._uri)
        return cast("Deferred[Any]", endpoint.connect(protocol_factory))

    def __repr__(self) -> str:
        return f"<endpoint to {self._factory.address}:{self._uri.port} for {self._uri.host!r}, built at connect>"


class _AddressKeyedPool:
    """A view of an ``HTTPConnectionPool`` whose keys carry the bind address and the pinned address, so a
    pooled connection is reused only for the same (scheme, host, port, bind address, address).

    ``Agent`` uses only ``pool.getConnection(key, endpoint)`` and ``pool.persistent`` (public
    ``HTTPConnectionPool`` API; Twisted 22.8.0 and 26.10.0); the pool files the connection back under the
    key it was given."""

    def __init__(self, pool: HTTPConnectionPool, extra: tuple[Any, ...]) -> None:
        self._pool = pool
        self._extra = extra
        #: Whether the pool keeps connections alive: the wrapped pool's, read when the view is made (Scrapy's
        #: handler sets it when it builds its pool, ``HTTPConnectionPool(reactor, persistent=True)``, and never
        #: changes it; Scrapy 2.18.0 and 2.19.0).
        self.persistent = bool(pool.persistent)

    def getConnection(self, key: tuple[Any, ...], endpoint: IStreamClientEndpoint) -> Deferred[Any]:
        return self._pool.getConnection(key + self._extra, endpoint)


def pinned_agent(*, reactor: Any, address: str, context_factory: IPolicyForHTTPS, connect_timeout: float | None,
                 bind_address: tuple[str, int] | None, pool: HTTPConnectionPool) -> Agent:
    """A Twisted ``Agent`` that connects every request to ``address`` (an IP address literal).

    The connection goes through ``HostnameEndpoint``, hence through the reactor's name resolver with the
    literal, so the resolver's public-address filter applies once more at connect time. The keep-alive
    ``pool`` is shared with Scrapy's other agents; its keys get ``(bind_address, address)`` appended, so a
    connection to another address of the same host (or from another local address, as Scrapy ≥ 2.19's
    ``_BindAddressAgent`` also ensures) is never reused.

    Args:
        reactor: the Twisted reactor.
        address: the booked IP address (``meta['polite_ip']``).
        context_factory: Scrapy's ``IPolicyForHTTPS`` (TLS uses the URL's host name).
        connect_timeout: seconds, or None for Twisted's default.
        bind_address: the local ``(host, port)`` to bind to, or None.
        pool: the handler's ``HTTPConnectionPool``.

    Raises (from the returned agent's ``request``): ``SchemeNotSupported`` for a scheme other than http/https.
    """
    factory = _PinnedEndpointFactory(reactor=reactor, address=address, context_factory=context_factory,
                                     connect_timeout=connect_timeout, bind_address=bind_address)
    keyed = _AddressKeyedPool(pool, (bind_address, address))
    # Twisted (22.8.0 to 26.10.0) leaves usingEndpointFactory unannotated; ``keyed`` stands in for the pool.
    agent: Agent = Agent.usingEndpointFactory(reactor, factory, pool=keyed)  # type: ignore[no-untyped-call]
    return agent


# -- Scrapy's HTTP/1.1 handler with the pinned agent --------------------------------------------------------

class _PinnedScrapyAgent(_ScrapyAgent):
    """Scrapy's ``_ScrapyAgent`` (private; checked against Scrapy 2.18.0 and 2.19.0, whose constructor,
    ``_get_agent(request, timeout)``, ``_contextFactory``, ``_bindAddress`` and ``_pool`` are the same):
    a request booked on an address and not sent through a proxy gets :func:`pinned_agent`; any other
    request gets Scrapy's own agent (Scrapy 2.18: ``Agent``; 2.19: ``_BindAddressAgent``).

    A Twisted ``Agent`` is meant to be reused: the pinned one is kept in :attr:`pinned_agents` (the
    handler's, set by :func:`download_pinned`) under (address, bind address, connect timeout), everything
    it is built from besides the handler's own context factory and pool."""

    #: (address, bind address, connect timeout) → the pinned agent built for them (at most :data:`_AGENTS_MAX`).
    pinned_agents: dict[tuple[Any, ...], Agent]

    def _get_agent(self, request: Request, timeout: float) -> Agent:
        meta = request.meta
        address = meta.get(IP_META)
        if not address or meta.get("proxy"):
            return super()._get_agent(request, timeout)
        # scrapy.utils._download_handlers.normalize_bind_address: private module, same in 2.18.0 and 2.19.0.
        bind_address = normalize_bind_address(meta.get("bindaddress") or self._bindAddress)
        key = (str(address), bind_address, timeout)
        agent = self.pinned_agents.get(key)
        if agent is None:
            from twisted.internet import reactor  # noqa: PLC0415 - the installed reactor, read when used (as Scrapy does)

            assert self._pool is not None  # the handler always passes its pool
            if len(self.pinned_agents) >= _AGENTS_MAX:
                self.pinned_agents.clear()
            agent = self.pinned_agents[key] = pinned_agent(
                reactor=reactor, address=key[0], context_factory=self._contextFactory, connect_timeout=timeout,
                bind_address=bind_address, pool=self._pool)
        return agent


async def download_pinned(handler: HTTP11DownloadHandler, request: Request) -> Response:
    """Download ``request`` as Scrapy's ``HTTP11DownloadHandler.download_request`` does, connecting a request
    booked on an address (``meta['polite_ip']``, without ``meta['proxy']``) to that address.

    A copy of Scrapy's method (identical in Scrapy 2.18.0 and 2.19.0) with the agent replaced. It reads the
    handler's private settings attributes ``_contextFactory``, ``_bind_address``, ``_pool`` (set by
    ``HTTP11DownloadHandler.__init__``) and ``_default_maxsize``, ``_default_warnsize``, ``_fail_on_dataloss``,
    ``_fail_on_dataloss_warned``, ``_tls_verbose_logging`` (``BaseHttpDownloadHandler.__init__``), all
    checked against Scrapy 2.18.0 and 2.19.0.

    The pinned agents are kept with the handler (in its ``__dict__``, under ``_polite_pinned_agents``: see
    :class:`_PinnedScrapyAgent`), so a page reuses its address's agent.

    Raises: what Scrapy's handler raises (Scrapy's download exceptions, wrapped from Twisted's by
    ``wrap_twisted_exceptions``; ``ResponseDataLossError`` when ``DOWNLOAD_FAIL_ON_DATALOSS`` is on).
    """
    spider = handler.crawler.spider
    if hasattr(spider, "download_maxsize"):
        warn_on_deprecated_spider_attribute("download_maxsize", "DOWNLOAD_MAXSIZE")
    if hasattr(spider, "download_warnsize"):
        warn_on_deprecated_spider_attribute("download_warnsize", "DOWNLOAD_WARNSIZE")
    agent = _PinnedScrapyAgent(
        contextFactory=handler._contextFactory,
        bindAddress=handler._bind_address,
        pool=handler._pool,
        maxsize=getattr(spider, "download_maxsize", handler._default_maxsize),
        warnsize=getattr(spider, "download_warnsize", handler._default_warnsize),
        fail_on_dataloss=handler._fail_on_dataloss,
        crawler=handler.crawler,
        tls_verbose_logging=handler._tls_verbose_logging,
    )
    agent.pinned_agents = vars(handler).setdefault("_polite_pinned_agents", {})
    try:
        # scrapy.utils._download_handlers.wrap_twisted_exceptions: private module, same in 2.18.0 and 2.19.0.
        with wrap_twisted_exceptions():
            return await maybe_deferred_to_future(agent.download_request(request))
    except ResponseDataLossError:
        if not handler._fail_on_dataloss_warned:
            _http11_logger.warning(get_dataloss_msg(request.url))
            handler._fail_on_dataloss_warned = True
        raise


# -- Scrapy's HTTP/2 handler with a pinned agent ------------------------------------------------------------

if HAS_H2:
    class _PinnedH2Agent(H2Agent):
        """Scrapy's ``H2Agent`` (private ``scrapy.core._http2.agent``; checked against Scrapy 2.18.0 and 2.19.0,
        whose constructor, ``endpoint_factory``, ``_context_factory``, ``get_endpoint(uri)`` and ``get_key(uri)``
        are the same; 2.19 adds the bind address to the key) connecting to ``address``: its endpoint is
        :class:`_PinnedEndpointFactory`'s (TLS with ALPN ``h2`` and SNI for the URL's host), and its pool key
        gets ``(bind_address, address)`` appended, so a connection to another address of the same host is never
        reused."""

        def __init__(self, *, reactor: Any, pool: Any, context_factory: Any, connect_timeout: float | None,
                     bind_address: tuple[str, int] | None, address: str) -> None:
            super().__init__(reactor=reactor, pool=pool, context_factory=context_factory,
                             connect_timeout=connect_timeout, bind_address=bind_address)
            self._pinned = _PinnedEndpointFactory(reactor=reactor, address=address,
                                                  context_factory=self._context_factory,
                                                  connect_timeout=connect_timeout, bind_address=bind_address)
            self._pin_key = (bind_address, address)

        def get_endpoint(self, uri: URI) -> Any:
            # Built at once, not at connect: Scrapy's H2ConnectionPool marks the key pending before it connects,
            # so an endpoint that failed to build there (its TLS setup raising) would leave it pending.
            return self._pinned.build(uri)

        def get_key(self, uri: URI) -> Any:
            return (*super().get_key(uri), *self._pin_key)


    class _PinnedScrapyH2Agent(_ScrapyH2Agent):
        """Scrapy's ``_ScrapyH2Agent`` (private; Scrapy 2.18.0 and 2.19.0: same constructor and
        ``_get_agent(request, timeout)``): a booked request gets :class:`_PinnedH2Agent`. Scrapy's HTTP/2 agent
        refuses proxies (``NotImplementedError``), so every request it sends is booked on an address."""

        def _get_agent(self, request: Request, timeout: float | None) -> H2Agent:
            address = request.meta.get(IP_META)
            if not address or request.meta.get("proxy"):
                return super()._get_agent(request, timeout)
            from twisted.internet import reactor  # noqa: PLC0415 - the installed reactor, read when used (as Scrapy does)

            bind_address = normalize_bind_address(request.meta.get("bindaddress") or self._bind_address)
            return _PinnedH2Agent(reactor=reactor, pool=self._pool, context_factory=self._context_factory,
                                  connect_timeout=timeout, bind_address=bind_address, address=str(address))


    async def download_pinned_h2(handler: H2DownloadHandler, request: Request) -> Response:
        """Download ``request`` as Scrapy's ``H2DownloadHandler.download_request`` does (a copy of it, identical
        in Scrapy 2.18.0 and 2.19.0), connecting a request booked on an address (``meta['polite_ip']``) to
        that address. Reads the handler's private ``_context_factory``, ``_pool``, ``_bind_address`` and
        ``_crawler`` (set by ``H2DownloadHandler.__init__``, Scrapy 2.18.0 and 2.19.0).

        Raises: what Scrapy's handler raises (``UnsupportedURLSchemeError`` for ``http``: Scrapy's HTTP/2
        handler speaks HTTP/2 over TLS only; Scrapy's download exceptions).
        """
        if request.url.split(":", 1)[0].lower() == "http":
            raise UnsupportedURLSchemeError(f"{type(handler).__name__} doesn't support plain HTTP.")
        agent = _PinnedScrapyH2Agent(context_factory=handler._context_factory, pool=handler._pool,
                                     bind_address=handler._bind_address, crawler=handler._crawler)
        spider = handler._crawler.spider
        assert spider is not None
        with wrap_twisted_exceptions():
            return await maybe_deferred_to_future(agent.download_request(request, spider))


# -- Failures and the engine -------------------------------------------------------------------------------

def server_side_failure_types() -> tuple[type[BaseException], ...]:
    """The download failures that reached the server's side (SPEC §2: they count as a throttle without
    Retry-After). DNS failures (``DNSLookupError``, Scrapy's ``CannotResolveHostError``) are not among them.

    Twisted's connection errors, its HTTP client's ``ResponseFailed`` and ``ResponseNeverReceived``
    (defined in the private ``twisted.web._newclient``, imported from their public re-export in
    ``twisted.web.client``; Twisted 22.8.0 and 26.10.0), and the wrappers Scrapy ≥ 2.17 raises instead
    of Twisted's errors (``DownloadTimeoutError``, ``DownloadConnectionRefusedError``,
    ``DownloadFailedError``; Scrapy 2.18.0 and 2.19.0).
    """
    return (txerror.TimeoutError, txerror.TCPTimedOutError, txerror.ConnectionRefusedError, txerror.ConnectionLost,
            txerror.ConnectionDone, txerror.ConnectError, ResponseFailed, ResponseNeverReceived, DownloadTimeoutError,
            DownloadConnectionRefusedError, DownloadFailedError)


def crawler_engine(crawler: Any) -> Any:
    """The crawler's execution engine, or None before the crawl started it (Scrapy 2.19.0's ``Crawler.engine``
    raises ``RuntimeError`` until then; Scrapy 2.18.0's is None)."""
    try:
        return getattr(crawler, "engine", None)
    except RuntimeError:
        return None


def in_engine(crawler: Any, request: Any) -> bool:
    """``request`` is in the engine: handed out by the scheduler, its pass (download, callback) not over (the private
    ``ExecutionEngine._slot.inprogress`` of Scrapy 2.18.0 and 2.19.0; ``Downloader.active`` without one)."""
    engine = crawler_engine(crawler)
    inprogress: Any = getattr(getattr(engine, "_slot", None), "inprogress", None)  # (empty: so is the downloader's)
    return request in (inprogress or getattr(getattr(engine, "downloader", None), "active", ()))


def engine_closing(crawler: Any) -> bool:
    """The engine's close has begun (``ExecutionEngine._slot.closing``, private; Scrapy 2.18.0 and 2.19.0): it waits
    for every request in the engine to leave, and Scrapy sends no signal before they have."""
    return getattr(getattr(crawler_engine(crawler), "_slot", None), "closing", None) is not None


def stats_incrementer(stats: Any) -> Callable[[str, float], None]:
    """``inc(key, count)``, what ``stats.inc_value(key, count)`` does. For Scrapy's ``StatsCollector`` and
    ``MemoryStatsCollector`` themselves (not subclasses) it adds to their private ``_stats`` dict as their
    ``inc_value`` does (Scrapy 2.18.0 and 2.19.0), without Scrapy 2.19's ``__getattribute__``, which runs Python
    on every attribute read of the collector and raises an ``AttributeError`` inside: about 17,000 instructions
    per ``inc_value``, against a few hundred. Any other collector's own ``inc_value`` is called."""
    if type(stats) not in (StatsCollector, MemoryStatsCollector):
        return cast("Callable[[str, float], None]", stats.inc_value)
    read = object.__getattribute__

    def inc(key: str, count: float = 1) -> None:
        d = read(stats, "_stats")  # read each time: set_stats() replaces the dict
        d[key] = d.setdefault(key, 0) + count

    return inc


def wake_engine(crawler: Crawler) -> None:
    """Make the engine ask the scheduler for requests on its next reactor turn (it otherwise polls every
    few seconds). Does nothing before the engine opened the spider (its scraper's slot is set after the scheduler's
    ``open``; trial: a resumed JOBDIR's timer woke it between, and Scrapy's ``needs_backout`` asserted) or after.

    Uses ``ExecutionEngine._slot.nextcall.schedule()`` (private; Scrapy 2.18.0 and 2.19.0): Scrapy has
    no public way to wake the engine; ``engine.crawl()`` would also schedule a request.
    """
    try:  # crawler_engine(crawler), without its call: once per page
        engine = getattr(crawler, "engine", None)
    except RuntimeError:
        return
    nextcall = getattr(getattr(engine, "_slot", None), "nextcall", None)
    if nextcall is not None and getattr(getattr(engine, "scraper", None), "slot", None) is not None:
        nextcall.schedule()


def pickle_fifo_sqlite_queue() -> type[Any]:
    """Scrapy's ``PickleFifoSQLiteQueue``: a FIFO of requests in a queuelib SQLite file, serialised the way
    Scrapy's disk queues serialise them (``request.to_dict`` and pickle).

    Scrapy 2.19.0 exports it from ``scrapy.squeues``; Scrapy 2.18.0 has only the disk (file) queues there,
    so the same class is built from the helpers that module uses for them (``_scrapy_serialization_queue``,
    ``_serializable_queue``, ``_with_mkdir``, ``_pickle_serialize``: private; identical in 2.18.0 and
    2.19.0) and queuelib's ``FifoSQLiteQueue``.
    """
    existing = getattr(squeues, "PickleFifoSQLiteQueue", None)
    if existing is not None:
        return cast("type[Any]", existing)
    fifo = squeues._with_mkdir(queuelib_queue.FifoSQLiteQueue)  # type: ignore[arg-type]  # as Scrapy does
    serializable = squeues._serializable_queue(fifo, squeues._pickle_serialize, pickle.loads)
    return cast("type[Any]", squeues._scrapy_serialization_queue(serializable))


def commit_without_fsync(queue: Any) -> None:
    """Make a queuelib ``FifoSQLiteQueue`` (``scrapy.squeues.PickleFifoSQLiteQueue``) on a WAL-mode file
    commit without an fsync (``PRAGMA synchronous=NORMAL``, as the SQLite pace table does): each commit is
    then an append to the WAL, about 20 µs instead of about 1 ms on the reactor. A committed push still
    survives the death of the process (``kill -9``); only an operating-system crash or a power cut may
    lose the last commits, never the file's consistency.

    Uses the queue's connection ``_db`` (private; queuelib 1.6.1 to 1.10.0): the queue has no public way
    to set a pragma. A queue without it is left as it is (each commit then waits for the disk).
    """
    db = getattr(queue, "_db", None)
    if isinstance(db, sqlite3.Connection):
        db.execute("PRAGMA synchronous=NORMAL")


# -- The exit status of a crawl the add-on stopped -------------------------------------------------------

#: The runners' common base (``CrawlerRunner``, ``AsyncCrawlerRunner`` and the two processes).
_RUNNER_TYPES: tuple[type[Any], ...] = tuple(t for t in (getattr(scrapy_crawler, name, None) for name in (
    "CrawlerRunnerBase", "CrawlerRunner", "AsyncCrawlerRunner")) if isinstance(t, type))


def fail_crawl_process(crawler: Crawler) -> int:
    """Count the crawl as failed in the runner running it, so that ``scrapy crawl`` (``runspider``,
    ``check``, …) exits with status 1 (docs/spec.md §7): for a crawl scrapy-polite stopped (its pace
    table failed, the resolver is missing).

    Scrapy has no public way to fail a crawl that started: its commands exit with 1 when the runner's
    ``bootstrap_failed`` (public attribute) is set, which the runner does only for a crawl that failed to
    start. The crawler does not know its runner, so the runner is found as the holder of the set its
    public ``crawlers`` property returns (``CrawlerRunnerBase._crawlers``: the crawler is in it until its
    crawl ends), through :func:`gc.get_referrers` (two or three scans of the heap: call it once per crawl,
    at its close). Checked against Scrapy 2.18.0 and 2.19.0 (``bootstrap_failed |= ...`` after the crawl,
    never reset).

    Returns:
        how many runners were marked (0: none found, e.g. a crawler run without a runner).
    """
    found: list[Any] = []

    def keep(candidates: list[Any]) -> None:
        for candidate in candidates:
            if (isinstance(candidate, _RUNNER_TYPES) and crawler in getattr(candidate, "crawlers", ())
                    and not any(candidate is f for f in found)):
                found.append(candidate)

    sets = [r for r in gc.get_referrers(crawler) if isinstance(r, set)]
    if sets:
        holders = gc.get_referrers(*sets)
        keep(holders)
        # The runner's attributes in a dict of their own (``__dict__``): one level more.
        if not found and (dicts := [h for h in holders if isinstance(h, dict)]):
            keep(gc.get_referrers(*dicts))
    for runner in found:
        runner.bootstrap_failed = True
    return len(found)
