"""scrapy-playwright's browser is pinned: it reaches the network only through the crawl's proxy (issue 33, part 2;
docs/spec.md §4.1, docs/guides/safety.md "Download handlers").

One page, served from an allowed loopback address, tries every way a page has to make the browser reach an internal
canary (another loopback address, outside ``POLITE_ALLOWED_NETWORKS``): a direct ``fetch``, a ``fetch`` of its own
host that redirects (302) to the canary, ``window.open``, a WebSocket, a service worker's ``fetch``, and a host name
whose DNS answer changes to the canary's address after a first, allowed answer (the test DNS server; the browser's
own resolver is told the canary's address too, ``--host-resolver-rules``). With the add-on, the canary accepts no
connection and each refusal is counted and logged; without it (the negative control), the same page reaches the
canary by every one of those ways.

Debian's ``chromium`` (``/usr/bin/chromium``, or ``$POLITE_TEST_CHROMIUM``): missing, the tests skip on a developer's
machine and fail in CI, as tests/test_e2e_handlers.py does.
"""

from __future__ import annotations

import base64
import logging
import socket
import threading

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_polite.addon import Addon
from scrapy_polite.browser import BrowserRequestGuard, find_browser_proxy, proxy_refusal
from scrapy_polite.browser_proxy import CHROMIUM_ARGS, BrowserProxy, ProxyOptions
from scrapy_polite.network.addresses import AddressFilter
from scrapy_polite.network.handlers import CHECKED, PINNED, handler_modes
from scrapy_polite.resolver import PublicHostnameResolver
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)
from tests.support.server import Reply
from tests.test_e2e_addresses import same_port_servers  # noqa: F401  (a fixture)
from tests.test_e2e_handlers import PLAYWRIGHT, need, need_chromium
from tests.test_e2e_regressions import SilentServer

SITE = "127.0.21.2"
CANARY = "127.0.21.99"

PAGE = """<html><head><title>waiting</title></head><body><p>page</p><script>
const C = "http://{canary}:{port}";
const settle = (name, p) => Promise.resolve(p).then(() => name + ":ok", (e) => name + ":err");
const wait = (ms) => new Promise((res) => setTimeout(res, ms));
const attempts = [
  settle("direct", fetch(C + "/direct", {{mode: "no-cors"}})),
  settle("redirect", fetch("/redirect")),
  settle("rebind", fetch("http://rebind.test:{port}/first", {{mode: "no-cors"}}).catch(() => null)
    .then(() => fetch("http://rebind.test:{port}/second", {{mode: "no-cors"}}))),
  settle("ws", new Promise((res, rej) => {{
    const ws = new WebSocket("ws://{canary}:{port}/ws");
    ws.onopen = res; ws.onerror = rej; ws.onclose = rej; setTimeout(rej, 5000);
  }})),
  settle("popup", (async () => {{ window.open(C + "/popup"); await wait(2000); }})()),
  settle("sw", navigator.serviceWorker
    ? navigator.serviceWorker.register("/sw.js").then(() => Promise.race([navigator.serviceWorker.ready, wait(5000)]))
    : Promise.reject(new Error("no service workers"))),
];
Promise.all(attempts).then((results) => {{ document.title = "done " + results.join(" "); }});
</script></body></html>"""

SERVICE_WORKER = """self.addEventListener("install", (event) => {{
  event.waitUntil(fetch("http://{canary}:{port}/sw", {{mode: "no-cors"}}).catch(() => null));
}});
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
"""

#: What reaches the canary without the add-on: one path per way (the WebSocket's handshake is a GET of /ws).
CANARY_PATHS = {"/direct", "/redirected", "/popup", "/ws", "/sw", "/first", "/second"}


def count_connections(server) -> list[int]:
    """Count every TCP connection ``server`` accepts (an HTTP request or not): ``counted[0]``."""
    counted = [0]
    track = server._track

    def counting(conn, opened):
        if opened:
            counted[0] += 1
        track(conn, opened)

    server._track = counting
    return counted


