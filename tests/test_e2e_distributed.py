"""Many Scrapy processes, one Redis pace table (docs/spec.md §6; README "Running many crawlers").

Real ``scrapy`` processes (subprocesses with ``CrawlerProcess``) crawl the same loopback hosts through one
real ``redis-server``, and the checks read the **server-side** arrival log:

* four processes, five hosts (two of them on one address), on one Redis and on a Redis Cluster: no two requests to one host, or to one address,
  closer than the interval, across processes; a 429 with ``Retry-After`` answered to one process holds
  every process off; one process runs with its clock 30 s ahead and the spacing still holds (the table's
  clock is the server's); the same on one SQLite file (its openers read one clock). Negative controls: the
  same crawl with a pace table per process (``memory://``) breaks the spacing;
* a process anchored 5 s ahead joins a crawl on one SQLite file: it books on the file's clock, and no spacing
  breaks; read on a clock per process (the code before "One clock per file"), it does;
* Redis stopped and restarted mid-crawl: no request goes out while it is down, the crawl finishes, the
  stats count the outage, and the hold recorded before the outage is still honoured after it; not back
  within ``POLITE_STORE_TIMEOUT``: the spider closes with reason ``polite_store_error``;
* Redis not running at start: ``scrapy crawl`` refuses to start, with one error naming the URL and the fix,
  and exits with a non-zero status.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from scrapy_polite.clock import process_clock
from tests.support.fleet import ROOT, Crawl
from tests.support.redis_cluster import redis_cluster_url  # noqa: F401
from tests.support.redis_server import RedisServer, free_port, redis_url, unique_prefix  # noqa: F401
from tests.support.server import Arrival, Reply, RequestInfo, always, page, scripted

#: Seconds of slack for the arrival log (timestamps taken by the server's threads; loopback latency).
TOL = 0.03

HOST_INTERVAL = 0.25
IP_INTERVAL = 0.35
RETRY_AFTER = 2.0
H1_INTERVAL = 0.5

#: Five hosts on four loopback addresses: h4 and h5 share one.
HOSTS = {"h1.test": "127.0.9.1", "h2.test": "127.0.9.2", "h3.test": "127.0.9.3", "h4.test": "127.0.9.4",
         "h5.test": "127.0.9.4"}

def settings(store: str, prefix: str, **overrides: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "ADDONS": {"scrapy_polite.Addon": 0},
        "POLITE_STORE": store,
        "POLITE_STORE_PREFIX": prefix,
        "POLITE_HOST_INTERVAL": HOST_INTERVAL,
        "POLITE_IP_INTERVAL": IP_INTERVAL,
        "POLITE_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "POLITE_DNS_OVERRIDES": {host: [address] for host, address in HOSTS.items()},
        # h1 throttles: a longer interval leaves its 429 time to be recorded before anyone books h1 again.
        "POLITE_HOST_DELAYS": {"h1.test": H1_INTERVAL},
        "CONCURRENT_REQUESTS": 16,
        "LOG_LEVEL": "INFO",
    }
    s.update(overrides)
    return s


def violations(arrivals: list[Arrival], interval: float) -> list[str]:
    """Consecutive arrivals closer than ``interval`` (from the end of one response to the next start)."""
    ordered = sorted(arrivals, key=lambda a: a.start)
    return [f"{a.host}{a.path} ended {a.end:.3f}, {b.host}{b.path} started {b.start:.3f} "
            f"({b.start - a.end:.3f} s < {interval} s)"
            for a, b in zip(ordered, ordered[1:]) if b.start - a.end < interval - TOL]


def describe(arrivals: list[Arrival]) -> str:
    return "\n".join(f"  {a.start:.3f}-{a.end:.3f} {a.status} {a.host}{a.path}"
                     for a in sorted(arrivals, key=lambda a: a.start))


def start_servers(arrival_server: Any) -> dict[str, Any]:
    """One ArrivalServer per address; h1's second request (from whichever process) is a 429 with
    Retry-After. Returns host → its server."""
    servers: dict[str, Any] = {}
    for address in sorted(set(HOSTS.values())):
        servers[address] = arrival_server(address)
    lock = threading.Lock()
    seen = [0]

    def h1(info: RequestInfo, count: int) -> Reply:
        with lock:
            seen[0] += 1
            n = seen[0]
        return Reply.throttle(429, str(RETRY_AFTER)) if n == 2 else page(info.path)

    servers[HOSTS["h1.test"]].route("/*", h1, host="h1.test")
    return {host: servers[address] for host, address in HOSTS.items()}


def urls_for(servers: dict[str, Any], process: int, pages: int) -> list[str]:
    return [servers[host].url(f"/p{process}/{i}", host=host) for i in range(pages) for host in HOSTS]


def all_arrivals(servers: dict[str, Any]) -> list[Arrival]:
    return [a for srv in {id(s): s for s in servers.values()}.values() for a in srv.arrivals()]


PROCESSES = 4
PAGES = 3


def run_four(tmp_path: Any, arrival_server: Any, store: str, prefix: str, skew: float = 0.0,
             patch: list[str] | None = None) -> tuple[list[Arrival], list[dict[str, Any]]]:
    servers = start_servers(arrival_server)
    crawls = [Crawl(tmp_path, f"crawl{p}", urls_for(servers, p, PAGES), settings(store, prefix),
                    skew=skew if p == PROCESSES - 1 else 0.0, patch=patch)
              for p in range(PROCESSES)]
    results = [c.result() for c in crawls]
    return all_arrivals(servers), results


def spacing_problems(hits: list[Arrival]) -> list[str]:
    """Every host's and every address's spacing broken in the arrival log."""
    problems = []
    for host in HOSTS:
        problems += violations([a for a in hits if a.host == host], H1_INTERVAL if host == "h1.test" else HOST_INTERVAL)
    problems += violations([a for a in hits if HOSTS[a.host] == "127.0.9.4"], IP_INTERVAL)  # h4 + h5
    for address in ("127.0.9.1", "127.0.9.2", "127.0.9.3"):
        problems += violations([a for a in hits if HOSTS[a.host] == address], IP_INTERVAL)
    return problems


@pytest.mark.parametrize("table", ["redis", "redis_cluster", "redis_cluster_sharded", "sqlite"])
def test_four_processes_share_one_budget_per_host_and_address(table, request, arrival_server, tmp_path):
    # One Redis server, or a Redis Cluster of three nodes (redis+cluster://), or the cluster with the sharded
    # layout (every row in its own slot, a booking over two: docs/scale.md): the same guarantees. And one SQLite
    # file on this machine, whose openers read one clock (docs/spec.md §6, "One clock per file"): the process
    # anchored 30 s ahead (as one started after a step of the wall clock) books on the others' time.
    if table == "sqlite":
        store = f"sqlite:///{tmp_path / 'pace.sqlite3'}"
    else:
        store = request.getfixturevalue("redis_url" if table == "redis" else "redis_cluster_url")
    if table == "redis_cluster_sharded":
        store += "?layout=sharded"
    prefix = unique_prefix("e2e")
    hits, results = run_four(tmp_path, arrival_server, store, prefix, skew=30.0)
    assert len({(a.host, a.path) for a in hits}) == PROCESSES * PAGES * len(HOSTS), describe(hits)  # every page
    # The skewed process really was 30 s ahead.
    assert results[-1]["clock_ahead"] > 29.0 and results[0]["clock_ahead"] < 1.0
    problems = spacing_problems(hits)
    assert not problems, "\n".join(problems) + "\n" + describe(hits)
    # Every process crawled every host (they shared the work, none waited it all out alone).
    for p in range(PROCESSES):
        assert {a.host for a in hits if a.path.startswith(f"/p{p}/")} == set(HOSTS)
    # The 429 answered to one process held every process off h1 for Retry-After.
    h1 = sorted((a for a in hits if a.host == "h1.test"), key=lambda a: a.start)
    (throttled,) = [a for a in h1 if a.status == 429]
    after = [a for a in h1 if a.start > throttled.start]
    assert after and after[0].start >= throttled.end + RETRY_AFTER - TOL, describe(h1)
    throttled_process = throttled.path.split("/")[1]
    assert {a.path.split("/")[1] for a in after} - {throttled_process}, "no other process came back to h1"
    assert sum(r["stats"].get("polite/throttles/429", 0) for r in results) == 1


#: Pages per host of each process of the joined crawl: the first still crawls every host when the second joins.
PAGES_JOINED = 20
#: Seconds the first process's pages of h2 and h3 take to answer in the joined crawl (a slow host: longer than its
#: interval).
SLOW_FIRST = 0.8


@pytest.mark.parametrize("patch", [[], ["own_clock"]], ids=["one-clock", "negative-control-a-clock-each"])
def test_a_process_anchored_after_a_step_joins_a_sqlite_crawl_on_its_clock(patch, arrival_server, tmp_path):
    """A crawl runs on one SQLite file; once its requests arrive, a second process anchored 5 s ahead (as one
    started after a step of the wall clock) joins it on the same hosts. It reads the table on the first's
    clock (docs/spec.md §6, "One clock per file"): no host's spacing is broken. With a clock each (the code
    before), it reads every row 5 s old and books hosts the first still holds.

    The first process's pages of h2 and h3 are slow (``SLOW_FIRST`` s): whenever the second joins, the first has
    one of them in flight or just answered, so a second on a clock of its own books it too early whatever the
    moment. With answers of a few ms, the second booked inside the first's interval only when it happened to
    start within it, and the negative control failed about one run in three on the lowest versions."""
    servers = start_servers(arrival_server)
    for host in ("h2.test", "h3.test"):
        servers[host].route("/p0/*", always(Reply.html("<p>slow</p>", delay=SLOW_FIRST)), host=host)
    store = f"sqlite:///{tmp_path / 'pace.sqlite3'}"
    first = Crawl(tmp_path, "first", urls_for(servers, 0, PAGES_JOINED), settings(store, "unused:"), patch=patch)
    deadline = process_clock() + 60.0
    while len(all_arrivals(servers)) < 5 and process_clock() < deadline:
        time.sleep(0.05)
    second = Crawl(tmp_path, "second", urls_for(servers, 1, PAGES_JOINED), settings(store, "unused:"), skew=5.0, patch=patch)
    results = [first.result(), second.result()]
    hits = all_arrivals(servers)
    assert results[1]["clock_ahead"] > 4.0 and len({(a.host, a.path) for a in hits}) == 2 * PAGES_JOINED * len(HOSTS)
    joined = [a for a in hits if a.path.startswith("/p1/")]
    overlap = [a for a in hits if a.path.startswith("/p0/") and a.start > min(b.start for b in joined)]
    assert overlap, "the second process joined after the first was done: nothing was shared\n" + describe(hits)
    problems = spacing_problems(hits)
    if patch:
        assert problems, describe(hits)
    else:
        assert not problems, "\n".join(problems) + "\n" + describe(hits)


def test_negative_control_a_table_per_process_breaks_the_spacing(arrival_server, tmp_path):
    hits, _ = run_four(tmp_path, arrival_server, "memory://", "unused:")
    problems = [p for host in HOSTS for p in violations([a for a in hits if a.host == host], HOST_INTERVAL)]
    assert len(problems) >= 5, describe(hits)  # each process paced alone: several at once on every host


# --------------------------------------------------------------------------------------------------
# Redis lost mid-crawl


def test_redis_stopped_and_restarted_mid_crawl(arrival_server, tmp_path):
    """Host a answers its first request with a 429 (Retry-After 3 s), recorded before Redis goes away; host b
    crawls steadily. Redis is stopped while both are busy, kept down 2 s, then restarted."""
    with RedisServer() as redis_server:
        a, b = arrival_server("127.0.9.11"), arrival_server("127.0.9.12")
        a.route("/*", scripted(Reply.throttle(429, "3")))
        stopped = threading.Event()
        down: dict[str, float] = {}
        seen = [0]

        def maybe_stop(info: RequestInfo, count: int) -> Reply:
            seen[0] += 1
            if seen[0] == 4 and not stopped.is_set():  # b's 4th request: stop Redis before answering it
                redis_server.stop()
                down["stopped"] = process_clock()
                stopped.set()
            return page(info.path)

        b.route("/*", maybe_stop)
        urls = [a.url(f"/{i}") for i in range(3)] + [b.url(f"/{i}") for i in range(12)]
        crawl = Crawl(tmp_path, "outage", urls, settings(redis_server.url, "t:", POLITE_DNS_OVERRIDES={},
                                                          POLITE_IP_INTERVAL=0, POLITE_STORE_TIMEOUT=30))
        assert stopped.wait(60), (tmp_path / "outage.log").read_text()[-3000:]
        time.sleep(2.0)
        down["end"] = process_clock()
        redis_server.start()  # from the main thread (see RedisServer.start)
        result = crawl.result()
        hits = a.arrivals() + b.arrivals()

    during = [h for h in hits if down["stopped"] + TOL < h.start < down["end"]]
    assert not during, f"requests went out while Redis was down:\n{describe(during)}"
    assert result["statuses"].count(200) >= 14, result  # every page of b and the two others of a
    stats = result["stats"]
    assert stats["finish_reason"] == "finished"
    assert stats["polite/store/outages"] == 1
    assert 1.5 <= stats["polite/store/outage_seconds"] <= 10, stats
    # The 429's hold, recorded before the outage, survived it: h1's next request waited out Retry-After.
    h1 = sorted(a.arrivals(), key=lambda x: x.start)
    assert h1[0].status == 429 and h1[1].start >= h1[0].end + 3.0 - TOL, describe(h1)
    log = (tmp_path / "outage.log").read_text()
    assert log.count("Requests wait (none is sent without a booking)") == 1  # one WARNING per outage
    assert "reachable again" in log


def test_redis_not_back_within_the_timeout_closes_the_spider(arrival_server, tmp_path):
    with RedisServer() as redis_server:
        srv = arrival_server("127.0.9.13")
        stopped = threading.Event()

        seen = [0]

        def stop_at_3rd(info: RequestInfo, count: int) -> Reply:
            seen[0] += 1
            if seen[0] == 3 and not stopped.is_set():
                redis_server.stop()
                stopped.set()
            return page(info.path)

        srv.route("/*", stop_at_3rd)
        started = process_clock()
        crawl = Crawl(tmp_path, "gone", [srv.url(f"/{i}") for i in range(10)],
                      settings(redis_server.url, "t:", POLITE_DNS_OVERRIDES={}, POLITE_IP_INTERVAL=0,
                               POLITE_STORE_TIMEOUT=2))
        result = crawl.result(reason="polite_store_error")
    stats = result["stats"]
    assert stats["finish_reason"] == "polite_store_error", stats
    assert len(srv.arrivals()) == 3  # none after Redis went away
    assert stats["polite/store/outages"] == 1 and stats["polite/store/outage_seconds"] == pytest.approx(2.0, abs=0.5)
    assert process_clock() - started < 30
    log = (tmp_path / "gone.log").read_text()
    assert "POLITE_STORE_TIMEOUT" in log and "Stopping the crawl" in log


# --------------------------------------------------------------------------------------------------
# Redis not running at start

SPIDER = textwrap.dedent("""
    import scrapy

    class Once(scrapy.Spider):
        name = "once"
        start_urls = [{url!r}]

        def parse(self, response):
            pass
