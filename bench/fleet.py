"""The two-process slow-host crawl of docs/spec.md §3 ("In flight"), with and without the in-flight hold, on the
default SQLite table and on Redis: the server-side figures.

Usage::

    python bench/fleet.py [--rounds 1] [--pages 4] [--slow 1.2] [--interval 0.5]

Two real Scrapy processes (``CrawlerProcess``, the add-on, ``POLITE_HOST_INTERVAL = POLITE_IP_INTERVAL =
--interval``) share one pace table and crawl one loopback host that answers every page ``--slow`` seconds after
it arrives, ``--pages`` pages each. From the server's arrival log it prints, per table and mode:

* **overlapped**: consecutive pairs whose second request started while the first was still in progress;
* **early**: pairs whose second request started before the first one's end + the interval (− 20 ms);
* **span / ideal**: the crawl's span (first start to last end) against its ideal, each request one interval
  after the previous end (target with the hold: ≤ 1.1).

"hold off" is the crawl with the hold switched off in both processes (``tests.support.fleet``'s ``no_hold``: the
booking reserves the host for one interval from its start, as before the hold). Redis is a ``redis-server`` this
script starts on a free loopback port (persistence off) and stops. Nothing leaves the machine; about a minute.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.support.fleet import Crawl  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.server import ArrivalServer, Reply  # noqa: E402

HOST = "slow.test"
ADDRESS = "127.0.9.71"


def crawl(store: str, prefix: str, pages: int, slow: float, interval: float, hold: bool) -> tuple[int, int, int, float]:
    """One two-process crawl: (pairs, overlapped, early, span / ideal)."""
    with ArrivalServer(ADDRESS) as srv, tempfile.TemporaryDirectory() as tmp:
        srv.route("/*", lambda info, count: Reply.text(info.path, delay=slow), host=HOST)
        settings = {"ADDONS": {"scrapy_polite.Addon": 0}, "POLITE_STORE": store.format(tmp=tmp),
                    "POLITE_STORE_PREFIX": prefix, "POLITE_HOST_INTERVAL": interval, "POLITE_IP_INTERVAL": interval,
                    "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"], "POLITE_DNS_OVERRIDES": {HOST: [ADDRESS]},
                    "LOG_LEVEL": "WARNING"}
        crawls = [Crawl(Path(tmp), f"c{p}", [srv.url(f"/p{p}/{i}", host=HOST) for i in range(pages)], settings,
                        patch=[] if hold else ["no_hold"]) for p in range(2)]
        for c in crawls:
            c.result(timeout=300)
        hits = sorted(srv.arrivals(), key=lambda a: a.start)
    pairs = list(zip(hits, hits[1:]))
    overlapped = sum(1 for a, b in pairs if b.start < a.end)
    early = sum(1 for a, b in pairs if b.start - a.end < interval - 0.02)
    ideal = sum(a.end - a.start for a in hits) + interval * (len(hits) - 1)
    return len(pairs), overlapped, early, (hits[-1].end - hits[0].start) / ideal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pages", type=int, default=4, help="pages per process")
    parser.add_argument("--slow", type=float, default=1.2, help="seconds the host takes over each answer")
    parser.add_argument("--interval", type=float, default=0.5, help="host and address interval, seconds")
    args = parser.parse_args()
    with RedisServer(persist=False) as redis:
        tables = {"SQLite": ("sqlite:///{tmp}/polite.sqlite3", "polite:"), "Redis": (redis.url, "bench:fleet:")}
        print(f"two processes, {args.pages} pages each, host answers in {args.slow} s, interval {args.interval} s")
        print(f"{'table':8} {'mode':9} {'round':>5} {'overlapped':>11} {'early':>9} {'span/ideal':>11}")
        for name, (store, prefix) in tables.items():
            for hold in (False, True):
                for r in range(args.rounds):
                    pairs, overlapped, early, ratio = crawl(store, f"{prefix}{hold}:{r}:", args.pages, args.slow,
                                                            args.interval, hold)
                    mode = "hold" if hold else "hold off"
                    print(f"{name:8} {mode:9} {r + 1:5} {overlapped:>4} of {pairs:<4} {early:>3} of {pairs:<3} "
                          f"{ratio:>11.3f}")


if __name__ == "__main__":
    main()