def canary_page_crawl(site, canary, dns_srv, *, addon: bool):
    """The settings and URL of the crawl of the canary page (add-on on or off)."""
    port = site.port
    site.route("/", Reply.html(PAGE.format(canary=CANARY, port=port)))
    site.route("/redirect", Reply.redirect(f"http://{CANARY}:{port}/redirected"))
    site.route("/sw.js", Reply(200, {"Content-Type": "text/javascript"}, SERVICE_WORKER.format(canary=CANARY, port=port)))
    site.route("/first", Reply.text("first"))
    canary.route("/", Reply.text("internal"))
    from scrapy_playwright.page import PageMethod

    settings = {
        "DOWNLOAD_HANDLERS": {"http": PLAYWRIGHT, "https": PLAYWRIGHT},
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "PLAYWRIGHT_BROWSER_TYPE": "chromium",
        "PLAYWRIGHT_LAUNCH_OPTIONS": {
            "executable_path": need_chromium(), "headless": True,
            # The browser's own resolver answers the canary's address: the rebound answer.
            "args": [f"--host-resolver-rules=MAP rebind.test {CANARY}"]},
        "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": 30_000,
    }
    if addon:
        settings.update(polite_settings(
            POLITE_ALLOWED_NETWORKS=[f"{SITE}/32"], POLITE_DNS_NAMESERVERS=[dns_srv.address], POLITE_DNS_MIN_TTL=0,
            POLITE_DNS_TIMEOUT=2.0, POLITE_HOST_INTERVAL=0.0, POLITE_IP_INTERVAL=0.0))
    meta = {"playwright": True,
            "playwright_page_methods": [PageMethod("wait_for_function", "document.title.startsWith('done')",
                                                   timeout=25_000)]}
    return settings, [f"http://{SITE}:{port}/"], meta


def rebinding_dns(dns_server):  # noqa: F811
    """rebind.test: the allowed site's address on the first A query, the canary's on every later one (TTL 0)."""
    answers: list[str] = []

    def rebind(n: int, qtype: str) -> list[tuple[str, int]]:
        if qtype != "A":
            return []
        answers.append(SITE if n == 0 else CANARY)
        return [(answers[-1], 0)]

    return dns_server({"rebind.test": rebind}), answers


class PageSpider(ListSpider):
    name = "canary_page"

    def parse(self, response, user_meta):
        self.title = response.css("title::text").get()
        return super().parse(response, user_meta)


@pytest_twisted.ensureDeferred
async def test_the_browser_reaches_no_internal_address_by_any_way_through_the_proxy(
        same_port_servers, dns_server, caplog):  # noqa: F811
    site, canary = same_port_servers(SITE, CANARY)
    connections = count_connections(canary)
    dns_srv, answers = rebinding_dns(dns_server)
    settings, urls, meta = canary_page_crawl(site, canary, dns_srv, addon=True)
    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.browser_proxy"):
        crawler = await run_crawl(PageSpider, settings, urls=urls, meta=meta, timeout=90)
    spider = crawler.spider
    assert spider.statuses() == [200], spider.failed
    assert spider.title.startswith("done"), spider.title
    refusals = [r.getMessage() for r in caplog.records if "the browser's proxy refused" in r.getMessage()]
    assert connections[0] == 0 and canary.arrivals() == [], (canary.arrivals(), spider.title, refusals)
    # Each way was tried, and refused by the proxy.
    for path in ("/direct", "/redirected", "/popup", "/sw", "/second"):
        assert any(f"{CANARY}:{site.port}{path}" in m or f"rebind.test:{site.port}{path}" in m for m in refusals), \
            (path, refusals)
    assert any(f"refused {CANARY}:{site.port}:" in m for m in refusals), ("the WebSocket's CONNECT", refusals)
    # The rebinding: the first answer was allowed and used (the site saw /first), the second was the canary's.
    assert answers[:2] == [SITE, CANARY], answers
    assert "/first" in [a.path for a in site.arrivals()]
    assert crawler.stats.get_value("polite/browser/refused") >= 6
    assert crawler.stats.get_value("polite/browser/proxied") >= 3  # the page, /redirect, /first, /sw.js
    assert crawler.stats.get_value("polite/unpinned/playwright") is None  # pinned: no checked request


