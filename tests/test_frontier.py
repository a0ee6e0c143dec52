"""The shared frontier's Redis steps (``scrapy_polite/frontier/leases.py``; docs/spec.md §5, "The shared frontier"),
against a real ``redis-server`` and scrapy-redis's own queue classes: take and lease in one step, hold until
due, skip blocked hosts, return a dead worker's leases, end leases, give back at close. The crawls are in
``tests/test_e2e_frontier.py``."""

from __future__ import annotations

import io
import logging
import os
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.core.scheduler import Scheduler
from scrapy.settings import Settings
from twisted.internet import defer

from scrapy_polite.commands import run_command
from scrapy_polite.frontier.leases import LEASE_META, RedisFrontier, is_shared_scheduler, queue_mode
from scrapy_polite.frontier.worker import SharedWorker
from scrapy_polite.scheduler import PoliteScheduler
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401
from tests.support.scheduler_pacer import SchedulerPacer

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


# --------------------------------------------------------------------------------------------------
# A deferred request is written back as the scheduler handed it out (issue 30, finding 5)


def this_workers_middlewares(request: Request, agent: str) -> None:
    """What Scrapy's downloader middlewares of one worker do to a request before it is sent: its
    ``User-Agent`` (UserAgentMiddleware), the ``Cookie`` of its jar, which the host filled with a Set-Cookie
    (CookiesMiddleware), ``download_timeout`` (DownloadTimeoutMiddleware), and an ``Authorization`` header as
    HttpAuthMiddleware sets it."""
    from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
    from scrapy.downloadermiddlewares.downloadtimeout import DownloadTimeoutMiddleware
    from scrapy.downloadermiddlewares.useragent import UserAgentMiddleware
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(settings_dict={"USER_AGENT": agent, "DOWNLOAD_TIMEOUT": 7})
    cookies = CookiesMiddleware.from_crawler(crawler)
    first_page = Request("http://a.test/")
    cookies.process_response(first_page, HtmlResponse("http://a.test/", request=first_page,
                                                      headers={"Set-Cookie": "session=first-worker-secret"}))
    for mw in (UserAgentMiddleware.from_crawler(crawler), cookies, DownloadTimeoutMiddleware.from_crawler(crawler)):
        if hasattr(mw, "spider_opened") and mw is not cookies:
            mw.spider_opened(SimpleNamespace(name="s"))
        assert mw.process_request(request) is None
    request.headers[b"Authorization"] = b"Basic Zmlyc3Q6c2VjcmV0"


@pytest.mark.parametrize("ended_first", [False, True])
def test_a_deferred_request_is_written_back_as_the_scheduler_handed_it_out(redis_url, ended_first):
    """The record another worker takes has none of the headers, cookies or meta the first worker's downloader
    middlewares added (its User-Agent, its jar's Cookie, Authorization, download_timeout), keeps what the
    spider gave the request and its throttle-retry count; the first worker's own request is not changed.
    ``ended_first``: a throttle retry, whose response ended the lease on the same reactor turn.
    Negative control: before the fix, the mutated request was serialised, and this test fails on its
    User-Agent, Cookie and Authorization."""
    farm = Farm(redis_url)
    farm.queue.push(Request("http://a.test/p", headers={"X-Spider": "mine"}, cookies={"spider": "1"},
                            meta={"feed": "x"}))
    first, second = farm.worker(), farm.worker()
    request, _ = first.take(set())
    this_workers_middlewares(request, "first-worker")
    assert request.headers[b"User-Agent"] == b"first-worker"  # the middlewares did run
    assert b"first-worker-secret" in request.headers[b"Cookie"] and request.meta["download_timeout"] == 7
    request.meta["polite_throttle_retries"] = 1  # its response was a throttle
    if ended_first:
        first.end(request)
    assert first.hold(request, "a.test", 0.0)
    first.settle()
    again, host = second.take(set(), queue=False)
    assert (again.url, host) == ("http://a.test/p", "a.test")
    sent = {k.decode().lower(): v for k, v in again.headers.items()}
    assert "user-agent" not in sent and "cookie" not in sent and "authorization" not in sent, sent
    assert sent["x-spider"] == [b"mine"] and again.cookies == {"spider": "1"}
    assert "download_timeout" not in again.meta, again.meta
    assert again.meta["feed"] == "x" and again.meta["polite_throttle_retries"] == 1
    assert again.meta[LEASE_META] != request.meta[LEASE_META]  # the second worker's own lease
    # The first worker's request is as its middlewares left it.
    assert request.headers[b"User-Agent"] == b"first-worker" and b"Cookie" in request.headers
    assert request.meta["download_timeout"] == 7


