"""What passes from one scrapy-redis worker to another through the shared frontier (docs/spec.md §5, "The shared
frontier"; README "Running many crawlers"; issue 30, findings 3 and 5).

Real scrapy-redis workers (``tests/support/redis_worker.py``) on one real ``redis-server``, loopback servers
that record every request; the checks read the **server-side** log and Redis itself:

* a worker SIGKILLed while it leases requests, with the others' idle window (``MAX_IDLE_TIME_BEFORE_CLOSE``)
  shorter than ``POLITE_LEASE_TIME``: the survivors stay until its leases come back and fetch every page
  before they close. Negative control: with that wait switched off they close "finished" while Redis still
  holds the dead worker's leases, and those pages are never fetched;
* a request deferred into Redis by one worker and taken by another is sent with the second worker's own
  ``User-Agent`` and none of the first worker's cookies. (The negative control is
  ``tests/test_frontier.py::test_a_deferred_request_is_written_back_as_the_scheduler_handed_it_out``: the
  record the first worker wrote carried its User-Agent, Cookie and Authorization before the fix.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.support.farm import (
    ADDRESSES,
    Worker,
    farm_name,
    farm_settings,
    leased_urls,
    page_urls,
    push_requests,
    start_servers,
    worker_id,
)
from tests.support.redis_server import redis_url, unique_prefix  # noqa: F401
from tests.support.server import Reply, RequestInfo, page

redis = pytest.importorskip("redis")
pytest.importorskip("scrapy_redis")

#: The lease and the survivors' idle window of the kill test (s): the window is shorter than the lease.
LEASE = 12.0
WINDOW = 2
#: Pages per host (three hosts): more than a worker's CONCURRENT_REQUESTS (16), so the victim takes 16 and
#: leaves the rest in the queue for the survivors.
PAGES = 6


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("lease_wait", [True, False], ids=["survivors-wait", "negative-control-no-wait"])
def test_a_killed_workers_leases_are_fetched_by_survivors_whose_idle_window_is_shorter_than_the_lease(
        lease_wait, redis_url, arrival_server, tmp_path):
    servers = start_servers(arrival_server)
    name = farm_name()
    key = f"{name}:polite"
    urls = page_urls(servers, PAGES)
    push_requests(redis_url, name, urls)
    settings = farm_settings(redis_url, unique_prefix("strand"), POLITE_LEASE_TIME=LEASE,
                             MAX_IDLE_TIME_BEFORE_CLOSE=WINDOW, POLITE_HOST_INTERVAL=0.5)
    extra = {} if lease_wait else {"lease_wait": False}
    # The survivors start (open their spiders, renew) at once, and take requests once the test says "go".
    victim = Worker(tmp_path, "sv", name, settings, [["sv", 0.0]])
    survivors = [Worker(tmp_path, label, name, settings, [["go", 0.0]], extra=extra) for label in ("sa", "sb")]
    wait_for(lambda: len(victim.fetched()) >= 4, 60, "the victim's first pages")
    victim.killed()
    client = redis.Redis.from_url(redis_url)
    victim_id = worker_id(victim)
    stranded = leased_urls(client, key, victim_id)  # what it had taken and not finished
    last_renewal = float(client.zscore(f"{key}:renewed", victim_id))
    assert len(stranded) >= 1
    (tmp_path / "ready" / "go.ready").touch()
    stats = [w.stats() for w in survivors]
    assert all(s["finish_reason"] == "finished" for s in stats), stats
    answered = {srv.url(path) for srv in servers for _, status, path in srv.agents if status == 200}
    by_survivors = {srv.url(path) for srv in servers for agent, status, path in srv.agents
                    if status == 200 and agent in ("sa", "sb")}
    print(f"lease_wait={lease_wait}: the victim leased {len(stranded)} requests at its kill; "
          f"{len(stranded - by_survivors)} of them not fetched by the survivors; {len(set(urls) - answered)} of "
          f"the {len(urls)} pages never answered 200")
    leftover = leased_urls(client, key, victim_id)
    if lease_wait:
        # Every page fetched (the server answered it 200): the victim's leases came back and the survivors
        # fetched them.
        assert stranded <= by_survivors, sorted(stranded - by_survivors)
        assert answered == set(urls), sorted(set(urls) - answered)
        assert sum(s.get("polite/lease/expired", 0) for s in stats) == len(stranded), stats
        closing = [line for w in survivors for line in w.text().splitlines() if "closes. Waiting in the" in line]
        assert len(closing) == 2 and not any(victim_id in line for line in closing), closing
        assert not leftover and not client.exists(f"{key}:lease:{victim_id}")
        # Not before its lease had expired (its last renewal + POLITE_LEASE_TIME, the server's clock).
        # (The last arrival of each such page is the survivors': the victim, dead, sent none after them.)
        last: dict[str, float] = {}
        for srv in servers:
            for a in srv.arrivals():
                if srv.url(a.path) in stranded:
                    last[a.path + srv.address] = max(last.get(a.path + srv.address, 0.0), a.start)
        assert len(last) == len(stranded) and min(last.values()) >= last_renewal + LEASE - 0.1, (last, last_renewal)
        said = "\n".join(w.text() for w in survivors)
        assert f"leased by worker {victim_id}, which stopped renewing its leases" in said, said[-3000:]
    else:
        # Negative control: the survivors closed "finished" with the victim's requests still leased in
        # Redis, and none of them was fetched.
        assert not stranded & by_survivors, sorted(stranded & by_survivors)
        assert leftover == stranded and stranded - answered, (sorted(stranded), sorted(answered))
        assert all(s.get("polite/frontier/leased_elsewhere_at_close") == len(stranded) for s in stats), stats
        assert not any(s.get("polite/lease/expired") for s in stats), stats
        closing = [line for w in survivors for line in w.text().splitlines() if "closes. Waiting in the" in line]
        assert len(closing) == 2 and all(f"worker {victim_id}: {len(stranded)} requests, " in line
                                         for line in closing), closing


@pytest.mark.parametrize("second_cookies", [True, False], ids=["cookies-on", "second-worker-cookies-off"])
def test_a_deferred_request_taken_by_another_worker_carries_no_user_agent_or_cookie_of_the_first(
        second_cookies, redis_url, arrival_server, tmp_path):
    """The host sets a cookie, then throttles (429, Retry-After 2): the first worker ("wa", cookies on) defers
    the request into Redis and is killed; the second ("wb") takes it when due. The server saw the 429'd request
    with wa's User-Agent and wa's cookie (the first worker's middlewares added them), and the retry with wb's
    User-Agent and no cookie of wa's. ``second-worker-cookies-off``: the second worker's CookiesMiddleware does
    not run (it would otherwise rewrite the Cookie header from its own jar), so any Cookie the record carried
    would reach the server."""
    seen: list[tuple[str, str, int, str]] = []
    lock = threading.Lock()

    def handler(info: RequestInfo, count: int) -> Reply:
        with lock:
            n = len(seen)
            if n == 0:
                reply = Reply.html("<p>hello</p>", headers={"Set-Cookie": "session=first-worker-secret; Path=/"})
            elif n == 1:
                reply = Reply.throttle(429, "2")
            else:
                reply = page(info.path)
            seen.append((info.headers.get("user-agent", ""), info.headers.get("cookie", ""), reply.status,
                         info.path))
        return reply

    srv = arrival_server(ADDRESSES[0])
    srv.route("/*", handler)
    name = farm_name()
    push_requests(redis_url, name, [srv.url("/p/0"), srv.url("/p/1")])
    settings = farm_settings(redis_url, unique_prefix("hdr"), COOKIES_ENABLED=True)
    first = Worker(tmp_path, "wa", name, settings, [["wa", 0.0]])
    client = redis.Redis.from_url(redis_url)
    wait_for(lambda: int(client.get(f"{name}:polite:count") or 0) >= 1, 60, "the 429'd request held in Redis")
    first.killed()
    second = Worker(tmp_path, "wb", name, {**settings, "COOKIES_ENABLED": second_cookies,
                                           "MAX_IDLE_TIME_BEFORE_CLOSE": 10}, [["wb", 0.0]])
    stats = second.stats()
    assert stats["finish_reason"] == "finished" and stats["polite/frontier/taken/held"] == 1, stats
    print("the server saw:", seen)
    throttled = seen[1]
    # The first worker's middlewares put its User-Agent and its jar's cookie on the request it deferred.
    assert throttled[0] == "wa" and "first-worker-secret" in throttled[1] and throttled[2] == 429, seen
    again = [row for row in seen[2:] if row[3] == throttled[3]]
    assert len(again) == 1 and again[0][2] == 200, seen
    assert again[0][0] == "wb", seen  # the second worker's own User-Agent
    assert "first-worker-secret" not in again[0][1], seen  # no cookie of the first worker
    assert [line.split()[1] for line in second.fetched()] == [srv.url(throttled[3])]