@pytest_twisted.ensureDeferred
async def test_negative_control_without_the_addon_the_page_reaches_the_canary_every_way(
        same_port_servers, dns_server):  # noqa: F811
    site, canary = same_port_servers(SITE, CANARY)
    dns_srv, _answers = rebinding_dns(dns_server)
    settings, urls, meta = canary_page_crawl(site, canary, dns_srv, addon=False)
    crawler = await run_crawl(PageSpider, settings, urls=urls, meta=meta, timeout=90)
    spider = crawler.spider
    assert spider.statuses() == [200], spider.failed
    reached = {a.path for a in canary.arrivals()}
    assert reached >= CANARY_PATHS, (sorted(reached), spider.title)


# ---------------------------------------------------------------------------------------------------
# The proxy itself, spoken to with a plain socket (no browser)


def exchange(port: int, data: bytes, *, then: bytes = b"", wait_close: bool = True) -> bytes:
    """Send ``data`` to the proxy on 127.0.0.1:``port`` and read until it closes (5 s at most); after a ``200``
    to a CONNECT, also send ``then`` through the tunnel."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        sent_then = False
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
            if then and not sent_then and b"\r\n\r\n" in received and received.startswith(b"HTTP/1.1 200"):
                sock.sendall(then)
                sent_then = True
            if not wait_close and b"\r\n\r\n" in received:
                break
        return received


def started_proxy(allowed: str, overrides=None):
    """A proxy bound to the add-on's resolver allowing only ``allowed``, listening; and what it counted."""
    from twisted.internet import reactor

    address_filter = AddressFilter(allowed_networks=[allowed])
    resolver = PublicHostnameResolver(reactor, address_filter=address_filter, overrides=overrides or {})
    counted: list[str] = []
    proxy = BrowserProxy()
    proxy.bind(address_filter=address_filter, resolver=lambda: resolver, inc=counted.append)
    proxy.start()
    return proxy, resolver, counted


def auth(proxy: BrowserProxy) -> bytes:
    token = base64.b64encode(f"{proxy.username}:{proxy.password}".encode())
    return b"Proxy-Authorization: Basic " + token + b"\r\n"


def port_of(proxy: BrowserProxy) -> int:
    return int(proxy.options["server"].rsplit(":", 1)[1])


