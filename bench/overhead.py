"""Benchmark: the cost of scrapy-polite on a fast crawl where politeness asks for nothing.

Usage::

    python bench/overhead.py [--hosts 50] [--pages 40] [--repeat 2]

A crawl of ``hosts × pages`` pages (default 50 × 40 = 2,000) over loopback hosts 127.0.5.10, 127.0.5.11, …
(one :class:`~tests.support.server.ArrivalServer` per address, all in a *separate process* so that the
servers do not compete with the crawler for the GIL), URLs listed round-robin over the hosts, run

* ``plain``: plain Scrapy (``CONCURRENT_REQUESTS=16``, ``CONCURRENT_REQUESTS_PER_DOMAIN=8``, no delay);
* ``polite``: the same with ``ADDONS = {"scrapy_polite.Addon": 0}`` and every interval 0
  (``POLITE_HOST_INTERVAL=0``, ``POLITE_IP_INTERVAL=0``), the default SQLite pace table in a temporary
  directory, loopback allowed (``POLITE_ALLOWED_NETWORKS``).

For comparison, ``polite (memory://)`` is the add-on with the in-memory pace table (``--no-memory`` skips it).
Each is run ``--repeat`` times, alternating; printed: pages/s of every run (crawl wall time from start to
close), the best of each, and the ratio polite/plain of the bests (target ≥ 0.9). A warm-up crawl runs first.
``--order host`` lists all URLs of one host, then the next (the add-on then defers the requests whose host's
line is taken). Runs in well under a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

BASE = "127.0.5."


def serve(hosts: int, first: int) -> None:
    """Child process: start the servers, print ``{address: port}`` as one JSON line, serve until stdin closes."""
    from tests.support.server import ArrivalServer, Reply

    servers = []
    body = "<html><body>" + "<p>lorem ipsum dolor sit amet</p>" * 20 + "</body></html>"
    for i in range(hosts):
        srv = ArrivalServer(f"{BASE}{first + i}")
        srv.route("/*", Reply.html(body))
        servers.append(srv)
    print(json.dumps({srv.address: srv.port for srv in servers}), flush=True)
    sys.stdin.read()
    for srv in servers:
        srv.stop()


async def crawl(settings, urls):
    from tests.support.crawl import ListSpider, run_crawl

    t0 = time.time()
    crawler = await run_crawl(ListSpider, settings, urls=urls, timeout=600)
    elapsed = time.time() - t0
    ok = sum(1 for f in crawler.spider.fetched if f.status == 200)
    assert ok == len(urls), f"{ok} of {len(urls)} pages fetched: {crawler.stats.get_stats()}"
    assert crawler.stats.get_value("finish_reason") == "finished"
    return len(urls) / elapsed, crawler


async def main(args) -> None:
    from tests.support.crawl import polite_settings

    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--hosts", str(args.hosts)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(child.stdout.readline())
        hosts = sorted(ports, key=lambda a: tuple(int(x) for x in a.split(".")))
        if args.order == "host":
            urls = [f"http://{a}:{ports[a]}/p/{i}" for a in hosts for i in range(args.pages)]
        else:
            urls = [f"http://{a}:{ports[a]}/p/{i}" for i in range(args.pages) for a in hosts]
        tmp = tempfile.mkdtemp(prefix="polite-overhead-")
        plain = {"LOG_LEVEL": "WARNING", "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 8}

        def polite(run: int, store: str = "sqlite"):
            uri = "memory://" if store == "memory" else f"sqlite:///{tmp}/run{run}/polite.sqlite3"
            return {**plain, **polite_settings(
                POLITE_HOST_INTERVAL=0, POLITE_IP_INTERVAL=0, POLITE_ALLOWED_NETWORKS=["127.0.0.0/8"],
                POLITE_STORE=uri)}

        os.makedirs(f"{tmp}/warm", exist_ok=True)
        await crawl({**plain, "LOG_LEVEL": "ERROR"}, urls[: len(hosts)])
        print(f"overhead benchmark: {len(urls)} pages over {len(hosts)} loopback hosts "
              f"({hosts[0]} .. {hosts[-1]}, URLs in {args.order} order), CONCURRENT_REQUESTS=16, "
              "servers in a separate process")
        names = ["plain", "polite"] + (["polite (memory://)"] if args.memory else [])
        results: dict[str, list[float]] = {name: [] for name in names}
        for run in range(args.repeat):
            for name in names:
                if name == "plain":
                    settings = plain
                else:
                    os.makedirs(f"{tmp}/run{run}", exist_ok=True)
                    settings = polite(run, "memory" if "memory" in name else "sqlite")
                rate, crawler = await crawl(settings, urls)
                results[name].append(rate)
                extra = ""
                if name != "plain":
                    get = crawler.stats.get_value
                    extra = (f"  (polite/requests={get('polite/requests')}, deferrals={get('polite/deferrals', 0)}, "
                             f"waits={get('polite/waits', 0)})")
                print(f"  run {run + 1} {name:19} {rate:8.1f} pages/s{extra}", flush=True)
        best = {name: max(rates) for name, rates in results.items()}
        print("best: " + ", ".join(f"{name} {rate:.1f} pages/s" for name, rate in best.items()))
        print(f"ratio polite/plain {best['polite'] / best['plain']:.2f} (target >= 0.9)"
              + (f"; with the memory:// store {best['polite (memory://)'] / best['plain']:.2f}" if args.memory else ""))
    finally:
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--pages", type=int, default=40, help="pages per host")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--order", choices=["round-robin", "host"], default="round-robin",
                        help="URL order: round-robin over the hosts (default) or all of one host, then the next")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the extra polite run with the memory:// store (for comparison)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=10, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.hosts, args.first)
    else:
        from twisted.internet import asyncioreactor

        asyncioreactor.install()
        from twisted.internet import defer, task

        task.react(lambda _reactor: defer.ensureDeferred(main(args)))
