"""The shared frontier: scrapy-redis workers lose nothing (docs/spec.md §5, "The shared frontier"; README
"Running many crawlers"; issue 18).

Real scrapy-redis workers (``tests/support/redis_worker.py``, one process each: ``RedisSpider`` or
``RedisCrawlSpider``, scrapy-redis's scheduler and dupefilter, the add-on with a ``redis://`` pace table)
crawl loopback servers through one real ``redis-server``; workers are stopped with SIGINT (graceful) or
SIGKILL (a crashed pod). The checks read the **server-side** arrival log:

* work sharing: two workers share the pages (neither gets less than a quarter), each page fetched exactly
  once; negative control: without the shared frontier one worker takes nearly everything;
* a graceful stop gives its unsent requests back to Redis and the other worker fetches every one;
* the worker that received a throttle is killed while its host's requests wait, a replacement is started:
  every page fetched, spacing per host and per address across all workers, nothing inside the Retry-After
  window, every worker closes on its own;
* a worker killed with requests in flight: they come back when its lease expires and another worker
  fetches them (``polite/lease/expired``);
* scrapy-redis's FIFO, LIFO and priority queues, start URLs as a list, a set and a sorted set, a JSON feed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from scrapy_polite.clock import process_clock
from tests.support.farm import (
    ADDRESSES,
    INTERVAL,
    TOL,
    Worker,
    arrivals,
    by_worker,
    farm_name,
    farm_settings,
    leased_urls,
    page_urls,
    push_requests,
    run_farm,
    start_servers,
    violations,
    worker_id,
)
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401
from tests.support.server import Arrival, Reply, RequestInfo, page

redis = pytest.importorskip("redis")
pytest.importorskip("scrapy_redis")

# --------------------------------------------------------------------------------------------------
# Work sharing


def test_two_workers_share_the_pages(redis_url, arrival_server, tmp_path):
    """Two workers split one crawl of 3 hosts × 20 pages, neither starved; with a second worker started 1 s late,
    it still gets a share, which it does not without the shared frontier (the first worker took the whole queue
    into its memory)."""
    pages = 20
    total = pages * len(ADDRESSES)
    shares: dict[str, float] = {}
    for run, settings, stagger in (("polite", farm_settings(redis_url, unique_prefix("share")), 0.0),
                                   ("polite_late", farm_settings(redis_url, unique_prefix("share")), 1.0),
                                   ("no_frontier_late", farm_settings(redis_url, unique_prefix("share"),
                                                                      POLITE_SHARED_FRONTIER=False), 1.0)):
        servers = start_servers(arrival_server)
        (tmp_path / run).mkdir()
        farm, stats = run_farm(tmp_path / run, redis_url, page_urls(servers, pages), settings, stagger=stagger)
        counts = by_worker(servers)
        assert sum(counts.values()) == total, (run, counts)
        shares[run] = counts[farm[1].label] / total  # the second worker's share
        if run.startswith("polite"):
            hits = arrivals(servers)
            # A healthy farm, no kill: each page fetched exactly once, spaced across the workers.
            assert Counter((a.server_address, a.path) for a in hits).most_common(1)[0][1] == 1
            for srv in servers:
                problems = violations(srv.arrivals(), INTERVAL)
                who = {p: a for a, _, p in srv.agents}
                assert not problems, (problems, [who.get(p.split()[0]) for p in problems],
                                      [who.get(p.split()[3].rstrip(",")) for p in problems])
            assert all(s["finish_reason"] == "finished" for s in stats), stats
            assert not any(s.get("polite/lease/expired") for s in stats)
    print("second worker's share:", {run: round(share, 3) for run, share in shares.items()})
    # Neither worker is starved. The split is not plain scrapy-redis's even one: the worker that has just recorded
    # a host's response books the host's next turn at once, while the other one, held out by the in-flight hold,
    # looks again every HOLD_POLL; a host's pages stay mostly with one worker, so with 3 hosts the split follows
    # the hosts (1/3 : 2/3 seen as often as 1/2 : 1/2; with many hosts it evens out).
    assert min(shares["polite"], 1 - shares["polite"]) >= 0.25, shares
    # A worker started late still shares the work; negative control: without the shared frontier it does not.
    assert shares["polite_late"] >= 0.2, shares
    assert shares["no_frontier_late"] < 0.5 * shares["polite_late"], shares


# --------------------------------------------------------------------------------------------------
# Stops and kills


def start_throttled_servers(arrival_server: Any, throttles: int, retry_after: float
                            ) -> tuple[list[Any], threading.Event, dict[str, Any]]:
    """Two servers; the first answers its first ``throttles`` requests 429 + Retry-After. The Event is set at
    the first 429, and ``seen['agent']`` names the worker that received it."""
    seen: dict[str, Any] = {"n": 0}
    first = threading.Event()
    lock = threading.Lock()

    def handler(info: RequestInfo, count: int) -> Reply:
        if info.server_address != ADDRESSES[0]:
            return page(info.path)
        with lock:
            seen["n"] += 1
            n = seen["n"]
        if n <= throttles:
            if n == 1:
                seen["agent"] = info.headers.get("user-agent", "")
                first.set()
            return Reply.throttle(429, str(retry_after))
        return page(info.path)

    return start_servers(arrival_server, handler, count=2), first, seen


def outside_retry_after(hits: list[Arrival], retry_after: float) -> list[str]:
    """Requests to the throttled host that started inside a Retry-After window."""
    ordered = sorted(hits, key=lambda a: a.start)
    problems = []
    for a in ordered:
        if a.status == 429:
            problems += [f"{b.path} at {b.start:.3f}, {b.start - a.end:.3f} s after a 429"
                         for b in ordered if a.end < b.start < a.end + retry_after - TOL]
    return problems


def fetched_pages(servers: list[Any]) -> set[tuple[str, str]]:
    return {(a.server_address, a.path) for a in arrivals(servers) if a.status == 200}


def throttled_farm(tmp_path: Any, redis_url: str, arrival_server: Any, throttles: int, retry_after: float,
                   pages: int, labels: tuple[str, str], settle: float
                   ) -> tuple[list[Any], str, dict[str, Any], Worker, Worker]:
    """Two workers (``labels``) on ``pages`` pages of two servers (:func:`start_throttled_servers`), the whole
    frontier in the shared request queue; returns once the first 429 was answered and ``settle`` seconds more
    passed: the servers, the spider's name, the settings, the worker that received the 429 and the other."""
    servers, first, seen = start_throttled_servers(arrival_server, throttles, retry_after)
    name = farm_name()
    push_requests(redis_url, name, page_urls(servers, pages))
    settings = farm_settings(redis_url, unique_prefix(labels[0]))
    a, b = (Worker(tmp_path, label, name, settings, [[other, 0.0] for other in labels]) for label in labels)
    assert first.wait(60), a.text()[-3000:] + b.text()[-3000:]
    time.sleep(settle)
    holder, other = (a, b) if seen["agent"] == labels[0] else (b, a)
    return servers, name, settings, holder, other