@pytest_twisted.ensureDeferred
async def test_the_proxy_wants_the_crawls_own_credential(arrival_server):
    from twisted.internet import threads

    site = arrival_server("127.0.21.3")
    proxy, _resolver, counted = started_proxy("127.0.21.3/32")
    try:
        request = f"GET {site.url('/x')} HTTP/1.1\r\nHost: {site.netloc}\r\n".encode()
        for credential in (b"", b"Proxy-Authorization: Basic " + base64.b64encode(b"scrapy-polite:guess") + b"\r\n"):
            answer = await threads.deferToThread(exchange, port_of(proxy), request + credential + b"\r\n")
            assert answer.startswith(b"HTTP/1.1 407"), answer
            assert b'Proxy-Authenticate: Basic realm="scrapy-polite"' in answer
        assert site.arrivals() == [] and counted == []
        # Negative control: with the credential, the request goes.
        answer = await threads.deferToThread(exchange, port_of(proxy), request + auth(proxy) + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        [arrival] = site.arrivals()
        assert arrival.path == "/x" and arrival.target == "/x"  # sent in origin form
        assert counted == ["browser/proxied"]
    finally:
        await proxy.stop()


@pytest.mark.parametrize("spelling", [CANARY, "2132743523", "0x7f.0.21.99", "0177.0.21.99", "[::ffff:127.0.21.99]"])
@pytest_twisted.ensureDeferred
async def test_the_proxy_refuses_every_spelling_of_a_non_public_address(arrival_server, spelling):
    from twisted.internet import threads

    canary = arrival_server(CANARY)
    connections = count_connections(canary)
    proxy, _resolver, counted = started_proxy(f"{SITE}/32")
    try:
        for request in (f"GET http://{spelling}:{canary.port}/x HTTP/1.1\r\nHost: a\r\n".encode(),
                        f"CONNECT {spelling}:{canary.port} HTTP/1.1\r\nHost: a\r\n".encode()):
            answer = await threads.deferToThread(exchange, port_of(proxy), request + auth(proxy) + b"\r\n")
            assert answer.startswith(b"HTTP/1.1 403"), answer
        assert connections[0] == 0
        assert counted == ["browser/refused"] * 2
    finally:
        await proxy.stop()


@pytest_twisted.ensureDeferred
async def test_the_proxy_connects_to_the_pinned_address_and_tunnels(same_port_servers):  # noqa: F811
    """pinned.test resolves to .3 (an override), but a booked request pinned it to .4 (the booked address): the
    proxy connects to .4 while the pin holds, to .3 after; a CONNECT tunnel carries the bytes both ways."""
    from twisted.internet import threads

    three, four = same_port_servers("127.0.21.3", "127.0.21.4")
    proxy, resolver, counted = started_proxy("127.0.21.0/29", overrides={"pinned.test": ["127.0.21.3"]})
    try:
        resolver.pin("pinned.test", "127.0.21.4")
        request = f"GET http://pinned.test:{three.port}/p HTTP/1.1\r\nHost: pinned.test\r\n".encode() + auth(proxy)
        assert (await threads.deferToThread(exchange, port_of(proxy), request + b"\r\n")).startswith(b"HTTP/1.1 200")
        resolver.unpin("pinned.test", "127.0.21.4")
        assert (await threads.deferToThread(exchange, port_of(proxy), request + b"\r\n")).startswith(b"HTTP/1.1 200")
        assert [a.path for a in four.arrivals()] == ["/p"] and [a.path for a in three.arrivals()] == ["/p"]
        tunnel = f"CONNECT pinned.test:{three.port} HTTP/1.1\r\nHost: pinned.test\r\n".encode() + auth(proxy) + b"\r\n"
        inner = b"GET /t HTTP/1.1\r\nHost: pinned.test\r\nConnection: close\r\n\r\n"
        answer = await threads.deferToThread(exchange, port_of(proxy), tunnel, then=inner)
        assert answer.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200"), answer
        assert "/t" in [a.path for a in three.arrivals()]
        assert counted == ["browser/proxied"] * 3
        assert proxy.per_host == {"pinned.test": 3}
    finally:
        await proxy.stop()


class KeepAliveOrigin(SilentServer):
    """An origin on 127.0.21.3 that ignores ``Connection: close``: it answers every request head it reads on a
    connection, keeping it open; ``heads`` is every head (and body) it received."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        super().__init__("127.0.21.3")

    def _accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while chunk := conn.recv(65536):
                buffer += chunk
                while b"\r\n\r\n" in buffer:
                    head, buffer = buffer.split(b"\r\n\r\n", 1)
                    self.heads.append(head + (b" BODY=" + buffer if buffer else b""))
                    buffer = b""
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")


def two_on_one_connection(port: int, first: bytes, second: bytes) -> tuple[bytes, bytes]:
    """``first`` then, once its answer came, ``second`` on one connection to the proxy: both answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(first)
        answer = sock.recv(65536)
        sock.sendall(second)
        rest = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            rest += chunk
        return answer, rest


@pytest_twisted.ensureDeferred
async def test_a_second_request_on_a_kept_alive_connection_is_not_relayed():
    """A browser keeps its proxy connection alive; an origin that ignores ``Connection: close`` keeps its own. The
    second request (another host's, with its cookie and the proxy's credential) must not be relayed to the first
    origin unchecked (review): the proxy closes both connections instead. A request's body is relayed whole; the
    negative control: the same second request on a connection of its own is relayed."""
    from twisted.internet import threads

    origin = KeepAliveOrigin()
    proxy, _resolver, counted = started_proxy("127.0.21.3/32", overrides={"site.test": ["127.0.21.3"],
                                                                          "intranet.test": [CANARY]})
    try:
        first = (f"POST http://site.test:{origin.port}/form HTTP/1.1\r\nHost: site.test\r\nContent-Length: 5\r\n"
                 .encode() + auth(proxy) + b"\r\nhello")
        second = (f"GET http://intranet.test:{origin.port}/secret HTTP/1.1\r\nHost: intranet.test\r\n"
                  "Cookie: session=SECRET\r\n".encode() + auth(proxy) + b"\r\n")
        answer, rest = await threads.deferToThread(two_on_one_connection, port_of(proxy), first, second)
        assert answer.startswith(b"HTTP/1.1 200") and rest == b"", (answer, rest)
        assert len(origin.heads) == 1 and origin.heads[0].endswith(b" BODY=hello"), origin.heads
        assert b"Proxy-Authorization" not in origin.heads[0]
        again = second.replace(b"intranet.test", b"site.test")
        answer = await threads.deferToThread(exchange, port_of(proxy), again, wait_close=False)
        assert answer.startswith(b"HTTP/1.1 200") and len(origin.heads) == 2, answer
        assert counted == ["browser/proxied"] * 2
    finally:
        origin.close()
        await proxy.stop()


def recv_or_reset(sock: socket.socket) -> bytes:
    """What ``sock`` reads next; b"" when the connection was closed or reset (an aborted tunnel is reset)."""
    try:
        return sock.recv(1024)
    except ConnectionResetError:
        return b""


@pytest_twisted.ensureDeferred
async def test_stopping_the_proxy_closes_its_tunnels_and_its_port(arrival_server):
    from twisted.internet import threads

    site = arrival_server("127.0.21.3")
    proxy, _resolver, _counted = started_proxy("127.0.21.3/32")
    port = port_of(proxy)
    sock = await threads.deferToThread(socket.create_connection, ("127.0.0.1", port), 5)
    try:
        sock.sendall(f"CONNECT {site.netloc} HTTP/1.1\r\n".encode() + auth(proxy) + b"\r\n")
        assert (await threads.deferToThread(sock.recv, 1024)).startswith(b"HTTP/1.1 200")
        await proxy.stop()
        assert proxy.options["server"] == "http://127.0.0.1:1"  # a browser launched now could reach nothing
        assert await threads.deferToThread(recv_or_reset, sock) == b"", "the tunnel outlived the proxy"
    finally:
        sock.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ---------------------------------------------------------------------------------------------------
# What the add-on installs


def test_the_addon_gives_every_browser_context_the_proxy():
    settings = Settings({"DOWNLOAD_HANDLERS": {"https": PLAYWRIGHT},
                         "PLAYWRIGHT_LAUNCH_OPTIONS": {"headless": True, "args": ["--lang=de"]},
                         "PLAYWRIGHT_CONTEXTS": {"plain": {"locale": "de-DE"},
                                                 "kept": {"user_data_dir": "/tmp/x", "args": ["--a"]}}})
    Addon().update_settings(settings)
    launch = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    proxy = find_browser_proxy(settings)
    assert isinstance(proxy, BrowserProxy) and launch["proxy"] is proxy.options
    assert launch["args"] == ["--lang=de", *CHROMIUM_ARGS] and launch["headless"] is True
    contexts = settings.getdict("PLAYWRIGHT_CONTEXTS")
    assert contexts["plain"] == {"locale": "de-DE"}  # made from the launched browser: its proxy
    assert contexts["kept"]["proxy"] is proxy.options and contexts["kept"]["args"] == ["--a", *CHROMIUM_ARGS]
    assert handler_modes(settings)["https"].mode == PINNED  # the add-on's own proxy keeps it pinned
    assert settings.get("PLAYWRIGHT_ABORT_REQUEST") is None  # the proxy is the one rule
    assert set(proxy.options) == {"server", "username", "password"} and len(proxy.password) >= 32
    # Another crawl gets another credential.
    other = Settings({"DOWNLOAD_HANDLERS": {"https": PLAYWRIGHT}})
    Addon().update_settings(other)
    assert find_browser_proxy(other).password != proxy.password


@pytest.mark.parametrize(("extra", "why"), [
    ({"PLAYWRIGHT_CDP_URL": "http://127.0.0.1:9222"}, "PLAYWRIGHT_CDP_URL"),
    ({"PLAYWRIGHT_BROWSER_TYPE": "firefox"}, "PLAYWRIGHT_BROWSER_TYPE"),
    ({"PLAYWRIGHT_LAUNCH_OPTIONS": {"proxy": {"server": "http://corp:3128"}}}, "PLAYWRIGHT_LAUNCH_OPTIONS"),
    ({"PLAYWRIGHT_CONTEXTS": {"a": {"proxy": {"server": "http://corp:3128"}}}}, "PLAYWRIGHT_CONTEXTS['a']"),
    ({"PLAYWRIGHT_BROWSER_PROVIDER": "myproject.Provider"}, "PLAYWRIGHT_BROWSER_PROVIDER"),
    ({"PLAYWRIGHT_LAUNCH_OPTIONS": {"args": ["--no-proxy-server"]}}, "--no-proxy-server"),
    ({"PLAYWRIGHT_CONTEXTS": {"p": {"user_data_dir": "/tmp/p", "args": ["--proxy-server=http://corp:3128"]}}},
     "--proxy-server=http://corp:3128"),
])
def test_a_browser_that_cannot_be_given_the_proxy_is_checked_with_a_warning(extra, why, caplog):
    settings = Settings({"DOWNLOAD_HANDLERS": {"http": PLAYWRIGHT, "https": PLAYWRIGHT}, **extra})
    assert why in proxy_refusal(settings)
    with caplog.at_level(logging.WARNING, logger="scrapy_polite.addon"):
        Addon().update_settings(settings)
    assert handler_modes(settings)["https"].mode == CHECKED
    assert isinstance(settings["PLAYWRIGHT_ABORT_REQUEST"], BrowserRequestGuard)
    assert find_browser_proxy(settings) is None
    assert [r.levelname for r in caplog.records] == ["WARNING"] and why in caplog.records[0].getMessage()


def test_a_requests_own_persistent_context_gets_the_proxy_too():
    from scrapy import Request

    from scrapy_polite.network.handlers import UnpinnedRequests

    need("scrapy_playwright")
    settings = Settings({"DOWNLOAD_HANDLERS": {"https": PLAYWRIGHT}})
    Addon().update_settings(settings)
    options = find_browser_proxy(settings).options
    unpinned = UnpinnedRequests(handler_modes(settings), AddressFilter(), lambda _key: None)
    persistent = Request("https://a.example/", meta={"playwright_context_kwargs": {"user_data_dir": "/tmp/p"}})
    unpinned.sent(persistent)
    assert persistent.meta["playwright_context_kwargs"] == {"user_data_dir": "/tmp/p", "proxy": options,
                                                            "args": list(CHROMIUM_ARGS)}
    # Negative controls: a context made from the launched browser has the launch proxy already; a proxy of the
    # project's own is its choice (as meta['proxy'] is).
    for kwargs in ({"locale": "de-DE"}, {"user_data_dir": "/tmp/q", "proxy": {"server": "http://corp:3128"}}):
        request = Request("https://a.example/", meta={"playwright_context_kwargs": dict(kwargs)})
        unpinned.sent(request)
        assert request.meta["playwright_context_kwargs"] == kwargs
    assert isinstance(options, ProxyOptions)
