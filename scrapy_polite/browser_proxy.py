"""The browser's proxy: scrapy-playwright's browser reaches only the addresses the add-on checked (docs/spec.md §4.1).

A page rendered by scrapy-playwright makes requests of its own (scripts, images, ``fetch``, redirects, popups,
WebSockets, service workers) that never pass through Scrapy's downloader, and the browser resolves names itself.
The add-on therefore gives the browser a forward proxy: :class:`BrowserProxy`, on the crawl's reactor, listening on
``127.0.0.1`` on a port the system picks when the spider opens, closed (with every connection through it) when the
spider closes. Every browser context uses it (``proxy`` in ``PLAYWRIGHT_LAUNCH_OPTIONS`` and in each persistent
context of ``PLAYWRIGHT_CONTEXTS``; ``--proxy-bypass-list=<-loopback>`` removes Chromium's implicit bypass of
loopback addresses; WebRTC may use proxied traffic only), and the proxy:

1. reads one request head: ``CONNECT host:port`` (HTTPS, WebSockets) or an absolute ``http://`` request;
2. requires this crawl's credential (``Proxy-Authorization``, a random password made per crawl), so that another
   process on the machine cannot use it to reach what the crawl may reach;
3. takes the host's addresses from the add-on's resolver (:class:`~scrapy_polite.resolver.PublicHostnameResolver`):
   the address a page request was booked on while that request is in flight (its pin), else the resolver's
   public answer; the crawl's own address rules apply on top (a spider's narrower ``POLITE_ALLOWED_NETWORKS``);
4. refuses a host with no allowed address (``403``, counted in ``polite/browser/refused``), or connects to the
   address it checked (``TCP4ClientEndpoint``/``TCP6ClientEndpoint``: no second lookup) and relays bytes both
   ways, counted in ``polite/browser/proxied`` and per host.

A redirect, a popup, a WebSocket, a service worker's request and a DNS answer that changes all meet the same rule,
since the browser has no other way out. A plain ``http://`` request is sent to the origin with ``Connection:
close``: one request per proxy connection, so a kept-alive connection never carries another host's request.

Nothing here blocks the reactor: the resolver answers from its cache or a thread, connections are Twisted's.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.python.failure import Failure

from .crawl.reactor import installed_reactor
from .network.addresses import AddressFilter
from .network.hosts import InvalidHost, url_host
from .resolver import BlockedHost, PublicHostnameResolver

__all__ = ["BrowserProxy", "ProxyOptions", "PROXIED_STAT", "REFUSED_STAT", "FAILED_STAT", "CHROMIUM_ARGS"]

logger = logging.getLogger(__name__)

#: Stats (under ``polite/``): connections made, hosts refused, and targets that could not be reached.
PROXIED_STAT = "browser/proxied"
REFUSED_STAT = "browser/refused"
FAILED_STAT = "browser/failed"

#: Chromium's flags for the proxy: no implicit bypass of loopback addresses (Chromium sends ``localhost``,
#: ``127.0.0.1`` and ``[::1]`` direct by default), and WebRTC limited to traffic that goes through the proxy
#: (no UDP of its own, which would reach any address). ``--webrtc-ip-handling-policy`` is the switch Debian's
#: Chromium 156 has (its binary has no ``--force-webrtc-ip-handling-policy``); WebRTC is not exercised by the tests.
CHROMIUM_ARGS = ("--proxy-bypass-list=<-loopback>", "--webrtc-ip-handling-policy=disable_non_proxied_udp")

#: The server before the proxy listens: a port nothing listens on, so a browser launched too early fails closed.
UNBOUND_SERVER = "http://127.0.0.1:1"

_MAX_HEAD = 64 * 1024
_HEAD_TIMEOUT = 30.0
_REALM = "scrapy-polite"
_DROPPED_HEADERS = frozenset({b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive"})


class ProxyOptions(dict[str, str]):
    """Playwright's ``proxy`` option (``server``, ``username``, ``password``) for one crawl's :class:`BrowserProxy`.

    The add-on puts this very dict in the settings before the crawl starts; the proxy fills in its ``server``
    when it listens (Scrapy's ``getdict`` copies the outer dict only, so scrapy-playwright's copy sees it)."""

    proxy: BrowserProxy


class _Refused(Exception):
    """The host may not be contacted: ``reason`` says why."""


class BrowserProxy:
    """One crawl's forward proxy for its browser (see the module).

    Built by the add-on (its ``options``, Playwright's ``proxy`` option, go into the settings), bound to the crawl
    by its pacer (:meth:`bind`), started when the spider opens (:meth:`start`) and stopped when it closes
    (:meth:`stop`).
    """

    def __init__(self, *, connect_timeout: float = 30.0) -> None:
        self.username = "scrapy-polite"
        self.password = secrets.token_urlsafe(24)
        self.connect_timeout = connect_timeout
        self.options = ProxyOptions(server=UNBOUND_SERVER, username=self.username, password=self.password)
        self.options.proxy = self
        self._expected = b"Basic " + base64.b64encode(f"{self.username}:{self.password}".encode())
        self._address_filter: AddressFilter | None = None
        self._resolver: Callable[[], PublicHostnameResolver] | None = None
        self._inc: Callable[[str], None] = lambda _key: None
        self._reactor: Any = None
        self._port: Any = None
        self._connections: set[protocol.Protocol] = set()
        self._logged: set[str] = set()
        #: Connections (a tunnel, or one plain HTTP request) made through the proxy, per host.
        self.per_host: Counter[str] = Counter()

    # -- the crawl's side ----------------------------------------------------------------------------------------

    def bind(self, *, address_filter: AddressFilter, resolver: Callable[[], PublicHostnameResolver],
             inc: Callable[[str], None], reactor: Any = None) -> None:
        """Use the crawl's address rules, its resolver (a getter: raises ``ResolverNotInstalled`` when the process's
        resolver is not ours), its counter and its reactor (the installed one by default, read at :meth:`start`)."""
        self._address_filter = address_filter
        self._resolver = resolver
        self._inc = inc
        self._reactor = reactor

    @property
    def listening(self) -> bool:
        """Whether the proxy listens (between :meth:`start` and :meth:`stop`)."""
        return self._port is not None

    def start(self) -> str:
        """Listen on ``127.0.0.1`` (a port the system picks) and write the server into ``options``; returns it.
        Idempotent."""
        if self._port is None:
            if self._address_filter is None:
                raise RuntimeError("BrowserProxy.start() before bind()")
            if self._reactor is None:
                self._reactor = installed_reactor()
            factory = protocol.Factory.forProtocol(_ClientSide)
            factory.proxy = self  # type: ignore[attr-defined]
            self._port = self._reactor.listenTCP(0, factory, interface="127.0.0.1")
            self.options["server"] = f"http://127.0.0.1:{self._port.getHost().port}"
            logger.debug("scrapy-polite: the browser's proxy listens on %s", self.options["server"])
        return self.options["server"]

    def stop(self) -> defer.Deferred[None]:
        """Stop listening and close every connection through the proxy (the browser can reach nothing more)."""
        port, self._port = self._port, None
        self.options["server"] = UNBOUND_SERVER
        for connection in list(self._connections):
            transport: Any = connection.transport
            transport.abortConnection()
        self._connections.clear()
        if port is None:
            return defer.succeed(None)
        return defer.maybeDeferred(port.stopListening)

    def summary(self, most: int = 10) -> str:
        """The connections per host, most first (``a.example 12, b.example 3``), at most ``most`` hosts named."""
        ranked = self.per_host.most_common()
        words = ", ".join(f"{host} {count}" for host, count in ranked[:most])
        if len(ranked) > most:
            words += f" (and {len(ranked) - most} more hosts)"
        return words

    # -- the rule ------------------------------------------------------------------------------------------------

    def authorized(self, value: bytes | None) -> bool:
        """Whether a ``Proxy-Authorization`` value carries this crawl's credential."""
        return value is not None and hmac.compare_digest(value.strip(), self._expected)

    def addresses(self, host: str) -> defer.Deferred[tuple[str, list[str]]]:
        """``(key, addresses)`` for ``host`` (a URL Standard host, as ``url_host`` reads it: its key): the pinned
        address while a booked request of the host is in flight, else the resolver's public answer, narrowed by
        the crawl's address rules. Fails with :class:`_Refused` when none may be contacted."""
        address_filter, get_resolver = self._address_filter, self._resolver
        if address_filter is None or get_resolver is None:
            return defer.fail(_Refused("the crawl's address rules are not ready yet"))
        try:
            resolver = get_resolver()
        except Exception as exc:  # ResolverNotInstalled: the crawl is being stopped
            return defer.fail(_Refused(str(exc)))
        pinned = resolver.pinned(host)
        d: defer.Deferred[list[str]] = defer.succeed(pinned) if pinned else resolver.resolve(host)

        def narrow(addresses: list[str]) -> tuple[str, list[str]]:
            kept, dropped = address_filter.split(addresses)
            if not kept:
                raise _Refused(f"{host} has no allowed address ({', '.join(dropped)} not allowed)")
            return host, kept

        def refused(failure: Failure) -> Failure:
            exc = failure.value
            if isinstance(exc, BlockedHost):
                raise _Refused(f"{exc.host} is not an allowed address" if exc.dropped == [exc.host] else
                               f"{exc.host} resolves only to non-public addresses ({', '.join(exc.dropped)})")
            return failure

        return d.addCallbacks(narrow, refused)

    def refused(self, target: str, reason: str) -> None:
        """Count and log a refusal (WARNING once per reason, at most 100 reasons; then DEBUG)."""
        self._inc(REFUSED_STAT)
        level = logging.DEBUG if reason in self._logged or len(self._logged) >= 100 else logging.WARNING
        self._logged.add(reason)
        logger.log(level, "scrapy-polite: the browser's proxy refused %s: %s", target, reason)

    def connected(self, host: str) -> None:
        self._inc(PROXIED_STAT)
        self.per_host[host] += 1

    def failed(self, target: str, reason: str) -> None:
        self._inc(FAILED_STAT)
        logger.debug("scrapy-polite: the browser's proxy could not reach %s: %s", target, reason)

    def connect(self, address: str, port: int, peer: _ClientSide) -> defer.Deferred[Any]:
        """Connect to ``address`` (an IP literal the rules allowed) on ``port``, relaying to ``peer``."""
        assert self._address_filter is not None and self._address_filter.allows(address)  # checked by the caller
        cls = TCP6ClientEndpoint if ipaddress.ip_address(address).version == 6 else TCP4ClientEndpoint
        endpoint = cls(self._reactor, address, port, timeout=self.connect_timeout)
        return endpoint.connect(protocol.Factory.forProtocol(lambda: _ServerSide(peer)))

    def call_later(self, seconds: float, fn: Callable[..., object]) -> Any:
        return self._reactor.callLater(seconds, fn)


