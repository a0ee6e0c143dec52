"""A scripted loopback HTTP server that records when every request arrived.

End-to-end tests run a real Scrapy crawl against one or more :class:`ArrivalServer` instances and then
check the *server-side* timeline (:meth:`ArrivalServer.arrivals`), which is what politeness is about:
when did each request reach the host, how long after the previous one ended, on which address.

Quick tour::

    with ArrivalServer("127.0.0.2") as srv:
        srv.site(5)                                   # /, /p/0 .. /p/4, linked so a link-follower finds all
        srv.route("/api", sequence(Reply.throttle(429, "2"), Reply.text("ok")))
        srv.route("/slow/*", always(Reply.html("<p>slow</p>", delay=0.5)))   # '*' = prefix route
        url = srv.url("/api")                        # http://127.0.0.2:<port>/api
        ... run a crawl ...
        hits = srv.arrivals(path_prefix="/p/")
        assert min(gaps(hits)) >= 1.0

Rules:

* Only loopback addresses can be bound (127.0.0.0/8 and ``::1``); anything else raises ``ValueError``.
  On Linux every address of 127/8 is bindable without setup, so one machine can play many "IPs".
* HTTP/1.1 with keep-alive; every response carries ``Content-Length``.
* Routing: an exact path route wins; else the longest prefix route (a route registered as ``"/x/*"``
  matches every path starting with ``/x/``); routes may be limited to one ``Host`` (virtual hosts: many
  host names, one address). Unrouted ``/robots.txt`` is 404; any other unrouted path gets a small 200
  HTML page without links.
* A handler is ``handler(info: RequestInfo, count: int) -> Reply`` where ``count`` is how many times this
  (host, path) was requested before (0 on the first hit). The path used for counting and routing has no
  query string; :attr:`RequestInfo.target` keeps the raw request target.
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from scrapy_polite.clock import process_clock

__all__ = [
    "clock",
    "Arrival",
    "ArrivalServer",
    "Handler",
    "Reply",
    "RequestInfo",
    "always",
    "gaps",
    "sequence",
    "start_gaps",
]


def clock() -> float:
    """Now on the add-on's process clock (:data:`scrapy_polite.clock.process_clock`: epoch seconds that a step of
    the wall clock does not move), read from its anchor, so a test that swaps the process clock or the wall
    clock out (tests/test_clock.py) moves neither the servers' arrival logs nor the spiders' times."""
    return process_clock.anchor + time.monotonic()


# --------------------------------------------------------------------------------------------------
# Data types


@dataclass(frozen=True)
class Arrival:
    """One request as the server saw it.

    ``host`` is the Host header without port (IPv6 brackets removed, lower-cased); ``start`` is
    ``clock()`` right after the request line was read, ``end`` right before the response's last write (the
    client cannot have had the whole response earlier); ``server_address`` is the local address the connection was accepted on and ``client_port``
    the peer's port (equal ports on consecutive arrivals = one keep-alive connection; with more than one
    client address, compare ``(client_host, client_port)``).
    """

    host: str
    path: str
    start: float
    end: float
    status: int
    server_address: str
    client_port: int
    method: str = "GET"
    target: str = ""  # raw request target, query string included
    client_host: str = ""  # the peer's address: (client_host, client_port) names one connection


@dataclass(frozen=True)
class RequestInfo:
    """What a handler gets to decide its reply."""

    method: str
    host: str
    path: str  # without query string
    target: str  # raw request target (path + query)
    headers: dict[str, str]  # header names lower-cased
    body: bytes
    server_address: str
    client_port: int
    start: float


@dataclass
class Reply:
    """A scripted response. ``delay`` (seconds) is slept before the response is written, to simulate a
    slow server (the request's ``end`` then includes it)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | str = b""
    delay: float = 0.0

    # -- helpers ---------------------------------------------------------------------------------
    @classmethod
    def html(cls, html: str, status: int = 200, headers: dict[str, str] | None = None, delay: float = 0.0) -> Reply:
        return cls(status, {"Content-Type": "text/html; charset=utf-8", **(headers or {})}, html, delay)

    @classmethod
    def text(cls, text: str, status: int = 200, headers: dict[str, str] | None = None, delay: float = 0.0) -> Reply:
        return cls(status, {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}, text, delay)

    @classmethod
    def robots(cls, text: str) -> Reply:
        """A robots.txt body (served as text/plain, 200)."""
        return cls.text(text)

    @classmethod
    def throttle(
        cls, status: int = 429, retry_after: str | int | float | None = None, body: str = "slow down", delay: float = 0.0
    ) -> Reply:
        """A "slow down" reply: ``status`` (429/503/403…) with an optional ``Retry-After`` header, sent
        verbatim (``str(retry_after)``, so dates, decimals and garbage can all be scripted)."""
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return cls(status, headers, body, delay)

    @classmethod
    def redirect(cls, location: str, status: int = 302) -> Reply:
        return cls(status, {"Location": location, "Content-Type": "text/plain"}, "redirect")

    @classmethod
    def not_found(cls) -> Reply:
        return cls.text("not found", status=404)


Handler = Callable[[RequestInfo, int], Reply]


def always(reply: Reply) -> Handler:
    """A handler that answers ``reply`` every time."""
    return lambda info, count: reply


def sequence(*replies: Reply) -> Handler:
    """A handler that answers ``replies[count]`` for the count-th hit of a (host, path), repeating the last
    one forever: ``sequence(Reply.throttle(), Reply.throttle(), Reply.text("ok"))``."""
    if not replies:
        raise ValueError("sequence() needs at least one reply")
    return lambda info, count: replies[min(count, len(replies) - 1)]


def page(text: str = "ok") -> Reply:
    """A small HTML page."""
    return Reply.html(f"<html><body><p>{text}</p></body></html>")


def scripted(*replies: Reply | Handler, then: Reply | Handler | None = None) -> Handler:
    """A handler answering ``replies[i]`` to the i-th request the host receives, whatever its path (so the
    order in which Scrapy sends the URLs does not matter), then ``then`` (default a 200 page) forever.
    A reply may be a handler ``(info, count) -> Reply``, called at that moment."""
    lock = threading.Lock()
    seen = [0]

    def handler(info: RequestInfo, count: int) -> Reply:
        with lock:
            i = seen[0]
            seen[0] += 1
        reply = replies[i] if i < len(replies) else then if then is not None else page(info.path)
        return reply(info, count) if callable(reply) else reply

    return handler


# --------------------------------------------------------------------------------------------------
# Timeline helpers


def _sorted(arrivals: Iterable[Arrival]) -> list[Arrival]:
    return sorted(arrivals, key=lambda a: (a.start, a.end))


def gaps(arrivals: Iterable[Arrival]) -> list[float]:
    """``start[i+1] - end[i]`` for consecutive arrivals sorted by start: the idle time the server saw
    between the end of one response and the next request (negative when they overlapped)."""
    s = _sorted(arrivals)
    return [b.start - a.end for a, b in zip(s, s[1:])]


def start_gaps(arrivals: Iterable[Arrival]) -> list[float]:
    """``start[i+1] - start[i]`` for consecutive arrivals sorted by start."""
    s = _sorted(arrivals)
    return [b.start - a.start for a, b in zip(s, s[1:])]


# --------------------------------------------------------------------------------------------------
# The server


def _check_loopback(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"ArrivalServer binds only loopback IP literals (127.0.0.0/8, ::1), got {address!r}") from None
    if not ip.is_loopback:
        raise ValueError(f"ArrivalServer refuses to bind non-loopback address {address!r} (loopback only: 127.0.0.0/8, ::1)")
    return ip


def _host_without_port(host_header: str) -> str:
    h = host_header.strip().lower()
    if h.startswith("["):  # [v6]:port or [v6]
        end = h.find("]")
        return h[1:end] if end != -1 else h[1:]
    if h.count(":") == 1:  # name:port / v4:port
        return h.split(":", 1)[0]
    return h  # bare name, or a bare v6 literal (invalid in Host but keep it whole)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64
    owner: ArrivalServer

    def process_request(self, request, client_address):  # type: ignore[override]
        self.owner._track(request, True)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[override]
        self.owner._track(request, False)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):  # type: ignore[override]
        # A client that reset or dropped its connection (a crawler stopped or killed mid-request) is the client's
        # business, not the server's failure: no traceback on stderr. Anything else is printed, as by default.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ArrivalServer/1"
    timeout = 30  # an idle keep-alive connection is dropped after this
    server: _Server

    def log_message(self, format, *args):  # silence stderr logging
        pass

    def parse_request(self) -> bool:
        # Called right after the request line was read (and before the headers are).
        self._t_start = clock()
        self.server.owner._begin()
        self._in_flight = True
        ok = super().parse_request()
        if not ok:  # a malformed request was answered with an error: not logged
            self._done()
        return ok

    def _done(self) -> None:
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.server.owner._end()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self._done()  # whatever happened (client gone mid-response…), the request is no longer in flight

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_POST(self) -> None:
        self._serve()

    do_PUT = do_DELETE = do_OPTIONS = do_PATCH = do_POST

    def _serve(self, head: bool = False) -> None:
        owner = self.server.owner
        start = getattr(self, "_t_start", clock())
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        host = _host_without_port(self.headers.get("Host", "")) or owner.address
        target = self.path
        path = target.split("?", 1)[0].split("#", 1)[0] or "/"
        local = self.connection.getsockname()[0]
        info = RequestInfo(
            method=self.command,
            host=host,
            path=path,
            target=target,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            server_address=local,
            client_port=self.client_address[1],
            start=start,
        )
        try:
            reply = owner._dispatch(info)
        except Exception as exc:  # a broken handler is a test bug: make it visible as a 500
            owner.handler_errors.append(exc)
            reply = Reply.text(f"handler error: {exc!r}", status=500)
        if reply.delay > 0:
            time.sleep(reply.delay)
        payload = reply.body.encode("utf-8") if isinstance(reply.body, str) else bytes(reply.body)
        status = int(reply.status)
        self.send_response(status)
        sent = {k.lower() for k in reply.headers}
        for k, v in reply.headers.items():
            if k.lower() != "content-length":
                for line in v if isinstance(v, list) else [v]:  # a list: the field on several lines
                    self.send_header(k, line)
        if "content-type" not in sent and payload:
            self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(payload)))
        if "connection" in sent and reply.headers.get("Connection", "").lower() == "close":
            self.close_connection = True
        # ``end`` is read just before the response's last write: the client cannot have the whole response any
        # earlier. Read after it, a server thread waiting for the GIL (the crawl's reactor, in the same process,
        # collecting garbage) read it 60 ms late once, and a correctly paced next request looked 60 ms early.
        if not head and payload:
            self.end_headers()
            end = clock()
            self.wfile.write(payload)
        else:
            end = clock()
            self.end_headers()
        self.wfile.flush()
        owner._record(
            Arrival(
                host=host,
                path=path,
                start=start,
                end=end,
                status=status,
                server_address=local,
                client_port=self.client_address[1],
                method=self.command,
                target=target,
                client_host=self.client_address[0],
            )
        )