""")


def runspider(spider: Any, store: str, cwd: Any) -> subprocess.CompletedProcess[str]:
    """``scrapy runspider`` with the add-on and the store on the command line, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "scrapy", "runspider", str(spider),
                           "-s", 'ADDONS={"scrapy_polite.Addon": 0}', "-s", f"POLITE_STORE={store}",
                           "-s", "POLITE_ALLOWED_NETWORKS=127.0.0.0/8", "-s", "TELNETCONSOLE_ENABLED=0",
                           "-s", "RETRY_ENABLED=0"],
                          cwd=str(cwd), env=env, capture_output=True, text=True, timeout=60)


def test_redis_not_running_at_start_refuses_to_crawl(arrival_server, tmp_path):
    srv = arrival_server("127.0.9.14")
    port = free_port()
    store = f"redis://127.0.0.1:{port}/0"
    spider = tmp_path / "once.py"
    spider.write_text(SPIDER.format(url=srv.url("/")))
    proc = runspider(spider, store, tmp_path)
    assert proc.returncode != 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert len(re.findall(r"\] ERROR: ", output)) == 1, output[-3000:]  # one error record...
    last = output.strip().splitlines()[-1]  # ...whose exception names the URL and the fix
    assert last.startswith("scrapy_polite.stores.base.StoreError: ") and store in last and "Fix:" in last, last
    assert "redis.exceptions" not in output  # the message says it all: no chain of client errors
    assert srv.arrivals() == []
    # Negative control: with the server running, the same spider crawls and exits 0.
    with RedisServer(port=port):
        ok = runspider(spider, store, tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert len(srv.arrivals()) == 1, ok.stderr[-3000:]
