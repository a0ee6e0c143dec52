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

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_polite.addon import Addon
from scrapy_polite.addresses import AddressFilter
from scrapy_polite.browser import BrowserRequestGuard, find_browser_proxy, proxy_refusal
from scrapy_polite.browser_proxy import CHROMIUM_ARGS, BrowserProxy, ProxyOptions
from scrapy_polite.handlers import CHECKED, PINNED, handler_modes
from scrapy_polite.resolver import PublicHostnameResolver
from tests.support.crawl import ListSpider, polite_settings, run_crawl
from tests.support.dns_server import dns_server  # noqa: F401  (a fixture)
from tests.support.server import Reply
from tests.test_e2e_addresses import same_port_servers  # noqa: F401  (a fixture)
from tests.test_e2e_handlers import PLAYWRIGHT, need, need_chromium

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
