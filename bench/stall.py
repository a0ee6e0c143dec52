"""Benchmark: the stall of Scrapy issue #2638 ("Scrapy will fill all slots with the same, waiting domain").

Usage::

    python bench/stall.py [--pages 30] [--healthy 9] [--retry-after 20]

The crawl: ``--healthy`` loopback hosts (127.0.4.10, …) with ``--pages`` pages each, plus one *bad* host
(127.0.4.99) with as many URLs that serves its first request and answers every later one
``429`` + ``Retry-After: 20``. ``CONCURRENT_REQUESTS=16``, ``RETRY_ENABLED`` left at Scrapy's default
(True) so Scrapy behaves as users see it. Run four ways, each with and without the bad host:

* ``plain DOWNLOAD_DELAY``: plain Scrapy with ``DOWNLOAD_DELAY=0.1``;
* ``plain AutoThrottle``: plain Scrapy with ``AUTOTHROTTLE_ENABLED=True`` (its defaults otherwise;
  ``DOWNLOAD_DELAY=0.1`` is its minimum delay);
* ``plain + sleep on RA``: plain Scrapy (``DOWNLOAD_DELAY=0.1``) with the downloader middleware users commonly
  write to honour Retry-After (:class:`SleepRetryAfterMiddleware`: the host's next requests sleep inside the
  downloader until the Retry-After has passed) — the set-up in which #2638's stall shows: the sleeping
  requests hold ``CONCURRENT_REQUESTS`` slots;
* ``scrapy-polite``: the add-on, ``POLITE_HOST_INTERVAL=0.1``, ``POLITE_IP_INTERVAL=0``,
  ``POLITE_MAX_IDLE_WAIT=2`` (the crawl ends once only the bad host's deferred requests are left).

Printed for each: the healthy hosts' completion time (last healthy response's end − crawl start) without and
with the bad host and their ratio (target for scrapy-polite ≤ 1.1), and the number of requests the bad host
received and how many of them started inside a Retry-After window (less than Retry-After seconds after the
end of an earlier 429; target for scrapy-polite: 0).

Plain Scrapy ignores Retry-After and would go on retrying the bad host long after the healthy hosts are
done (AutoThrottle keeps the bad host's slot at its start delay, since only 200s lower it); those runs are
stopped ``--grace`` seconds after the last healthy page (the bad host's counts are up to then, as printed).
A one-page warm-up crawl runs first. Runs in about 1.5 minutes on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

from twisted.internet import asyncioreactor  # noqa: E402

asyncioreactor.install()

from scrapy.utils.defer import deferred_from_coro  # noqa: E402
from twisted.internet import defer, reactor, task  # noqa: E402

from tests.support.crawl import ListSpider, polite_settings, run_crawl  # noqa: E402
from tests.support.server import ArrivalServer, Reply, scripted  # noqa: E402

HEALTHY_BASE = "127.0.4."
BAD_ADDRESS = "127.0.4.99"


class StallSpider(ListSpider):
    """Stops the crawl ``grace`` seconds after every healthy URL was answered (None: never)."""

    name = "stall"

    def __init__(self, *args, healthy_total: int = 0, grace: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.healthy_total = healthy_total
        self.grace = grace
        self.healthy_done = 0
        self._stopping = False

    def parse(self, response, user_meta):
        if not response.url.startswith(f"http://{BAD_ADDRESS}:"):
            self.healthy_done += 1
            if self.grace is not None and self.healthy_done >= self.healthy_total and not self._stopping:
                self._stopping = True
                reactor.callLater(self.grace, self._stop)
        return super().parse(response, user_meta)

    def _stop(self):
        """Stop the crawl now. Requests still queued in the downloader's slots (plain Scrapy's bad-host
        retries waiting for their slot's delay) and requests sleeping in SleepRetryAfterMiddleware are cancelled
        first: the engine would otherwise wait for each
        of them to be sent before it closes."""
        from scrapy.exceptions import IgnoreRequest

        for slot in self.crawler.engine.downloader.slots.values():
            while slot.queue:
                request, d = slot.queue.popleft()
                d.errback(IgnoreRequest("benchmark stopped"))
        for mw in self.crawler.engine.downloader.middleware.middlewares:
            if isinstance(mw, SleepRetryAfterMiddleware):
                mw.cancel()
        deferred_from_coro(self.crawler.stop_async())


class SleepRetryAfterMiddleware:
    """What users commonly write to honour Retry-After with plain Scrapy: remember the host's Retry-After and
    make the next requests to it *wait inside the downloader* (a non-blocking sleep in process_request)."""

    def __init__(self):
        self.until: dict[str, float] = {}
        self.sleeping: set = set()

    async def process_request(self, request):
        from urllib.parse import urlsplit

        from scrapy.utils.defer import maybe_deferred_to_future

        wait = self.until.get(urlsplit(request.url).hostname, 0.0) - time.time()
        if wait > 0:
            d = task.deferLater(reactor, wait, lambda: None)
            self.sleeping.add(d)
            try:
                await maybe_deferred_to_future(d)
            finally:
                self.sleeping.discard(d)
        return None

    def process_response(self, request, response):
        from urllib.parse import urlsplit

        raw = response.headers.get(b"Retry-After")
        if response.status in (429, 503) and raw and raw.strip().isdigit():
            host = urlsplit(request.url).hostname
            self.until[host] = max(self.until.get(host, 0.0), time.time() + int(raw))
        return response

    def cancel(self):
        for d in list(self.sleeping):
            d.cancel()


def bad_handler(retry_after: int):
    """The bad host: its first request is served, every later one answered 429 + Retry-After."""
    return scripted(Reply.html("<html><body>first</body></html>"), then=Reply.throttle(429, str(retry_after)))


def modes(tmp: str) -> dict[str, tuple[dict, float | None]]:
    common = {"CONCURRENT_REQUESTS": 16, "RETRY_ENABLED": True, "LOG_LEVEL": "WARNING"}
    return {
        "plain DOWNLOAD_DELAY": ({**common, "DOWNLOAD_DELAY": 0.1}, "grace"),
        "plain AutoThrottle": ({**common, "DOWNLOAD_DELAY": 0.1, "AUTOTHROTTLE_ENABLED": True}, "grace"),
        "plain + sleep on RA": ({**common, "DOWNLOAD_DELAY": 0.1,
                                 "DOWNLOADER_MIDDLEWARES": {SleepRetryAfterMiddleware: 950}}, "grace"),
        "scrapy-polite": ({**common, **polite_settings(
            POLITE_HOST_INTERVAL=0.1, POLITE_IP_INTERVAL=0, POLITE_MAX_IDLE_WAIT=2.0,
            POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"], POLITE_STORE=f"sqlite:///{tmp}/{{run}}.sqlite3")}, None),
    }


def urls_for(healthy, bad, pages):
    per_host = [[srv.url(f"/p/{i}") for i in range(pages)] for srv in healthy]
    if bad is not None:
        per_host.insert(0, [bad.url(f"/b/{i}") for i in range(pages)])
    return [u[i] for i in range(pages) for u in per_host]


def in_windows(arrivals, window):
    throttles = [a for a in arrivals if a.status == 429]
    return [a for a in arrivals if any(t.end <= a.start < t.end + window for t in throttles if t is not a)]


async def one_run(name, settings, grace, healthy, bad, pages, args, tmp, run_id):
    for srv in healthy + [bad]:
        srv.clear()
    bad.route("/*", bad_handler(args.retry_after))  # a fresh script: its first request is served again
    s = dict(settings)
    if "POLITE_STORE" in s:
        s["POLITE_STORE"] = s["POLITE_STORE"].replace("{run}", run_id)
    t0 = time.time()
    crawler = await run_crawl(StallSpider, s, urls=urls_for(healthy, bad if args.with_bad else None, pages),
                              healthy_total=len(healthy) * pages,
                              grace=args.grace if grace == "grace" else None, timeout=args.timeout)
    t_end = time.time()
    healthy_hits = [a for srv in healthy for a in srv.arrivals()]
    ok = sum(1 for a in healthy_hits if a.status == 200)
    t_healthy = max(a.end for a in healthy_hits) - t0
    bad_hits = sorted(bad.arrivals(), key=lambda a: a.start)
    return {
        "t_healthy": t_healthy, "healthy_ok": ok, "bad_requests": len(bad_hits),
        "bad_in_windows": len(in_windows(bad_hits, args.retry_after)),
        "reason": crawler.stats.get_value("finish_reason"), "duration": t_end - t0,
        "not_crawled": crawler.stats.get_value("polite/deferred/not_crawled"),
    }


async def main(args):
    healthy = [ArrivalServer(f"{HEALTHY_BASE}{10 + i}") for i in range(args.healthy)]
    bad = ArrivalServer(BAD_ADDRESS)
    tmp = tempfile.mkdtemp(prefix="polite-stall-")
    try:
        await run_crawl(ListSpider, {"LOG_LEVEL": "WARNING"}, urls=[healthy[0].url("/warm")])
        print(f"stall benchmark: {args.healthy} healthy hosts x {args.pages} pages + 1 bad host x {args.pages} URLs "
              f"(first request 200, then 429 + Retry-After: {args.retry_after}); CONCURRENT_REQUESTS=16, "
              f"RETRY_ENABLED=True")
        header = (f"{'mode':22} {'healthy s (no bad)':>18} {'healthy s (bad)':>16} {'ratio':>6} "
                  f"{'bad reqs':>8} {'in RA window':>12} {'crawl s':>7}  finish_reason")
        print(header)
        print("-" * len(header))
        for i, (name, (settings, grace)) in enumerate(modes(tmp).items()):
            args.with_bad = False
            without = await one_run(name, settings, grace, healthy, bad, args.pages, args, tmp, f"{i}-without")
            args.with_bad = True
            with_ = await one_run(name, settings, grace, healthy, bad, args.pages, args, tmp, f"{i}-with")
            total = args.healthy * args.pages
            assert without["healthy_ok"] == total and with_["healthy_ok"] == total, (name, without, with_)
            ratio = with_["t_healthy"] / without["t_healthy"]
            extra = f" (not_crawled={with_['not_crawled']})" if with_["not_crawled"] is not None else ""
            print(f"{name:22} {without['t_healthy']:18.2f} {with_['t_healthy']:16.2f} {ratio:6.2f} "
                  f"{with_['bad_requests']:8d} {with_['bad_in_windows']:12d} {with_['duration']:7.1f}  "
                  f"{with_['reason']}{extra}")
        print("targets for scrapy-polite: ratio <= 1.1, 0 requests inside a Retry-After window")
    finally:
        for srv in healthy + [bad]:
            srv.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=30)
    parser.add_argument("--healthy", type=int, default=9)
    parser.add_argument("--retry-after", type=int, default=20)
    parser.add_argument("--grace", type=float, default=5.0,
                        help="plain runs: stop this long after the last healthy page (default 5 s)")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    task.react(lambda _reactor: defer.ensureDeferred(main(args)))