def test_the_worker_holding_a_throttled_host_is_killed_and_nothing_is_lost(redis_url, arrival_server, tmp_path):
    retry_after, pages = 2.0, 12
    # After 1 s the victim holds the throttled host's requests (deferred until Retry-After), and its lines.
    servers, name, settings, victim, survivor = throttled_farm(tmp_path, redis_url, arrival_server, 2, retry_after,
                                                               pages, ("ka", "kb"), settle=1.0)
    victim_id = worker_id(victim)
    victim.killed()
    # What it had taken and not finished, read after the kill (its lease lasts 2 s: nothing has taken it back yet).
    # A worker in line for a host another worker is fetching holds that request in Redis, not leased (the
    # in-flight hold), so this may be none.
    client = redis.Redis.from_url(redis_url)
    stranded = leased_urls(client, f"{name}:polite", victim_id)
    client.close()
    replacement = Worker(tmp_path, "kc", name, settings, [["kc", 0.0]])
    stats = [survivor.stats(), replacement.stats()]  # both close on their own
    assert all(s["finish_reason"] == "finished" for s in stats), stats
    hits = arrivals(servers)
    # Every page fetched (200) at least once.
    assert fetched_pages(servers) == {(srv.address, f"/p/{i}") for srv in servers for i in range(pages)}
    # Per-host spacing across all three workers (one address per host: the per-IP spacing too); nothing
    # inside a Retry-After window.
    for srv in servers:
        problems = violations(srv.arrivals(), INTERVAL)
        assert not problems, problems
    throttled = [h for h in hits if h.server_address == ADDRESSES[0]]
    assert not outside_retry_after(throttled, retry_after), outside_retry_after(throttled, retry_after)
    assert sum(1 for h in throttled if h.status == 429) == 2
    # The victim's leases came back (the requests it had taken and not finished), every one of them.
    assert sum(s.get("polite/lease/expired", 0) for s in stats) == len(stranded), (stranded, stats)


