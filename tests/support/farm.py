"""A farm of scrapy-redis workers for the shared-frontier tests (``tests/test_e2e_frontier.py``,
``tests/test_e2e_frontier_handoff.py``): worker processes (``tests/support/redis_worker.py``), their settings,
the shared queue, loopback servers that record each request's User-Agent, and the checks of the arrival log.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from typing import Any

from tests.support.crawl import assert_no_illegal_moves
from tests.support.redis_server import unique_prefix
from tests.support.server import Arrival, Reply, RequestInfo, page

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds of slack for the arrival log: across processes a request is spaced from the *booking* of the one
#: before, and on a loaded 2-core machine (two Scrapy workers, Redis, the servers) the moment a booked
#: request reaches the server lags its booking by tens of milliseconds (up to 74 ms measured).
TOL = 0.08
INTERVAL = 0.2
ADDRESSES = ["127.0.18.1", "127.0.18.2", "127.0.18.3"]


class Worker:
    """One worker process (``python -m tests.support.redis_worker``); ``extra``: more of its config (e.g.
    ``{"lease_wait": False}``, see the worker's module)."""

    def __init__(self, tmp_path: Any, label: str, name: str, settings: dict[str, Any], barrier: list[Any],
                 kind: str = "RedisSpider", extra: dict[str, Any] | None = None) -> None:
        self.label = label
        self.out = tmp_path / f"{label}.json"
        self.log = tmp_path / f"{label}.log"
        self.fetched_path = tmp_path / f"{label}.fetched"
        ready = tmp_path / "ready"
        ready.mkdir(exist_ok=True)
        config = tmp_path / f"{label}-config.json"
        config.write_text(json.dumps({"name": name, "worker": label, "kind": kind, "settings": settings,
                                      "ready_dir": str(ready), "barrier": barrier,
                                      "fetched": str(self.fetched_path), "out": str(self.out),
                                      **(extra or {})}))
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.redis_worker", str(config)], cwd=ROOT,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def stats(self, timeout: float = 90.0) -> dict[str, Any]:
        """Wait for the worker to close on its own; its stats."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.label} did not close in {timeout} s:\n{self.text()[-4000:]}") from None
        finally:
            self._log.close()
        assert self.proc.returncode == 0, self.text()[-4000:]
        stats: dict[str, Any] = json.loads(self.out.read_text())
        assert_no_illegal_moves(stats, self.label)
        return stats

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def killed(self) -> None:
        """SIGKILL, as a crashed pod; wait until it is gone."""
        self.signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def fetched(self) -> list[str]:
        """The URLs this worker's spider parsed (``<status> <url>``)."""
        return self.fetched_path.read_text().split("\n")[:-1] if self.fetched_path.exists() else []


def farm_settings(redis_url: str, prefix: str, **overrides: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "POLITE_STORE": redis_url,
        "POLITE_STORE_PREFIX": prefix,
        "REDIS_URL": redis_url,
        "POLITE_HOST_INTERVAL": INTERVAL,
        "POLITE_IP_INTERVAL": 0,
    }
    s.update(overrides)
    return s


def push_start_urls(url: str, name: str, urls: list[str], how: str = "list") -> None:
    """Feed ``<name>:start_urls`` as scrapy-redis reads it: a list (default), a set, a sorted set; ``json``:
    a list of JSON objects ``{"url": …, "meta": …}``."""
    import redis

    client = redis.Redis.from_url(url)
    key = f"{name}:start_urls"
    if how == "set":
        client.sadd(key, *urls)
    elif how == "zset":
        client.zadd(key, {u: len(urls) - i for i, u in enumerate(urls)})
    elif how == "json":
        client.rpush(key, *[json.dumps({"url": u, "meta": {"feed": "json"}}) for u in urls])
    else:
        client.rpush(key, *urls)
    client.close()


def push_requests(url: str, name: str, urls: list[str]) -> None:
    """Put ``urls`` into scrapy-redis's shared request queue (``<name>:requests``, its default priority
    queue), as a crawl that follows links leaves them: the whole frontier is in Redis from the start."""
    from types import SimpleNamespace

    import redis
    from scrapy import Request
    from scrapy_redis.queue import PriorityQueue

    client = redis.Redis.from_url(url)
    queue = PriorityQueue(server=client, spider=SimpleNamespace(name=name), key="%(spider)s:requests")
    for u in urls:
        queue.push(Request(u))
    client.close()


def arrivals(servers: list[Any]) -> list[Arrival]:
    return [a for srv in servers for a in srv.arrivals() if a.path != "/robots.txt"]


def violations(hits: list[Arrival], interval: float) -> list[str]:
    """Consecutive starts closer than ``interval``: across processes a booking spaces a host's requests from
    the previous booking (docs/spec.md §3; within one process its line also waits for the response)."""
    ordered = sorted(hits, key=lambda a: a.start)
    return [f"{a.path} started {a.start:.3f}, {b.path} started {b.start:.3f} ({b.start - a.start:.3f} s < {interval} s)"
            for a, b in zip(ordered, ordered[1:]) if b.start - a.start < interval - TOL]


def by_worker(servers: list[Any]) -> Counter[str]:
    """Pages answered 200, per worker (its User-Agent, recorded by the servers' handlers)."""
    return Counter(agent for srv in servers for agent, status, _ in srv.agents if status == 200)


def start_servers(arrival_server: Any, handler: Any = None, count: int = len(ADDRESSES)) -> list[Any]:
    """One server per address (the first ``count``); each records ``(User-Agent, status, path)`` per request
    in ``srv.agents``."""
    servers = []
    for address in ADDRESSES[:count]:
        srv = arrival_server(address)
        srv.agents = []
        lock = threading.Lock()

        def reply(info: RequestInfo, count: int, srv: Any = srv, lock: threading.Lock = lock) -> Reply:
            answer = handler(info, count) if handler is not None else page(info.path)
            with lock:
                srv.agents.append((info.headers.get("user-agent", ""), answer.status, info.path))
            return answer

        srv.route("/*", reply)
        servers.append(srv)
    return servers


def page_urls(servers: list[Any], pages: int) -> list[str]:
    return [srv.url(f"/p/{i}") for i in range(pages) for srv in servers]


def farm_name() -> str:
    """A spider name no other test uses (its Redis keys are its own)."""
    return unique_prefix("farm").replace(":", "-").strip("-")


def run_farm(tmp_path: Any, redis_url: str, urls: list[str], settings: dict[str, Any], workers: int = 2,
             kind: str = "RedisSpider", how: str = "queue", stagger: float = 0.0
             ) -> tuple[list[Worker], list[dict[str, Any]]]:
    """Feed ``urls`` (``how``: ``queue``, the shared request queue; else start URLs, :func:`push_start_urls`),
    start ``workers`` workers (together, or each ``stagger`` s after the previous) and wait for them."""
    name = farm_name()
    if how == "queue":
        push_requests(redis_url, name, urls)
    else:
        push_start_urls(redis_url, name, urls, how)
    labels = [f"w{i}-{name[-6:]}" for i in range(workers)]
    # Worker i starts once every worker has been ready for i × stagger seconds.
    farm = [Worker(tmp_path, label, name, settings, [[other, stagger * i] for other in labels], kind)
            for i, label in enumerate(labels)]
    return farm, [w.stats() for w in farm]


def worker_id(worker: Worker) -> str:
    """The id the worker logged at start (``shared frontier worker <id> (pid <pid>)``)."""
    found = re.search(r"shared frontier worker (\S+) \(pid (\d+)\)", worker.text())
    assert found is not None and int(found.group(2)) == worker.proc.pid, worker.text()[-3000:]
    return found.group(1)


def leased_urls(client: Any, key: str, worker: str) -> set[str]:
    """The URLs in ``worker``'s lease hash (scrapy-redis's default serializer: pickle)."""
    return {pickle.loads(v)["url"] for v in client.hvals(f"{key}:lease:{worker}")}
