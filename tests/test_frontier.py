"""The shared frontier's Redis steps (``scrapy_polite/frontier.py``; docs/spec.md §5, "The shared frontier"),
against a real ``redis-server`` and scrapy-redis's own queue classes: take and lease in one step, hold until
due, skip blocked hosts, return a dead worker's leases, end leases, give back at close. The crawls are in
``tests/test_e2e_frontier.py``."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request
from scrapy.core.scheduler import Scheduler
from twisted.internet import defer

from scrapy_polite.commands import run_command
from scrapy_polite.frontier import LEASE_META, RedisFrontier, is_shared_scheduler, queue_mode
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401

redis = pytest.importorskip("redis")
scrapy_redis_queue = pytest.importorskip("scrapy_redis.queue")
scrapy_redis_scheduler = pytest.importorskip("scrapy_redis.scheduler")


def inline(fn: Any, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
    return defer.succeed(fn(*args, **kwargs))


class Farm:
    """One spider's queue and the frontiers of its workers."""

    def __init__(self, url: str, queue_cls: str = "PriorityQueue", lease_time: float = 0.5) -> None:
        self.client = redis.Redis.from_url(url)
        self.spider = SimpleNamespace(name=unique_prefix("unit").replace(":", "-").strip("-"))
        self.queue = getattr(scrapy_redis_queue, queue_cls)(server=self.client, spider=self.spider,
                                                           key="%(spider)s:requests")
        self.lease_time = lease_time
        self.stats: dict[str, float] = {}

    def worker(self) -> RedisFrontier:
        def inc(key: str, count: float) -> None:
            self.stats[key] = self.stats.get(key, 0) + count

        return RedisFrontier(self.client, self.queue, self.spider, f"{self.spider.name}:polite", self.lease_time,
                             inc, in_thread=inline)

    def leases(self, frontier: RedisFrontier) -> int:
        return int(self.client.hlen(f"{frontier.key}:lease:{frontier.worker}"))


@pytest.mark.parametrize("queue_cls, order", [("FifoQueue", ["a", "b", "c"]), ("LifoQueue", ["c", "b", "a"]),
                                              ("PriorityQueue", ["b", "a", "c"])])
def test_take_pops_scrapy_redis_queues_in_their_order_and_leases_in_one_step(redis_url, queue_cls, order):
    farm = Farm(redis_url, queue_cls)
    for path, priority in (("a", 0), ("b", 5), ("c", 0)):
        farm.queue.push(Request(f"http://h.test/{path}", priority=priority, meta={"x": path}))
    worker = farm.worker()
    taken = [worker.take(set()) for _ in range(4)]
    assert taken[-1] is None
    assert [r.url.rsplit("/", 1)[1] for r, _ in taken[:3]] == order
    assert [r.meta["x"] for r, _ in taken[:3]] == order  # meta kept
    assert len(farm.queue) == 0 and farm.leases(worker) == 3  # popped from the queue, leased
    assert farm.stats == {"frontier/taken/queue": 3}


def test_queue_detection_and_negative_controls():
    assert queue_mode(scrapy_redis_queue.FifoQueue.__new__(scrapy_redis_queue.FifoQueue)) == "fifo"
    assert queue_mode(scrapy_redis_queue.SpiderStack.__new__(scrapy_redis_queue.SpiderStack)) == "lifo"

    class OwnPop(scrapy_redis_queue.FifoQueue):
        def pop(self, timeout: int = 0) -> Any:
            return None

    assert queue_mode(OwnPop.__new__(OwnPop)) == "none"  # its own pop: not replaced by the script
    assert is_shared_scheduler(scrapy_redis_scheduler.Scheduler.__new__(scrapy_redis_scheduler.Scheduler))
    assert not is_shared_scheduler(Scheduler.__new__(Scheduler))  # Scrapy's own: nothing changes


def test_a_held_request_waits_for_its_host_and_skips_blocked_hosts(redis_url):
    farm = Farm(redis_url)
    for host in ("a.test", "b.test"):
        farm.queue.push(Request(f"http://{host}/", meta={"polite_throttle_retries": 2}))
    one, two = farm.worker(), farm.worker()
    first, _ = one.take(set())
    second, _ = one.take(set())
    assert one.hold(first, "a.test", 0.3) and one.hold(second, "b.test", 0.0)
    assert farm.leases(one) == 0  # moved from the lease to the held lists
    # b.test is due, but blocked in the taking worker: skipped (negative control: not skipped, taken).
    assert two.take({"b.test"}, queue=False) is None
    again, host = two.take(set(), queue=False)
    assert (again.url, host, again.meta["polite_throttle_retries"]) == ("http://b.test/", "b.test", 2)
    assert two.take(set(), queue=False) is None  # a.test is not due yet
    time.sleep(0.35)
    later, host = two.take(set(), queue=False)
    assert (later.url, host) == ("http://a.test/", "a.test")
    assert farm.stats["frontier/taken/held"] == 2 and two.renew().held == 0


def test_a_dead_workers_leases_return_after_the_lease_time_and_ended_leases_do_not(redis_url):
    farm = Farm(redis_url, lease_time=0.4)
    for i in range(3):
        farm.queue.push(Request(f"http://h.test/{i}"))
    dead, alive = farm.worker(), farm.worker()
    taken = [dead.take(set()) for _ in range(3)]
    dead.end(taken[0][0])  # its response ended that lease
    dead.settle()
    assert farm.leases(dead) == 2
    state = alive.renew()
    assert (state.expired, state.others_leased) == (0, 2)  # still within its lease
    time.sleep(0.5)  # the dead worker never renews
    state = alive.renew()
    assert (state.expired, state.returned) == (2, 2) and farm.stats["lease/expired"] == 2
    back = sorted(alive.take(set())[0].url for _ in range(2))
    assert back == ["http://h.test/1", "http://h.test/2"]
    assert alive.take(set()) is None
    # A live worker's leases are not taken: it renews, the lease stays.
    alive.renew()
    assert farm.leases(alive) == 2 and alive.renew().expired == 0


def test_close_gives_back_what_a_worker_leases(redis_url):
    farm = Farm(redis_url)
    farm.queue.push(Request("http://h.test/x"))
    worker = farm.worker()
    request, _ = worker.take(set())
    assert worker.owns(request) and LEASE_META in request.meta
    assert worker.release() == 1
    state = farm.worker().renew()
    assert state.returned == 1 and state.others_leased == 0
    assert "1 returned requests" in farm.worker().describe()


def test_scrapy_polite_hosts_lists_what_waits_in_redis_per_host(redis_url):
    farm = Farm(redis_url)
    farm.queue.push(Request("http://a.test/1"))
    farm.queue.push(Request("http://a.test/2"))
    worker = farm.worker()
    for _ in range(2):
        request, _ = worker.take(set())
        worker.hold(request, "a.test", 30.0)
    out, err = io.StringIO(), io.StringIO()
    settings = {"SCHEDULER": "scrapy_redis.scheduler.Scheduler", "REDIS_URL": redis_url,
                "POLITE_FRONTIER_KEY": f"{farm.spider.name}:polite"}
    assert run_command(["hosts", "--store", "memory://"], settings, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert f"shared frontier {farm.spider.name}:polite: 2 requests held in Redis, 0 returned" in text, text
    assert "a.test" in text and ("30 s" in text or "29 s" in text), text
    # Negative control: without scrapy-redis's scheduler in the settings, nothing of it is listed.
    out = io.StringIO()
    assert run_command(["hosts", "--store", "memory://"], {"REDIS_URL": redis_url}, out=out, err=err) == 0
    assert "shared frontier" not in out.getvalue()
