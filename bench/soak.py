"""Soak: a long crawl over 200 loopback hosts that throttle at random, checked on the server side.

Usage::

    python bench/soak.py [--minutes 5] [--hosts 200] [--seed N] [--plain]

200 host names (``h0.soak.test`` …, ``POLITE_DNS_OVERRIDES``) on 8 loopback addresses (127.0.9.1-8, one
:class:`~tests.support.server.ArrivalServer` each, in this process) answer each request, at random (seeded):
8 % ``429`` with ``Retry-After`` 1-5 s, 2 % ``503`` without one, else ``200`` after 0-30 ms. The crawl runs in
a fresh process (this script with ``--child``): the add-on, a SQLite pace table in a temporary directory,
``POLITE_HOST_INTERVAL = 0.5``, ``POLITE_IP_INTERVAL = 0``, Scrapy's retries, ``CLOSESPIDER_TIMEOUT`` =
``--minutes``. Its spider keeps two requests per host outstanding (``dont_filter``, so the dupe filter does
not grow), round robin, without end.

Printed: requests and statuses the servers saw, the crawl's ``polite/...`` counters, the **spacing
violations** found in the servers' arrival log (target 0) — a request to a host that started less than
``POLITE_HOST_INTERVAL`` after the end of the previous one (or while it was in flight), or less than
``Retry-After`` after the end of a ``429`` — and the crawl process's RSS 15 s in and at the end (sampled every
5 s from ``/proc``, Linux). ``--plain`` runs the same crawl without the add-on, the checks' negative control.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # a source checkout: the package need not be installed

INTERVAL = 0.5
#: Lower-bound tolerance (seconds): clock granularity only (one machine, one clock).
TOL = 0.02
ADDRESSES = [f"127.0.9.{i}" for i in range(1, 9)]


def host_names(n: int) -> list[str]:
    return [f"h{i}.soak.test" for i in range(n)]


# -- the crawl process -------------------------------------------------------------------------------------


def child(config_path: str) -> None:
    import scrapy
    from scrapy.crawler import CrawlerProcess

    with open(config_path) as f:
        config = json.load(f)
    plain = config["plain"]
    # Plain Scrapy cannot use the DNS overrides: it connects to the address and names the host in the header.
    targets = [(ip_base if plain else base, {"Host": name} if plain else {})
               for base, ip_base, name in config["targets"]]

    class SoakSpider(scrapy.Spider):
        name = "soak"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.outstanding = 0

        async def start(self) -> AsyncIterator[Any]:
            n = 0
            while True:
                while self.outstanding >= 2 * len(targets):
                    await asyncio.sleep(0.02)
                base, headers = targets[n % len(targets)]
                self.outstanding += 1
                yield scrapy.Request(f"{base}/p/{n}", headers=headers, dont_filter=True, callback=self.parse,
                                     errback=self.failed)
                n += 1

        def parse(self, response: Any) -> None:
            self.outstanding -= 1

        def failed(self, failure: Any) -> None:
            self.outstanding -= 1

    settings = {
        "ADDONS": {} if plain else {"scrapy_polite.Addon": 0},
        "POLITE_STORE": config["store"],
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "POLITE_DNS_OVERRIDES": config["overrides"],
        "POLITE_HOST_INTERVAL": INTERVAL,
        "POLITE_IP_INTERVAL": 0,
        "CLOSESPIDER_TIMEOUT": config["seconds"],
        "CONCURRENT_REQUESTS": 64,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "DOWNLOAD_TIMEOUT": 10,
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(SoakSpider)
    process.crawl(crawler)
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    print(json.dumps({k: v for k, v in stats.items() if k.startswith("polite/") or k in (
        "finish_reason", "downloader/request_count", "retry/count", "item_scraped_count")}, default=str))


# -- the servers and the checks ----------------------------------------------------------------------------


class Throttling:
    """8 % 429 + Retry-After 1-5 s, 2 % 503, else a page after 0-30 ms. :attr:`retry_after` keeps the
    Retry-After of each 429 by ``(host, path, start)`` (the server's arrival log has the same start)."""

    def __init__(self, seed: int) -> None:
        from tests.support.server import Reply

        self.reply = Reply
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.retry_after: dict[tuple[str, str, float], float] = {}

    def __call__(self, info: Any, count: int) -> Any:
        with self.lock:
            x = self.random.random()
            retry_after = self.random.randint(1, 5)
            delay = self.random.uniform(0, 0.03)
            if x < 0.08:
                self.retry_after[(info.host, info.path, info.start)] = float(retry_after)
        if x < 0.08:
            return self.reply.throttle(429, str(retry_after))
        if x < 0.10:
            return self.reply.throttle(503)
        return self.reply.html(f"<p>{info.path}</p>", delay=delay)


def violations(arrivals: list[Any], retry_after: dict[tuple[str, str, float], float]) -> tuple[int, int, list[str]]:
    """(interval violations, Retry-After violations, examples) over one host's arrivals."""
    hits = sorted(arrivals, key=lambda a: a.start)
    spacing = windows = 0
    examples = []
    for prev, nxt in zip(hits, hits[1:]):
        gap = nxt.start - prev.end
        if gap < INTERVAL - TOL:
            spacing += 1
            if len(examples) < 5:
                examples.append(f"{nxt.host}: {nxt.path} {gap:.3f} s after the end of {prev.path}")
    throttles = [a for a in hits if a.status == 429]
    for t in throttles:
        ra = retry_after[(t.host, t.path, t.start)]
        inside = [a for a in hits if t.end <= a.start < t.end + ra - TOL]
        windows += len(inside)
        for a in inside[: max(0, 5 - len(examples))]:
            examples.append(f"{a.host}: {a.path} {a.start - t.end:.3f} s after a 429 with Retry-After {ra:g}")
    return spacing, windows, examples


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--plain", action="store_true",
                        help="the negative control: plain Scrapy, without the add-on (the checks must find violations)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)

    from tests.support.server import ArrivalServer

    handler = Throttling(seed)
    servers = [ArrivalServer(address) for address in ADDRESSES]
    for srv in servers:
        srv.route("/*", handler)
    names = host_names(args.hosts)
    server_of = {name: servers[i % len(servers)] for i, name in enumerate(names)}
    directory = tempfile.mkdtemp(prefix="polite-soak-")
    config = {
        "targets": [(server_of[name].url("", host=name).rstrip("/"), server_of[name].url("").rstrip("/"), name)
                    for name in names],
        "overrides": {name: [server_of[name].address] for name in names},
        "store": f"sqlite:///{os.path.join(directory, 'pace.sqlite3')}",
        "seconds": int(args.minutes * 60),
        "plain": args.plain,
    }
    config_path = os.path.join(directory, "config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)

    print(f"soak{' (plain Scrapy, no add-on)' if args.plain else ''}: {args.hosts} hosts on {len(servers)} loopback "
          f"addresses, {args.minutes:g} min, seed {seed}")
    started = time.time()
    proc = subprocess.Popen([sys.executable, __file__, "--child", config_path], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, float]] = []
    while proc.poll() is None:
        rss = rss_mb(proc.pid)
        if rss is not None:
            samples.append((time.time() - started, rss))
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    out, err = proc.communicate()
    elapsed = time.time() - started
    for srv in servers:
        srv.stop()
    if proc.returncode != 0 or not out.strip():
        raise SystemExit(f"the crawl failed ({proc.returncode}):\n{err[-3000:]}")
    stats = json.loads(out.strip().splitlines()[-1])

    by_host: dict[str, list[Any]] = defaultdict(list)
    for srv in servers:
        for a in srv.arrivals():
            by_host[a.host].append(a)
    statuses: Counter[int] = Counter()
    spacing = windows = 0
    examples: list[str] = []
    for hits in by_host.values():
        statuses.update(a.status for a in hits)
        s, w, e = violations(hits, handler.retry_after)
        spacing, windows = spacing + s, windows + w
        examples += e[: max(0, 5 - len(examples))]
    total = sum(statuses.values())
    warm = next((rss for t, rss in samples if t >= 15), samples[0][1] if samples else float("nan"))
    print(f"  {total:,} requests in {elapsed:.0f} s ({total / elapsed:.0f}/s) to {len(by_host)} hosts: "
          + ", ".join(f"{n:,} × {code}" for code, n in sorted(statuses.items())))
    print(f"  crawl: finish_reason {stats.get('finish_reason')}, polite/requests {stats.get('polite/requests', 0):,}, "
          f"deferrals {stats.get('polite/deferrals', 0):,}, max held {stats.get('polite/deferred/max_held', 0):,}, "
          f"backoff steps {stats.get('polite/backoff_steps', 0):,}")
    print(f"  spacing violations: {spacing} (interval {INTERVAL:g} s), {windows} inside a Retry-After window"
          + ("" if not examples else "\n    " + "\n    ".join(examples)))
    print(f"  crawl process RSS: {warm:.1f} MB at 15 s, {samples[-1][1]:.1f} MB at the end, "
          f"max {max(r for _, r in samples):.1f} MB ({len(samples)} samples)")


if __name__ == "__main__":
    main()