# --------------------------------------------------------------------------------------------------
# Leases per worker, live or not (issue 30, finding 3)


def stop_renewing(farm: Farm, frontier: RedisFrontier, ago: float, back_in: float) -> None:
    """Make ``frontier`` look like a worker that last renewed ``ago`` s ago and whose leases come back in
    ``back_in`` s (the server's clock), as a worker killed ``ago`` s ago with a lease of ``ago + back_in`` s."""
    seconds, micros = farm.client.time()
    now = seconds + micros / 1e6
    farm.client.zadd(f"{frontier.key}:renewed", {frontier.worker: now - ago})
    farm.client.zadd(f"{frontier.key}:workers", {frontier.worker: now + back_in})


def test_leases_are_listed_per_worker_renewing_or_not(redis_url):
    """The closing log and ``scrapy polite hosts`` list what each other worker leases, whether it renews, and
    when the leases of one that stopped renewing come back. Negative control: a frontier holding only leases
    (nothing held, nothing returned) was not listed at all before (the command looked for held hosts only)."""
    farm = Farm(redis_url, lease_time=30.0)
    for i in range(3):
        farm.queue.push(Request(f"http://a.test/{i}"))
    dead, alive, closing = farm.worker(), farm.worker(), farm.worker()
    dead.take(set())
    dead.take(set())
    alive.take(set())
    stop_renewing(farm, dead, ago=20.0, back_in=10.0)
    state = closing.renew()
    rows = {w.worker: w for w in state.elsewhere}
    assert set(rows) == {dead.worker, alive.worker} and state.others_leased == 3
    assert rows[dead.worker].leases == 2 and not rows[dead.worker].renewing(30.0)
    assert 19 <= rows[dead.worker].renewed_ago <= 21 and 9 <= rows[dead.worker].back_in <= 10
    assert rows[alive.worker].leases == 1 and rows[alive.worker].renewing(30.0)
    text = closing.describe()
    assert re.search(rf"worker {re.escape(dead.worker)}: 2 requests, stopped renewing (20|21) s ago, back in (10|9) s",
                     text), text
    assert f"worker {alive.worker}: 1 request, renewing (last " in text, text
    assert "3 requests leased by other workers" in text, text
    assert len(dead.worker.split("-")) >= 3 and dead.worker.split("-")[-2] == str(os.getpid())
    out, err = io.StringIO(), io.StringIO()
    settings = {"SCHEDULER": "scrapy_redis.scheduler.Scheduler", "REDIS_URL": redis_url,
                "POLITE_FRONTIER_KEY": f"{farm.spider.name}:polite", "POLITE_LEASE_TIME": 30.0}
    assert run_command(["hosts", "--store", "memory://"], settings, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert f"shared frontier {farm.spider.name}:polite: 0 requests held in Redis, 0 returned, 3 leased by 2 workers" \
        in text, text
    lines = {line.split()[0]: line for line in text.splitlines() if line.split()[:1] in ([dead.worker],
                                                                                           [alive.worker])}
    # 20 s ago and back in 10 s as written, a second more and less on a loaded machine.
    assert lines[dead.worker].split()[1] == "2" and lines[dead.worker].split()[2] in ("20", "21"), text
    assert re.search(r"come back in (10|9) s", lines[dead.worker]), text
    assert lines[alive.worker].split()[1] == "1" and lines[alive.worker].endswith("renewing"), text


def idle_worker(farm: Farm) -> SharedWorker:
    """A worker's side of the frontier (its idle decision), with a crawler that has no engine to wake."""
    crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
    pacer = SchedulerPacer()
    pacer.report.counts = farm.stats  # type: ignore[misc]
    return SharedWorker(crawler, pacer, farm.worker(), inner=None)  # type: ignore[arg-type]


def test_an_idle_worker_stays_for_the_leases_of_a_worker_that_stopped_renewing_whatever_its_window(redis_url):
    """Idle window 2 s, leases of 30 s: the idle worker's first check finds only other workers' leases and
    stays one beat; the next finds the live one renewed (its requests are its own) and the dead one not: it
    stays until the dead one's leases come back, then takes them. Negative controls: once the other worker
    renews too, the idle worker may close; with the lease time within the window, the old rule (stay for
    any lease) holds."""
    farm = Farm(redis_url, lease_time=30.0)
    for i in range(3):
        farm.queue.push(Request(f"http://a.test/{i}"))
    survivor = idle_worker(farm)
    dead, live = farm.worker(), farm.worker()
    dead.take(set())
    dead.take(set())
    live.take(set())
    try:
        assert survivor.wait(2.0) == 1.0  # the first decision: one beat for the others to show they live
        live.renew()
        stay = survivor.wait(2.0)  # the dead worker did not renew since
        assert stay is not None and 25 <= stay <= 30, stay
        assert survivor.wait(2.0) is not None  # and stays while it does not
        # Negative control: a worker that renews again is alive: nothing keeps the idle worker.
        dead.renew()
        assert survivor.wait(2.0) is None
        # With POLITE_LEASE_TIME within the window, any other worker's leases keep it (the old rule).
        assert survivor.wait(60.0) == 30.0
        # The dead worker's leases come back: any renewal returns them, and the idle worker takes them.
        assert survivor.wait(2.0) == 1.0  # a new decision: one beat
        live.renew()
        stop_renewing(farm, dead, ago=31.0, back_in=-1.0)
        assert survivor.wait(2.0) == 0.0 and farm.stats["lease/expired"] == 2
        taken = sorted(survivor.frontier.take(set())[0].url for _ in range(2))
        assert taken == ["http://a.test/0", "http://a.test/1"]
    finally:
        survivor.stop()


def test_a_frontier_emptied_under_the_crawl_is_one_warning(redis_url, caplog):
    """A Redis restarted without persistence forgets the frontier (queue, dupefilter, held and leased requests): each
    worker says so once, at its next renewal, and counts it (it was silent). The controls: renewals of a frontier that
    kept its keys, and a worker joining late, say nothing."""
    farm = Farm(redis_url, lease_time=30.0)
    farm.queue.push(Request("http://a.test/1"))
    first, second = farm.worker(), farm.worker()

    def warnings() -> int:
        return sum("was emptied under the crawl" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="scrapy_polite.frontier"):
        first.renew()
        first.take(set())
        first.renew()
        second.renew()  # joins a frontier that is already there
        assert warnings() == 0 and "frontier/emptied" not in farm.stats
        farm.client.delete(*farm.client.keys(f"{farm.spider.name}:*"))  # what a restart without persistence leaves
        first.renew()
        second.renew()
        first.renew()
        second.renew()
    assert warnings() == 2 and farm.stats["frontier/emptied"] == 2  # once per worker, not per renewal


class FlakyFrontier:
    """A frontier whose renewals fail while ``down`` (a Redis outage), each a failed Deferred at once."""

    lease_time = 30.0

    def __init__(self) -> None:
        self.down = True

    mode = "list"

    def renew_soon(self) -> defer.Deferred[Any]:
        return defer.fail(ConnectionError("Connection refused")) if self.down else defer.succeed(None)

    def take(self, blocked: set[str], queue: bool) -> None:
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6461. Connection refused.")


def test_a_frontier_outage_is_one_warning_until_a_renewal_succeeds(caplog):
    """The beat comes every second: an outage is one WARNING, the next failures DEBUG, an INFO when the leases are
    renewed again, and the next outage warns again (fleet trial: one WARNING per second per worker)."""
    crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
    frontier = FlakyFrontier()
    worker = SharedWorker(crawler, SchedulerPacer(), frontier, inner=None)  # type: ignore[arg-type]

    def levels() -> list[int]:
        return [r.levelno for r in caplog.records if "leases" in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.frontier.worker"):
        for _ in range(3):
            worker._heartbeat()
        assert levels() == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        frontier.down = False
        worker._heartbeat()
        frontier.down = True
        worker._heartbeat()
        # Taking a request during the outage (fleet trial: it raised into Scrapy's engine loop, an ERROR each time):
        # nothing taken, logged at DEBUG within the outage already warned of.
        assert worker.take(set(), 0) is None
    assert levels() == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.INFO, logging.WARNING]
    takes = [r.levelno for r in caplog.records if "taking a request" in r.getMessage()]
    assert takes == [logging.DEBUG]


def test_a_lease_end_that_cannot_be_written_in_an_outage_is_logged_once_per_outage(caplog):
    """Fleet trial: during a Redis outage every lease end (one per page) logged its own ERROR. With the worker attached,
    a write that failed because Redis cannot be reached goes to the outage's one WARNING (DEBUG after); the controls: a
    frontier without a worker logs each at ERROR, and an error that is not an outage (a wrong key type) is an ERROR."""
    errors: list[BaseException] = [redis.exceptions.ConnectionError("Error 111 connecting. Connection refused.")]

    def failing(fn: Any, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        return defer.fail(errors[0])

    client = redis.Redis(host="127.0.0.1", port=9)  # register_script does not connect
    spider = SimpleNamespace(name="outage")
    queue = scrapy_redis_queue.FifoQueue(server=client, spider=spider, key="%(spider)s:requests")
    frontier = RedisFrontier(client, queue, spider, "outage:polite", 30.0, lambda key, count: None, in_thread=failing)

    def end_leases(*ids: str) -> None:
        for lease_id in ids:
            frontier.leased[lease_id] = "a.test"
            frontier.end(Request("http://a.test/", meta={LEASE_META: lease_id}))
        frontier.settle()  # the ends are written now, not on the next reactor turn

    def levels(text: str) -> list[int]:
        return [r.levelno for r in caplog.records if text in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.frontier"):
        end_leases("1")
        assert levels("a write to the shared frontier") == [logging.ERROR]  # no worker: each an ERROR
        caplog.clear()
        crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
        SharedWorker(crawler, SchedulerPacer(), frontier, inner=None)  # type: ignore[arg-type]
        end_leases("2")
        end_leases("3")
        end_leases("4")
        assert levels("cannot be reached (writing to it)") == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        assert levels("a write to the shared frontier") == []
        errors[0] = redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
        end_leases("5")
        assert levels("a write to the shared frontier") == [logging.ERROR]


class DownQueue:
    """scrapy-redis's scheduler during a Redis outage: its queue cannot be counted."""

    def has_pending_requests(self) -> bool:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6461. Connection refused.")


def test_a_frontier_that_cannot_be_counted_has_requests_pending(caplog):
    """Review: during an outage Scrapy's engine asked ``has_pending_requests`` on every heartbeat and got scrapy-redis's
    ``ConnectionError`` (an ERROR with a traceback each time). With a shared frontier the answer is "pending" (the
    spider does not close as idle while the frontier cannot say), logged once per outage; the control: without a
    shared frontier the error is the wrapped scheduler's own, raised."""
    crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
    pacer = SchedulerPacer()
    scheduler = PoliteScheduler(crawler, DownQueue(), pacer)  # type: ignore[arg-type]
    with pytest.raises(redis.exceptions.ConnectionError):
        scheduler.has_pending_requests()
    scheduler.shared = SharedWorker(crawler, pacer, FlakyFrontier(), inner=None)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="scrapy_polite.frontier.worker"):
        assert scheduler.has_pending_requests() is True
        assert scheduler.has_pending_requests() is True
    levels = [r.levelno for r in caplog.records if "counting the requests pending" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]


def test_a_request_popped_from_the_queue_is_kept_when_its_lease_fails():
    """A queue class of its own (mode "none"): scrapy-redis pops, then the add-on leases. A lease that fails (Redis
    gone between the two) must not lose the popped request (review): it goes unleased. The control: a popped request
    is leased when Redis answers."""
    popped = Request("http://a.test/1")
    leased: list[Request] = []

    class OwnQueueFrontier(FlakyFrontier):
        mode = "none"

        def take(self, blocked: set[str], queue: bool) -> None:
            return None

        def lease(self, request: Request) -> None:
            if self.down:
                raise redis.exceptions.ConnectionError("Connection refused")
            leased.append(request)

    crawler = SimpleNamespace(settings=Settings({"CONCURRENT_REQUESTS": 16}), stats=None, engine=None)
    frontier = OwnQueueFrontier()
    worker = SharedWorker(crawler, SchedulerPacer(), frontier,  # type: ignore[arg-type]
                          inner=SimpleNamespace(next_request=lambda: popped))
    assert worker.take(set(), 0) is popped and leased == []
    frontier.down = False
    assert worker.take(set(), 0) is popped and leased == [popped]