def _response(status: str, reason: str = "", extra: str = "") -> bytes:
    body = (reason + "\n").encode("utf-8", "replace") if reason else b""
    return (f"HTTP/1.1 {status}\r\n{extra}Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nProxy-Connection: close\r\n\r\n").encode() + body


class _ServerSide(protocol.Protocol):
    """The connection to the checked address: relays what it receives to the browser's side."""

    def __init__(self, peer: _ClientSide) -> None:
        self.peer = peer

    def connectionMade(self) -> None:
        self.peer.upstream_made(self)

    def dataReceived(self, data: bytes) -> None:
        self.peer.transport.write(data)  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.peer.transport.loseConnection()  # type: ignore[union-attr]


class _ClientSide(protocol.Protocol):
    """One connection from the browser: a request head, the rule, then bytes relayed to the checked address."""

    factory: Any

    def __init__(self) -> None:
        self.buffer = b""
        self.upstream: _ServerSide | None = None
        self.head_done = False
        self.closed = False
        self.timeout: Any = None
        #: The request body's bytes still to relay (``Content-Length``); None: a tunnel, where every byte is relayed.
        self.body_left: int | None = None

    @property
    def proxy(self) -> BrowserProxy:
        return self.factory.proxy  # type: ignore[no-any-return]

    def connectionMade(self) -> None:
        self.proxy._connections.add(self)
        self.timeout = self.proxy.call_later(_HEAD_TIMEOUT, self.transport.abortConnection)  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closed = True
        self.proxy._connections.discard(self)
        self._cancel_timeout()
        if self.upstream is not None:
            self.upstream.transport.loseConnection()  # type: ignore[union-attr]

    def _cancel_timeout(self) -> None:
        if self.timeout is not None and self.timeout.active():
            self.timeout.cancel()
        self.timeout = None

    def _reply(self, status: str, reason: str = "", extra: str = "") -> None:
        self._cancel_timeout()
        self.transport.write(_response(status, reason, extra))  # type: ignore[union-attr]
        self.transport.loseConnection()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        if self.upstream is not None:
            self._relay(data)
            return
        self.buffer += data
        if self.head_done:  # waiting for the rule or the connection: keep what comes (a request body)
            if len(self.buffer) > _MAX_HEAD * 16:
                self.transport.abortConnection()  # type: ignore[union-attr]
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD:
                self._reply("431 Request Header Fields Too Large")
            return
        self.head_done = True
        self._cancel_timeout()  # from here the resolver's and the connection's own timeouts apply
        head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
        self._request(head)

    def _relay(self, data: bytes) -> None:
        """Relay the browser's bytes to the checked address: a tunnel's all; an ``http://`` request's body only. A
        byte past it is another request on this connection (a browser keeps it alive): it is not relayed, and both
        connections are closed, so that each request meets the rule on a connection of its own (review: a second
        request, another host's, went unchecked to the first origin with the proxy's credentials)."""
        if self.body_left is None:
            self.upstream.transport.write(data)  # type: ignore[union-attr]
            return
        body, extra = data[:self.body_left], data[self.body_left:]
        self.body_left -= len(body)
        if body:
            self.upstream.transport.write(body)  # type: ignore[union-attr]
        if extra:
            self.transport.loseConnection()  # type: ignore[union-attr]
            self.upstream.transport.loseConnection()  # type: ignore[union-attr]

    def _request(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._reply("400 Bad Request", "scrapy-polite's browser proxy: not an HTTP/1.x request")
            return
        method, target_bytes, _version = parts
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._reply("400 Bad Request", "scrapy-polite's browser proxy: a malformed header line")
                return
            headers.append((name.strip().lower(), value.strip()))
        auth = next((value for name, value in headers if name == b"proxy-authorization"), None)
        if not self.proxy.authorized(auth):
            self._reply("407 Proxy Authentication Required", "",
                        f'Proxy-Authenticate: Basic realm="{_REALM}"\r\n')
            return
        target = target_bytes.decode("latin-1")
        tunnel = method == b"CONNECT"
        url = f"http://{target}/" if tunnel else target
        if not tunnel and not target.lower().startswith("http://"):
            self._reply("400 Bad Request", "scrapy-polite's browser proxy: only CONNECT and http:// requests")
            return
        if not tunnel:
            if any(name == b"transfer-encoding" for name, _ in headers):
                self._reply("411 Length Required", "scrapy-polite's browser proxy: a body needs a Content-Length")
                return
            length = next((value for name, value in headers if name == b"content-length"), b"0")
            if not length.isdigit():
                self._reply("400 Bad Request", "scrapy-polite's browser proxy: a request body needs a Content-Length")
                return
            self.body_left = int(length)
        try:
            host = url_host(url)
            port = _port(url, tunnel)
        except (InvalidHost, ValueError) as exc:
            self.proxy.refused(target, getattr(exc, "reason", str(exc)))
            self._reply("403 Forbidden", f"scrapy-polite refused {target}: {exc}")
            return
        if host is None:
            self._reply("400 Bad Request", "scrapy-polite's browser proxy: no host")
            return
        d = self.proxy.addresses(host.key)
        d.addCallback(self._connect, port, target, tunnel, method, headers, url)
        d.addErrback(self._failed, target)

    def _connect(self, checked: tuple[str, list[str]], port: int, target: str, tunnel: bool, method: bytes,
                 headers: list[tuple[bytes, bytes]], url: str) -> defer.Deferred[Any]:
        key, addresses = checked
        if self.closed or not self.proxy.listening:
            return defer.succeed(None)

        def attempt(index: int) -> defer.Deferred[Any]:
            d = self.proxy.connect(addresses[index], port, self)
            if index + 1 < len(addresses):
                d.addErrback(lambda _failure: attempt(index + 1))
            return d

        def made(_protocol: object) -> None:
            if self.upstream is None:  # the browser went away meanwhile (upstream_made closed it)
                return
            self.proxy.connected(key)
            if tunnel:
                self.transport.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")  # type: ignore[union-attr]
            else:
                self.upstream.transport.write(_origin_head(method, url, headers))  # type: ignore[union-attr]
            rest, self.buffer = self.buffer, b""
            if rest:
                self._relay(rest)

        return attempt(0).addCallback(made)

    def upstream_made(self, upstream: _ServerSide) -> None:
        self._cancel_timeout()
        if self.closed:
            upstream.transport.loseConnection()  # type: ignore[union-attr]
            return
        self.upstream = upstream
        # Flow control both ways, as twisted.protocols.portforward does.
        upstream.transport.registerProducer(self.transport, True)  # type: ignore[union-attr]
        self.transport.registerProducer(upstream.transport, True)  # type: ignore[union-attr]

    def _failed(self, failure: Failure, target: str) -> None:
        if isinstance(failure.value, _Refused):
            self.proxy.refused(target, str(failure.value))
            self._reply("403 Forbidden", f"scrapy-polite refused {target}: {failure.value}",
                        "X-Scrapy-Polite: refused\r\n")
            return
        self.proxy.failed(target, failure.getErrorMessage())
        if not self.closed:
            self._reply("502 Bad Gateway", f"scrapy-polite's browser proxy could not reach {target}")


def _port(url: str, tunnel: bool) -> int:
    """The port of a CONNECT authority (required) or an ``http://`` URL (80 by default)."""
    port = urlsplit(url).port  # ValueError for a port out of range
    if port is None:
        if tunnel:
            raise ValueError("CONNECT without a port")
        return 80
    return port


def _origin_head(method: bytes, url: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head an origin server expects: the path instead of the absolute URL, no proxy headers, one
    request per connection (``Connection: close``)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [method + b" " + path.encode("latin-1") + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in headers if name not in _DROPPED_HEADERS]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