def test_requests_in_flight_with_a_killed_worker_come_back_when_its_lease_expires(redis_url, arrival_server,
                                                                                   tmp_path):
    slow = 2.0
    in_flight: list[tuple[str, str]] = []
    lock = threading.Lock()
    three = threading.Event()

    def handler(info: RequestInfo, count: int) -> Reply:
        with lock:
            in_flight.append((info.headers.get("user-agent", ""), info.path))
            if sum(1 for agent, _ in in_flight if agent == "fa") == 3:
                three.set()
        return Reply.html("<p>slow</p>", delay=slow)

    servers = start_servers(arrival_server, handler)
    name = farm_name()
    urls = page_urls(servers, 2)
    push_requests(redis_url, name, urls)
    settings = farm_settings(redis_url, unique_prefix("lease"))
    victim = Worker(tmp_path, "fa", name, settings, [["fa", 0.0]])
    assert three.wait(60), victim.text()[-3000:]
    victim.killed()  # three requests in flight (one per host), three more taken and held for its lines
    killed_at = process_clock()
    other = Worker(tmp_path, "fb", name, settings, [["fb", 0.0]])
    stats = other.stats()
    assert stats["finish_reason"] == "finished"
    assert stats["polite/lease/expired"] == len(urls), stats
    refetched = [(a.server_address, a.path) for a in arrivals(servers)]
    # Every page fetched by the other worker, each once; the three in flight were sent twice (once by the
    # killed worker, whose responses never arrived).
    assert sorted(refetched) == sorted((srv.address, f"/p/{i}") for srv in servers for i in range(2))
    assert sum(1 for agent, _ in in_flight if agent == "fa") == 3
    assert sum(1 for agent, _ in in_flight if agent == "fb") == len(urls)
    # Not before the lease had expired.
    assert min(a.start for a in arrivals(servers)) >= killed_at + 0.5


def test_a_graceful_stop_gives_its_requests_back_and_the_other_worker_fetches_them(redis_url, arrival_server,
                                                                                    tmp_path):
    retry_after, pages = 2.0, 10
    servers, _, _, stopped, other = throttled_farm(tmp_path, redis_url, arrival_server, 1, retry_after, pages,
                                                   ("ga", "gb"), settle=0.5)
    stopped.signal(signal.SIGINT)  # Ctrl-C: Scrapy's graceful stop
    stopped_stats, other_stats = stopped.stats(), other.stats()
    assert stopped_stats["finish_reason"] == "shutdown", stopped_stats
    assert "polite/deferred/not_crawled" not in stopped_stats
    log = stopped.text()
    assert "Waiting in the shared frontier" in log, log[-3000:]
    assert other_stats["finish_reason"] == "finished"
    # Every page fetched, the ones the stopped worker had not sent by the other worker.
    assert fetched_pages(servers) == {(srv.address, f"/p/{i}") for srv in servers for i in range(pages)}
    fetched_by_stopped = {line.split()[1] for line in stopped.fetched()}
    fetched_by_other = {line.split()[1] for line in other.fetched()}
    assert fetched_by_stopped | fetched_by_other == {srv.url(f"/p/{i}") for srv in servers for i in range(pages)}
    assert len(fetched_by_other) > len(fetched_by_stopped)


# --------------------------------------------------------------------------------------------------
# What scrapy-redis users run


@pytest.mark.parametrize("queue, kind, how", [
    ("scrapy_redis.queue.FifoQueue", "RedisSpider", "list"),
    ("scrapy_redis.queue.LifoQueue", "RedisCrawlSpider", "set"),
    ("scrapy_redis.queue.PriorityQueue", "RedisSpider", "zset"),
    ("scrapy_redis.queue.PriorityQueue", "RedisSpider", "json"),
])
def test_queue_classes_spiders_and_start_url_feeds(queue, kind, how, redis_url, arrival_server, tmp_path):
    """One worker, two hosts × 4 pages as start URLs; the first host's first answer is a 429, so its pages go
    through the shared frontier's held list and come back (meta and throttle retries kept)."""
    servers, _, _ = start_throttled_servers(arrival_server, 1, 1.0)
    urls = page_urls(servers, 4)
    farm, stats = run_farm(tmp_path, redis_url, urls, farm_settings(redis_url, unique_prefix("q"),
                                                                     SCHEDULER_QUEUE_CLASS=queue,
                                                                     REDIS_START_URLS_AS_SET=how == "set",
                                                                     REDIS_START_URLS_AS_ZSET=how == "zset"),
                           workers=1, kind=kind, how=how)
    assert stats[0]["finish_reason"] == "finished", stats
    assert stats[0]["polite/frontier/held"] >= 1, stats
    lines = [line.split() for line in farm[0].fetched()]
    assert sorted(url for status, url, _, _ in lines) == sorted(urls)  # each page once, all 200
    assert {status for status, _, _, _ in lines} == {"200"}
    assert sum(int(retries) for _, _, _, retries in lines) == 1  # the throttled page kept its retry count
    if how == "json":
        assert {feed for _, _, feed, _ in lines} == {"json"}  # the feed's meta survived the hold in Redis