class ArrivalServer:
    """A loopback HTTP/1.1 server on an ephemeral port that logs every request as an :class:`Arrival`.

    Args:
        address: a loopback IP literal (``127.x.y.z`` or ``::1``); anything else raises ``ValueError``.
        port: 0 (default) for an ephemeral port.
        start: start serving immediately (default True); else call :meth:`start`.
    """

    def __init__(self, address: str = "127.0.0.1", port: int = 0, *, start: bool = True):
        ip = _check_loopback(address)
        self.address: str = str(ip)
        self.is_ipv6: bool = ip.version == 6
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._arrivals: list[Arrival] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        self._routes: list[tuple[str | None, str, bool, Handler]] = []  # (host, path, is_prefix, handler)
        self._conns: set[socket.socket] = set()
        self.handler_errors: list[BaseException] = []
        cls = _Server6 if self.is_ipv6 else _Server
        self._httpd = cls((self.address, port), _RequestHandler, bind_and_activate=True)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> ArrivalServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"ArrivalServer-{self.address}:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop open keep-alive connections and close the listening socket (idempotent)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()

    def __enter__(self) -> ArrivalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addressing --------------------------------------------------------------------------------
    @property
    def netloc(self) -> str:
        return self.hostport()

    def hostport(self, host: str | None = None) -> str:
        h = host if host is not None else self.address
        if ":" in h and not h.startswith("["):
            h = f"[{h}]"
        return f"{h}:{self.port}"

    def url(self, path: str = "/", host: str | None = None) -> str:
        """``http://host:port/path``; ``host`` defaults to the bind address (IPv6 literals bracketed).
        Use a host name (with the add-on's DNS overrides) to put several virtual hosts on one address."""
        if not path.startswith("/"):
            path = "/" + path
        return f"http://{self.hostport(host)}{path}"

    # -- scripting ---------------------------------------------------------------------------------
    def route(self, path_or_prefix: str, handler: Handler | Reply, host: str | None = None) -> ArrivalServer:
        """Serve ``path_or_prefix`` with ``handler`` (or a fixed :class:`Reply`).

        A trailing ``*`` makes a prefix route (``"/p/*"`` matches ``/p/anything``); otherwise the path must
        match exactly (query string ignored). ``host`` limits the route to one Host header value (without
        port). Later registrations of the same (host, path) replace earlier ones. Returns self.
        """
        if isinstance(handler, Reply):
            handler = always(handler)
        is_prefix = path_or_prefix.endswith("*")
        path = path_or_prefix[:-1] if is_prefix else path_or_prefix
        key_host = host.lower() if host else None
        with self._lock:
            self._routes = [r for r in self._routes if not (r[0] == key_host and r[1] == path and r[2] == is_prefix)]
            self._routes.append((key_host, path, is_prefix, handler))
        return self

    def site(self, n_pages: int, links_per_page: int = 3, host: str | None = None) -> list[str]:
        """Install a small link graph: ``/`` links to ``/p/0 .. /p/{k-1}`` and ``/p/i`` links to the next
        ``k`` pages (``k = links_per_page``), so a spider that follows links from ``/`` fetches all of
        ``/``, ``/p/0`` … ``/p/{n-1}`` (``n_pages + 1`` URLs). Pages beyond ``n_pages`` are 404.
        Returns the site's paths (``["/", "/p/0", ...]``)."""
        k = max(1, links_per_page)

        def page(links: Iterable[int], title: str) -> Reply:
            items = "".join(f'<li><a href="/p/{j}">page {j}</a></li>' for j in links)
            return Reply.html(f"<html><head><title>{title}</title></head><body><ul>{items}</ul></body></html>")

        def root(info: RequestInfo, count: int) -> Reply:
            return page(range(min(k, n_pages)), "root")

        def pages(info: RequestInfo, count: int) -> Reply:
            tail = info.path[len("/p/") :]
            if not tail.isdigit() or int(tail) >= n_pages:
                return Reply.not_found()
            i = int(tail)
            return page(range(i + 1, min(i + 1 + k, n_pages)), f"page {i}")

        self.route("/", root, host=host)
        self.route("/p/*", pages, host=host)
        return ["/"] + [f"/p/{i}" for i in range(n_pages)]

    def _dispatch(self, info: RequestInfo) -> Reply:
        key = (info.host, info.path)
        with self._lock:
            count = self._counts[key]
            self._counts[key] += 1
            routes = list(self._routes)
        best: tuple[int, int, Handler] | None = None  # (exact?, specificity, handler)
        for r_host, r_path, is_prefix, handler in routes:
            if r_host is not None and r_host != info.host:
                continue
            if is_prefix:
                if not info.path.startswith(r_path):
                    continue
                rank = (0, len(r_path) * 2 + (r_host is not None))
            else:
                if info.path != r_path:
                    continue
                rank = (1, r_host is not None)
            if best is None or rank > best[:2]:
                best = (*rank, handler)
        if best is not None:
            return best[2](info, count)
        if info.path == "/robots.txt":
            return Reply.not_found()
        return Reply.html(f"<html><body><p>{info.path}</p></body></html>")

    # -- the log -----------------------------------------------------------------------------------
    def _begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def _record(self, arrival: Arrival) -> None:
        with self._lock:
            self._arrivals.append(arrival)

    def wait_idle(self, timeout: float = 2.0) -> bool:
        """Wait until no request is being served (its arrival then is in the log). A client can read a
        response a moment before the server logs it; :meth:`arrivals` calls this first. Returns False on
        timeout (a request still in progress, e.g. a slow reply)."""
        with self._lock:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._lock:
            (self._conns.add if opened else self._conns.discard)(conn)

    def arrivals(self, host: str | None = None, path_prefix: str | None = None) -> list[Arrival]:
        """A snapshot of the log, in completion order, optionally filtered by Host (without port, compared
        lower-case) and path prefix. Sort by ``start`` (or use :func:`gaps`) for the request timeline.
        Waits up to 2 s for requests in progress to be logged (see :meth:`wait_idle`)."""
        self.wait_idle()
        with self._lock:
            out = list(self._arrivals)
        if host is not None:
            h = _host_without_port(host) if host.startswith("[") else host.lower()
            out = [a for a in out if a.host == h]
        if path_prefix is not None:
            out = [a for a in out if a.path.startswith(path_prefix)]
        return out

    def hits(self, path: str, host: str | None = None) -> int:
        """How many requests reached exactly ``path`` (optionally on one Host)."""
        return sum(1 for a in self.arrivals(host=host) if a.path == path)

    def clear(self) -> None:
        """Forget the log and the per-(host, path) counts (routes are kept)."""
        with self._lock:
            self._arrivals.clear()
            self._counts.clear()

    def __repr__(self) -> str:
        return f"<ArrivalServer {self.hostport()} arrivals={len(self._arrivals)}>"

